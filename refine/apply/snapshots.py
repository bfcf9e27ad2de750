"""Which of a batch's lone last snapshot reads start a snapshot: a table of one row has one snapshot read,
marked as a last (see :func:`refine.apply.latest.lone_snapshot_reads`), and a re-created connector's
snapshot of it must still remove the rows deleted while no connector streamed."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.core.tables import is_delta_table
from refine.apply.batch_facts import BatchFacts
from refine.apply.latest import SnapshotStart
from refine.apply.merge import LSN, OFFSET, OP
from refine.records.envelope import Op


def with_lone_snapshot_starts(
    spark: SparkSession, changes: DataFrame, facts: BatchFacts, refined: str
) -> tuple[DataFrame, BatchFacts]:
    """The parsed ``changes`` and their ``facts`` with each lone last read that starts a snapshot marked as a
    start (``source_snapshot_start``, ``snapshot_from``): those whose snapshot has no earlier read in the
    refined table at ``refined``. A read of it there would be the rest of a snapshot that an earlier batch
    began; a replayed old one-row snapshot is marked too, as harmless as a replayed ``first`` read."""
    starts = [read for read in facts.lone_reads if not _holds_earlier_read(spark, refined, read)]
    if not starts:
        return changes, facts
    marked = reduce(Column.__or__, [_at(start) for start in starts], F.col("source_snapshot_start"))
    latest = max([*starts, *([facts.snapshot_from] if facts.snapshot_from else [])], key=lambda s: s.order)
    return changes.withColumn("source_snapshot_start", marked), facts._replace(snapshot_from=latest)


def _holds_earlier_read(spark: SparkSession, refined: str, read: SnapshotStart) -> bool:
    """Whether the refined table holds a row an earlier read of ``read``'s snapshot wrote (a row's position
    is its last change's: no later change of a row comes before its snapshot's last read in Kafka)."""
    if not is_delta_table(spark, refined):
        return False
    table = spark.read.format("delta").load(refined)
    earlier = (F.col(OP) == Op.READ.value) & (F.col(LSN) == read.lsn) & (F.col(OFFSET) < read.offset)
    return not table.where(earlier).isEmpty()


def _at(read: SnapshotStart) -> Column:
    return (F.col("kafka_partition") == read.partition) & (F.col("kafka_offset") == read.offset)
