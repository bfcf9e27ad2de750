"""Refined tables: their rows, their schema, and the MERGE that applies a batch of changes.

A refined table holds the source table's columns and metadata columns prefixed ``_cdc_`` (never a
source column name Debezium produces for Postgres):

- ``_cdc_lsn``, ``_cdc_offset``: the source position of the row's last change (LSN, Kafka offset);
- ``_cdc_committed_at``: when that change was committed at the source;
- ``_cdc_op``: its operation (``r`` snapshot read, ``c`` create, ``u`` update);
- ``_cdc_refined_at``: when it was merged.

A change applies only when it is at or after the row's position, so replays and late duplicates
never overwrite newer state.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc.errors import TableError
from cdc.raw.table import KIND_PROPERTY, is_delta_table
from refine.envelope import Op
from refine.toast import placeholder

LSN, OFFSET, COMMITTED_AT, OP, REFINED_AT = "_cdc_lsn", "_cdc_offset", "_cdc_committed_at", "_cdc_op", "_cdc_refined_at"
METADATA_COLUMNS = (LSN, OFFSET, COMMITTED_AT, OP, REFINED_AT)


def refined_rows(latest: DataFrame, columns: list[str]) -> DataFrame:
    """Rows as the refined table stores them: the row image (``before`` for a delete) and metadata."""
    image = F.when(F.col("op") == Op.DELETE.value, F.col("before")).otherwise(F.col("after"))
    return latest.select(
        *[image[column].alias(column) for column in columns],
        F.col("source_lsn").alias(LSN),
        F.col("kafka_offset").alias(OFFSET),
        F.col("source_committed_at").alias(COMMITTED_AT),
        F.col("op").alias(OP),
        F.current_timestamp().alias(REFINED_AT),
    )


def ensure_refined_table(spark: SparkSession, location: str, schema: StructType, kind: str = "refined") -> None:
    """Create the table, or add the columns the source gained; refuse a column whose type changed."""
    if not is_delta_table(spark, location):
        (
            DeltaTable.createIfNotExists(spark).location(location).addColumns(schema)
            .property("delta.enableChangeDataFeed", "true").property(KIND_PROPERTY, kind)
            .execute()
        )  # fmt: skip
        return
    current = {field.name: field.dataType for field in DeltaTable.forPath(spark, location).toDF().schema}
    added = []
    for field in schema:
        if field.name not in current:
            added.append(field)
        elif current[field.name] != field.dataType:
            raise TableError(
                "a source column changed type in a way that cannot be applied safely",
                table=location, column=field.name,
                old_type=current[field.name].simpleString(), new_type=field.dataType.simpleString(),
            )  # fmt: skip
    if added:
        columns = ", ".join(f"`{field.name}` {field.dataType.simpleString()}" for field in added)
        spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({columns})")


def merge_changes(
    spark: SparkSession,
    location: str,
    rows: DataFrame,
    key_columns: list[str],
    truncated_at: tuple[int, int] | None,
) -> None:
    """Apply one batch's last change per key (and a truncate, if the batch had one)."""
    ensure_refined_table(spark, location, StructType([StructField(f.name, f.dataType) for f in rows.schema]))
    newer = f"(s.{LSN} > t.{LSN} OR (s.{LSN} = t.{LSN} AND s.{OFFSET} >= t.{OFFSET}))"
    updates = {}
    for field in rows.schema:
        source = F.col(f"s.`{field.name}`")
        # A TOAST placeholder keeps the value the row has.
        marker = placeholder(field.dataType)
        updates[f"`{field.name}`"] = (
            source if marker is None else F.when(source == marker, F.col(f"t.`{field.name}`")).otherwise(source)
        )
    merge = (
        DeltaTable.forPath(spark, location).alias("t")
        .merge(rows.alias("s"), " AND ".join(f"t.`{key}` = s.`{key}`" for key in key_columns))
        .whenMatchedDelete(f"s.{OP} = '{Op.DELETE.value}' AND {newer}")
        .whenMatchedUpdate(f"s.{OP} <> '{Op.DELETE.value}' AND {newer}", updates)
        .whenNotMatchedInsert(f"s.{OP} <> '{Op.DELETE.value}'", {f"`{f.name}`": F.col(f"s.`{f.name}`") for f in rows.schema})
    )  # fmt: skip
    if truncated_at is not None:
        lsn, offset = truncated_at
        merge = merge.whenNotMatchedBySourceDelete(f"t.{LSN} < {lsn} OR (t.{LSN} = {lsn} AND t.{OFFSET} < {offset})")
    merge.execute()
