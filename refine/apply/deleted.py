"""Deleted keys: where each deleted row was deleted, so no late or replayed change brings it back.

A MERGE that deletes a row deletes its position guard with it: a replayed create of the key (Debezium
delivers at least once) would then insert it again. So each refined table of a keyed source has a
side table, ``<warehouse>/_cdc/deleted/<topic>``, holding each deleted key with the position of its
delete and the row's last image (which a primary-key change's create may need when its delete came
in an earlier batch: see :mod:`refine.apply.rekey`). It has the refined table's columns, ``_cdc_op`` being
``d``.

A truncate deletes every row older than it without naming them: its position is kept as the side
table's property ``cdc.truncated_at``, and changes older than it are dropped too. A new snapshot's
first read deletes the older rows it does not read again: those are recorded as deleted at its
position, by key (changes older than the snapshot stay valid for other keys: a transaction open
across the snapshot's LSN comes after it with lower LSNs).

Why a side table and not soft-deleted rows in the refined table: readers of the refined table see
exactly the source table, with no filter to remember and no view to maintain.

A batch with deletes appends them to the side table first; then changes at or before their key's
latest recorded delete are dropped before the refined MERGE. That join is left out when every create and
update of the batch comes after the newest position the side table may hold (:class:`DeletedBound`, kept
between batches and checked against the side table's version): as in a stream without replays, where it
cost a warm batch three Spark jobs and a fifth of its time. The side table is append-only: a key
deleted twice has two entries, and a recreated key keeps its entry, which is harmless, as an entry
only drops changes at or before its delete and the recreated row's position is after it. An append
is one write, where a MERGE into the side table would cost a join and a rewrite on every batch with
deletes. A batch replayed after a crash appends its deletes again: the same entries twice, which
drop the same changes, so both steps stay idempotent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc.core.tables import delta_properties, is_delta_table, table_snapshot
from refine.apply.latest import at_or_after
from refine.apply.merge import LSN, OFFSET, OP, TableSettings, ensure_refined_table
from refine.apply.rekey import with_state_before
from refine.apply.schema_changes import conformed
from refine.records.envelope import Op
from refine.records.flattened import LONE_TOMBSTONE_LSN

DELETED_KIND = "deleted"
_LAST_OFFSET = 2**63 - 1
TRUNCATED_AT_PROPERTY = "cdc.truncated_at"


def deleted_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/_cdc/deleted/{topic}"


def with_deleted_images(latest: DataFrame, states: DataFrame, stored: DataFrame | None) -> DataFrame:
    """``latest`` with each delete's ``before`` replaced by the row's last image before it (the
    delete itself carries only the key), keeping the key from the delete."""
    is_delete = F.col("op") == Op.DELETE.value
    with_prior = with_state_before(latest, is_delete, F.col("key"), states, stored)
    before_type = latest.schema["before"].dataType
    assert isinstance(before_type, StructType)
    key_type = latest.schema["key"].dataType
    assert isinstance(key_type, StructType)
    keys = set(key_type.fieldNames())
    image = F.struct(
        *[
            (F.col(f"key.`{f.name}`") if f.name in keys else F.col(f"image.`{f.name}`")).alias(f.name)
            for f in before_type.fields
        ]
    )
    return with_prior.withColumn("before", F.when(is_delete, image).otherwise(F.col("before"))).drop("image")


def _strictly_after(newer: str, older: str) -> Column:
    return ~at_or_after(
        [F.col(f"{older}.{LSN}"), F.col(f"{older}.{OFFSET}")], [F.col(f"{newer}.{LSN}"), F.col(f"{newer}.{OFFSET}")]
    )


def _ensure_side_table(spark: SparkSession, location: str, settings: TableSettings, rows: DataFrame) -> StructType:
    schema = StructType([StructField(f.name, f.dataType) for f in rows.schema])
    return ensure_refined_table(spark, location, settings.side(), schema, kind=DELETED_KIND)


def record_deletes(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    rows: DataFrame,
    lone_tombstones: tuple[str, list[str]] | None = None,
) -> None:
    """Append the deletes among a batch's refined ``rows`` (the last change per key) to the side table
    (of the refined table's ``settings``, without its features). ``lone_tombstones``: the refined table and its
    key columns, when the rows hold a flattened topic's tombstone without an LSN of its own."""
    side_table = _ensure_side_table(spark, location, settings, rows)
    zone = settings.schema_rules.source_time_zone
    deletes = rows.where(F.col(OP) == Op.DELETE.value)
    if lone_tombstones is not None:
        deletes = _placed_at_their_rows(spark, deletes, *lone_tombstones)
    conformed(deletes, side_table, True, zone).write.format("delta").mode("append").save(location)


def _placed_at_their_rows(spark: SparkSession, deletes: DataFrame, refined: str, key_columns: list[str]) -> DataFrame:
    """``deletes`` with each lone tombstone's entry at the LSN of the row it deletes (read before the MERGE),
    after every offset: a replay of that row's changes stays out, a create of the key by a later transaction
    comes in. Its own LSN, the largest, would keep every later create of the key out for good."""
    if not is_delta_table(spark, refined):
        return deletes
    stored = (
        spark.read.format("delta")
        .load(refined)
        .select(*[F.col(f"`{k}`") for k in key_columns], F.col(LSN).alias("_cdc_stored_lsn"))
    )
    lone = F.col(LSN) == LONE_TOMBSTONE_LSN
    return (
        deletes.join(stored, key_columns, "left")
        .withColumn(OFFSET, F.when(lone, F.lit(_LAST_OFFSET)).otherwise(F.col(OFFSET)))
        .withColumn(LSN, F.when(lone, F.coalesce(F.col("_cdc_stored_lsn"), F.lit(0))).otherwise(F.col(LSN)))
        .drop("_cdc_stored_lsn")
    )


def record_truncate(
    spark: SparkSession, location: str, settings: TableSettings, rows: DataFrame, truncated_at: tuple[int, int]
) -> None:
    """Keep the position of the table's last truncate (a property of the side table, created with the
    columns of the batch's refined ``rows`` if this is its first entry): every row older than it is
    deleted, and no change older than it may come back."""
    _ensure_side_table(spark, location, settings, rows)
    if (last := _truncated_at(spark, location)) is None or truncated_at > last:
        spark.sql(
            f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES "
            f"('{TRUNCATED_AT_PROPERTY}' = '{truncated_at[0]}:{truncated_at[1]}')"
        )


def record_snapshot_removals(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    refined: str,
    rows: DataFrame,
    key_columns: list[str],
    snapshot_at: tuple[int, int],
) -> None:
    """Record as deleted at ``snapshot_at`` (a snapshot's first read) the rows of the ``refined`` table older
    than it that the batch's ``rows`` do not hold: the MERGE deletes them, as the snapshot did not read them
    again, and a replayed older change must not bring them back. Read before that MERGE (a whole scan of the
    table, once per snapshot); a batch replayed after it finds them deleted already."""
    if not is_delta_table(spark, refined):
        return
    lsn, offset = snapshot_at
    stored = spark.read.format("delta").load(refined)
    older = ~at_or_after([F.col(LSN), F.col(OFFSET)], [F.lit(lsn), F.lit(offset)])
    removed = stored.where(older).join(rows.select(*[F.col(f"`{k}`") for k in key_columns]), key_columns, "left_anti")
    marked = {LSN: F.lit(lsn), OFFSET: F.lit(offset), OP: F.lit(Op.DELETE.value)}
    removed = removed.select(
        *[
            (marked[f.name] if f.name in marked else F.col(f"`{f.name}`") if f.name in stored.columns else F.lit(None))
            .cast(f.dataType)
            .alias(f.name)
            for f in rows.schema
        ]
    )
    record_deletes(spark, location, settings, removed)


@dataclass
class DeletedBound:
    """At or after every position (LSN, Kafka offset) the side table records, a delete's or its truncate's:
    valid for the side table at ``table`` (its Delta id and version; None: not known yet). ``newest`` None with a
    table: it records none."""

    table: tuple[str, int] | None = None
    newest: tuple[int, int] | None = None

    def holds_for(self, spark: SparkSession, location: str) -> bool:
        return self.table is not None and self.table == _side_table_at(spark, location)

    def may_drop(self, spark: SparkSession, location: str, oldest_upsert: tuple[int, int] | None) -> bool:
        """Whether the side table may drop a change of a batch whose oldest create or update is at
        ``oldest_upsert`` (None: unknown), as it is before the batch records in it: each key has one change in
        a batch's rows, so its own deletes drop none of them."""
        if oldest_upsert is None or not is_delta_table(spark, location):
            return oldest_upsert is None
        newest = self._read(spark, location)
        return newest is not None and oldest_upsert <= newest

    def _read(self, spark: SparkSession, location: str) -> tuple[int, int] | None:
        """The newest position the side table records, from this bound while it holds, else read (one
        aggregate over the side table)."""
        if not self.holds_for(spark, location):
            at = _side_table_at(spark, location)
            placed = spark.read.format("delta").load(location).where(F.col(LSN).isNotNull() & F.col(OFFSET).isNotNull())
            newest = placed.agg(F.max(F.struct(LSN, OFFSET)).alias("newest"))  # an entry without both drops nothing
            row = newest.collect()[0].newest
            recorded = [tuple(row)] if row is not None else []
            truncated = _truncated_at(spark, location)
            self.table, self.newest = at, max([*recorded, *([truncated] if truncated else [])], default=None)
        return self.newest

    @contextmanager
    def recording(
        self, spark: SparkSession, location: str, newest_change: tuple[int, int] | None, records: bool
    ) -> Iterator[None]:
        """Follow the side table through the block, where a batch whose changes are at or before
        ``newest_change`` (None: unknown) ``records`` in it: the bound moves to that position when it held
        before (or there was no side table), else is read again when next needed."""
        if not records:
            yield
            return
        existed = is_delta_table(spark, location)
        held = self.holds_for(spark, location) if existed else self.table is None
        self.table = None  # not valid while the side table changes (a failed write included)
        yield
        if held and newest_change is not None and is_delta_table(spark, location):
            self.table = _side_table_at(spark, location)
            self.newest = max([newest_change, *([self.newest] if existed and self.newest else [])])


def _side_table_at(spark: SparkSession, location: str) -> tuple[str, int]:
    snapshot = table_snapshot(spark, location)
    return snapshot.table_id, snapshot.version


def _truncated_at(spark: SparkSession, location: str) -> tuple[int, int] | None:
    properties = delta_properties(spark, location)
    if TRUNCATED_AT_PROPERTY not in properties:
        return None
    lsn, offset = properties[TRUNCATED_AT_PROPERTY].split(":")
    return int(lsn), int(offset)


def without_resurrections(spark: SparkSession, location: str, rows: DataFrame, key_columns: list[str]) -> DataFrame:
    """``rows`` without creates and updates at or before their key's recorded delete or the table's
    last truncate."""
    if not is_delta_table(spark, location):
        return rows
    if (truncated_at := _truncated_at(spark, location)) is not None:
        after_truncate = at_or_after([F.col(LSN), F.col(OFFSET)], [F.lit(v) for v in truncated_at])
        rows = rows.where((F.col(OP) == Op.DELETE.value) | after_truncate)
    deleted = spark.read.format("delta").load(location).select(*[F.col(f"`{k}`") for k in key_columns], LSN, OFFSET)
    same_key = [F.col(f"s.`{k}`") == F.col(f"d.`{k}`") for k in key_columns]
    stale = reduce(Column.__and__, same_key, (F.col(f"s.{OP}") != Op.DELETE.value) & ~_strictly_after("s", "d"))
    return rows.alias("s").join(deleted.alias("d"), stale, "left_anti")
