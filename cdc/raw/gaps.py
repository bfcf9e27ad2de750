"""Offset gaps: records Kafka deleted (retention) before the raw table landed them.

By default a gap stops the job. With ``--allow-gaps`` the job goes on and records each gap in the
Delta table ``<warehouse>/_cdc/raw_gaps``, one row per (table, topic, partition, first missing
offset), so that what was lost stays known.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from cdc.core.errors import OffsetGapError
from cdc.core.shared_tables import merge_into_shared_table
from cdc.core.source import PartitionOffsets
from cdc.core.tables import raw_table_location
from cdc.raw.checkpoint import Offsets

GAPS_SCHEMA = StructType(
    [
        StructField("table", StringType(), nullable=False),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("first_missing", LongType(), nullable=False),
        StructField("last_missing", LongType(), nullable=False),
        StructField("detected_at", TimestampType(), nullable=False),
    ]
)


@dataclass(frozen=True)
class OffsetGap:
    """Offsets ``first_missing`` to ``last_missing`` (inclusive) of a partition are gone from Kafka."""

    topic: str
    partition: int
    first_missing: int
    last_missing: int


def find_gaps(next_offsets: Offsets, kafka: dict[tuple[str, int], PartitionOffsets]) -> list[OffsetGap]:
    """Partitions whose next offset to read is older than the oldest one Kafka still holds."""
    gaps = []
    for (topic, partition), next_offset in sorted(next_offsets.items()):
        held = kafka.get((topic, partition))
        if held is not None and held.earliest > next_offset:
            gaps.append(OffsetGap(topic, partition, next_offset, held.earliest - 1))
    return gaps


def refuse_gaps(gaps: list[OffsetGap], warehouse: str) -> None:
    """Stop the landing when Kafka no longer holds offsets a raw table has not landed: an
    :class:`OffsetGapError` naming the first of ``gaps``."""
    if gaps:
        gap = gaps[0]
        raise OffsetGapError(
            "Kafka no longer holds offsets the raw table has not landed (retention deleted them); "
            "rerun with --allow-gaps to continue and record the gap",
            topic=gap.topic,
            partition=gap.partition,
            missing=f"{gap.first_missing}-{gap.last_missing}",
            table=raw_table_location(warehouse, gap.topic),
        )


def record_gaps(spark: SparkSession, gaps_table: str, raw_table: str, gaps: list[OffsetGap]) -> None:
    """Add ``gaps`` to the gaps table; a gap already recorded (a replayed batch) is not added twice, and grows
    when Kafka has deleted more of it since."""
    if not gaps:
        return
    detected_at = datetime.now(UTC)
    rows = [{"table": raw_table, **asdict(gap), "detected_at": detected_at} for gap in gaps]
    new = spark.createDataFrame(rows, GAPS_SCHEMA)
    same = " AND ".join(
        f"recorded.`{name}` = new.`{name}`" for name in ("table", "topic", "partition", "first_missing")
    )
    merge_into_shared_table(
        spark,
        gaps_table,
        GAPS_SCHEMA,
        lambda table: (
            table.alias("recorded")
            .merge(new.alias("new"), same)
            .whenMatchedUpdate("new.last_missing > recorded.last_missing", {"last_missing": "new.last_missing"})
            .whenNotMatchedInsertAll()
        ),
    )
