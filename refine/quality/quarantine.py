"""The quarantine: records refinement could not decode, kept with the reason, so nothing is lost.

One Delta table per warehouse, ``<warehouse>/_cdc/quarantine``: the raw table and topic, the Kafka
partition and offset, the raw value and the reason. A replayed batch does not add a record twice.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from cdc.core.shared_tables import merge_into_shared_table
from cdc.core.tables import is_delta_table

QUARANTINE_SCHEMA = StructType(
    [
        StructField("source_table", StringType(), nullable=False),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("raw_value", StringType()),
        StructField("reason", StringType(), nullable=False),
        StructField("quarantined_at", TimestampType(), nullable=False),
    ]
)


def quarantine_location(warehouse: str) -> str:
    return f"{warehouse}/_cdc/quarantine"


def quarantine(spark: SparkSession, location: str, source_table: str, topic: str, problems: DataFrame) -> None:
    """Add ``problems`` (parsed changes with a ``problem``) to the quarantine table."""
    if problems.isEmpty():  # the common case: no table access, no empty commit
        return
    rows = problems.select(
        F.lit(source_table).alias("source_table"),
        F.lit(topic).alias("topic"),
        F.col("kafka_partition").alias("partition"),
        F.col("kafka_offset").alias("offset"),
        F.col("raw_value"),
        F.col("problem").alias("reason"),
        F.current_timestamp().alias("quarantined_at"),
    )
    add_quarantined(spark, location, rows)


def add_quarantined(spark: SparkSession, location: str, rows: DataFrame) -> None:
    """Add ``rows`` (of :data:`QUARANTINE_SCHEMA`) to the quarantine table, each record once."""
    keys = ("source_table", "partition", "offset")
    merge_into_shared_table(
        spark,
        location,
        QUARANTINE_SCHEMA,
        lambda table: (
            table.alias("q")
            .merge(rows.alias("n"), " AND ".join(f"q.`{k}` = n.`{k}`" for k in keys))
            .whenNotMatchedInsertAll()
        ),
    )


def quarantined_since(spark: SparkSession, location: str, source_tables: list[str], since: datetime) -> dict[str, int]:
    """Records the quarantine at ``location`` received at ``since`` or later, per one of ``source_tables``
    (those with none left out)."""
    if not is_delta_table(spark, location):
        return {}
    table = spark.read.format("delta").load(location)
    recent = table.where(F.col("source_table").isin(source_tables) & (F.col("quarantined_at") >= F.lit(since)))
    return {
        row.source_table: row.records
        for row in recent.groupBy("source_table").agg(F.count("*").alias("records")).collect()
    }
