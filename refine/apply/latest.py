"""The last change per key in a batch, in source order (pure DataFrame -> DataFrame).

Source order is Postgres' LSN, then the Kafka offset (a primary-key change gives a delete and a
create at the same LSN). Tombstones repeat the delete before them and are left out; a truncate
makes every earlier change of the batch irrelevant.
"""

from __future__ import annotations

from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from refine.records.envelope import Op
from refine.records.toast import fill_from_earlier_changes

POSITION_COLUMNS = ("source_lsn", "kafka_offset")


def at_or_after(position: list[Column], other: list[Column]) -> Column:
    """``position`` at or after ``other``, compared part by part (lsn, then offset...): re-applying
    the same change is harmless."""
    first, *rest = position
    other_first, *other_rest = other
    if not rest:
        return first >= other_first
    return (first > other_first) | ((first == other_first) & at_or_after(rest, other_rest))


def resets_table() -> Column:
    """Whether a parsed change resets the table: a truncate, or the first read of a snapshot (which
    reads the whole table again, so a row it does not read is gone: deleted while the connector was
    away, say, before a re-created connector's snapshot)."""
    return (F.col("op") == Op.TRUNCATE.value) | F.col("source_snapshot_start")


class SnapshotStart(NamedTuple):
    """Where a snapshot's first read is: in Kafka, and at the source."""

    partition: int
    offset: int
    lsn: int

    @property
    def position(self) -> tuple[int, int]:
        """Its source position (LSN, Kafka offset), as a truncate's."""
        return self.lsn, self.offset

    @classmethod
    def of(cls, found) -> SnapshotStart | None:
        """The value of :func:`last_snapshot_start` (a Row, or None) as a SnapshotStart."""
        return None if found is None else cls(found.partition, found.offset, found.lsn)


def last_snapshot_start() -> Column:
    """Aggregate of parsed changes: the last snapshot start among them (null if none; see SnapshotStart.of)."""
    where = F.struct(
        F.col("kafka_offset").alias("offset"),
        F.col("kafka_partition").alias("partition"),
        F.col("source_lsn").alias("lsn"),
    )
    return F.max(F.when(F.col("source_snapshot_start"), where))


def from_snapshot_start(start: SnapshotStart) -> Column:
    """Changes not before a snapshot's first read ``start``, where before means earlier both in the order
    Debezium sent them (Kafka offset within the read's partition) and at the source (LSN, offset).
    Kafka order alone would let a replayed old snapshot drop newer changes sent before it; the LSN alone
    would drop a transaction that wrote before the snapshot's LSN and committed after it, which comes
    after the snapshot with lower LSNs and is not in it. A change of another partition is not before."""
    earlier_in_kafka = (F.col("kafka_partition") == start.partition) & (F.col("kafka_offset") < start.offset)
    earlier_at_source = ~at_or_after(
        [F.col("source_lsn"), F.col("kafka_offset")], [F.lit(start.lsn), F.lit(start.offset)]
    )
    return ~(earlier_in_kafka & earlier_at_source)


def latest_per_key(
    changes: DataFrame,
    key_columns: list[str],
    truncated_at: tuple[int, int] | None,
    placeholders: bool = True,
    snapshot_from: SnapshotStart | None = None,
) -> DataFrame:
    """For each key, its last create, read, update or delete after ``truncated_at`` (if any) and from
    the snapshot start ``snapshot_from`` (if any, see :func:`from_snapshot_start`), with
    TOAST placeholders filled from the key's earlier changes in the batch (``placeholders``: the
    changes may hold any; without, that running window over each key's changes is left out)."""
    rows = changes.where(F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value))
    if truncated_at is not None:
        lsn, offset = truncated_at
        rows = rows.where(at_or_after([F.col("source_lsn"), F.col("kafka_offset")], [F.lit(lsn), F.lit(offset)]))
    if snapshot_from is not None:
        rows = rows.where(from_snapshot_start(snapshot_from))
    if placeholders:
        rows = fill_from_earlier_changes(rows, key_columns, [F.col(c) for c in POSITION_COLUMNS])
    order = Window.partitionBy(*[F.col(f"key.{column}") for column in key_columns]).orderBy(
        *[F.col(c).desc() for c in POSITION_COLUMNS]
    )
    return rows.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")
