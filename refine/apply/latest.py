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

    @classmethod
    def lone(cls, aggregated) -> tuple[SnapshotStart, ...]:
        """The values of :func:`lone_snapshot_reads` in the Row ``aggregated``: per snapshot (partition and LSN)
        that the batch reads only with last reads, the first of those."""
        others = {(read.partition, read.lsn) for read in aggregated.snapshot_other_reads}
        lone: dict[tuple[int, int], SnapshotStart] = {}
        for read in aggregated.snapshot_end_reads:
            snapshot = (read.partition, read.lsn)
            if snapshot not in others and (snapshot not in lone or read.offset < lone[snapshot].offset):
                lone[snapshot] = cls(read.partition, read.offset, read.lsn)
        return tuple(sorted(lone.values(), key=lambda start: (start.offset, start.partition)))

    @property
    def order(self) -> tuple[int, int, int]:
        """Its place among the starts of a batch, as :func:`last_snapshot_start` orders them."""
        return self.offset, self.partition, self.lsn


def last_snapshot_start() -> Column:
    """Aggregate of parsed changes: the last snapshot start among them (null if none; see SnapshotStart.of)."""
    where = F.struct(
        F.col("kafka_offset").alias("offset"),
        F.col("kafka_partition").alias("partition"),
        F.col("source_lsn").alias("lsn"),
    )
    return F.max(F.when(F.col("source_snapshot_start"), where))


def lone_snapshot_reads() -> list[Column]:
    """Aggregates of parsed changes (read by :meth:`SnapshotStart.lone`): the last reads of snapshots, and the
    snapshots (partition, LSN: reads of one snapshot share its LSN) of the other reads.

    Debezium marks a snapshot's first read of a table ``first`` or ``first_in_data_collection``, except when the
    table has one row: its one read is marked as a last (``last``, ``last_in_data_collection``). A last read with
    no other read of its snapshot in the batch either is such a one-row snapshot, which starts a snapshot, or
    ends one begun in an earlier batch: :func:`refine.apply.snapshots.with_lone_snapshot_starts` tells them
    apart by the refined table."""
    read = F.struct(F.col("kafka_partition").alias("partition"), F.col("source_lsn").alias("lsn"))
    end = F.struct(
        F.col("kafka_partition").alias("partition"),
        F.col("source_lsn").alias("lsn"),
        F.col("kafka_offset").alias("offset"),
    )
    other_read = (F.col("op") == Op.READ.value) & ~F.col("source_snapshot_end")
    return [
        F.collect_set(F.when(F.col("source_snapshot_end") & F.col("source_lsn").isNotNull(), end)).alias(
            "snapshot_end_reads"
        ),
        F.collect_set(F.when(other_read, read)).alias("snapshot_other_reads"),
    ]


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
