"""Debezium's MongoDB connector classes (through the MongoDB harness) -> Kafka -> `cdc raw` -> `cdc refine`:
refined collections equal the reference model's final documents.

The records are the connector's own (its record emitter, collection schema and source info,
serialised by Kafka Connect's JsonConverter) for change-stream documents the reference model of
the collections writes (:mod:`cdc.stack.mongo_model`, MongoDB's update semantics). The writes are
seeded random (the seed is printed on failure; ``CDC_RANDOM_SEED=<seed>`` runs it again): nested $set,
$unset, $push/$pull/$pop, truncated arrays, replaces, deletes and re-inserts of one _id, type drift,
ids of several BSON types.
"""

from __future__ import annotations

import copy
import json
import os
import random
from decimal import Decimal

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType

import refine.mongo.documents
from cdc.core.errors import CdcError
from cdc.core.tables import is_delta_table, raw_table_location
from cdc.stack.mongo_harness import connector_records, kafka_record
from cdc.stack.mongo_model import (
    OPERATORS,
    Binary,
    Collection,
    Compound,
    Date,
    Decimal128,
    Int64,
    ObjectId,
    Update,
    as_json,
    canonical,
    random_writes,
)
from refine.config import refined_table_location
from refine.mongo.extended_json import commented_untyped
from refine.quality.quarantine import quarantine_location

JSON_TEXT_COMMENT = "MongoDB values of several types, as JSON text"  # a column of values of several types


def exact_json(text: str):
    """JSON text with its numbers exact (a decimal's digits beyond a double's are compared too)."""
    return json.loads(text, parse_float=Decimal)


def _id_text(document_id) -> str:
    """An _id as comparable text: the Kafka key's relaxed Extended JSON, parsed."""
    if isinstance(document_id, ObjectId):
        document_id = {"$oid": document_id.hex}
    elif isinstance(document_id, Int64):
        document_id = document_id.value
    elif isinstance(document_id, (Binary, Compound)):
        document_id = _relaxed(canonical(document_id))
    return json.dumps(document_id, sort_keys=True)


def _relaxed(value):
    """Canonical Extended JSON as relaxed (the key's form): int32 and int64 as plain numbers."""
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("$numberInt", "$numberLong"):
        return int(next(iter(value.values())))
    if isinstance(value, dict):
        return {k: _relaxed(v) for k, v in value.items()}
    return value


def refined_documents(spark, location: str) -> dict[str, dict]:
    """The refined table's documents as JSON values (JSON-text columns parsed), null fields left out."""
    table = spark.read.format("delta").load(location)
    data = [c for c in table.columns if c != "_id" and not c.startswith("_cdc_")]
    texts = {f.name for f in table.schema.fields if f.metadata.get("comment") == JSON_TEXT_COMMENT}
    rows = table.select("_id", F.to_json(F.struct(*[F.col(f"`{c}`") for c in data])).alias("document")).collect()
    documents = {}
    for row in rows:
        document = exact_json(row.document)
        documents[json.dumps(json.loads(row._id), sort_keys=True)] = {
            name: exact_json(value) if name in texts else value for name, value in document.items()
        }
    return documents


def expected_documents(collection: Collection, columns: set[str]) -> dict[str, dict]:
    """The model's documents as :func:`refined_documents` shows them; a field that has only held
    ``[]`` has no column yet (its element type is unknown)."""
    expected = {}
    for document_id, document in collection.documents.items():
        fields = as_json({k: v for k, v in document.items() if k != "_id"})
        expected[_id_text(document_id)] = {k: v for k, v in fields.items() if k in columns or v != []}
    return expected


def scripted_writes(collection: Collection, full_document: bool) -> None:
    """Every BSON type and _id type the model has, and each kind of write, in a fixed order."""
    ada, bob = ObjectId("64b7f0c2a1b2c3d4e5f60718"), "bob"
    collection.insert(
        {
            "_id": ada,
            "__v": 0,  # a field of the document (Mongoose's version key), not of a transform
            "name": "Ada",
            "qty": 1,
            "big": Int64(2**53 + 1),
            "price": 2.5,
            "balance": Decimal128("10.50"),
            "joined": Date(-86_400_000),
            "active": True,
            "none": None,
            "avatar": Binary(b"\x01\x02"),
            "ref": ObjectId("64b7f0c2a1b2c3d4e5f60719"),
            "address": {"city": "London", "zip": "N1", "geo": {"lat": 51.5}},
            "tags": ["a", "b", "c", "d"],
            "orders": [{"sku": "x", "qty": 1}, {"sku": "y", "qty": 2}],
        }
    )
    collection.insert({"_id": bob, "name": "Bob", "qty": 2, "tags": ["z"]})
    collection.insert({"_id": 7, "name": "Seven", "qty": 3})
    collection.insert({"_id": Int64(2**40), "name": "Big", "qty": 4})
    # Many changes to one document within one second.
    collection.update(
        ada,
        Update(
            [
                ("$set", "address.city", "Paris"),
                ("$unset", "address.zip", ""),
                ("$set", "address.geo.lat", 48.9),
                ("$push", "tags", "e"),
            ]
        ),
        full_document,
    )
    collection.update(
        ada,
        Update([("$pop", "tags", 1), ("$set", "orders.1.qty", 5), ("$set", "orders.3", {"sku": "w", "qty": 9})]),
        full_document,
    )
    collection.update(ada, Update([("$pull", "tags", "b"), ("$pop", "orders", -1)]), full_document)
    collection.next_second()
    collection.update(bob, Update([("$set", "qty", "many"), ("$unset", "tags", "")]), full_document)  # type drift
    collection.update(7, Update([("$set", "qty", Int64(2**40)), ("$set", "extra", {"k": [1, 2]})]), full_document)
    collection.replace({"_id": Int64(2**40), "name": "Big v2", "note": "replaced"})
    collection.delete(bob)
    collection.next_second()
    collection.insert({"_id": bob, "name": "Bob again", "qty": 1.5})  # re-inserted; qty a double now
    collection.update(
        ada, Update([("$set", "joined", Date(1_700_000_000_123)), ("$set", "active", False)]), full_document
    )


@pytest.mark.parametrize("mode", ["change_streams_update_full", "change_streams"])
def test_scripted_writes_refine_to_the_model_documents(spark, kafka, land_and_refine, unique_name, tmp_path, mode):
    collection = Collection("shop", "people")
    scripted_writes(collection, full_document=mode == "change_streams_update_full")
    records = connector_records(collection.events, {"topic.prefix": unique_name, "capture.mode": mode})
    assert [json.loads(r["value"])["payload"]["op"] if r["value"] else None for r in records] == [
        "c",
        "c",
        "c",
        "c",
        "u",
        "u",
        "u",
        "u",
        "u",
        "u",
        "d",
        None,
        "c",
        "u",
    ]
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    kafka.produce(topic, [kafka_record(r) for r in records[:4]])
    land_and_refine(warehouse, topic)
    kafka.produce(topic, [kafka_record(r) for r in records[4:]])
    land_and_refine(warehouse, topic)
    location = refined_table_location(warehouse, topic)
    got = refined_documents(spark, location)
    wanted = expected_documents(collection, set(spark.read.format("delta").load(location).columns))
    assert got == wanted
    assert not is_delta_table(spark, quarantine_location(warehouse))
    # The raw table keeps each record's headers: the connector's context, a tombstone's included.
    raw = spark.read.format("delta").load(raw_table_location(warehouse, topic)).orderBy("offset").collect()
    contexts = [
        {h.key: h.value.decode() for h in row.headers if h.key.startswith("__debezium.context.")} for row in raw
    ]
    assert [
        (c["__debezium.context.connectorLogicalName"], c["__debezium.context.connectorName"]) for c in contexts
    ] == [(unique_name, "mongodb")] * len(records)


def untyped_writes(collection: Collection, then_typed: bool = True) -> int:
    """Fields (top-level, nested, set by a patch update) that hold only ``[]``, then (``then_typed``)
    a later batch's first typed values of them; the number of events in the first batch."""
    collection.insert({"_id": 1, "name": "a", "tags": [], "address": {"city": "x", "codes": []}})
    collection.update(1, Update([("$set", "extra", []), ("$set", "address.more", [])]), False)
    first = len(collection.events)
    if not then_typed:
        return first
    collection.insert({"_id": 2, "name": "b", "tags": ["t"], "address": {"city": "y", "codes": [1], "more": [2]}})
    collection.update(2, Update([("$set", "extra", ["e"])]), False)
    return first


def test_fields_that_have_held_only_empty_arrays_are_refined(spark, kafka, land_and_refine, unique_name, tmp_path):
    """``[]`` has no element type: a field that has held nothing else is an array of strings for now,
    named as untyped in its column's comment, and its documents read ``[]``, not null."""
    collection = Collection("shop", "things")
    untyped_writes(collection, then_typed=False)
    records = connector_records(collection.events, {"topic.prefix": unique_name, "capture.mode": "change_streams"})
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    kafka.produce(topic, [kafka_record(r, schemas=False) for r in records])
    location = refined_table_location(warehouse, topic)
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        table = spark.read.format("delta").load(location)
        assert refined_documents(spark, location) == expected_documents(collection, set(table.columns))
        assert table.schema["tags"].dataType == ArrayType(StringType())
        assert commented_untyped(table.schema["tags"]) == [()]
        assert commented_untyped(table.schema["address"]) == [("codes",), ("more",)]
        assert commented_untyped(table.schema["extra"]) == [()]
    assert not is_delta_table(spark, quarantine_location(warehouse))


def test_fields_that_held_only_empty_arrays_keep_them_once_typed(spark, kafka, land_and_refine, unique_name, tmp_path):
    """Once a batch brings a field's first elements, documents refined before with ``[]`` in it read ``[]``."""
    collection = Collection("shop", "things")
    first = untyped_writes(collection)
    records = connector_records(collection.events, {"topic.prefix": unique_name, "capture.mode": "change_streams"})
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    for batch in (records[:first], records[first:]):
        kafka.produce(topic, [kafka_record(r, schemas=False) for r in batch])
        land_and_refine(warehouse, topic)
    location = refined_table_location(warehouse, topic)
    table = spark.read.format("delta").load(location)
    assert refined_documents(spark, location) == expected_documents(collection, set(table.columns))
    assert table.schema["address"].dataType["codes"].dataType == ArrayType(LongType())
    assert table.schema["tags"].dataType == ArrayType(StringType())
    assert not any(commented_untyped(field) for field in table.schema.fields)
    assert not is_delta_table(spark, quarantine_location(warehouse))


def test_untyped_arrays_typed_later_keep_their_history_and_child_tables(
    spark, kafka, land_and_refine, unique_name, tmp_path, monkeypatch
):
    """Exploded arrays, arrays inside their elements and nested fields (under a name SQL must quote)
    hold only ``[]`` or nulls in a first batch; in a second they take elements (documents with null
    fields, among them) or deepen (``[[]]``), and its first run stops after the refined table was
    retyped: the refined table, its child tables and its history equal the model after each batch
    and after each rerun; the history's rows of the first batch read ``[]`` too."""
    collection = Collection("shop", "carts")
    collection.insert({"_id": 1, "items": [{"sku": "x", "marks": []}], "tags": [], "meta": {"content-type": "a"}})
    collection.insert({"_id": 2, "tags": [], "items": [], "lines": [], "deep": []})
    collection.update(2, Update([("$set", "notes", [[]]), ("$set", "meta.codes", [])]), False)
    collection.insert({"_id": 4, "tags": [None]})
    first = len(collection.events)
    before = copy.deepcopy(collection.documents)
    collection.insert(
        {
            "_id": 3,
            "items": [{"sku": "y", "marks": [7]}],
            "tags": [5],
            "notes": [["n"]],
            "lines": [{"n": 1, "note": None}],
            "deep": [[]],
            "meta": {"content-type": "b", "codes": [3]},
        }
    )
    collection.update(2, Update([("$set", "tags", [6, 7])]), False)
    records = connector_records(collection.events, {"topic.prefix": unique_name, "capture.mode": "change_streams"})
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    settings = {"explode": ["items", "tags"], "history": True}
    location = refined_table_location(warehouse, topic)
    history = refined_table_location(warehouse, f"{topic}__history")
    for number, (batch, documents) in enumerate(((records[:first], before), (records[first:], collection.documents))):
        kafka.produce(topic, [kafka_record(r, schemas=False) for r in batch])
        if number:  # stops after the refined table's retype, before its MERGE and the child tables
            with monkeypatch.context() as patched:
                patched.setattr(refine.mongo.documents, "merge_changes", lambda *_, **__: 1 / 0)
                with pytest.raises(CdcError, match="ZeroDivisionError"):
                    land_and_refine(warehouse, topic, **settings)
        model = Collection("shop", "carts")
        model.documents = documents
        for _ in range(2):  # a rerun changes nothing
            land_and_refine(warehouse, topic, **settings)
            columns = set(spark.read.format("delta").load(location).columns)
            assert refined_documents(spark, location) == expected_documents(model, columns)
            for field in ("items", "tags"):  # an array with no elements yet has no child table
                children = refined_table_location(warehouse, f"{topic}__{field}")
                got, as_text = child_rows(spark, children) if is_delta_table(spark, children) else ({}, False)
                assert not as_text
                assert got == expected_child_rows(model, field, as_text)
            current = spark.read.format("delta").load(history).where("_cdc_is_current").drop("_cdc_is_current")
            assert {
                json.dumps(json.loads(row._id)): {k: v for k, v in exact_json(row.document).items() if k in columns}
                for row in current.select(
                    "_id",
                    F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns if not c.startswith("_")])).alias("document"),
                ).collect()
            } == expected_documents(model, columns)
    first_version = spark.read.format("delta").load(history).where("_id = '1'").orderBy("_cdc_ts_ms").head()
    assert first_version.tags == []
    assert first_version.items[0].marks == []
    table = spark.read.format("delta").load(location)
    assert table.schema["tags"].dataType == ArrayType(LongType())
    assert table.schema["notes"].dataType == ArrayType(ArrayType(StringType()))
    assert {field.name: commented_untyped(field) for field in table.schema.fields if commented_untyped(field)} == {
        "deep": [()]  # [[]]: still no element type
    }
    assert not is_delta_table(spark, quarantine_location(warehouse))


@pytest.mark.parametrize(
    ("mode", "schemas", "snapshot"),
    [  # every pair of the three settings' values, once (the capture modes with and without pre-images)
        ("change_streams_update_full", True, False),
        ("change_streams_with_pre_image", False, False),
        ("change_streams_update_full_with_pre_image", False, True),
        ("change_streams", True, True),
    ],
)
def test_random_writes_refine_to_the_model_documents(
    spark, kafka, land_and_refine, unique_name, tmp_path, mode, schemas, snapshot
):
    """With ``snapshot``, the collection holds documents before capture starts, which the connector's
    initial snapshot reads (op ``r``, its snapshot record emitter) while writes go on; their changes
    are streamed after the reads, from the snapshot's start (so a read may already hold them). The
    ``*_with_pre_image`` modes put the document before each change in the records' ``before``."""
    seed = int(os.environ.get("CDC_RANDOM_SEED") or random.randrange(2**32))
    pre_images = mode.endswith("_with_pre_image")
    collection = Collection("shop", "things", pre_images=pre_images)
    full_document = mode.startswith("change_streams_update_full")
    written = random_writes(
        seed,
        collection,
        steps=160,
        full_document=full_document,
        snapshot=snapshot,
        later_lookups=full_document,
        more_ids=True,
    )
    assert all(written[operator] for operator in OPERATORS), written
    assert bool(written["later lookup"]) == full_document, written  # a lookup that found a later state or null
    records = connector_records(collection.events, {"topic.prefix": unique_name, "capture.mode": mode})
    payloads = [json.loads(r["value"])["payload"] for r in records if r["value"]]
    reads = [p for p in payloads if p["op"] == "r"]
    assert bool(reads) == snapshot
    assert any(p.get("before") for p in payloads if p["op"] in ("u", "d")) == pre_images
    # The dispatcher's snapshot receiver marks the last read.
    assert [r["source"]["snapshot"] for r in reads] == ["true"] * (len(reads) - 1) + ["last"] * bool(reads)
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    rng = random.Random(seed)
    cuts = [rng.randrange(1, len(records)), len(records)]  # two batches of random sizes
    start = 0
    for cut in cuts:
        kafka.produce(topic, [kafka_record(r, schemas) for r in records[start:cut]])
        start = cut
        land_and_refine(warehouse, topic)
    location = refined_table_location(warehouse, topic)
    for rerun in (False, True):  # a rerun changes nothing
        if rerun:
            land_and_refine(warehouse, topic)
        got = refined_documents(spark, location)
        columns = set(spark.read.format("delta").load(location).columns)
        wanted = expected_documents(collection, columns)
        assert wanted, f"seed {seed}: the model holds no document"
        differing = sorted(k for k in set(got) | set(wanted) if got.get(k) != wanted.get(k))
        assert not differing, (
            f"seed {seed} ({mode}): {len(differing)} documents differ, e.g. {differing[0]}: "
            f"refined {got.get(differing[0])} != model {wanted.get(differing[0])}"
        )
    if is_delta_table(spark, quarantine_location(warehouse)):
        reasons = [row.reason for row in spark.read.format("delta").load(quarantine_location(warehouse)).collect()]
        assert not reasons, f"seed {seed} ({mode}): quarantined {reasons}"


def _flat(element, prefix: str = "") -> dict:
    """A document element as the child table's columns name its fields (``a.b`` -> ``a_b``)."""
    columns = {}
    for name, value in element.items():
        if isinstance(value, dict):
            columns.update(_flat(value, f"{prefix}{name}_"))
        else:
            columns[f"{prefix}{name}"] = value
    return columns


def child_rows(spark, location: str) -> tuple[dict[tuple[str, int], object], bool]:
    """A child table's rows: (_id, pos) -> the element (a JSON-text ``value`` parsed; a scalar
    ``value``; else the element's columns, nulls left out), and whether ``value`` is JSON text."""
    table = spark.read.format("delta").load(location)
    fields = [f for f in table.schema.fields if f.name not in ("_id", "pos") and not f.name.startswith("_cdc_")]
    texts = [f.name == "value" and f.metadata.get("comment") == JSON_TEXT_COMMENT for f in fields]
    as_text = texts == [True]
    rows = {}
    for row in table.select(
        "_id", "pos", F.to_json(F.struct(*[F.col(f"`{f.name}`") for f in fields])).alias("e")
    ).collect():
        element = exact_json(row.e)
        key = (json.dumps(json.loads(row._id), sort_keys=True), row.pos)
        if [f.name for f in fields] == ["value"]:
            value = element.get("value")
            rows[key] = exact_json(value) if as_text and value is not None else value
        else:
            rows[key] = element
    return rows, as_text


def expected_child_rows(collection: Collection, field: str, as_text: bool) -> dict[tuple[str, int], object]:
    """The model's elements of the array ``field`` of each document (none where it is not an array)."""
    expected = {}
    for document_id, document in collection.documents.items():
        value = document.get(field)
        if not isinstance(value, list):
            continue
        for pos, element in enumerate(as_json(value)):
            flat = not as_text and isinstance(element, dict)
            expected[(_id_text(document_id), pos)] = _flat(element) if flat else element
    return expected


@pytest.mark.parametrize("schemas", [True, False])
def test_exploded_arrays_follow_the_documents_through_type_drift(
    spark, kafka, land_and_refine, unique_name, tmp_path, schemas
):
    """Arrays exploded into child tables drift (to a string; an element's field to a string): the
    child rows are each document's current elements, as the model has them."""
    seed = int(os.environ.get("CDC_RANDOM_SEED") or random.randrange(2**32))
    collection = Collection("shop", "carts")
    random_writes(seed, collection, steps=120, full_document=True, array_drift=True)
    records = connector_records(
        collection.events, {"topic.prefix": unique_name, "capture.mode": "change_streams_update_full"}
    )
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    rng = random.Random(seed)
    start = 0
    for cut in [rng.randrange(1, len(records)), len(records)]:  # two batches of random sizes
        kafka.produce(topic, [kafka_record(r, schemas) for r in records[start:cut]])
        start = cut
        land_and_refine(warehouse, topic, explode=["items", "tags"])
    location = refined_table_location(warehouse, topic)
    for _ in range(2):  # a rerun changes nothing
        columns = set(spark.read.format("delta").load(location).columns)
        assert refined_documents(spark, location) == expected_documents(collection, columns), f"seed {seed}"
        for field in ("items", "tags"):
            got, as_text = child_rows(spark, refined_table_location(warehouse, f"{topic}__{field}"))
            wanted = expected_child_rows(collection, field, as_text)
            differing = sorted(k for k in set(got) | set(wanted) if got.get(k) != wanted.get(k))
            assert not differing, (
                f"seed {seed} ({field}): {len(differing)} child rows differ, e.g. {differing[0]}: "
                f"refined {got.get(differing[0])} != model {wanted.get(differing[0])}"
            )
        land_and_refine(warehouse, topic, explode=["items", "tags"])
    assert not is_delta_table(spark, quarantine_location(warehouse)), f"seed {seed}"


@pytest.mark.parametrize("mode", ["change_streams_update_full", "change_streams"])
def test_an_exploded_array_that_drifts_leaves_no_stale_child_rows(
    spark, kafka, land_and_refine, unique_name, tmp_path, mode
):
    """An exploded array drifts (to a string; an element's field to a string) after its child rows
    were refined: the child rows are the documents' current elements (JSON text), as the model has
    them. An update that truncates the drifted array is applied when it carries the whole document,
    and quarantined when it carries only the path (which cannot reach into JSON text)."""
    full = mode == "change_streams_update_full"
    collection = Collection("shop", "carts")
    a, b = ObjectId("64b7f0c2a1b2c3d4e5f60718"), "b"
    collection.insert({"_id": a, "items": [{"sku": "x", "n": 1}, {"sku": "y", "n": 2}, {"sku": "z", "n": 3}]})
    collection.insert({"_id": b, "items": [{"sku": "x", "n": 4}]})
    first = len(collection.events)
    collection.update(a, Update([("$set", "items", "none")]), full)  # no longer an array
    collection.update(b, Update([("$set", "items", [{"sku": "x", "n": "four"}, {"sku": "v", "n": 8}])]), full)
    if full:
        collection.update(b, Update([("$set", "items.1.n", "eight")]), full)
    collection.insert({"_id": 7, "items": [{"sku": "q", "n": 6}, {"sku": "r", "n": 7}]})
    oracle = copy.deepcopy(collection)
    collection.update(7, Update([("$pop", "items", -1)]), full)  # truncated
    if full:
        oracle = collection
    records = connector_records(collection.events, {"topic.prefix": unique_name, "capture.mode": mode})
    topic = kafka.create_topic(records[0]["topic"])
    warehouse = str(tmp_path)
    for batch in (records[:first], records[first:]):
        kafka.produce(topic, [kafka_record(r) for r in batch])
        land_and_refine(warehouse, topic, explode=["items"])
    got, as_text = child_rows(spark, refined_table_location(warehouse, f"{topic}__items"))
    assert as_text
    assert got == expected_child_rows(oracle, "items", as_text)
    location = refined_table_location(warehouse, topic)
    assert refined_documents(spark, location) == expected_documents(oracle, {"items"})
    if full:
        assert not is_delta_table(spark, quarantine_location(warehouse))
    else:
        reasons = [r.reason for r in spark.read.format("delta").load(quarantine_location(warehouse)).collect()]
        assert len(reasons) == 1, reasons
        assert reasons[0].startswith("cannot apply update path items"), reasons


UNWRAP = {"unwrap.add.fields": "op,source.ts_ms"}  # deletes as tombstones alone: the transform's default


def _as_unwrapped_json(value):
    """A model value as ExtractNewDocumentState leaves it and the refined table shows it: a decimal as
    its text, a date as its epoch milliseconds (else as :func:`as_json`)."""
    if isinstance(value, Decimal128):
        return value.text
    if isinstance(value, Date):
        return value.millis
    if isinstance(value, dict):
        return {k: _as_unwrapped_json(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_as_unwrapped_json(v) for v in value]
    return as_json(value)


def expected_unwrapped_documents(collection: Collection) -> dict[str, dict]:
    """The model's documents as :func:`refined_documents` shows them refined from ExtractNewDocumentState's
    rows (the key's id is the row's ``_id``: an ObjectId its hex text)."""
    return {
        json.dumps(_as_unwrapped_json(document_id), sort_keys=True): _as_unwrapped_json(
            {k: v for k, v in document.items() if k != "_id"}
        )
        for document_id, document in collection.documents.items()
    }


def refine_unwrapped(
    kafka, land_and_refine, warehouse: str, records: list[dict], schemas: bool, cuts: list[int]
) -> str:
    """Produce ExtractNewDocumentState's records (those it keeps) in batches ending at ``cuts``, each landed
    and refined; the topic."""
    records = [r for r in records if r["unwrapped"]]
    topic = kafka.create_topic(records[0]["topic"])
    start = 0
    for cut in [*cuts, len(records)]:
        batch = records[start:cut]
        start = cut
        kafka.produce(topic, [kafka_record(r, schemas, unwrapped=True) for r in batch])
        land_and_refine(warehouse, topic)
    return topic


@pytest.mark.parametrize(
    ("schemas", "deletes"), [(True, "rewrite"), (False, "tombstone"), (True, "rewrite-with-tombstone")]
)
def test_extract_new_document_state_rows_refine_to_the_model_documents(
    spark, kafka, land_and_refine, unique_name, tmp_path, schemas, deletes
):
    """Debezium's ExtractNewDocumentState (the connector's own transform, run on its records as Kafka
    Connect runs it) flattens full documents into rows, each with its document's own schema (a nested
    field gone, a type drifted, ids of four BSON types), deletes as ``__deleted`` rows, tombstones or
    both: they are refined as the documents they are, equal to the model's, with nothing quarantined."""
    collection = Collection("shop", "people")
    scripted_writes(collection, full_document=True)
    settings = {
        "topic.prefix": unique_name,
        "capture.mode": "change_streams_update_full",
        **UNWRAP,
        "unwrap.delete.tombstone.handling.mode": deletes,
    }
    records = connector_records(collection.events, settings)
    delete, tombstone = records[-4:-2]  # the delete as the transform leaves it, then the connector's tombstone
    row = delete["unwrapped_value_bare"]
    assert delete["unwrapped"]
    assert (row is not None and json.loads(row)["__deleted"]) == (deletes != "tombstone")
    assert tombstone["unwrapped"] == (deletes == "rewrite-with-tombstone")
    warehouse = str(tmp_path)
    kept = [r for r in records if r["unwrapped"]]
    first_delete = next(i for i, r in enumerate(kept) if r["value"] and json.loads(r["value"])["payload"]["op"] == "d")
    # The delete (a tombstone, or a rewritten row) in a batch of its own: it shows no document's schema.
    cuts = [4, first_delete, first_delete + 1]
    topic = refine_unwrapped(kafka, land_and_refine, warehouse, records, schemas, cuts)
    location = refined_table_location(warehouse, topic)
    for _ in range(2):  # a rerun changes nothing
        assert refined_documents(spark, location) == expected_unwrapped_documents(collection)
        land_and_refine(warehouse, topic)
    assert not is_delta_table(spark, quarantine_location(warehouse))


@pytest.mark.parametrize("snapshot", [False, True])
def test_random_writes_through_extract_new_document_state_refine_to_the_model_documents(
    spark, kafka, land_and_refine, unique_name, tmp_path, snapshot
):
    seed = int(os.environ.get("CDC_RANDOM_SEED") or random.randrange(2**32))
    collection = Collection("shop", "things")
    random_writes(seed, collection, steps=160, full_document=True, snapshot=snapshot)
    settings = {"topic.prefix": unique_name, "capture.mode": "change_streams_update_full", **UNWRAP}
    records = connector_records(collection.events, settings)
    cuts = sorted(random.Random(seed).sample(range(1, len(records) - 20), 2))
    warehouse = str(tmp_path)
    topic = refine_unwrapped(kafka, land_and_refine, warehouse, records, bool(seed % 2), cuts)
    got = refined_documents(spark, refined_table_location(warehouse, topic))
    wanted = expected_unwrapped_documents(collection)
    differing = sorted(k for k in set(got) | set(wanted) if got.get(k) != wanted.get(k))
    assert not differing, (
        f"seed {seed}: {len(differing)} documents differ, e.g. {differing[0]}: "
        f"refined {got.get(differing[0])} != model {wanted.get(differing[0])}"
    )
    assert not is_delta_table(spark, quarantine_location(warehouse)), f"seed {seed}: records quarantined"


def test_extract_new_document_state_rows_of_patches_go_to_the_quarantine(
    spark, kafka, land_and_refine, unique_name, tmp_path
):
    """With capture.mode=change_streams an update's row holds only its dotted paths (its removed fields
    and truncated arrays lost): no document can be made of it, so it is quarantined with why, and the
    rest is refined."""
    collection = Collection("shop", "people")
    scripted_writes(collection, full_document=False)
    settings = {"topic.prefix": unique_name, "capture.mode": "change_streams", **UNWRAP}
    records = connector_records(collection.events, settings)
    rows = [json.loads(r["unwrapped_value_bare"]) for r in records if r["unwrapped"] and r["unwrapped_value_bare"]]
    patches = [row for row in rows if any("." in name for name in row)]
    assert len(patches) == 3  # nested $set, $push, array changes; the other updates set top-level fields
    warehouse = str(tmp_path)
    topic = refine_unwrapped(kafka, land_and_refine, warehouse, records, schemas=True, cuts=[])
    reasons = [row.reason for row in spark.read.format("delta").load(quarantine_location(warehouse)).collect()]
    assert len(reasons) == len(patches)
    assert all("capture.mode=change_streams" in reason for reason in reasons)
    assert set(refined_documents(spark, refined_table_location(warehouse, topic))) == set(
        expected_unwrapped_documents(collection)
    )


def test_documents_holding_an_id_and_topics_that_switch_forms(spark, kafka, land_and_refine, unique_name, tmp_path):
    """ExtractNewDocumentState's rows of documents holding an ``id`` field are documents: told by the key
    where some ``id`` differs from its ``_id``, by ``connector: mongodb`` where every ``id`` equals it (and
    that setting leaves the connector's envelopes, a batch of tombstones alone included, as they are).
    Without ``__source_ts_ms`` a document's commit time is its Kafka record's. A topic that switches
    between the envelopes and the transform's rows is refused, its table left as it was: the two key an
    ObjectId differently."""
    collection = Collection("shop", "parts")
    collection.insert({"_id": 1, "id": 1, "qty": 1, "address": {"city": "x"}})
    collection.insert({"_id": 2, "id": 2, "qty": 2})
    collection.update(1, Update([("$set", "qty", "many"), ("$unset", "address", "")]), full_document=True)
    collection.insert({"_id": 3, "id": "part-3", "qty": 3})
    collection.delete(2)
    collection.update(3, Update([("$set", "qty", 4)]), full_document=True)
    settings = {"topic.prefix": unique_name, "capture.mode": "change_streams_update_full", "unwrap.add.fields": "op"}
    records = connector_records(collection.events, settings)
    rows = [r for r in records if r["unwrapped"]]
    warehouse = str(tmp_path)

    def produce(topic: str, batch: list[dict], unwrapped: bool = True) -> None:
        kafka.produce(topic, [kafka_record(r, unwrapped=unwrapped) for r in batch])

    told_by_key = kafka.create_topic(f"{unique_name}.by_key.parts")
    produce(told_by_key, rows)
    declared = kafka.create_topic(f"{unique_name}.declared.parts")  # the documents whose id is their _id
    produce(declared, [r for r in rows if json.loads(r["unwrapped_key_bare"])["id"] in (1, 2)])
    envelopes = kafka.create_topic(f"{unique_name}.envelopes.parts")
    tombstone = next(i for i, r in enumerate(records) if r["value"] is None)
    produce(envelopes, records[:tombstone], unwrapped=False)
    land_and_refine(warehouse, envelopes, connector="mongodb")
    produce(envelopes, [records[tombstone]], unwrapped=False)  # a batch of one tombstone
    land_and_refine(warehouse, envelopes, connector="mongodb")
    produce(envelopes, records[tombstone + 1 :], unwrapped=False)
    expected = expected_unwrapped_documents(collection)
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, told_by_key)
        land_and_refine(warehouse, declared, connector="mongodb")
        land_and_refine(warehouse, envelopes, connector="mongodb")
        assert refined_documents(spark, refined_table_location(warehouse, told_by_key)) == expected
        assert refined_documents(spark, refined_table_location(warehouse, declared)) == {
            key: document for key, document in expected.items() if key == "1"
        }
        assert refined_documents(spark, refined_table_location(warehouse, envelopes)) == expected
    assert not is_delta_table(spark, quarantine_location(warehouse))
    committed = spark.read.format("delta").load(refined_table_location(warehouse, told_by_key))
    assert committed.where("_cdc_committed_at < current_timestamp() - INTERVAL 1 HOUR").isEmpty()
    assert committed.where("_cdc_committed_at IS NULL").isEmpty()
    for topic, batch, unwrapped in ((told_by_key, records[-1:], False), (envelopes, rows[-1:], True)):
        produce(topic, batch, unwrapped)
        with pytest.raises(CdcError, match="refine each form from a topic of its own"):
            land_and_refine(warehouse, topic)
        assert refined_documents(spark, refined_table_location(warehouse, topic)) == expected
