"""A batch of a table with a primary key, MERGEd into its refined table: the last change per key
(primary-key changes: :mod:`refine.apply.rekey`), checked against the table's expectations; the deleted
keys, truncates and snapshot starts recorded first (:mod:`refine.apply.deleted`), so a replayed change
cannot bring a row back; then the exploded arrays' child tables and the history (:mod:`refine.apply.history`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc.core.errors import ConfigError
from cdc.core.frames import computed_once
from cdc.core.tables import is_delta_table
from refine.apply.batch_facts import BatchFacts, row_type_of
from refine.apply.deleted import (
    DELETED_KIND,
    DeletedBound,
    record_deletes,
    record_snapshot_removals,
    record_truncate,
    with_deleted_images,
    without_resurrections,
)
from refine.apply.flatten import array_element
from refine.apply.history import record_debezium_history
from refine.apply.latest import latest_per_key
from refine.apply.merge import TableSettings, ensure_refined_table, merge_changes, refined_rows, refresh_children
from refine.apply.rekey import batch_states, fill_from_old_keys, stored_states
from refine.apply.rules import TableRules
from refine.apply.shaping import (
    DeleteMode,
    TableShape,
    fill_ignored_nulls,
    masked_values,
    shaped_rows,
    with_masked_keys,
)
from refine.records.envelope import ConnectSchema


@dataclass(frozen=True)
class KeyedTables:
    """Where a keyed table's batch is written."""

    name: str  # the refined table's name, for errors
    refined: str
    deleted: str  # the deleted keys (refine/apply/deleted.py)
    children: dict[str, str]  # exploded array path -> its child table's location
    history: str | None  # the history table's location, when one is kept
    settings: TableSettings  # what the job declares for them (the deleted keys: settings.side())
    shape: TableShape = field(default_factory=TableShape)  # how the refined, history and child tables are shaped
    mask_key: bytes | None = None  # the hmac_sha256 key (read once by the job)
    deleted_bound: DeletedBound = field(default_factory=DeletedBound)  # kept between batches

    def shaped(self, rows: DataFrame, key_columns: list[str]) -> DataFrame:
        """Refined rows as the shape declares them (:func:`refine.apply.shaping.shaped_rows`)."""
        return shaped_rows(rows, self.shape, key_columns, self.name, self.mask_key)

    def masked(self, rows: DataFrame) -> DataFrame:
        """Rows of source columns with the masked ones masked (:func:`refine.apply.shaping.masked_values`): what
        the quarantine keeps of a row an expectation dropped."""
        return masked_values(rows, self.shape, self.mask_key)


def merge_keyed_batch(
    spark: SparkSession,
    changes: DataFrame,
    key_schema: ConnectSchema,
    columns: list[str],
    facts: BatchFacts,
    tables: KeyedTables,
    rules: TableRules,
    batch_id: int,
) -> None:
    """MERGE a batch's valid parsed ``changes`` (of the refined ``columns``, keyed by ``key_schema``)
    into ``tables``."""
    key_columns = [field.field_name for field in key_schema.fields or ()]
    tables.shape.check_keys(key_columns, tables.name)
    changes = with_masked_keys(changes, tables.shape, key_columns, tables.mask_key)
    _check_explode(row_type_of(changes), tables)
    _follow_schema(spark, changes, columns, key_columns, tables)
    ignored = tables.shape.ignored_nulls(columns, key_columns)
    filled, latest = _latest_changes(spark, changes, key_schema, key_columns, facts, tables, ignored)
    with (
        rules.enforced_changes(spark, latest, columns, key_columns, batch_id, tables.masked) as enforced,
        # Computed once, from the tables as they were, and planned as a leaf by each write that reads them.
        computed_once(tables.shaped(enforced, key_columns)) as rows,
    ):
        _write_rows(spark, rows, key_columns, facts, tables)
    if tables.history is not None:
        record_debezium_history(
            spark,
            tables.history,
            tables.settings,
            filled,
            key_columns,
            columns,
            rules.passing_versions,
            truncated=facts.resets,
            whole_rows=True,
            shaped=lambda versions: tables.shaped(versions, key_columns),
            tracked=None if tables.shape.tracks_all else tables.shape.tracked,
        )


def _follow_schema(
    spark: SparkSession, changes: DataFrame, columns: list[str], key_columns: list[str], tables: KeyedTables
) -> None:
    """Give the refined table and its deleted keys a column the source changed (:mod:`refine.apply.schema_changes`)
    before the batch reads them: a table rewritten after a read of it would fail that read."""
    if is_delta_table(spark, tables.refined):
        rows = tables.shaped(refined_rows(changes, columns), key_columns)
        schema = StructType([StructField(f.name, f.dataType) for f in rows.schema])
        ensure_refined_table(spark, tables.refined, tables.settings, schema, source_columns=True)
        if is_delta_table(spark, tables.deleted):
            ensure_refined_table(spark, tables.deleted, tables.settings.side(), schema, kind=DELETED_KIND)


def _check_explode(row_type: StructType, tables: KeyedTables) -> None:
    for path in tables.children:
        try:
            array_element(row_type, path)
        except ConfigError as error:
            raise ConfigError(f"explode: {error.message}", table=tables.name) from None


def _latest_changes(
    spark: SparkSession,
    changes: DataFrame,
    key_schema: ConnectSchema,
    key_columns: list[str],
    facts: BatchFacts,
    tables: KeyedTables,
    ignored_nulls: list[str],
) -> tuple[DataFrame, DataFrame]:
    """The changes with the rows of primary-key changes filled from their old keys (and, with
    ``ignored_nulls``, those columns' NULLs from the key's earlier changes), and the last change per key
    (a delete with the row image it removes)."""
    filled, stored = changes, None
    if facts.key_changes:  # only then are stored rows read (a scan of the refined table)
        stored = stored_states(spark, [tables.refined, tables.deleted], key_columns, row_type_of(changes))
        filled = fill_from_old_keys(changes, key_schema, stored)
    filled = fill_ignored_nulls(filled, key_columns, ignored_nulls)
    latest = latest_per_key(filled, key_columns, facts.truncated_at, facts.placeholders, facts.snapshot_from)
    if facts.deletes:
        latest = with_deleted_images(latest, batch_states(filled), stored)
    return filled, latest


def _write_rows(
    spark: SparkSession, rows: DataFrame, key_columns: list[str], facts: BatchFacts, tables: KeyedTables
) -> None:
    """Record the deleted keys, truncate and snapshot start of the batch's last ``rows`` per key, then
    MERGE those that bring back no deleted row, and refresh the child tables of their keys."""
    truncated_at = facts.truncated_at
    snapshot_at = None if facts.snapshot_from is None else facts.snapshot_from.position
    deletes = facts.deletes or tables.shape.where is not None  # a row that stops matching `where` is a delete
    # A truncate of the batch drops its older changes: the guard applies it.
    oldest_upsert = facts.oldest_upsert if truncated_at is None else None
    guard = tables.deleted_bound.may_drop(spark, tables.deleted, oldest_upsert)
    with tables.deleted_bound.recording(spark, tables.deleted, facts.newest_change, deletes or facts.resets):
        if deletes:
            lone = (tables.refined, key_columns) if facts.lone_tombstones else None
            record_deletes(spark, tables.deleted, tables.settings, rows, lone)
        if truncated_at is not None:
            record_truncate(spark, tables.deleted, tables.settings, rows, truncated_at)
        if snapshot_at is not None:
            record_snapshot_removals(
                spark, tables.deleted, tables.settings, tables.refined, rows, key_columns, snapshot_at
            )
    guarded = without_resurrections(spark, tables.deleted, rows, key_columns) if guard else rows
    keys = rows.select(*[F.col(f"`{key}`") for key in key_columns])  # of the rows computed once
    merge_changes(
        spark,
        tables.refined,
        tables.settings,
        guarded,
        key_columns,
        truncated_at,
        keys=keys,
        snapshot_at=snapshot_at,
        whole_rows=True,
        soft_deletes=tables.shape.deletes is DeleteMode.SOFT,
        ignore_nulls=tables.shape.ignored_nulls([c for c in guarded.columns if not c.startswith("_cdc_")], key_columns),
    )
    for path, child in tables.children.items():
        refresh_children(spark, tables.refined, child, tables.settings, keys, key_columns, path, truncated=facts.resets)
