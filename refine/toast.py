"""TOAST: large values an update left unchanged arrive as Debezium's placeholder, not as the value.

The value then lives in an earlier change of the same row (in the same batch) or in the refined
table's current row: :func:`fill_from_earlier_changes` takes it from the first, the MERGE
(:mod:`refine.merge`) from the second.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, DataType, StringType, StructType

TOAST_PLACEHOLDER = "__debezium_unavailable_value"


def placeholder(data_type: DataType) -> Column | None:
    """The placeholder as a decoded value of ``data_type``; None where Debezium sends none."""
    if isinstance(data_type, StringType):  # text, varchar, json, jsonb
        return F.lit(TOAST_PLACEHOLDER)
    if isinstance(data_type, BinaryType):  # bytea: the placeholder's bytes
        return F.lit(TOAST_PLACEHOLDER.encode())
    if isinstance(data_type, ArrayType) and isinstance(data_type.elementType, StringType):
        return F.array(F.lit(TOAST_PLACEHOLDER))
    return None


def has_placeholder(row: Column, row_type: StructType) -> Column:
    """True where a field of ``row`` (a struct of ``row_type``) holds the placeholder; false when none can."""
    checks = [row[field.name] == marker for field in row_type.fields if (marker := placeholder(field.dataType)) is not None]
    return F.coalesce(reduce(Column.__or__, checks), F.lit(False)) if checks else F.lit(False)


def fill_from_earlier_changes(changes: DataFrame, key_columns: list[str], order: list[Column]) -> DataFrame:
    """Replace placeholders in ``after`` by the key's last real value among its earlier changes."""
    after_type = changes.schema["after"].dataType
    assert isinstance(after_type, StructType)
    history = (
        Window.partitionBy(*[F.col(f"key.{key}") for key in key_columns])
        .orderBy(*order)
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    fields = []
    for field in after_type.fields:
        value = F.col(f"after.`{field.name}`")
        marker = placeholder(field.dataType)
        if marker is None:
            fields.append(value.alias(field.name))
            continue
        # Wrapped in a struct so that a real NULL counts as a value and only placeholders are skipped.
        known = F.when(F.col("after").isNull() | (value == marker), F.lit(None)).otherwise(F.struct(value.alias("v")))
        filled = F.last(known, ignorenulls=True).over(history)
        fields.append(F.when(filled.isNull(), value).otherwise(filled["v"]).alias(field.name))
    return changes.withColumn("after", F.when(F.col("after").isNull(), F.col("after")).otherwise(F.struct(*fields)))


def replace_placeholders(row: Column, values: Column, row_type: StructType) -> Column:
    """``row`` (a struct of ``row_type``) with each placeholder replaced by the same field of
    ``values`` (a struct of the same type), where ``values`` is not null."""
    fields = []
    for field in row_type.fields:
        value, marker = row[field.name], placeholder(field.dataType)
        if marker is not None:
            value = F.when((value == marker) & values.isNotNull(), values[field.name]).otherwise(value)
        fields.append(value.alias(field.name))
    return F.when(row.isNull(), row).otherwise(F.struct(*fields))
