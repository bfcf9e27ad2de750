"""Column types declared in the refine job's configuration (``columns``, ``key``).

Two uses:

- **Values without a schema** (``value.converter.schemas.enable=false``): the record says nothing
  about types, so the declared columns are the row's schema. They are read as Debezium encodes them
  by default: ``date`` as days since the epoch, ``timestamp`` as an ISO string in UTC
  (``ZonedTimestamp``, timestamptz), ``timestamp_ntz`` as microseconds (``MicroTimestamp``),
  ``time`` as microseconds of the day (``MicroTime``, a string column: Delta tables cannot hold
  Spark's TIME type), ``binary`` as base64, and ``decimal(p,s)`` as the text Debezium writes with
  ``decimal.handling.mode=string`` (precise mode's base64 loses the scale without a schema;
  ``double`` mode is a ``double`` column). Debezium's default ``time.precision.mode=adaptive``
  writes ``timestamp(0-3)`` and ``time(0-3)`` columns in milliseconds instead: they are declared with
  their Postgres precision, ``timestamp_ntz(3)`` and ``time(3)`` (the precision only picks the
  encoding; ``time.precision.mode=connect`` writes milliseconds for every precision: declare ``(3)``).
- **Overrides** with a schema: a declared type replaces the decoded one, e.g. a
  ``decimal.handling.mode=string`` column (a plain string field in the schema) declared
  ``decimal(12,2)`` is converted exactly with ``try_cast``; a value that does not convert goes to
  the quarantine with the field and the type.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from refine.records.decode import DATE, MICRO_TIME, MICRO_TIMESTAMP, TIME, TIMESTAMP, ZONED_TIMESTAMP
from refine.records.envelope import ConnectSchema

_PRIMITIVES = {
    "string": {"type": "string"},
    "boolean": {"type": "boolean"},
    "tinyint": {"type": "int8"},
    "smallint": {"type": "int16"},
    "int": {"type": "int32"},
    "bigint": {"type": "int64"},
    "float": {"type": "float"},
    "double": {"type": "double"},
    "binary": {"type": "bytes"},
    "date": {"type": "int32", "name": DATE},
    "timestamp": {"type": "string", "name": ZONED_TIMESTAMP},
    "timestamp_ntz": {"type": "int64", "name": MICRO_TIMESTAMP},
    "time": {"type": "int64", "name": MICRO_TIME},
}
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
# A Postgres precision on a temporal type: it picks Debezium's encoding (milliseconds up to 3 digits).
_WITH_PRECISION = re.compile(r"(timestamp_ntz|time)\(\s*(\d+)\s*\)")
_BY_PRECISION = {  # (type, in milliseconds?) -> Connect schema
    ("timestamp_ntz", True): {"type": "int64", "name": TIMESTAMP},
    ("timestamp_ntz", False): _PRIMITIVES["timestamp_ntz"],
    ("time", True): {"type": "int32", "name": TIME},
    ("time", False): _PRIMITIVES["time"],
}
SUPPORTED = (
    "string, boolean, tinyint, smallint, int, bigint, float, double, binary, date, timestamp, timestamp_ntz, "
    "timestamp_ntz(p), time, time(p), decimal(p,s), array<...>"
)


def connect_type(spark_type: str) -> dict:
    """The Connect schema (as JSON) Debezium writes a column of ``spark_type`` with, without schemas;
    ValueError for a type this job cannot read."""
    text = spark_type.strip().lower()
    if text in _PRIMITIVES:
        return dict(_PRIMITIVES[text])
    if (temporal := _WITH_PRECISION.fullmatch(text)) is not None:
        if int(temporal[2]) > 6:
            raise ValueError(f"{spark_type}: precision must be 0-6")
        return dict(_BY_PRECISION[temporal[1], int(temporal[2]) <= 3])
    if (decimal := _DECIMAL.fullmatch(text)) is not None:
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 0 < precision <= 38 or scale > precision:
            raise ValueError(f"{spark_type}: precision must be 1-38 and scale at most the precision")
        return {"type": "string"}  # decimal.handling.mode=string; converted by declared_types
    if text.startswith("array<") and text.endswith(">"):
        return {"type": "array", "items": connect_type(text[len("array<") : -1])}
    raise ValueError(f"unsupported column type {spark_type!r} (supported: {SUPPORTED})")


def spark_type(declared: str) -> DataType:
    """The Spark type of a declared column type (one :func:`connect_type` reads)."""
    text = _WITH_PRECISION.sub(lambda temporal: temporal[1], declared.strip().lower())
    return DataType.fromDDL(re.sub(r"\btime\b", "string", text))  # no time-of-day type: ISO text


def declared_schemas(columns: dict[str, str], key: list[str]) -> tuple[ConnectSchema, ConnectSchema]:
    """The envelope and key schemas of a schemaless Postgres topic, from the declared columns."""
    row = {
        "type": "struct",
        "optional": True,
        "fields": [{**connect_type(t), "optional": name not in key, "field": name} for name, t in columns.items()],
    }
    source = {
        "type": "struct",
        "field": "source",
        "fields": [
            {"type": "int64", "field": "lsn", "optional": True},
            {"type": "string", "field": "sequence", "optional": True},
            {"type": "string", "field": "snapshot", "optional": True},
            {"type": "int64", "field": "ts_ms"},
        ],
    }
    envelope = {
        "type": "struct",
        "fields": [{**row, "field": "before"}, {**row, "field": "after"}, source, {"type": "string", "field": "op"}],
    }
    key_schema = {"type": "struct", "fields": [{**connect_type(columns[name]), "field": name} for name in key]}
    return ConnectSchema.model_validate(envelope), ConnectSchema.model_validate(key_schema)


def declared_types(changes: DataFrame, columns: dict[str, str]) -> DataFrame:
    """``changes`` (from :func:`refine.records.parse.parse_changes`) with the declared types applied to
    ``before`` and ``after``, and a problem where a value does not convert."""
    image_type = changes.schema["after"].dataType
    assert isinstance(image_type, StructType)
    targets = {name: spark_type(t) for name, t in columns.items() if name in image_type.names}
    changed = {name: t for name, t in targets.items() if image_type[name].dataType != t}
    if not changed:
        return changes
    problem = F.when(F.col("problem").isNotNull(), F.col("problem"))
    for image in ("before", "after"):
        for name, data_type in changed.items():
            value = F.col(f"{image}.`{name}`")
            problem = problem.when(
                value.isNotNull() & value.try_cast(data_type).isNull(),
                F.lit(
                    f"field {image}.{name}: cannot convert the value to the declared type {data_type.simpleString()}"
                ),
            )
    return changes.withColumn("problem", problem).withColumns(
        {image: _converted(image, image_type, changed) for image in ("before", "after")}
    )


def _converted(image: str, image_type: StructType, changed: dict[str, DataType]) -> Column:
    fields = [
        (
            F.col(f"{image}.`{f.name}`").try_cast(changed[f.name])
            if f.name in changed
            else F.col(f"{image}.`{f.name}`")
        ).alias(f.name)
        for f in image_type.fields
    ]
    return F.when(F.col(image).isNotNull(), F.struct(*fields))
