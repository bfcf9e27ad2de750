"""Declared column types: values without a schema, and string-mode decimals, through real Kafka."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import validate
from cdc.core.errors import ConfigError, TableError
from cdc.stack.envelopes import postgres_envelope
from refine.config import RefineJobConfig, refined_table_location
from refine.quality.quarantine import quarantine_location

COLUMNS = {"id": "bigint", "name": "string", "amount": "decimal(12,2)", "day": "date", "at": "timestamp"}
EXPECTED_SCHEMA = "id long, name string, amount decimal(12,2), day date, at timestamp"


def item(
    item_id: int, name: str, amount: str | None, day: int = 20000, at: str = "2026-11-21T05:53:15.094926Z"
) -> dict:
    return {"id": item_id, "name": name, "amount": amount, "day": day, "at": at}


def changes() -> list[tuple[dict, dict | None]]:
    """(key, value) payloads: creates, an update, a delete and its tombstone, a bad decimal."""
    return [
        ({"id": 1}, postgres_envelope("c", 100, after=item(1, "a", "12.50"))),
        ({"id": 2}, postgres_envelope("c", 200, after=item(2, "b", "0.05", day=-1))),
        ({"id": 1}, postgres_envelope("u", 300, before=item(1, "a", "12.50"), after=item(1, "a2", "-7.25"))),
        ({"id": 3}, postgres_envelope("c", 400, after=item(3, "c", "1.00"))),
        ({"id": 3}, postgres_envelope("d", 500, before=item(3, "c", "1.00"))),
        ({"id": 3}, None),
        ({"id": 4}, postgres_envelope("c", 600, after=item(4, "d", "twelve"))),
    ]


EXPECTED = [
    (1, "a2", Decimal("-7.25"), date(2024, 10, 4), datetime(2026, 11, 21, 5, 53, 15, 94926, tzinfo=UTC)),
    (2, "b", Decimal("0.05"), date(1969, 12, 31), datetime(2026, 11, 21, 5, 53, 15, 94926, tzinfo=UTC)),
]


def test_schemaless_values_are_read_with_the_declared_columns(spark, kafka, land_and_refine, unique_name, tmp_path):
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    kafka.produce(topic, [(json.dumps(k).encode(), v and json.dumps(v).encode()) for k, v in changes()])
    warehouse = str(tmp_path)

    with pytest.raises(TableError, match="declare the refined table's `columns`"):
        land_and_refine(warehouse, topic)

    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic, columns=COLUMNS, key=["id"])
        refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(refined.select(*COLUMNS), spark.createDataFrame(EXPECTED, EXPECTED_SCHEMA))
    [bad] = spark.read.format("delta").load(quarantine_location(warehouse)).collect()
    assert (bad.offset, bad.reason) == (
        6,
        "field after.amount: cannot convert the value to the declared type decimal(12,2)",
    )


TEMPORAL_COLUMNS = {
    "id": "bigint",
    "local3": "timestamp_ntz(3)",
    "local6": "timestamp_ntz",
    "opens": "time(3)",
    "closes": "time",
    "moments": "array<timestamp_ntz(0)>",
}
EPOCH = datetime(1970, 1, 1)


def test_schemaless_temporal_columns_are_read_in_the_encoding_their_precision_gives(
    spark, kafka, land_and_refine, unique_name, tmp_path
):
    """Debezium's adaptive mode writes timestamp(0-3) and time(0-3) in milliseconds, wider ones in
    microseconds: the declared precision picks which (read the other way, a value is 1000x off)."""
    topic = kafka.create_topic(f"{unique_name}.shop.slots")

    def row(n, local3, local6, opens, closes):
        return {
            "id": n,
            "local3": local3,
            "local6": local6,
            "opens": opens,
            "closes": closes,
            "moments": [local3 - local3 % 1000, -1000],
        }

    first, second = row(1, 1_763_700_000_123, 1_763_700_000_123_456, 45_296_789, 45_296_789_012), row(2, -1, -1, 0, 1)
    updated = {**first, "local3": 1_763_700_000_999}
    records = [
        ({"id": 1}, postgres_envelope("c", 100, after=first)),
        ({"id": 2}, postgres_envelope("c", 200, after=second)),
        ({"id": 1}, postgres_envelope("u", 300, before=first, after=updated)),
    ]
    kafka.produce(topic, [(json.dumps(k).encode(), json.dumps(v).encode()) for k, v in records])
    warehouse = str(tmp_path)

    ms = lambda n: EPOCH + timedelta(milliseconds=n)  # noqa: E731
    expected = spark.createDataFrame(
        [
            (
                1,
                ms(1_763_700_000_999),
                EPOCH + timedelta(microseconds=1_763_700_000_123_456),
                "12:34:56.789000",
                "12:34:56.789012",
                [ms(1_763_700_000_000), ms(-1000)],
            ),
            (
                2,
                ms(-1),
                EPOCH - timedelta(microseconds=1),
                "00:00:00.000000",
                "00:00:00.000001",
                [ms(-1000), ms(-1000)],
            ),
        ],
        "id long, local3 timestamp_ntz, local6 timestamp_ntz, "
        "opens string, closes string, moments array<timestamp_ntz>",
    )
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic, columns=TEMPORAL_COLUMNS, key=["id"])
        refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(refined.select(*TEMPORAL_COLUMNS), expected)


def test_a_new_snapshot_resets_the_table_from_its_first_read_in_kafka_order(
    spark, kafka, land_and_refine, unique_name, tmp_path
):
    """Rows from before a new snapshot that it does not read again go; a change sent after the snapshot
    with a lower LSN (its transaction wrote before the snapshot's LSN and committed after) still
    applies, in the snapshot's batch or a later one; reruns change nothing."""
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    columns, warehouse = {"id": "bigint", "name": "string"}, str(tmp_path)
    row = lambda n, name: {"id": n, "name": name}  # noqa: E731

    def produce(records):
        return kafka.produce(
            topic,
            [(json.dumps({"id": v["after"]["id"]}).encode(), json.dumps(v).encode()) for v in records],
        )

    refined = lambda: spark.read.format("delta").load(refined_table_location(warehouse, topic)).select("id", "name")  # noqa: E731

    first = [
        postgres_envelope("r", 100, after=row(1, "a"), snapshot="first"),
        postgres_envelope("r", 100, after=row(2, "b"), snapshot="last"),
        postgres_envelope("c", 150, after=row(3, "c")),
    ]
    produce(first)
    land_and_refine(warehouse, topic, columns=columns, key=["id"], history=True)
    assertDataFrameEqual(refined(), [(1, "a"), (2, "b"), (3, "c")])

    # The connector is re-created: 2 and 3 were deleted meanwhile, 1 renamed. Then, with lower LSNs than the
    # snapshot's, the inserts of a transaction that was open across it.
    produce(
        [
            postgres_envelope("r", 500, after=row(1, "a2"), snapshot="first"),
            postgres_envelope("r", 500, after=row(4, "d"), snapshot="last"),
            postgres_envelope("c", 450, after=row(5, "late in this batch")),
        ]
    )
    land_and_refine(warehouse, topic, columns=columns, key=["id"], history=True)
    assertDataFrameEqual(refined(), [(1, "a2"), (4, "d"), (5, "late in this batch")])
    produce(
        [
            postgres_envelope("c", 460, after=row(6, "late in the next batch")),
            postgres_envelope("u", 600, after=row(4, "d2")),
        ]
    )
    for _ in range(2):
        land_and_refine(warehouse, topic, columns=columns, key=["id"], history=True)
        assertDataFrameEqual(
            refined(), [(1, "a2"), (4, "d2"), (5, "late in this batch"), (6, "late in the next batch")]
        )

    history = spark.read.format("delta").load(refined_table_location(warehouse, f"{topic}__history"))
    closed_by_the_snapshot = history.where("_cdc_op = 'r' AND _cdc_is_deleted").select("id", "_cdc_lsn")
    assertDataFrameEqual(closed_by_the_snapshot, [(2, 500), (3, 500)])  # 1 is read again, 5 created after it

    produce(first)  # the old snapshot and change again, as a replay: they neither reset nor bring back rows
    land_and_refine(warehouse, topic, columns=columns, key=["id"], history=True)
    assertDataFrameEqual(refined(), [(1, "a2"), (4, "d2"), (5, "late in this batch"), (6, "late in the next batch")])
    assertDataFrameEqual(history.where("_cdc_is_current").select("id", "name"), refined())
    assertDataFrameEqual(
        history.where("_cdc_op = 'r' AND _cdc_is_deleted").select("id", "_cdc_lsn"), closed_by_the_snapshot
    )


@pytest.mark.parametrize("separators", [(",", ":"), None], ids=["compact JSON", "JSON with spaces"])
def test_string_mode_decimals_become_the_declared_decimal(
    spark, kafka, land_and_refine, unique_name, tmp_path, separators, monkeypatch
):
    """Compact JSON, as JsonConverter writes it, is parsed in one pass with the guessed schemas; JSON
    with spaces after its schemas are found. Either way the undecodable record is quarantined."""
    from refine.batch import RefineBatch

    searched = []  # batches whose schemas were searched for
    search = RefineBatch._refine
    monkeypatch.setattr(RefineBatch, "_refine", lambda self, *args: searched.append(1) or search(self, *args))
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    row = {
        "type": "struct",
        "optional": True,
        "fields": [
            {"type": "int64", "optional": False, "field": "id"},
            {"type": "string", "optional": True, "field": "name"},
            {"type": "string", "optional": True, "field": "amount"},  # decimal.handling.mode=string
            {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "day"},
            {
                "type": "string",
                "optional": True,
                "name": "io.debezium.time.ZonedTimestamp",
                "version": 1,
                "field": "at",
            },
        ],
    }
    source = {
        "type": "struct",
        "field": "source",
        "fields": [
            {"type": "int64", "optional": True, "field": "lsn"},
            {"type": "int64", "optional": True, "field": "txId"},
            {"type": "int64", "field": "ts_ms"},
        ],
    }
    value_schema = {
        "type": "struct",
        "fields": [{**row, "field": "before"}, {**row, "field": "after"}, source, {"type": "string", "field": "op"}],
    }
    key_schema = {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "id"}]}
    kafka.produce(
        topic,
        [
            (
                json.dumps({"schema": key_schema, "payload": k}, separators=separators).encode(),
                v and json.dumps({"schema": value_schema, "payload": v}, separators=separators).encode(),
            )
            for k, v in changes()
        ],
    )
    warehouse = str(tmp_path)

    land_and_refine(warehouse, topic, columns={"amount": "decimal(12,2)"})

    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    assertDataFrameEqual(refined.select(*COLUMNS), spark.createDataFrame(EXPECTED, EXPECTED_SCHEMA))
    [bad] = spark.read.format("delta").load(quarantine_location(warehouse)).collect()
    assert bad.reason == "field after.amount: cannot convert the value to the declared type decimal(12,2)"
    assert '"twelve"' in bad.raw_value
    assert len(searched) == (0 if separators else 1)


def test_declared_columns_are_validated_up_front():
    settings = {"table": "demo.shop.items", "warehouse": "/tmp/w"}
    with pytest.raises(ConfigError, match=r"columns\.amount: .*unsupported column type 'money'"):
        validate(RefineJobConfig, {**settings, "columns": {"id": "bigint", "amount": "money"}}, "refine job")
    with pytest.raises(ConfigError, match="key: name not among the declared columns"):
        validate(RefineJobConfig, {**settings, "columns": {"id": "bigint"}, "key": ["name"]}, "refine job")
    with pytest.raises(ConfigError, match=r"columns\.at: .*time\(7\): precision must be 0-6"):
        validate(RefineJobConfig, {**settings, "columns": {"at": "time(7)"}}, "refine job")
    with pytest.raises(ConfigError, match="precision must be 1-38"):
        validate(RefineJobConfig, {**settings, "columns": {"amount": "decimal(40,2)"}}, "refine job")
