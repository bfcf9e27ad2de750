"""SCD type 2: a history table keeping every version of each keyed row, maintained by MERGE.

Input: a batch of changes, one row per change, holding the key columns, the row's columns, the
change's source position (one or more columns that order a key's changes, e.g. ``_cdc_lsn``,
``_cdc_offset``) and an op column (:class:`ChangeOp`: ``upsert`` or ``delete``).

The history table holds the changes' columns (without the op column) and:

- ``_cdc_valid_from``: when the version became valid (the value of the spec's ``valid_from_column``,
  by default the first position column; e.g. ``_cdc_committed_at``);
- ``_cdc_valid_to``: when it stopped being valid: the next version's ``_cdc_valid_from``, or the
  delete's; null while it is current;
- ``_cdc_is_current``: true for the one current version of a key that exists (never for a deleted key);
- ``_cdc_is_deleted``: true for a delete's marker row. A delete closes the version before it and is
  kept as a zero-length version (``_cdc_valid_to = _cdc_valid_from``), so a late change is still
  placed before or after it; the marker never matches an as-of query.

The row valid at time ``t``: ``_cdc_valid_from <= t AND (_cdc_valid_to IS NULL OR t < _cdc_valid_to)``.

Order is the source position, never arrival: a change that arrives late is inserted in its place and
its neighbours' validity is adjusted; a change already in the table (same key and position) changes
nothing, so replays and reruns are harmless. Keys and positions must not be null; valid-from values
should grow with the position (they do for a database's commit times).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from functools import reduce

from delta.tables import DeltaTable
from pydantic import Field, model_validator
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType

from cdc.core.config import _Strict
from cdc.core.errors import ConfigError
from cdc.core.tables import is_delta_table
from refine.apply.latest import SnapshotStart, at_or_after, from_snapshot_start, resets_table
from refine.apply.merge import (
    COMMITTED_AT,
    DELETED_AT,
    LSN,
    OFFSET,
    OP,
    REFINED_AT,
    SOURCE_POSITION,
    TableSettings,
    ensure_refined_table,
    refined_rows,
)
from refine.apply.schema_changes import conformed
from refine.records.envelope import Op
from refine.records.toast import ValueTest, placeholder_test

VALID_FROM, VALID_TO, IS_CURRENT, IS_DELETED = "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"
HISTORY_COLUMNS = (VALID_FROM, VALID_TO, IS_CURRENT, IS_DELETED)
HISTORY_KIND = "history"


class ChangeOp(str, Enum):
    """What a change does to its key: a new version of the row, or its deletion."""

    UPSERT = "upsert"
    DELETE = "delete"


def op_of_debezium(op: Column) -> Column:
    """The ChangeOp of a Debezium op (``d`` deletes; ``c``, ``u``, ``r`` upsert), e.g. of a refined row's
    ``_cdc_op``."""
    return F.when(op == Op.DELETE.value, F.lit(ChangeOp.DELETE.value)).otherwise(F.lit(ChangeOp.UPSERT.value))


CHANGE = "_cdc_change"  # the op column of a Debezium table's versions (not stored)


def debezium_versions(rows: DataFrame) -> DataFrame:
    """A Debezium table's refined rows (one per change, with ``_cdc_op``) as versions: with their ChangeOp."""
    return rows.withColumn(CHANGE, op_of_debezium(F.col(OP)))


def debezium_history_spec(
    key_columns: list[str], position_columns: list[str], tracked_columns: list[str] | None = None
) -> HistorySpec:
    """The history of a Debezium table: by its key, in source order, valid from the commit time."""
    return HistorySpec(
        key_columns=key_columns,
        position_columns=position_columns,
        valid_from_column=COMMITTED_AT,
        op_column=CHANGE,
        tracked_columns=tracked_columns,
    )


class HistorySpec(_Strict):
    """Which columns of a batch of changes identify, order and date a row's versions."""

    key_columns: list[str] = Field(min_length=1, description="The columns identifying a row (its primary key).")
    position_columns: list[str] = Field(
        min_length=1, description="The source position ordering a key's changes, most significant first."
    )
    valid_from_column: str | None = Field(
        default=None,
        description="The column whose value starts a version's validity; default the first position column.",
    )
    op_column: str = Field(default="op", description="The column holding the change's ChangeOp: 'upsert' or 'delete'.")
    tracked_columns: list[str] | None = Field(
        default=None,
        description="The columns whose change starts a new version; a change of none of them updates the version "
        "before it in place (its other columns, and ``<position>_last``: the position of the change it holds). "
        "None: every column.",
    )

    @model_validator(mode="after")
    def _distinct_roles(self) -> HistorySpec:
        if self.op_column in (*self.key_columns, *self.position_columns):
            raise ValueError(f"op_column {self.op_column!r} cannot also be a key or position column")
        return self

    @property
    def valid_from(self) -> str:
        return self.valid_from_column or self.position_columns[0]

    @property
    def last_change_columns(self) -> list[str]:
        """With ``tracked_columns``: each version's position of the last change it holds."""
        return [] if self.tracked_columns is None else [f"{c}_last" for c in self.position_columns]

    @property
    def version_columns(self) -> list[str]:
        """What identifies one version: the key and the position."""
        return [*self.key_columns, *self.position_columns]

    def check_columns(self, changes: DataFrame) -> None:
        """ConfigError naming a column the spec needs that the changes lack, or a reserved name they use."""
        names = set(changes.columns)
        for role, column in [
            *(("key column", c) for c in self.key_columns),
            *(("position column", c) for c in self.position_columns),
            ("valid-from column", self.valid_from),
            ("op column", self.op_column),
        ]:
            if column not in names:
                raise ConfigError(f"the changes have no {role} {column!r}", columns=", ".join(changes.columns))
        if reserved := names & set(HISTORY_COLUMNS):
            raise ConfigError(f"the changes use columns reserved for the history table: {', '.join(sorted(reserved))}")


def arriving_versions(changes: DataFrame, spec: HistorySpec) -> DataFrame:
    """The batch's changes as version rows: op column replaced by ``_cdc_valid_from`` and
    ``_cdc_is_deleted``; a change repeated in the batch (same key and position) kept once."""
    columns = [c for c in changes.columns if c != spec.op_column]
    return changes.select(
        *columns,
        *[F.col(p).alias(last) for p, last in zip(spec.position_columns, spec.last_change_columns, strict=False)],
        F.col(spec.valid_from).alias(VALID_FROM),
        (F.col(spec.op_column) == ChangeOp.DELETE.value).alias(IS_DELETED),
    ).dropDuplicates(spec.version_columns)


def history_updates(
    existing: DataFrame, arriving: DataFrame, spec: HistorySpec, unchanged: dict[str, ValueTest] | None = None
) -> DataFrame:
    """The rows to MERGE into the history table (pure): arriving versions it does not hold yet, and
    held versions whose validity changes, each with its ``_cdc_valid_to`` and ``_cdc_is_current``.

    ``existing`` is the history table's versions of the arriving keys (all of them: a late change's
    neighbours can be anywhere in the key's history). ``unchanged`` maps columns to a test of the
    values that mean "as in the previous version" (Debezium's TOAST placeholder): an arriving version
    holding one takes the key's previous value of the column instead."""
    fresh = arriving.join(existing.select(*spec.version_columns), spec.version_columns, "left_anti")
    timeline = (
        existing.withColumns({"_held": F.lit(True), "_held_to": F.col(VALID_TO), "_held_current": F.col(IS_CURRENT)})
        .drop(VALID_TO, IS_CURRENT)
        .unionByName(fresh.withColumn("_held", F.lit(False)), allowMissingColumns=True)
    )
    order = Window.partitionBy(*spec.key_columns).orderBy(*spec.position_columns)
    so_far = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)

    def last_value(name: str, is_unchanged: ValueTest) -> Column:
        """The key's last value of the column that is not "unchanged" (a real NULL counts: it is
        wrapped in a struct); the value itself when there is none."""
        value = F.col(f"`{name}`")
        real = ~F.coalesce(is_unchanged(value), F.lit(False))
        found = F.last(F.when(real, F.struct(value.alias("v"))), ignorenulls=True).over(so_far)
        return F.when(found.isNotNull(), found["v"]).otherwise(value)

    timeline = timeline.withColumns({name: last_value(name, test) for name, test in (unchanged or {}).items()})
    timeline = _untracked_changes_absorbed(timeline, spec, order)
    is_last = F.lead(F.lit(True)).over(order).isNull()
    deleted = F.col(IS_DELETED)
    updated = timeline.withColumns(
        {
            VALID_TO: F.when(deleted, F.col(VALID_FROM)).otherwise(F.lead(VALID_FROM).over(order)),
            IS_CURRENT: is_last & ~deleted,
        }
    )
    changed = (
        ~F.col("_held")
        | ~F.col(VALID_TO).eqNullSafe(F.col("_held_to"))
        | (F.col(IS_CURRENT) != F.col("_held_current"))
        | F.col("_values_changed")
    )
    return updated.where(changed).drop("_held", "_held_to", "_held_current", "_values_changed")


def _untracked_changes_absorbed(timeline: DataFrame, spec: HistorySpec, order: WindowSpec) -> DataFrame:
    """The ``timeline`` with each arriving version that changes no tracked column (of a key's version that
    is not a delete) folded into the version before it: that version takes the values of the latest
    change it holds (by ``<position>_last``, so a change delivered again, older than one it holds, changes
    nothing); ``_values_changed`` marks held versions whose values so change."""
    if spec.tracked_columns is None:
        return timeline.withColumn("_values_changed", F.lit(False))
    lasts = spec.last_change_columns
    held_lasts = {last: F.col(f"`{last}`") if last in timeline.columns else F.lit(None) for last in lasts}
    timeline = timeline.withColumns(
        {
            "_held_last": F.struct(*[held_lasts[last].alias(last) for last in lasts]),
            **{
                last: F.coalesce(held_lasts[last], F.col(f"`{p}`"))
                for p, last in zip(spec.position_columns, lasts, strict=True)
            },
        }
    )
    same = [F.col(f"`{c}`").eqNullSafe(F.lag(F.col(f"`{c}`")).over(order)) for c in spec.tracked_columns]
    absorbed = (
        ~F.col("_held")
        & ~F.col(IS_DELETED)
        & F.lag(F.lit(True)).over(order).isNotNull()
        & ~F.coalesce(F.lag(F.col(IS_DELETED)).over(order), F.lit(True))
        & reduce(Column.__and__, same, F.lit(True))
    )
    timeline = timeline.withColumn("_absorbed", absorbed)
    timeline = timeline.withColumn(
        "_run", F.sum(F.when(F.col("_absorbed"), 0).otherwise(1)).over(order.rowsBetween(Window.unboundedPreceding, 0))
    )
    fixed = {
        *spec.version_columns,
        VALID_FROM,
        IS_DELETED,
        "_held",
        "_held_to",
        "_held_current",
        "_held_last",
        "_absorbed",
        "_run",
    }
    values = [c for c in timeline.columns if c not in fixed]
    newest = Window.partitionBy(*spec.key_columns, "_run").orderBy(*[F.col(last).desc() for last in lasts])
    winner = F.first(F.struct(*[F.col(f"`{c}`").alias(c) for c in values])).over(newest)
    folded = timeline.withColumn("_winner", winner).where(~F.col("_absorbed"))
    folded = folded.withColumns({c: F.col("_winner")[c] for c in values})
    moved = F.col("_held") & ~F.struct(*[F.col(last) for last in lasts]).eqNullSafe(F.col("_held_last"))
    return folded.withColumn("_values_changed", moved).drop("_winner", "_absorbed", "_run", "_held_last")


def closing_versions(
    history: DataFrame, spec: HistorySpec, columns: StructType, at: dict[str, object], values: dict[str, Column]
) -> DataFrame:
    """Delete versions at position ``at`` (position column -> value) for every key of the ``history``
    table whose last version before it is not a delete: what a truncate does. Their other columns are
    ``values`` or null; ``columns`` is the schema of the changes they join."""
    position = [F.col(column) for column in spec.position_columns]
    before = ~at_or_after(position, [F.lit(at[column]) for column in spec.position_columns])
    last = Window.partitionBy(*spec.key_columns).orderBy(*[p.desc() for p in position])
    open_keys = (
        history.where(before)
        .withColumn("_rank", F.row_number().over(last))
        .where(F.col("_rank") == 1)
        .where(~F.col(IS_DELETED))
        .select(*spec.key_columns)
    )
    fixed = {**{c: F.lit(v) for c, v in at.items()}, **values, spec.op_column: F.lit(ChangeOp.DELETE.value)}
    return open_keys.select(
        *[
            F.col(f"`{f.name}`")
            if f.name in spec.key_columns
            else fixed.get(f.name, F.lit(None)).cast(f.dataType).alias(f.name)
            for f in columns.fields
        ]
    )


def apply_history(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    changes: DataFrame,
    spec: HistorySpec,
    unchanged: dict[str, ValueTest] | None = None,
    whole_rows: bool = False,
) -> None:
    """MERGE a batch of changes into the history table at ``location`` (created on first use, with
    Change Data Feed on and ``cdc.kind=history``; it follows the changes' schema as
    :func:`refine.apply.merge.ensure_refined_table` does); ``unchanged`` as in :func:`history_updates`;
    ``whole_rows`` as in :func:`refine.apply.merge.merge_changes`."""
    spec.check_columns(changes)
    arriving = arriving_versions(changes, spec)
    schema = StructType(
        [
            *(StructField(f.name, f.dataType) for f in arriving.schema if f.name != IS_DELETED),
            StructField(VALID_TO, arriving.schema[VALID_FROM].dataType),
            StructField(IS_CURRENT, BooleanType()),
            StructField(IS_DELETED, BooleanType()),
        ]
    )
    table = ensure_refined_table(spark, location, settings, schema, kind=HISTORY_KIND, source_columns=whole_rows)
    # Of the table's types; a column the source dropped is NULL in the versions after the drop.
    versions = StructType([f for f in table if f.name not in (VALID_TO, IS_CURRENT)])
    arriving = conformed(arriving, versions, whole_rows, settings.schema_rules.source_time_zone)
    history = spark.read.format("delta").load(location)
    existing = history.join(arriving.select(*spec.key_columns).distinct(), spec.key_columns, "left_semi")
    updates = history_updates(existing, arriving, spec, unchanged)
    same_version = " AND ".join(f"t.`{c}` = s.`{c}`" for c in spec.version_columns)
    held = [VALID_TO, IS_CURRENT]
    if spec.tracked_columns is not None:  # a version updated in place by untracked changes
        held += [c for c in updates.columns if c not in (*spec.version_columns, VALID_FROM, IS_DELETED)]
    (
        DeltaTable.forPath(spark, location)
        .alias("t")
        .merge(updates.alias("s"), same_version)
        .whenMatchedUpdate(set={f"`{c}`": F.col(f"s.`{c}`") for c in dict.fromkeys(held)})
        .whenNotMatchedInsert(values={f"`{f.name}`": F.col(f"s.`{f.name}`") for f in updates.schema})
        .execute()
    )


def delivered_first(versions: DataFrame, held: DataFrame | None, key_columns: list[str]) -> DataFrame:
    """``versions`` without the streamed changes delivered again (pure): Kafka Connect re-sends a change at
    a later offset, with the LSN and op it had. A streamed change (op ``c``, ``u``, ``d``) whose key, LSN
    and op the ``held`` versions (the history table's; None before its first batch) or an earlier offset of
    the batch already have is left out. Snapshot reads and a reset's delete versions share a snapshot's LSN
    (and two snapshots may share one): they stay told apart by their whole position. Without an LSN (0: rows
    flattened without ``__lsn``) a change cannot be told from one delivered again: each is kept."""
    change = [*key_columns, LSN, OP]
    streamed = F.col(OP).isin(Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value) & (F.col(LSN) != 0)
    first = F.row_number().over(Window.partitionBy(*change).orderBy(F.col(OFFSET)))
    in_batch = versions.withColumn("_first", F.when(streamed, first).otherwise(F.lit(1)))
    once = in_batch.where(F.col("_first") == 1).drop("_first")
    if held is None:
        return once
    again = once.where(streamed).join(held.select(*change).distinct(), change, "left_semi")
    return once.join(again.select(*change, OFFSET), [*change, OFFSET], "left_anti").select(*versions.columns)


def record_debezium_history(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    changes: DataFrame,
    key_columns: list[str],
    columns: list[str],
    passing: Callable[[DataFrame, Column], DataFrame],
    truncated: bool,
    whole_rows: bool = False,
    shaped: Callable[[DataFrame], DataFrame] | None = None,
    tracked: Callable[[str], bool] | None = None,
) -> None:
    """Every change of a batch of parsed Debezium ``changes`` as a version of its row in the history
    table at ``location`` (TOAST placeholders take the previous version's value); with ``truncated``,
    each truncate (or snapshot start) closes the versions open before it. ``passing``: the versions that
    pass the table's expectations (:meth:`refine.apply.rules.TableRules.passing_versions`); ``whole_rows`` as in
    :func:`refine.apply.merge.merge_changes`; ``shaped``: the table's shape applied to refined rows (a row that
    stops matching its ``where`` is a delete version); ``tracked``: whether a column's change starts a new
    version (None: every column's does)."""
    row_changes = changes.where(F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value))
    rows = refined_rows(row_changes, columns)
    if shaped is not None:
        rows = shaped(rows).drop(DELETED_AT)  # a history's deletes are its delete versions
    tracked_columns = None if tracked is None else [c for c in rows.columns if not c.startswith("_cdc_") and tracked(c)]
    spec = debezium_history_spec(key_columns, list(SOURCE_POSITION), tracked_columns)
    versions = debezium_versions(rows)
    versions = passing(versions, F.col(CHANGE) == ChangeOp.DELETE.value)
    # A batch's own records delivered twice are left out in the history's first batch too.
    held = spark.read.format("delta").load(location) if is_delta_table(spark, location) else None
    versions = delivered_first(versions, held, key_columns)
    unchanged = {
        f.name: test
        for f in versions.schema
        if f.name in columns and (test := placeholder_test(f.dataType)) is not None
    }
    position = [F.col(c) for c in SOURCE_POSITION]
    done = None  # versions up to here are applied
    for reset in _batch_resets(changes) if truncated else []:
        at = [F.lit(reset.source_lsn), F.lit(reset.kafka_offset)]
        part = versions.where(~at_or_after(position, at))
        earlier = part if done is None else part.where(at_or_after(position, done))
        apply_history(spark, location, settings, earlier, spec, unchanged, whole_rows)
        history = spark.read.format("delta").load(location)
        if reset.op == Op.READ.value and not history.where(at_or_after(position, at)).isEmpty():
            done = at
            continue  # a replayed old snapshot: the history already holds what came after it
        closing = _closed_by_reset(history, spec, versions.schema, reset, row_changes, key_columns)
        apply_history(spark, location, settings, closing, spec, unchanged, whole_rows)
        done = at
    later = versions if done is None else versions.where(at_or_after(position, done))
    apply_history(spark, location, settings, later, spec, unchanged, whole_rows)


def _batch_resets(changes: DataFrame) -> list[Row]:
    """The batch's truncates and snapshot starts, in order: a handful of positions, not data."""
    return (
        changes.where(resets_table())
        .select("source_lsn", "kafka_offset", "kafka_partition", "source_committed_at", "op")
        .distinct()
        .orderBy("source_lsn", "kafka_offset")
        .collect()
    )


def _closed_by_reset(
    history: DataFrame,
    spec: HistorySpec,
    columns: StructType,
    reset: Row,
    row_changes: DataFrame,
    key_columns: list[str],
) -> DataFrame:
    """The delete versions a truncate or snapshot start (``reset``) closes the open versions of the
    ``history`` with; a snapshot leaves open the keys the batch changes from its first read on."""
    closing = closing_versions(
        history,
        spec,
        columns,
        dict(zip(SOURCE_POSITION, reset[:2], strict=True)),
        {COMMITTED_AT: F.lit(reset.source_committed_at), OP: F.lit(reset.op), REFINED_AT: F.current_timestamp()},
    )
    if reset.op == Op.READ.value:
        start = SnapshotStart(reset.kafka_partition, reset.kafka_offset, reset.source_lsn)
        changed = row_changes.where(from_snapshot_start(start)).select(
            *[F.col(f"key.`{k}`").alias(k) for k in key_columns]
        )
        closing = closing.join(changed, key_columns, "left_anti")
    return closing
