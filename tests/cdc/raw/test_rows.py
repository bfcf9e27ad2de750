from datetime import datetime

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from cdc.raw.rows import original_bytes, raw_rows
from cdc.raw.table import RAW_SCHEMA

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string, value:binary>>"
)


def kafka_records(spark, rows):
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def test_text_when_utf8_and_bytes_when_not(spark):
    at = datetime(2026, 1, 1)
    records = kafka_records(spark, [
        (b'{"id":1}', "é ünïcode".encode(), "t", 0, 0, at, 0, [("h", b"\x00\xff")]),
        (b"\xc3\x28", b"\xff\xfe", "t", 0, 1, at, 1, []),  # invalid UTF-8
        (None, None, "t", 1, 7, at, 0, None),  # tombstone without key
        (b"", b"", "t", 1, 8, at, 0, None),  # empty is not null
    ])  # fmt: skip
    rows = raw_rows(records, batch_id=42).drop("ingested_at", "ingest_date")
    expected = spark.createDataFrame(
        [
            Row('{"id":1}', None, "é ünïcode", None, "t", 0, 0, at, "CreateTime", [Row("h", bytearray(b"\x00\xff"))], 42),
            Row(None, bytearray(b"\xc3\x28"), None, bytearray(b"\xff\xfe"), "t", 0, 1, at, "LogAppendTime", [], 42),
            Row(None, None, None, None, "t", 1, 7, at, "CreateTime", None, 42),
            Row("", None, "", None, "t", 1, 8, at, "CreateTime", None, 42),
        ],
        "key string, key_bytes binary, value string, value_bytes binary, topic string, "
        "partition int, offset long, timestamp timestamp, timestamp_type string, "
        "headers array<struct<key:string, value:binary>>, batch_id long",
    )
    assertDataFrameEqual(rows, expected)


def test_original_bytes_round_trip(spark):
    records = kafka_records(spark, [(b"\xc3\x28", "ü".encode(), "t", 0, 0, datetime(2026, 1, 1), 0, None)])
    landed = raw_rows(records, 0).select(original_bytes("key", "key_bytes").alias("k"), original_bytes("value", "value_bytes").alias("v"))
    assert landed.head() == Row(k=bytearray(b"\xc3\x28"), v=bytearray("ü".encode()))


def test_rows_follow_the_table_schema_and_partition_by_ingest_date(spark):
    records = kafka_records(spark, [(b"k", b"v", "t", 0, 0, datetime(2026, 1, 1), 0, None)])
    rows = raw_rows(records, 0)
    assert rows.columns == RAW_SCHEMA.fieldNames()
    row = rows.head()
    assert row.ingest_date == row.ingested_at.date()
