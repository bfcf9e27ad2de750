"""A batch of a table with a primary key, MERGEd into its refined table: the last change per key
(primary-key changes: :mod:`refine.rekey`), checked against the table's expectations; the deleted
keys, truncates and snapshot starts recorded first (:mod:`refine.deleted`), so a replayed change
cannot bring a row back; then the exploded arrays' child tables and the history (:mod:`refine.history`)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc.core.errors import ConfigError
from refine.batch_facts import BatchFacts, row_type_of
from refine.deleted import (
    record_deletes,
    record_snapshot_removals,
    record_truncate,
    with_deleted_images,
    without_resurrections,
)
from refine.envelope import ConnectSchema
from refine.flatten import array_element
from refine.history import record_debezium_history
from refine.latest import latest_per_key
from refine.merge import merge_changes, refresh_children
from refine.rekey import batch_states, fill_from_old_keys, stored_states
from refine.rules import TableRules


@dataclass(frozen=True)
class KeyedTables:
    """Where a keyed table's batch is written."""

    name: str  # the refined table's name, for errors
    refined: str
    deleted: str  # the deleted keys (refine/deleted.py)
    children: dict[str, str]  # exploded array path -> its child table's location
    history: str | None  # the history table's location, when one is kept


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
    _check_explode(row_type_of(changes), tables)
    filled, latest = _latest_changes(spark, changes, key_schema, key_columns, facts, tables)
    with rules.enforced_changes(spark, latest, columns, key_columns, batch_id) as enforced:
        rows = enforced.persist()  # computed once from the tables as they were
        try:
            _write_rows(spark, rows, key_columns, facts, tables)
        finally:
            rows.unpersist()
    if tables.history is not None:
        record_debezium_history(
            spark, tables.history, filled, key_columns, columns, rules.passing_versions, truncated=facts.resets
        )


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
) -> tuple[DataFrame, DataFrame]:
    """The changes with the rows of primary-key changes filled from their old keys, and the last change
    per key (a delete with the row image it removes)."""
    filled, stored = changes, None
    if facts.key_changes:  # only then are stored rows read (a scan of the refined table)
        stored = stored_states(spark, [tables.refined, tables.deleted], key_columns, row_type_of(changes))
        filled = fill_from_old_keys(changes, key_schema, stored)
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
    if facts.deletes:
        record_deletes(spark, tables.deleted, rows)
    if truncated_at is not None:
        record_truncate(spark, tables.deleted, rows, truncated_at)
    snapshot_at = None if facts.snapshot_from is None else facts.snapshot_from.position
    if snapshot_at is not None:
        record_snapshot_removals(spark, tables.deleted, tables.refined, rows, key_columns, snapshot_at)
    guarded = without_resurrections(spark, tables.deleted, rows, key_columns)
    keys = rows.select(*[F.col(f"`{key}`") for key in key_columns])  # cached with rows
    merge_changes(spark, tables.refined, guarded, key_columns, truncated_at, keys=keys, snapshot_at=snapshot_at)
    for path, child in tables.children.items():
        refresh_children(spark, tables.refined, child, keys, key_columns, path, truncated=facts.resets)
