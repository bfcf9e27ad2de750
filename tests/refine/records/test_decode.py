"""Decoding Debezium's encodings, checked against what Postgres stores for the same values."""

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from refine.records.decode import decode, decoded_type, json_type, undecodable
from refine.records.envelope import ConnectSchema


def two_complement(unscaled: int) -> str:
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def decoded(spark, schema: dict, values: list) -> list:
    """Decode JSON ``values`` of the Connect ``schema``, through from_json as the refine job does."""
    connect = ConnectSchema.model_validate({**schema, "field": "v"})
    wrapper = ConnectSchema.model_validate({"type": "struct", "fields": [connect.model_dump(exclude_none=True)]})
    rows = [(json.dumps({"v": value}),) for value in values]
    parsed = spark.createDataFrame(rows, "json string").select(F.from_json("json", json_type(wrapper)).alias("p"))
    result = parsed.select(decode(F.col("p.v"), connect).alias("v"))
    assert result.schema["v"].dataType == decoded_type(connect)
    return [row.v for row in result.collect()]


DECIMAL_12_2 = {
    "type": "bytes",
    "optional": True,
    "name": "org.apache.kafka.connect.data.Decimal",
    "parameters": {"scale": "2", "connect.decimal.precision": "12"},
}


@pytest.fixture(params=["project's JVM function", "Spark's expressions"])
def decimals_decoded_by(request, monkeypatch):
    """Each decimal test runs on both paths: the helpers jar's function, and the expressions a
    session without the jar uses."""
    from cdc.core.functions import DEBEZIUM_DECIMAL_FUNCTION, registered_helpers

    if request.param.startswith("project"):
        assert DEBEZIUM_DECIMAL_FUNCTION in registered_helpers, "the test session lacks the helpers jar"
    else:
        monkeypatch.setattr("refine.records.decode.registered_helpers", set())
    return request.param


def test_precise_decimals_including_negatives_and_zero(spark, decimals_decoded_by):
    values = [Decimal("1272.97"), Decimal("-0.01"), Decimal("0.00"), Decimal("-500.00"), Decimal("9999999999.99")]
    encoded = [two_complement(int(v.scaleb(2))) for v in values] + [None]
    assert decoded(spark, DECIMAL_12_2, encoded) == [*values, None]


def test_a_decimal_wider_than_eight_bytes(spark, decimals_decoded_by):
    schema = {**DECIMAL_12_2, "parameters": {"scale": "4", "connect.decimal.precision": "38"}}
    unscaled = -12345678901234567890123456789012  # 14 bytes; (Decimal.scaleb would round at 28 digits)
    assert decoded(spark, schema, [two_complement(unscaled)]) == [Decimal("-1234567890123456789012345678.9012")]


def test_decimals_at_every_width_boundary(spark, decimals_decoded_by):
    # 1 to 8 bytes decode in compiled expressions, 9 and more byte by byte: both sides of each edge.
    schema = {**DECIMAL_12_2, "parameters": {"scale": "0", "connect.decimal.precision": "38"}}
    edges = [2 ** (8 * width - 1) for width in range(1, 10)]
    unscaled = [value + delta for edge in edges for value in (edge, -edge) for delta in (-1, 0, 1)] + [0, -1, 1]
    encoded = [two_complement(value) for value in unscaled]
    # Zero-padded encodings must read the same: an 8-byte 255 and a 9-byte -1.
    encoded += [
        base64.b64encode((255).to_bytes(8, "big", signed=True)).decode(),
        base64.b64encode((-1).to_bytes(9, "big", signed=True)).decode(),
    ]
    assert decoded(spark, schema, encoded) == [Decimal(value) for value in unscaled] + [Decimal(255), Decimal(-1)]


def test_debezium_sample_from_the_stack(spark, decimals_decoded_by):
    # balance numeric(12,2) as the local stack's connector sent it: 'B27L' = 0x076ECB = 487115.
    assert decoded(spark, DECIMAL_12_2, ["B27L"]) == [Decimal("4871.15")]


def test_variable_scale_decimal(spark, decimals_decoded_by):
    schema = {
        "type": "struct",
        "name": "io.debezium.data.VariableScaleDecimal",
        "optional": True,
        "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}],
    }
    # '+zTR' is what the stack's connector sent for credit_limit -3.14159.
    values = [{"scale": 5, "value": "+zTR"}, {"scale": 0, "value": two_complement(42)}, None]
    assert decoded(spark, schema, values) == [Decimal("-3.14159"), Decimal(42), None]
    # More than the 18 fractional digits decimal(38,18) holds: exact when the digits beyond are zeros,
    # else undecodable (quarantined), never rounded.
    finer = [
        {"scale": 20, "value": two_complement(100)},
        {"scale": 20, "value": two_complement(123)},
        {"scale": 19, "value": two_complement(-5)},
    ]
    assert decoded(spark, schema, finer) == [Decimal("0.000000000000000001"), None, None]


def test_a_decimal_that_is_not_base64_or_does_not_fit_is_undecodable(spark, decimals_decoded_by):
    schema = ConnectSchema.model_validate({**DECIMAL_12_2, "field": "v"})
    frame = spark.createDataFrame([("not base64!",), (two_complement(10**12),), ("",), ("B27L",)], "v string")
    rows = frame.select(undecodable(F.col("v"), decode(F.col("v"), schema)).alias("bad")).collect()
    # Empty bytes hold no integer: undecodable too.
    assert [row.bad for row in rows] == [True, True, True, False]


def test_dates_before_and_after_1970(spark):
    schema = {"type": "int32", "optional": True, "name": "io.debezium.time.Date"}
    assert decoded(spark, schema, [-1, 0, 4427, -719162]) == [
        date(1969, 12, 31),
        date(1970, 1, 1),
        date(1982, 2, 14),
        date(1, 1, 1),
    ]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("io.debezium.time.Time", 49_500_123, "13:45:00.123000"),
        ("io.debezium.time.MicroTime", 49_500_123_456, "13:45:00.123456"),
        ("io.debezium.time.NanoTime", 49_500_123_456_789, "13:45:00.123456"),
    ],
)
def test_times_of_day(spark, name, value, expected):
    kind = "int32" if name.endswith(".Time") else "int64"
    assert decoded(spark, {"type": kind, "name": name}, [value]) == [expected]


def test_timestamps_without_and_with_zone(spark):
    assert decoded(spark, {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, [1_772_329_500_123_456]) == [
        datetime(2026, 3, 1, 1, 45, 0, 123456)
    ]
    assert decoded(spark, {"type": "int64", "name": "io.debezium.time.Timestamp"}, [-1000]) == [
        datetime(1969, 12, 31, 23, 59, 59)
    ]
    zoned = decoded(
        spark, {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, ["2026-11-21T05:53:15.094926Z"]
    )
    assert zoned[0].astimezone(UTC) == datetime(2026, 11, 21, 5, 53, 15, 94926, tzinfo=UTC)


def test_bytes_json_uuid_arrays_booleans_and_floats(spark):
    assert decoded(spark, {"type": "bytes"}, ["3q2+7w==", None]) == [bytearray(b"\xde\xad\xbe\xef"), None]
    assert decoded(spark, {"type": "string", "name": "io.debezium.data.Json"}, ['{"a": {"b": [1, 2]}}', "null"]) == [
        '{"a": {"b": [1, 2]}}',
        "null",
    ]
    assert decoded(spark, {"type": "array", "items": {"type": "string", "optional": True}}, [["x", None], []]) == [
        ["x", None],
        [],
    ]
    assert decoded(spark, {"type": "boolean"}, [True, False, None]) == [True, False, None]
    floats = decoded(spark, {"type": "double"}, [1.5, "NaN", "Infinity", "-Infinity"])
    assert floats[0] == 1.5
    assert floats[1] != floats[1]
    assert floats[2] == float("inf")
    assert floats[3] == float("-inf")


def test_undecodable_values_are_told_apart_from_nulls(spark):
    frame = spark.createDataFrame([("not base64!",), (None,), ("3q2+7w==",)], "raw string")
    schema = ConnectSchema.model_validate({"type": "bytes"})
    flags = frame.select(undecodable(F.col("raw"), decode(F.col("raw"), schema)).alias("bad")).collect()
    assert [row.bad for row in flags] == [True, False, False]


def test_decimal_scales_spark_cannot_hold_as_they_are_in_postgres(spark, decimals_decoded_by):
    """Postgres 15's numeric(2,4) (scale above the precision) fits a decimal(4,4); numeric(5,-2), whose
    scale Debezium reads as 2046 (the type modifier's 11 bits), and scales above 38 refine as exact text."""
    above = {**DECIMAL_12_2, "parameters": {"scale": "4", "connect.decimal.precision": "2"}}
    assert decoded(spark, above, [two_complement(12), two_complement(-99)]) == [Decimal("0.0012"), Decimal("-0.0099")]
    negative = {**DECIMAL_12_2, "parameters": {"scale": "2046", "connect.decimal.precision": "5"}}
    texts = decoded(spark, negative, [two_complement(123 * 10**2048), two_complement(-99999 * 10**2048), "AA=="])
    wide = {**DECIMAL_12_2, "parameters": {"scale": "40", "connect.decimal.precision": "41"}}
    texts += decoded(spark, wide, [two_complement(15 * 10**39)])
    if decimals_decoded_by.startswith("Spark"):  # Spark's expressions read 38 digits at most: undecodable, not wrong
        assert texts == [None, None, "0", None]
    else:
        assert texts == ["12300", "-9999900", "0", "1." + "5" + "0" * 39]


def test_dates_and_timestamps_beyond_sparks_years_do_not_decode(spark):
    """Spark holds years 1-9999; Debezium sends Postgres' infinity and years beyond as numbers out of
    that range (wrong dates if read as they are): they are undecodable, so quarantined."""
    days = decoded(
        spark, {"type": "int32", "name": "io.debezium.time.Date"}, [-719162, 2932896, -719163, 2932897, -622191234]
    )
    assert days == [date(1, 1, 1), date(9999, 12, 31), None, None, None]
    infinity, minus_infinity = 9223372036825200000, -9223372036832400000  # Debezium's ±infinity
    micros = decoded(
        spark,
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        [253402300799999999, infinity, minus_infinity, -62135596800000001],
    )
    assert micros == [datetime(9999, 12, 31, 23, 59, 59, 999999), None, None, None]
    millis = decoded(spark, {"type": "int64", "name": "io.debezium.time.Timestamp"}, [0, infinity // 1000, 2**63 - 1])
    assert millis == [datetime(1970, 1, 1), None, None]
    zoned = decoded(
        spark,
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        ["infinity", "+10000-01-01T00:00:00Z", "2026-11-21T05:53:15Z"],
    )
    assert zoned[:2] == [None, None]
    assert zoned[2] is not None


def test_times_of_day_include_midnight_at_the_end_and_connects_own_time(spark):
    micro = decoded(spark, {"type": "int64", "name": "io.debezium.time.MicroTime"}, [86_400_000_000, 0, 86_400_000_001])
    assert micro == ["24:00:00.000000", "00:00:00.000000", None]
    connect = decoded(spark, {"type": "int32", "name": "org.apache.kafka.connect.data.Time"}, [49_500_123])
    assert connect == ["13:45:00.123000"]


def test_saturated_interval_microseconds_do_not_decode(spark):
    schema = {"type": "int64", "name": "io.debezium.time.MicroDuration"}
    assert decoded(spark, schema, [37091106789000, -(2**63), 2**63 - 1]) == [37091106789000, None, None]


def test_bits_as_postgres_writes_them(spark):
    """Debezium's Bits: the bit string as an integer, its bytes little-endian (B'101000000001' is 0x01 0x0A)."""
    bits12 = {"type": "bytes", "name": "io.debezium.data.Bits", "parameters": {"length": "12"}}
    assert decoded(spark, bits12, ["AQo=", "", "/w8=", "AQ=="]) == [
        "101000000001",
        "000000000000",
        "111111111111",
        "000000000001",
    ]
    varbit = {"type": "bytes", "name": "io.debezium.data.Bits", "parameters": {"length": "2147483647"}}
    # A varbit's length is not sent: B'0011' arrives as B'11'.
    assert decoded(spark, varbit, ["BQ==", "B/gH", "", "Aw=="]) == ["101", "1111111100000000111", "", "11"]


def test_arrays_of_two_dimensions_debezium_sends_as_java_array_names_do_not_decode(spark):
    """A text[] holding {{a,b},{c,d}} arrives as the names of two Java arrays: not a value to keep."""
    schema = {"type": "array", "items": {"type": "string", "optional": True}}
    names = ["[Ljava.lang.String;@19b1e693", "[Ljava.lang.String;@7e4a7ad9"]
    assert decoded(spark, schema, [names, ["[L", "x", None], ["[Ljava.util.UUID;@2e28025c", None]]) == [
        None,
        ["[L", "x", None],
        None,
    ]
    uuids = {"type": "array", "items": {"type": "string", "optional": True, "name": "io.debezium.data.Uuid"}}
    assert decoded(spark, uuids, [["[Ljava.util.UUID;@2e28025c"]]) == [None]
