"""Debezium MongoDB topics -> Kafka -> `cdc raw` -> `cdc refine`: refined tables equal the documents.

Records are written as Debezium 3.6's MongoDB connector writes them with JsonConverter
(``schemas.enable=true``); the schemas follow the connector's code (MongoDbSchema, MongoDbSchemaFactory, the source info
struct maker): ``before``/``after`` are ``io.debezium.data.Json`` strings in strict Extended JSON,
``updateDescription`` holds ``updatedFields`` as relaxed Extended JSON text, and the key is
``{"id": <relaxed Extended JSON of _id>}``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from refine.config import refined_table_location
from refine.quality.expectations import expectations_location
from refine.quality.quarantine import quarantine_location
from refine.records.envelope import COMMON_SOURCE_FIELDS

PREFIX = "mongo"
_JSON = {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1}
_SOURCE = {
    "type": "struct",
    "optional": False,
    "name": "io.debezium.connector.mongo.Source",
    "field": "source",
    "fields": [
        *COMMON_SOURCE_FIELDS,
        {"type": "string", "optional": False, "field": "collection"},
        {"type": "int32", "optional": False, "field": "ord"},
        {"type": "string", "optional": True, "field": "lsid"},
        {"type": "int64", "optional": True, "field": "txnNumber"},
        {"type": "int64", "optional": True, "field": "wallTime"},
    ],
}
_UPDATE_DESCRIPTION = {
    "type": "struct",
    "optional": True,
    "name": "io.debezium.connector.mongodb.changestream.updatedescription",
    "version": 1,
    "field": "updateDescription",
    "fields": [
        {"type": "array", "items": {"type": "string", "optional": False}, "optional": True, "field": "removedFields"},
        {**_JSON, "field": "updatedFields"},
        {
            "type": "array",
            "optional": True,
            "field": "truncatedArrays",
            "items": {
                "type": "struct",
                "optional": False,
                "name": "io.debezium.connector.mongodb.changestream.truncatedarray",
                "version": 1,
                "fields": [
                    {"type": "string", "optional": False, "field": "field"},
                    {"type": "int32", "optional": False, "field": "size"},
                ],
            },
        },
    ],
}
_TRANSACTION = {
    "type": "struct",
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
}


def value_schema(topic: str) -> dict:
    return {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Envelope",
        "fields": [
            {**_JSON, "field": "before"},
            {**_JSON, "field": "after"},
            _UPDATE_DESCRIPTION,
            _SOURCE,
            {"type": "string", "optional": True, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            _TRANSACTION,
        ],
    }


def key(topic: str, document_id: str) -> bytes:
    """The Kafka key of a document whose ``_id`` is ``document_id`` (relaxed Extended JSON text)."""
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Key",
        "fields": [{"type": "string", "optional": False, "field": "id"}],
    }
    return json.dumps({"schema": schema, "payload": {"id": document_id}}).encode()


def value(
    topic: str,
    op: str,
    ts_ms: int,
    ord: int,
    *,
    after: str | None = None,
    updated: str | None = None,
    removed: list[str] | None = None,
    truncated: list[dict] | None = None,
    snapshot: str = "false",
) -> bytes:
    """A change event's value; ``after`` (strict) and ``updated`` (relaxed) are Extended JSON text."""
    db, collection = topic.split(".")[-2:]
    update = None
    if updated is not None or removed or truncated:
        update = {"removedFields": removed, "updatedFields": updated or "{}", "truncatedArrays": truncated}
    payload = {
        "before": None,
        "after": after,
        "updateDescription": update,
        "source": {
            "version": "3.6.3.Final",
            "connector": "mongodb",
            "name": topic.split(".")[0],
            "ts_ms": ts_ms,
            "snapshot": snapshot,
            "db": db,
            "sequence": None,
            "ts_us": ts_ms * 1000,
            "ts_ns": ts_ms * 1000000,
            "collection": collection,
            "ord": ord,
            "lsid": None,
            "txnNumber": None,
            "wallTime": ts_ms,
        },
        "op": op,
        "ts_ms": ts_ms + 5,
        "transaction": None,
    }
    return json.dumps({"schema": value_schema(topic), "payload": payload}).encode()


T0 = 1_763_700_000_000  # source.ts_ms of the snapshot
ADA, EVE, HAL = (f'{{"$oid": "64b7f0c2a1b2c3d4e5f6{n:04x}"}}' for n in (0x718, 0x719, 0x71A))
BOB, SEVEN, DOC, BIG, GUS = '"bob"', "7", '{"a": 1, "b": "x"}', "9007199254740993", '"gus"'

ADA_DOC = (
    '{"_id": {"$oid": "64b7f0c2a1b2c3d4e5f60718"},"name": "%s","age": {"$numberLong": "36"},'
    '"address": {"city": "London","zip": "N1"},"tags": ["x","y"],'
    '"orders": [{"sku": "a","qty": 1},{"sku": "b","qty": 2}],"joined": {"$date": 1700000000000},'
    '"balance": {"$numberDecimal": "10.50"},"score": 1.5,"avatar": {"$binary": "AQI=","$type": "00"},'
    '"ratio": NaN}'
)


def first_batch(topic: str) -> list[tuple[bytes, bytes | None]]:
    """Snapshot reads, inserts, full and updateDescription-only updates, a replace, deletes with
    their tombstones, ids of every kind, an undecodable record and a field whose type drifts (its column
    becomes JSON text)."""
    k = lambda document_id: key(topic, document_id)  # noqa: E731
    v = lambda *args, **kwargs: value(topic, *args, **kwargs)  # noqa: E731
    return [
        (k(ADA), v("r", T0, -1, after=ADA_DOC % "Ada", snapshot="true")),
        (
            k(BOB),
            v(
                "r",
                T0,
                -1,
                snapshot="last",
                after=(
                    '{"_id": "bob","name": "Bob","age": 40,"address": {"city": "Berlin","zip": "10115"},"tags": ["z"],'
                    '"orders": [{"sku": "c","qty": 3},{"sku": "d","qty": 4}],"score": 2.0,"ratio": 0.5}'
                ),
            ),
        ),
        (
            k(SEVEN),
            v("c", T0 + 1000, 1, after='{"_id": 7,"name": "Seven","age": {"$numberLong": "7"},"ratio": -Infinity}'),
        ),
        (k(DOC), v("c", T0 + 1000, 2, after='{"_id": {"a": 1,"b": "x"},"name": "Doc"}')),
        (k(ADA), v("u", T0 + 2000, 1, after=ADA_DOC % "Ada L.", updated='{"name": "Ada L."}')),
        (
            k(BOB),
            v("u", T0 + 3000, 1, updated='{"address.city": "Paris","orders.1.qty": 5,"score": 2.5}', removed=["tags"]),
        ),
        (k(BOB), v("u", T0 + 3000, 2, updated='{"address.zip": "75001","joined": {"$date": "2024-01-02T03:04:05Z"}}')),
        (k(SEVEN), v("u", T0 + 4000, 1, after='{"_id": 7,"name": "Seven v2","tags": ["q"]}')),
        (k(DOC), v("d", T0 + 5000, 1)),
        (k(DOC), None),
        (k(EVE), v("c", T0 + 6000, 1, after='{"_id": {"$oid": "64b7f0c2a1b2c3d4e5f60719"},"name": "Eve"}')),
        (k(EVE), v("d", T0 + 6000, 2)),
        (k(EVE), None),
        (k(BIG), v("c", T0 + 6000, 3, after='{"_id": {"$numberLong": "9007199254740993"},"name": "Big"}')),
        (k(GUS), b"{not json"),
        (k(GUS), v("c", T0 + 6000, 4, after='{"_id": "gus","name": "Gus","age": "old"}')),
    ]


def second_batch(topic: str) -> list[tuple[bytes, bytes | None]]:
    """Updates of documents refined earlier (a new nested field, an element past an array's end, a
    removed nested field with a truncated array), a path that cannot apply, and a document with a new field."""
    k = lambda document_id: key(topic, document_id)  # noqa: E731
    v = lambda *args, **kwargs: value(topic, *args, **kwargs)  # noqa: E731
    return [
        (k(ADA), v("u", T0 + 7000, 1, updated='{"age": 37,"address.country": "UK","orders.2": {"sku": "e","qty": 6}}')),
        (k(BOB), v("u", T0 + 7000, 2, removed=["address.zip"], truncated=[{"field": "orders", "size": 1}])),
        (k(SEVEN), v("u", T0 + 7000, 3, updated='{"name.first": "S"}')),
        (
            k(HAL),
            v("c", T0 + 8000, 1, after='{"_id": {"$oid": "64b7f0c2a1b2c3d4e5f6071a"},"name": "Hal","nickname": "H"}'),
        ),
    ]


def replayed(topic: str) -> list[tuple[bytes, bytes | None]]:
    """Older events again, as a connector restart delivers them: they must not overwrite newer state."""
    first = first_batch(topic)
    return [first[0], first[5]]  # Ada's snapshot read, Bob's first updateDescription


COLUMNS = (
    "_id string, name string, age string, address struct<city: string, zip: string>, tags array<string>, "
    "orders array<struct<qty: bigint, sku: string>>, joined timestamp, balance decimal(38,18), score double, "
    "avatar binary, ratio double"
)
NESTED = "struct<city: string, zip: string, country: string>"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def after_first_batch() -> list[tuple]:
    nan, ada_joined = float("nan"), utc(2023, 11, 14, 22, 13, 20)
    return [
        (
            ADA,
            "Ada L.",
            "36",
            ("London", "N1"),
            ["x", "y"],
            [(1, "a"), (2, "b")],
            ada_joined,
            Decimal("10.50"),
            1.5,
            bytearray(b"\x01\x02"),
            nan,
        ),
        (
            BOB,
            "Bob",
            "40",
            ("Paris", "75001"),
            None,
            [(3, "c"), (5, "d")],
            utc(2024, 1, 2, 3, 4, 5),
            None,
            2.5,
            None,
            0.5,
        ),
        (SEVEN, "Seven v2", None, None, ["q"], None, None, None, None, None, None),
        (BIG, "Big", None, None, None, None, None, None, None, None, None),
        (GUS, "Gus", '"old"', None, None, None, None, None, None, None, None),  # age drifted: JSON text
    ]


def after_second_batch() -> list[tuple]:
    ada, bob, seven, big, gus = after_first_batch()
    return [
        (*ada[:2], "37", (*ada[3], "UK"), ada[4], [*ada[5], (6, "e")], *ada[6:], None),
        (*bob[:3], ("Paris", None, None), bob[4], bob[5][:1], *bob[6:], None),
        (*seven[:3], None, *seven[4:], None),
        (*big[:3], None, *big[4:], None),
        (*gus[:3], None, *gus[4:], None),
        (HAL, "Hal", *[None] * 9, "H"),
    ]


def refined(spark, warehouse: str, topic: str, columns: list[str]):
    return spark.read.format("delta").load(refined_table_location(warehouse, topic)).select(*columns)


def test_mongo_documents_are_refined_to_typed_columns(spark, kafka, land_and_refine, unique_name, tmp_path):
    topic = kafka.create_topic(f"{unique_name}.shop.people")
    warehouse = str(tmp_path)

    kafka.produce(topic, first_batch(topic))
    land_and_refine(warehouse, topic)
    expected = spark.createDataFrame(after_first_batch(), COLUMNS)
    assertDataFrameEqual(refined(spark, warehouse, topic, expected.columns), expected)
    quarantined = spark.read.format("delta").load(quarantine_location(warehouse))
    assert sorted((row.offset, row.reason) for row in quarantined.collect()) == [
        (14, "value is not a Debezium JSON envelope"),
    ]

    kafka.produce(topic, second_batch(topic))
    land_and_refine(warehouse, topic)
    expected = spark.createDataFrame(
        after_second_batch(), COLUMNS.replace("zip: string>", "zip: string, country: string>", 1) + ", nickname string"
    )
    assertDataFrameEqual(refined(spark, warehouse, topic, expected.columns), expected)
    assert quarantined.where("offset = 18").head().reason == (
        "cannot apply update path name.first: name is a string, not a document or an array"
    )

    kafka.produce(topic, replayed(topic))
    versions = []
    for _ in range(2):  # replays change nothing, and neither does a rerun
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined(spark, warehouse, topic, expected.columns), expected)
        versions.append(DeltaTable.forPath(spark, refined_table_location(warehouse, topic)).history(1).head().version)
    assert versions[0] == versions[1]
    positions = refined(spark, warehouse, topic, ["_id", "_cdc_ts_ms", "_cdc_ord", "_cdc_offset", "_cdc_op"])
    assert sorted(tuple(row) for row in positions.collect()) == sorted(
        [
            (ADA, T0 + 7000, 1, 16, "u"),
            (BOB, T0 + 7000, 2, 17, "u"),
            (SEVEN, T0 + 4000, 1, 7, "u"),
            (BIG, T0 + 6000, 3, 13, "c"),
            (HAL, T0 + 8000, 1, 19, "c"),
            (GUS, T0 + 6000, 4, 15, "c"),
        ]
    )


def test_decimal128_values_a_decimal_cannot_hold_exactly_are_quarantined(
    spark, kafka, land_and_refine, unique_name, tmp_path
):
    """Decimal128 has 34 digits at any exponent; decimal(38,18) holds 20 integer and 18 fraction digits. A
    value it holds exactly (trailing zeros, exponents and zero aside) is refined exactly; any other, at the
    top, nested or in an update path, quarantines its record with the path: a cast would round or null it."""
    topic, warehouse = kafka.create_topic(f"{unique_name}.shop.ledger"), str(tmp_path)
    k = lambda document_id: key(topic, document_id)  # noqa: E731
    v = lambda *args, **kwargs: value(topic, *args, **kwargs)  # noqa: E731
    d = lambda text: f'{{"$numberDecimal": "{text}"}}'  # noqa: E731
    kafka.produce(
        topic,
        [
            (
                k('"a"'),
                v(
                    "c",
                    T0,
                    1,
                    after=f'{{"_id": "a","balance": {d("0.123456789012345678")},"line": {{"price": {d("1.5E+3")}}},'
                    f'"items": [{{"p": {d("1.50000000000000000000000")}}}]}}',
                ),
            ),
            (
                k('"b"'),
                v(
                    "c",
                    T0,
                    2,
                    after=f'{{"_id": "b","balance": {d("0E-6176")},'
                    f'"line": {{"price": {d("-99999999999999999999.999999999999999999")}}},"items": []}}',
                ),
            ),
            (k('"c"'), v("c", T0, 3, after=f'{{"_id": "c","balance": {d("0.1234567890123456789")}}}')),
            (k('"d"'), v("c", T0, 4, after=f'{{"_id": "d","balance": {d("1E+40")}}}')),
            (k('"e"'), v("c", T0, 5, after=f'{{"_id": "e","line": {{"price": {d("1.0000000000000000001")}}}}}')),
            (k('"f"'), v("c", T0, 6, after=f'{{"_id": "f","items": [{{"p": {d("1")}}},{{"p": {d("NaN")}}}]}}')),
            (k('"a"'), v("u", T0 + 1000, 1, updated=f'{{"balance": {d("2.0000000000000000001")}}}')),
            (k('"a"'), v("u", T0 + 1000, 2, updated=f'{{"line.price": {d("100000000000000000000")}}}')),
            (k('"b"'), v("u", T0 + 1000, 3, updated=f'{{"balance": {d("12.5E-1")}}}')),
        ],
    )
    inexact = "a Decimal128 value that decimal(38,18) cannot hold exactly"
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        rows = refined(spark, warehouse, topic, ["_id", "balance", "line.price", "items.p"]).collect()
        assert sorted(tuple(row) for row in rows) == [
            ('"a"', Decimal("0.123456789012345678"), Decimal(1500), [Decimal("1.5")]),
            ('"b"', Decimal("1.25"), Decimal("-99999999999999999999.999999999999999999"), []),
        ]
        quarantined = spark.read.format("delta").load(quarantine_location(warehouse))
        assert sorted((row.offset, row.reason) for row in quarantined.collect()) == [
            (2, f"field balance: {inexact}"),
            (3, f"field balance: {inexact}"),
            (4, f"field line.price: {inexact}"),
            (5, f"field items[].p: {inexact}"),
            (6, f"update path balance: {inexact}"),
            (7, f"update path line.price: {inexact}"),
        ]


def check_history_and_orders(spark, pipeline_run) -> None:
    """The history's current versions are the refined rows; the child table holds their orders."""
    people = pipeline_run.table("people")
    columns = [c for c in people.columns if c != "_cdc_refined_at"]
    current = pipeline_run.table("people__history").where("_cdc_is_current").select(*columns)
    assertDataFrameEqual(current, people.select(*columns))
    orders = people.select("_id", F.posexplode("orders").alias("pos", "order")).select("_id", "pos", "order.*")
    assertDataFrameEqual(pipeline_run.table("people__orders").select(*orders.columns), orders)


def test_a_mongo_collection_through_a_pipeline_with_expectations_history_and_a_business_table(
    spark, kafka, pipeline_run, unique_name
):
    topic = kafka.create_topic(f"{unique_name}.shop.people")
    kafka.produce(topic, first_batch(topic))
    pipeline = {
        "name": "people",
        "sources": {"people": {"kind": "debezium_mongodb", "topic": topic}},
        "refined": {"people": {"source": "people", "scd": 2, "explode": ["orders"]}},
        "business": {
            "people_per_city": {
                "sql": "SELECT address.city AS city, count(*) AS people FROM people GROUP BY address.city"
            }
        },
        "expectations": {
            "not_big": {"table": "people", "constraint": "name <> 'Big'", "action": "drop"},
            "has_address": {"table": "people", "constraint": "address.city IS NOT NULL", "action": "warn"},
        },
    }
    cities = spark.createDataFrame([("London", 1), ("Paris", 1), (None, 2)], "city string, people bigint")
    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        expected = spark.createDataFrame([row for row in after_first_batch() if row[0] != BIG], COLUMNS)
        assertDataFrameEqual(pipeline_run.table("people").select(*expected.columns), expected)
        assertDataFrameEqual(pipeline_run.table("people_per_city", "business"), cities)
        check_history_and_orders(spark, pipeline_run)
    history = pipeline_run.table("people__history")
    bob = history.where(F.col("_id") == BOB).orderBy("_cdc_ts_ms", "_cdc_ord").collect()
    assert [(row.name, tuple(row.address), row.tags, row._cdc_is_current) for row in bob] == [
        ("Bob", ("Berlin", "10115"), ["z"], False),
        ("Bob", ("Paris", "10115"), None, False),
        ("Bob", ("Paris", "75001"), None, True),
    ]
    doc = history.where(F.col("_id") == DOC).orderBy("_cdc_ts_ms").collect()
    assert [(row.name, row._cdc_op, row._cdc_is_deleted, row._cdc_is_current) for row in doc] == [
        ("Doc", "c", False, False),
        (None, "d", True, False),
    ]
    assert history.where(F.col("_id") == BIG).isEmpty()  # dropped by its expectation
    quarantined = spark.read.format("delta").load(quarantine_location(pipeline_run.warehouse))
    dropped = quarantined.where("reason LIKE 'failed expectations%'").collect()
    assert [(row.source_table, row.offset, row.reason) for row in dropped] == [
        ("people", 13, "failed expectations: not_big, has_address")
    ]
    assert '"name":"Big"' in dropped[0].raw_value
    kafka.produce(topic, second_batch(topic))
    assert pipeline_run(pipeline) == 0
    cities = spark.createDataFrame([("London", 1), ("Paris", 1), (None, 3)], "city string, people bigint")
    assertDataFrameEqual(pipeline_run.table("people_per_city", "business"), cities)
    check_history_and_orders(spark, pipeline_run)
    counts = spark.read.format("delta").load(expectations_location(pipeline_run.warehouse))
    failed = counts.groupBy("expectation").agg(F.sum("failed")).collect()
    # Each batch checks its documents' latest rows (deletes and quarantined records unchecked):
    # Seven, Big and Gus have no address in the first batch, Hal in the second; the rerun read no batch.
    assert {row[0]: row[1] for row in failed} == {"not_big": 1, "has_address": 4}


def without_schemas(records: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
    """The records as JsonConverter writes them with ``schemas.enable=false``: payloads only."""

    def bare(data: bytes | None) -> bytes | None:
        try:
            return None if data is None else json.dumps(json.loads(data)["payload"]).encode()
        except ValueError:
            return data  # not JSON: as it was

    return [(bare(k), bare(v)) for k, v in records]


def test_schemaless_mongo_documents_are_refined(spark, kafka, land_and_refine, unique_name, tmp_path):
    """A topic written with schemas.enable=false is refined as the same topic with schemas is: the
    envelope is told by source.connector; no columns need declaring."""
    topic = kafka.create_topic(f"{unique_name}.shop.people")
    warehouse = str(tmp_path)
    kafka.produce(topic, without_schemas(first_batch(topic)))
    land_and_refine(warehouse, topic)
    expected = spark.createDataFrame(after_first_batch(), COLUMNS)
    assertDataFrameEqual(refined(spark, warehouse, topic, expected.columns), expected)
    kafka.produce(topic, without_schemas(second_batch(topic)))
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        expected = spark.createDataFrame(
            after_second_batch(),
            COLUMNS.replace("zip: string>", "zip: string, country: string>", 1) + ", nickname string",
        )
        assertDataFrameEqual(refined(spark, warehouse, topic, expected.columns), expected)
    quarantined = spark.read.format("delta").load(quarantine_location(warehouse))
    assert sorted((row.offset, row.reason) for row in quarantined.collect()) == [
        (14, "value is not a Debezium JSON envelope"),
        (18, "cannot apply update path name.first: name is a string, not a document or an array"),
    ]


def test_a_field_whose_type_drifts_becomes_json_text(spark, kafka, land_and_refine, unique_name, tmp_path):
    """A field that changes type (a number, then a string) keeps every document current: its column
    becomes JSON text (existing rows converted, history too) instead of quarantining the change."""
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    k = lambda document_id: key(topic, document_id)  # noqa: E731
    v = lambda *args, **kwargs: value(topic, *args, **kwargs)  # noqa: E731
    kafka.produce(
        topic,
        [
            (k('"a"'), v("c", T0, 1, after='{"_id": "a","stock": {"$numberLong": "5"},"name": "A"}')),
            (k('"b"'), v("c", T0, 2, after='{"_id": "b","stock": 7,"name": "B"}')),
            (k('"c"'), v("c", T0, 3, after='{"_id": "c","stock": 9,"name": "C","price": 1}')),
            (
                k('"c"'),
                v("u", T0, 4, after='{"_id": "c","stock": 9,"name": "C","price": "free"}'),
            ),  # drifts in its batch
        ],
    )
    land_and_refine(warehouse, topic, history=True)
    kafka.produce(
        topic,
        [
            (
                k('"a"'),
                v(
                    "u",
                    T0 + 1000,
                    1,
                    after='{"_id": "a","stock": "discontinued","name": "A"}',
                    updated='{"stock": "discontinued"}',
                ),
            ),
            (k('"b"'), v("u", T0 + 1000, 2, updated='{"stock": {"$numberLong": "8"}, "name": "B2"}')),  # change_streams
            (
                k('"d"'),
                v(
                    "c",
                    T0 + 1000,
                    3,
                    after='{"_id": "d","stock": {"n": {"$numberLong": "1"}},"name": "D",'
                    '"when": {"$date": 1700000000000}}',
                ),
            ),
            (k('"e"'), v("c", T0 + 1000, 4, after='{"_id": "e","stock": 2.5,"name": "E"}')),
            (k('"b"'), v("u", T0 + 1000, 5, updated='{"stock.n": 3}')),  # cannot reach into JSON text
        ],
    )
    expected = spark.createDataFrame(
        [
            ('"a"', "A", '"discontinued"', None),
            ('"b"', "B2", "8", None),
            ('"c"', "C", "9", '"free"'),
            ('"d"', "D", '{"n":1}', None),
            ('"e"', "E", "2.5", None),
        ],
        "_id string, name string, stock string, price string",
    )
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic, history=True)
        table = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(table.select(*expected.columns), expected)
    assert {f.name: f.metadata.get("comment") for f in table.schema.fields if f.name in ("stock", "price", "name")} == {
        "stock": "MongoDB values of several types, as JSON text",
        "price": "MongoDB values of several types, as JSON text",
        "name": None,
    }
    history = spark.read.format("delta").load(refined_table_location(warehouse, f"{topic}__history"))
    assert history.schema["stock"].dataType.simpleString() == "string"
    assertDataFrameEqual(history.where("_cdc_is_current").select(*expected.columns), expected)
    assert sorted(tuple(r) for r in history.where("_id = '\"a\"'").select("stock", "_cdc_is_current").collect()) == [
        ('"discontinued"', True),
        ("5", False),
    ]
    quarantined = spark.read.format("delta").load(quarantine_location(warehouse)).collect()
    assert [(row.offset, row.reason) for row in quarantined] == [
        (
            8,
            (
                "cannot apply update path stock.n: stock has held values of several types and is stored as JSON text, "
                "which an update cannot reach into"
            ),
        )
    ]
