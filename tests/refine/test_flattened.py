"""Rows flattened by ExtractNewRecordState -> Kafka -> `cdc raw` -> `cdc refine`.

Records are written as the transform writes them with JsonConverter (``schemas.enable=true``),
``add.fields=op,lsn,source.ts_ms`` and ``delete.handling.mode=rewrite`` (``__deleted``), deletes
followed by tombstones, or tombstones alone.
"""

from __future__ import annotations

import functools
import json
from decimal import Decimal

import pytest
from pyspark.testing import assertDataFrameEqual

from refine.config import refined_table_location

pytestmark = pytest.mark.integration

DECIMAL = {
    "type": "bytes",
    "optional": True,
    "name": "org.apache.kafka.connect.data.Decimal",
    "version": 1,
    "parameters": {"scale": "2", "connect.decimal.precision": "10"},
}
ADDED = [
    {"type": "string", "optional": True, "field": "__op"},
    {"type": "int64", "optional": True, "field": "__lsn"},
    {"type": "int64", "optional": True, "field": "__source_ts_ms"},
    {"type": "string", "optional": True, "field": "__deleted"},
]
PRICES = {"12.50": "BOI=", "3.00": "ASw=", "7.25": "AtU="}  # base64 of the unscaled big-endian integers


def key(topic: str, item_id: int, separators: tuple[str, str] | None = None) -> bytes:
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Key",
        "fields": [{"type": "int64", "optional": False, "field": "id"}],
    }
    return json.dumps({"schema": schema, "payload": {"id": item_id}}, separators=separators).encode()


def row(
    topic: str,
    item_id: int,
    name: str,
    price: str,
    op: str,
    lsn: int,
    deleted: bool = False,
    separators: tuple[str, str] | None = None,
) -> bytes:
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Value",
        "fields": [
            {"type": "int64", "optional": False, "field": "id"},
            {"type": "string", "optional": True, "field": "name"},
            {**DECIMAL, "field": "price"},
            *ADDED,
        ],
    }
    payload = {
        "id": item_id,
        "name": name,
        "price": PRICES[price],
        "__op": op,
        "__lsn": lsn,
        "__source_ts_ms": 1_763_700_000_000 + lsn,
        "__deleted": "true" if deleted else "false",
    }
    return json.dumps({"schema": schema, "payload": payload}, separators=separators).encode()


@pytest.mark.parametrize("compact", [True, False], ids=["compact JSON", "JSON with spaces"])
def test_flattened_rows_are_upserted_and_deleted_in_lsn_order(
    spark, kafka, land_and_refine, unique_name, tmp_path, compact, monkeypatch
):
    """JsonConverter writes compact JSON: batches are then parsed in one pass with the last batch's
    schemas. Values with spaces are read all the same, after their schemas are found."""
    from refine.batch import RefineBatch

    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    searched = []  # batches whose schemas were searched for
    search = RefineBatch._refine
    monkeypatch.setattr(RefineBatch, "_refine", lambda self, *args: searched.append(1) or search(self, *args))
    separators = (",", ":") if compact else None
    key = functools.partial(globals()["key"], separators=separators)
    row = functools.partial(globals()["row"], separators=separators)
    kafka.produce(
        topic,
        [
            (key(topic, 1), row(topic, 1, "a", "12.50", "r", 100)),
            (key(topic, 2), row(topic, 2, "b", "3.00", "c", 200)),
            (key(topic, 1), row(topic, 1, "a2", "7.25", "u", 300)),
            (key(topic, 2), row(topic, 2, "b", "3.00", "d", 400, deleted=True)),  # delete.handling.mode=rewrite
            (key(topic, 2), None),
            (key(topic, 3), row(topic, 3, "c", "3.00", "c", 500)),
            (key(topic, 3), None),  # a delete as the tombstone alone
            (key(topic, 4), row(topic, 4, "d", "12.50", "c", 600)),
            (key(topic, 1), row(topic, 1, "a", "12.50", "r", 100)),  # replayed after a connector restart
        ],
    )
    expected = spark.createDataFrame(
        [(1, "a2", Decimal("7.25"), 300, "u"), (4, "d", Decimal("12.50"), 600, "c")],
        "id long, name string, price decimal(10,2), _cdc_lsn long, _cdc_op string",
    )
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(refined.select(*expected.columns), expected)
    assert "__op" not in refined.columns
    assert "__deleted" not in refined.columns

    kafka.produce(topic, [(key(topic, 1), None)])  # a batch of one tombstone: no schema in it
    land_and_refine(warehouse, topic)
    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    assertDataFrameEqual(refined.select(*expected.columns), expected.where("id = 4"))
    assert len(searched) == (0 if compact else 2)  # with spaces: each of the two batches


def test_a_batch_of_only_bad_records_on_a_flattened_topic_is_quarantined(
    spark, kafka, land_and_refine, unique_name, tmp_path
):
    """Batches holding no good row: a Debezium envelope (the topic holds rows, as its refined table
    remembers), a value schema that is no struct, a key schema naming a field the rows lack (no key
    schema of the batch can be read). Each is quarantined with its reason, the table is left as it
    was, and the job goes on."""
    from refine.quarantine import quarantine_location

    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    kafka.produce(topic, [(key(topic, 1), row(topic, 1, "a", "12.50", "c", 100))])
    land_and_refine(warehouse, topic)
    good = json.loads(row(topic, 2, "b", "3.00", "c", 200))
    columns = [{**field, "optional": True} for field in good["schema"]["fields"] if not field["field"].startswith("__")]
    envelope = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Envelope",
        "fields": [
            {"type": "struct", "optional": True, "field": "before", "fields": columns},
            {"type": "struct", "optional": True, "field": "after", "fields": columns},
            {"type": "struct", "optional": False, "field": "source", "fields": []},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    after = {name: good["payload"][name] for name in ("id", "name", "price")}
    nope = {"type": "struct", "optional": False, "fields": [{"type": "int64", "optional": False, "field": "nope"}]}
    batches = {
        "envelope": [(key(topic, 2), _wrapped(envelope, {"after": after, "source": {}, "op": "c"}))],
        "not a struct": [(key(topic, 3), _wrapped({"type": "string"}, "row 3"))],
        "nope": [(_wrapped(nope, {"nope": 4}), row(topic, 4, "d", "3.00", "c", 400))],
    }
    expected = spark.createDataFrame([(1, "a", Decimal("12.50"))], "id long, name string, price decimal(10,2)")
    for reason, records in batches.items():
        kafka.produce(topic, records)
        land_and_refine(warehouse, topic)
        refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(refined.select(*expected.columns), expected)
        quarantined = spark.read.format("delta").load(quarantine_location(warehouse)).orderBy("offset").collect()
        assert reason in quarantined[-1].reason, quarantined[-1].reason
    assert [q.offset for q in quarantined] == [1, 2, 3]


def _wrapped(schema: dict, payload) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}).encode()
