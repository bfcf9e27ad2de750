"""From Debezium's JSON encodings to proper Spark types, in Spark expressions only.

Two functions per Connect schema: :func:`json_type`, the type ``from_json`` reads a value as (what
is literally in the JSON), and :func:`decode`, the expression that turns that into the column's
real type (:func:`decoded_type`). Defaults assumed: ``decimal.handling.mode=precise``,
``time.precision.mode=adaptive``, ``binary.handling.mode=bytes``.

Spark runs with ANSI mode on, where a failed cast raises: decoding uses the ``try_`` forms, so a
value that cannot be decoded becomes null (and :func:`undecodable` tells such values apart from
source NULLs, for the quarantine).
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from cdc.core.functions import DEBEZIUM_DECIMAL_FUNCTION, registered_helpers
from refine.records.envelope import ConnectSchema, ConnectType

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATE = "io.debezium.time.Date"
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
TIME = "io.debezium.time.Time"  # millis of the day
MICRO_TIME = "io.debezium.time.MicroTime"
NANO_TIME = "io.debezium.time.NanoTime"
ZONED_TIME = "io.debezium.time.ZonedTime"
TIMESTAMP = "io.debezium.time.Timestamp"  # millis since the epoch, no zone
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
NANO_TIMESTAMP = "io.debezium.time.NanoTimestamp"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
CONNECT_TIME = "org.apache.kafka.connect.data.Time"  # millis of the day (time.precision.mode=connect)
MICRO_DURATION = "io.debezium.time.MicroDuration"
BITS = "io.debezium.data.Bits"

# Spark's dates and timestamps hold years 1 to 9999. Postgres' reach further (4713 BC, 294276 AD, and
# ±infinity, which Debezium sends as numbers far out of range): such a value is undecodable (so
# quarantined with its field) rather than a wrong date.
_FIRST_DAY, _LAST_DAY = -719162, 2932896
_FIRST_MICROS, _LAST_MICROS = -62135596800000000, 253402300799999999
_DAY_MICROS = 86_400_000_000
# An array of two dimensions of a text-like type reaches Debezium as arrays of Java arrays, and it sends
# their Java names ("[Ljava.lang.String;@19b1e693") as the elements: such an array is undecodable.
_JAVA_ARRAY_NAME = r"^\[L[\w.$]+;@[0-9a-f]+$"
# interval.handling.mode=numeric: Debezium saturates an interval beyond a long's microseconds to these.
_SATURATED_MICROS = (-(2**63), 2**63 - 1)

# Postgres' unconstrained numeric has no fixed precision or scale; it lands in the widest decimal
# Spark has, with room for 18 fractional digits. A value that does not fit is undecodable.
VARIABLE_SCALE_DECIMAL_TYPE = DecimalType(38, 18)
# Postgres 15 allows a scale above the precision (numeric(2,4)) and a negative one (numeric(5,-2)),
# which Debezium reads from the type modifier's 11 bits as 2048 plus the scale (2046 for -2). A scale
# Spark's decimals cannot hold (above 38) refines as the value's exact text; a misread negative scale
# has only zeros after the point, which the text drops (numeric(5,-2)'s 12300 is "12300").
_MAX_POSTGRES_SCALE = 1000
_MAX_SPARK_DIGITS = 38

_PRIMITIVES: dict[ConnectType, DataType] = {
    ConnectType.INT8: ByteType(),
    ConnectType.INT16: ShortType(),
    ConnectType.INT32: IntegerType(),
    ConnectType.INT64: LongType(),
    ConnectType.FLOAT32: FloatType(),
    ConnectType.FLOAT64: DoubleType(),
    ConnectType.BOOLEAN: BooleanType(),
    ConnectType.STRING: StringType(),
    ConnectType.BYTES: StringType(),  # base64 text in JSON
}


def json_type(schema: ConnectSchema) -> DataType:
    """The Spark type ``from_json`` reads a value of ``schema`` as."""
    if schema.name == VARIABLE_SCALE_DECIMAL:
        return StructType([StructField("scale", IntegerType()), StructField("value", StringType())])
    match schema.type:
        case ConnectType.STRUCT:
            return StructType([StructField(f.field_name, json_type(f)) for f in schema.fields or ()])
        case ConnectType.ARRAY:
            assert schema.items is not None
            return ArrayType(json_type(schema.items))
        case ConnectType.MAP:
            assert schema.values is not None
            return MapType(StringType(), json_type(schema.values))
        case primitive:
            return _PRIMITIVES[primitive]


def decoded_type(schema: ConnectSchema) -> DataType:
    """The Spark type of the decoded column."""
    match schema.name:
        case name if name == DECIMAL:
            parameters = schema.parameters or {}
            precision, scale = int(parameters.get("connect.decimal.precision", 38)), int(parameters["scale"])
            if scale > _MAX_SPARK_DIGITS:
                return StringType()
            return DecimalType(min(max(precision, scale), _MAX_SPARK_DIGITS), scale)
        case name if name == VARIABLE_SCALE_DECIMAL:
            return VARIABLE_SCALE_DECIMAL_TYPE
        case name if name in (DATE, CONNECT_DATE):
            return DateType()
        case name if name in (TIME, CONNECT_TIME, MICRO_TIME, NANO_TIME, ZONED_TIME):
            return StringType()  # Delta tables cannot hold Spark's TIME type: ISO text, e.g. 13:45:00.123456
        case name if name in (TIMESTAMP, CONNECT_TIMESTAMP, MICRO_TIMESTAMP, NANO_TIMESTAMP):
            return TimestampNTZType()
        case name if name == ZONED_TIMESTAMP:
            return TimestampType()
        case name if name == BITS:
            return StringType()  # bit(n), varbit: the bits as Postgres writes them, 0101
    match schema.type:
        case ConnectType.BYTES:
            return BinaryType()
        case ConnectType.STRUCT:
            return StructType([StructField(f.field_name, decoded_type(f)) for f in schema.fields or ()])
        case ConnectType.ARRAY:
            assert schema.items is not None
            return ArrayType(decoded_type(schema.items))
        case ConnectType.MAP:
            assert schema.values is not None
            return MapType(StringType(), decoded_type(schema.values))
        case primitive:
            return _PRIMITIVES[primitive]


def decode(value: Column, schema: ConnectSchema) -> Column:
    """The expression decoding ``value`` (read as :func:`json_type`) to :func:`decoded_type`."""
    match schema.name:
        case name if name == DECIMAL:
            target = decoded_type(schema)
            if isinstance(target, StringType):
                scale = int((schema.parameters or {})["scale"])
                text = _decimal_text(value, F.lit(scale))
                return F.regexp_replace(text, r"\.0*$", "") if scale > _MAX_POSTGRES_SCALE else text
            assert isinstance(target, DecimalType)
            return _decimal(value, F.lit(target.scale), target)
        case name if name == VARIABLE_SCALE_DECIMAL:
            text = _decimal_text(value["value"], value["scale"])
            # More fractional digits than the type holds would be rounded by the cast: such a value does not
            # fit (undecodable, so quarantined), unless the digits beyond are zeros.
            rounded = F.regexp_like(text, F.lit(rf"\.\d{{{VARIABLE_SCALE_DECIMAL_TYPE.scale}}}\d*[1-9]"))
            return F.when(~rounded, text.try_cast(VARIABLE_SCALE_DECIMAL_TYPE))
        case name if name in (DATE, CONNECT_DATE):
            return F.when(value.between(_FIRST_DAY, _LAST_DAY), F.date_add(F.lit("1970-01-01").cast("date"), value))
        case name if name in (TIME, CONNECT_TIME):
            return _time_of_day(value.cast("long") * 1000)
        case name if name == MICRO_TIME:
            return _time_of_day(value)
        case name if name == NANO_TIME:
            return _time_of_day(F.floor(value / 1000))
        case name if name in (TIMESTAMP, CONNECT_TIMESTAMP):
            return _timestamp(F.try_multiply(value.cast("long"), F.lit(1000)))
        case name if name == MICRO_TIMESTAMP:
            return _timestamp(value)
        case name if name == NANO_TIMESTAMP:
            return _timestamp(F.floor(value / 1000))
        case name if name == ZONED_TIMESTAMP:
            instant = value.try_cast(TimestampType())  # ISO 8601 in UTC: 2026-11-21T05:53:15.094926Z
            return F.when(F.unix_micros(instant).between(_FIRST_MICROS, _LAST_MICROS), instant)
        case name if name == MICRO_DURATION:
            return F.when(~value.isin(*_SATURATED_MICROS), value)
        case name if name == BITS:
            return _bits(value, int((schema.parameters or {}).get("length", 2**31 - 1)))
    match schema.type:
        case ConnectType.BYTES:
            return F.try_to_binary(value, F.lit("base64"))
        case ConnectType.STRUCT:
            fields = list(schema.fields or ())
            return F.when(value.isNull(), F.lit(None)).otherwise(
                F.struct(*[decode(value[f.field], f).alias(f.field_name) for f in fields])
            )
        case ConnectType.ARRAY:
            assert schema.items is not None
            items = schema.items
            decoded = F.transform(value, lambda item: decode(item, items))
            if json_type(items) == StringType():
                garbled = F.exists(value, lambda item: F.coalesce(item.rlike(_JAVA_ARRAY_NAME), F.lit(False)))
                return F.when(~garbled, decoded)
            return decoded
        case ConnectType.MAP:
            assert schema.values is not None
            values = schema.values
            return F.transform_values(value, lambda _, item: decode(item, values))
        case _:
            return value


def _time_of_day(micros: Column) -> Column:
    """Microseconds since midnight as ``HH:mm:ss.SSSSSS`` (Postgres' 24:00:00 included); null out of that range."""
    text = F.date_format(F.timestamp_micros(micros).cast(TimestampNTZType()), "HH:mm:ss.SSSSSS")
    return F.when(micros == _DAY_MICROS, F.lit("24:00:00.000000")).when((micros >= 0) & (micros < _DAY_MICROS), text)


def _timestamp(micros: Column) -> Column:
    """Microseconds since the epoch as a timestamp without zone; null out of Spark's years 1-9999."""
    return F.when(micros.between(_FIRST_MICROS, _LAST_MICROS), F.timestamp_micros(micros).cast(TimestampNTZType()))


def _bits(base64: Column, length: int) -> Column:
    """Debezium's ``Bits`` (the bit string as a little-endian integer's bytes) as Postgres writes it,
    ``length`` digits (a varbit's length is not sent: its leading zeros are lost)."""
    data = F.try_to_binary(base64, F.lit("base64"))
    byte_digits = F.transform(
        F.sequence(F.lit(1), F.octet_length(data)),
        lambda i: F.lpad(F.conv(F.hex(F.substring(data, i, 1)), 16, 2), 8, "0"),
    )
    digits = F.when(F.octet_length(data) > 0, F.array_join(F.reverse(byte_digits), "")).otherwise(F.lit(""))
    if length >= 2**31 - 1:  # varbit
        return F.when(data.isNotNull(), F.regexp_replace(digits, "^0+", ""))
    return F.when(
        data.isNotNull(),
        F.lpad(F.substring(F.concat(F.repeat(F.lit("0"), length), digits), -length, length), length, "0"),
    )


def _powers_of_256() -> Column:
    """[256^1 .. 256^8] as exact decimals (a double would round 2^64)."""
    return F.array(*[F.lit(Decimal(256**n)).cast(DecimalType(38, 0)) for n in range(1, 9)])


def _decimal(base64: Column, scale: Column, target: DecimalType) -> Column:
    """Debezium's precise decimal (the base64 of a big-endian two's-complement unscaled integer)
    and its scale, as ``target``; null when it is not base64 or does not fit ``target``."""
    return _decimal_text(base64, scale).try_cast(target)


def _decimal_text(base64: Column, scale: Column) -> Column:
    """Debezium's precise decimal and its scale as exact text (``-12.50``); null when it is not base64.
    With the project's JVM function when the session has it (a warm refine of 300k changes with one
    decimal column into 1M rows: ~7.5 s instead of ~9.1 s), else in Spark's expressions
    (:func:`_decimal_text_from_bytes`)."""
    if DEBEZIUM_DECIMAL_FUNCTION in registered_helpers:
        return F.call_function(DEBEZIUM_DECIMAL_FUNCTION, base64, scale.cast("int"))
    return _decimal_text_from_bytes(F.try_to_binary(base64, F.lit("base64")), scale)


def _decimal_text_from_bytes(two_complement: Column, scale: Column) -> Column:
    """A big-endian two's-complement unscaled integer and its scale, as exact text.

    Built as text (digits, then the point inserted ``scale`` places from the right) so that no
    arithmetic can round; null when there are no bytes or the integer has more than 38 digits.
    """
    hex_digits = F.hex(two_complement)
    width = F.octet_length(two_complement)
    negative = F.substring(hex_digits, 1, 1).isin(*"89ABCDEF")
    # Up to 8 bytes (precision 18 and below, the common case) in compiled expressions: conv reads
    # the bytes as an unsigned integer, and a negative value is 256^width minus it.
    unsigned = F.conv(hex_digits, 16, 10).cast(DecimalType(38, 0))
    narrow = F.when(negative, F.element_at(_powers_of_256(), width) - unsigned).otherwise(unsigned)
    # Wider values byte by byte; a negative value is -(~bits + 1): accumulate the inverted bytes so
    # nothing overflows.
    byte_values = F.transform(
        F.sequence(F.lit(0), width - 1),
        lambda i: F.conv(F.substring(hex_digits, i * 2 + 1, 2), 16, 10).cast("int"),
    )
    wide = F.aggregate(
        byte_values,
        F.lit(0).cast(DecimalType(38, 0)),
        lambda acc, byte: F.try_add(F.try_multiply(acc, F.lit(256)), F.when(negative, 255 - byte).otherwise(byte)),
    )
    wide = F.when(negative, F.try_add(wide, F.lit(1))).otherwise(wide)
    magnitude = F.when(width <= 8, narrow).otherwise(wide)
    unpadded = magnitude.cast("string")
    # At least one digit before the point (lpad would truncate longer strings: pad only).
    digits = F.concat(F.repeat(F.lit("0"), F.greatest(scale + 1 - F.length(unpadded), F.lit(0))), unpadded)
    point = F.length(digits) - scale
    text = F.concat(
        F.when(negative, F.lit("-")).otherwise(F.lit("")),
        F.substring(digits, F.lit(1), point),
        F.when(scale > 0, F.concat(F.lit("."), F.substring(digits, point + 1, scale))).otherwise(F.lit("")),
    )
    return F.when(F.octet_length(two_complement) > 0, text)


def undecodable(raw: Column, decoded: Column) -> Column:
    """True where a value was present in the JSON but did not decode (null out of non-null in)."""
    return raw.isNotNull() & decoded.isNull()
