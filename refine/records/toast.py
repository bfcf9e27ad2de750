"""TOAST: large values an update left unchanged arrive as Debezium's placeholder, not as the value.

The value then lives in an earlier change of the same row (in the same batch) or in the refined
table's current row: :func:`fill_from_earlier_changes` takes it from the first, the MERGE
(:mod:`refine.apply.merge`) from the second.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

TOAST_PLACEHOLDER = "__debezium_unavailable_value"
_PLACEHOLDER_BYTES = TOAST_PLACEHOLDER.encode()
# uuid[]: one element, the name-based UUID of the placeholder's bytes (Java's UUID.nameUUIDFromBytes).
TOAST_PLACEHOLDER_UUID = str(uuid.UUID(bytes=hashlib.md5(_PLACEHOLDER_BYTES).digest(), version=3))
# hstore with hstore.handling.mode=json (the default): the placeholder mapped to itself, as compact JSON.
TOAST_PLACEHOLDER_HSTORE = json.dumps({TOAST_PLACEHOLDER: TOAST_PLACEHOLDER}, separators=(",", ":"))
# Arrays of numbers (int2[], int4[], int8[]...): one element per byte of the placeholder.
_NUMBER_ELEMENTS = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType)


ValueTest = Callable[[Column], Column]


def placeholder_test(data_type: DataType) -> ValueTest | None:
    """A test of a decoded value of ``data_type``: true where it is Debezium's placeholder for an
    unchanged TOASTed value, in the shape Debezium gives it for that type (null where the value is);
    None where Debezium sends none."""
    markers: list[Column] = []
    if isinstance(data_type, StringType):  # text, varchar, json, jsonb; hstore as JSON
        markers = [F.lit(TOAST_PLACEHOLDER), F.lit(TOAST_PLACEHOLDER_HSTORE)]
    elif isinstance(data_type, BinaryType):  # bytea: the placeholder's bytes
        markers = [F.lit(_PLACEHOLDER_BYTES)]
    elif (
        isinstance(data_type, MapType)
        and isinstance(data_type.keyType, StringType)
        and isinstance(data_type.valueType, StringType)
    ):  # hstore as a map
        # Spark cannot compare maps: one entry, the placeholder mapped to itself.
        return lambda value: (F.size(value) == 1) & (value[TOAST_PLACEHOLDER] == TOAST_PLACEHOLDER)
    elif isinstance(data_type, ArrayType):
        element = data_type.elementType
        if isinstance(element, StringType):  # text[], varchar[], json[]; uuid[]
            markers = [F.array(F.lit(TOAST_PLACEHOLDER)), F.array(F.lit(TOAST_PLACEHOLDER_UUID))]
        elif isinstance(element, BinaryType):  # bytea[]
            markers = [F.array(F.lit(_PLACEHOLDER_BYTES))]
        elif isinstance(element, _NUMBER_ELEMENTS):
            markers = [F.array(*[F.lit(byte).cast(element) for byte in _PLACEHOLDER_BYTES])]
    if not markers:
        return None
    return lambda value: reduce(Column.__or__, [value == marker for marker in markers])


def has_placeholder(row: Column, row_type: StructType) -> Column:
    """True where a field of ``row`` (a struct of ``row_type``) holds the placeholder; false when none can."""
    checks = [
        test(row[field.name]) for field in row_type.fields if (test := placeholder_test(field.dataType)) is not None
    ]
    return F.coalesce(reduce(Column.__or__, checks), F.lit(False)) if checks else F.lit(False)


def fill_from_earlier_changes(
    changes: DataFrame, key_columns: list[str], order: list[Column], within: tuple[Column, ...] = ()
) -> DataFrame:
    """Replace placeholders in ``after`` by the key's last real value among its earlier changes (those
    of the same ``within`` values, when given)."""
    after_type = changes.schema["after"].dataType
    assert isinstance(after_type, StructType)
    history = (
        Window.partitionBy(*[F.col(f"key.{key}") for key in key_columns], *within)
        .orderBy(*order)
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    fields = []
    for field in after_type.fields:
        value = F.col(f"after.`{field.name}`")
        is_placeholder = placeholder_test(field.dataType)
        if is_placeholder is None:
            fields.append(value.alias(field.name))
            continue
        # Wrapped in a struct so that a real NULL counts as a value and only placeholders are skipped.
        known = F.when(F.col("after").isNull() | is_placeholder(value), F.lit(None)).otherwise(
            F.struct(value.alias("v"))
        )
        filled = F.last(known, ignorenulls=True).over(history)
        fields.append(F.when(filled.isNull(), value).otherwise(filled["v"]).alias(field.name))
    return changes.withColumn("after", F.when(F.col("after").isNull(), F.col("after")).otherwise(F.struct(*fields)))


def replace_placeholders(row: Column, values: Column, row_type: StructType) -> Column:
    """``row`` (a struct of ``row_type``) with each placeholder replaced by the same field of
    ``values`` (a struct of the same type), where ``values`` is not null."""
    fields = []
    for field in row_type.fields:
        value, is_placeholder = row[field.name], placeholder_test(field.dataType)
        if is_placeholder is not None:
            value = F.when(is_placeholder(value) & values.isNotNull(), values[field.name]).otherwise(value)
        fields.append(value.alias(field.name))
    return F.when(row.isNull(), row).otherwise(F.struct(*fields))
