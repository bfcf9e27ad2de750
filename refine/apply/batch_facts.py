"""What a batch of parsed Debezium changes holds (:class:`BatchFacts`), read in one pass: which
steps of the refinement it needs."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from refine.apply.latest import SnapshotStart, last_snapshot_start, lone_snapshot_reads
from refine.apply.rekey import is_key_change
from refine.records.envelope import Op
from refine.records.flattened import LONE_TOMBSTONE_LSN
from refine.records.parse import OTHER_SCHEMA
from refine.records.toast import has_placeholder


class BatchFacts(NamedTuple):
    """What a batch's parsed changes hold, read in one pass: which steps it needs."""

    problems: int  # records that did not decode
    truncated_at: tuple[int, int] | None  # source position of the last truncate
    snapshot_from: SnapshotStart | None  # the last snapshot start (see resets_table)
    lone_reads: tuple[SnapshotStart, ...]  # snapshot reads that may start a snapshot (see lone_snapshot_reads)
    key_changes: bool  # a primary-key change (Debezium's key headers)
    deletes: bool
    placeholders: bool  # a TOAST placeholder in a row image after a change
    other_schemas: int  # records of a schema the parser was not built for (only_schemas)
    records: int
    newest_commit: datetime | None = None  # the source commit time of the batch's newest change
    # Source positions (LSN, Kafka offset): of its oldest create, update or read, and of its newest change
    # (None: unknown), which tell whether a deleted key's guard can leave the batch alone (refine/apply/deleted.py).
    oldest_upsert: tuple[int, int] | None = None
    newest_change: tuple[int, int] | None = None
    lone_tombstones: bool = False  # a flattened topic's tombstone without an LSN (refine/records/flattened.py)

    @property
    def resets(self) -> bool:
        """A truncate or a snapshot start: rows the batch does not change may be gone."""
        return self.truncated_at is not None or self.snapshot_from is not None


# The changes a batch applies (a tombstone follows its delete, a message changes no row), and of them those
# that create or update a row.
_UPSERTS = (Op.READ.value, Op.CREATE.value, Op.UPDATE.value)
_CHANGES = (*_UPSERTS, Op.DELETE.value, Op.TRUNCATE.value)


def batch_facts(changes: DataFrame) -> BatchFacts:
    position = F.struct("source_lsn", "kafka_offset")
    row = changes.agg(
        F.count(F.when(F.col("problem").isNotNull(), 1)).alias("problems"),
        F.max(F.when(F.col("op") == Op.TRUNCATE.value, F.struct("source_lsn", "kafka_offset"))).alias("truncate"),
        last_snapshot_start().alias("snapshot"),
        *lone_snapshot_reads(),
        F.coalesce(F.max(is_key_change(F.col("kafka_headers"))), F.lit(False)).alias("key_changes"),
        F.coalesce(F.max(F.col("op") == Op.DELETE.value), F.lit(False)).alias("deletes"),
        F.coalesce(F.max(has_placeholder(F.col("after"), row_type_of(changes))), F.lit(False)).alias("toast"),
        F.count(F.when(F.col("problem") == OTHER_SCHEMA, 1)).alias("other_schemas"),
        F.count(F.lit(1)).alias("records"),
        (F.max("source_committed_at") if "source_committed_at" in changes.columns else F.lit(None)).alias(
            "newest_commit"
        ),
        F.min(F.when(F.col("op").isin(*_UPSERTS), position)).alias("oldest_upsert"),
        F.max(F.when(F.col("op").isin(*_CHANGES), position)).alias("newest_change"),
        # Structs order by their first field and nulls come first: a change without a position is told apart.
        F.count(
            F.when(F.col("op").isin(*_CHANGES) & (F.col("source_lsn").isNull() | F.col("kafka_offset").isNull()), 1)
        ).alias("unplaced"),
        F.coalesce(
            F.max((F.col("op") == Op.DELETE.value) & (F.col("source_lsn") == LONE_TOMBSTONE_LSN)), F.lit(False)
        ).alias("lone_tombstones"),
    ).collect()[0]  # an aggregate without grouping: one row
    truncate = tuple(row.truncate) if row.truncate else None
    return BatchFacts(
        row.problems,
        truncate,
        SnapshotStart.of(row.snapshot),
        SnapshotStart.lone(row),
        row.key_changes,
        row.deletes,
        row.toast,
        row.other_schemas,
        row.records,
        row.newest_commit,
        tuple(row.oldest_upsert) if row.oldest_upsert and not row.unplaced else None,
        tuple(row.newest_change) if row.newest_change and not row.unplaced else None,
        row.lone_tombstones,
    )


def row_type_of(changes: DataFrame) -> StructType:
    """The type of the changes' row images (``after``): a struct, as parsing builds it."""
    row_type = changes.schema["after"].dataType
    assert isinstance(row_type, StructType)
    return row_type
