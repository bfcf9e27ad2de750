from datetime import datetime

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.functions import IS_UTF8_FUNCTION, is_utf8, original_bytes, registered_helpers
from cdc.raw.rows import raw_rows
from cdc.raw.table import RAW_SCHEMA


def test_text_when_utf8_and_bytes_when_not(spark, kafka_records):
    at = datetime(2026, 1, 1)
    records = kafka_records(
        [
            (b'{"id":1}', "é ünïcode".encode(), "t", 0, 0, at, 0, [("h", b"\x00\xff")]),
            (b"\xc3\x28", b"\xff\xfe", "t", 0, 1, at, 1, []),  # invalid UTF-8
            (None, None, "t", 1, 7, at, 0, None),  # tombstone without key
            (b"", b"", "t", 1, 8, at, 0, None),  # empty is not null
        ]
    )
    rows = raw_rows(records, batch_id=42).drop("ingested_at", "ingest_date")
    expected = spark.createDataFrame(
        [
            Row(
                '{"id":1}', None, "é ünïcode", None, "t", 0, 0, at, "CreateTime", [Row("h", bytearray(b"\x00\xff"))], 42
            ),
            Row(None, bytearray(b"\xc3\x28"), None, bytearray(b"\xff\xfe"), "t", 0, 1, at, "LogAppendTime", [], 42),
            Row(None, None, None, None, "t", 1, 7, at, "CreateTime", None, 42),
            Row("", None, "", None, "t", 1, 8, at, "CreateTime", None, 42),
        ],
        "key string, key_bytes binary, value string, value_bytes binary, topic string, "
        "partition int, offset long, timestamp timestamp, timestamp_type string, "
        "headers array<struct<key:string, value:binary>>, batch_id long",
    )
    assertDataFrameEqual(rows, expected)


def test_original_bytes_round_trip(kafka_records):
    records = kafka_records([(b"\xc3\x28", "ü".encode(), "t", 0, 0, datetime(2026, 1, 1), 0, None)])
    landed = raw_rows(records, 0).select(
        original_bytes("key", "key_bytes").alias("k"), original_bytes("value", "value_bytes").alias("v")
    )
    assert landed.head() == Row(k=bytearray(b"\xc3\x28"), v=bytearray("ü".encode()))


def test_rows_follow_the_table_schema_and_partition_by_ingest_date(kafka_records):
    records = kafka_records([(b"k", b"v", "t", 0, 0, datetime(2026, 1, 1), 0, None)])
    rows = raw_rows(records, 0)
    assert rows.columns == RAW_SCHEMA.fieldNames()
    row = rows.head()
    assert row.ingest_date == row.ingested_at.date()


# Valid and invalid UTF-8 at the edges of the standard (Unicode 15, table 3-7).
UTF8_CASES = [
    b"",
    b"plain ascii",
    "é ü 中 😀".encode(),
    b"\xef\xbf\xbd",
    "\ufffe\U0010ffff".encode(),
    b"\x00",
    b"\xff",
    b"\x80",
    b"\xc3",
    b"\xc3\x28",
    b"\xc0\xaf",
    b"\xc1\xbf",  # bad bytes, cut short, overlong
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xf0\x8f\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80",
    b"x" * 5000 + b"\xff",  # past the reused buffer's first size
    "é".encode() * 3000,
]


@pytest.mark.parametrize("check", ["project's JVM function", "Spark's is_valid_utf8"])
def test_utf8_checks_agree_with_pythons_strict_decoder(spark, check):
    values = spark.createDataFrame(
        [(number, value) for number, value in enumerate(UTF8_CASES)] + [(-1, None)], "number int, value binary"
    )
    column = F.col("value")
    valid = (
        F.call_function(IS_UTF8_FUNCTION, column)
        if check.startswith("project")
        else F.is_valid_utf8(column.cast("string"))
    )
    expected = {-1: None} | {number: _decodes(value) for number, value in enumerate(UTF8_CASES)}
    assert {row.number: row.valid for row in values.select("number", valid.alias("valid")).collect()} == expected


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_sessions_have_the_fast_utf8_check(spark):
    """Built with the default jars, a session has the project's function: raw_rows uses it."""
    assert spark.catalog.functionExists(IS_UTF8_FUNCTION)
    assert IS_UTF8_FUNCTION in registered_helpers
    assert "cdc_is_utf8" in str(is_utf8(F.col("value")))


def test_without_the_helpers_jar_spark_checks_utf8_with_the_same_rows(spark, kafka_records, monkeypatch):
    records = kafka_records([(b"k\xff", "é".encode(), "t", 0, 0, datetime(2026, 1, 1), 0, None)])
    expected = raw_rows(records, 0).drop("ingested_at", "ingest_date").collect()
    monkeypatch.setattr("cdc.core.functions.registered_helpers", set())  # as a session built without the jar
    assert "is_valid_utf8" in str(is_utf8(F.col("value")))
    assertDataFrameEqual(raw_rows(records, 0).drop("ingested_at", "ingest_date"), expected)
