"""Refined tables: their rows, their schema, and the MERGE that applies a batch of changes.

A refined table holds the source table's columns and metadata columns prefixed ``_cdc_`` (never a
source column name Debezium produces for Postgres):

- ``_cdc_lsn``, ``_cdc_offset``: the source position of the row's last change (LSN, Kafka offset);
- ``_cdc_committed_at``: when that change was committed at the source;
- ``_cdc_op``: its operation (``r`` snapshot read, ``c`` create, ``u`` update);
- ``_cdc_refined_at``: when it was merged.

A change applies only when it is at or after the row's position, so replays and late duplicates
never overwrite newer state.

What a job declares for the tables it writes travels with each write as a :class:`TableSettings`: a
refined table's Delta features (:class:`cdc.core.tables.TableFeatures`: deletion vectors, Change Data
Feed), held by the tables beside it too (its history, child and split tables), and how they follow the
source's schema changes; the side tables under ``_cdc/`` follow the rules without the features
(:meth:`TableSettings.side`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType

from cdc.core.catalog import register_table
from cdc.core.ddl import quoted, sql_type
from cdc.core.errors import ConfigError
from cdc.core.functions import helpers_available
from cdc.core.storage import Storage
from cdc.core.tables import (
    CHECKPOINT_PROPERTIES,
    KIND_PROPERTY,
    TableFeatures,
    add_missing_properties,
    apply_features,
    clear_interrupted_creation,
    delta_properties,
    is_delta_table,
    table_snapshot,
)
from refine.apply.flatten import POSITION, child_rows
from refine.apply.latest import at_or_after
from refine.apply.schema_changes import (
    SchemaChangeRules,
    conformed,
    enable_types,
    mark_absent_columns,
    plan_schema_change,
    rewrite_table,
)
from refine.records.envelope import Op
from refine.records.toast import placeholder_test

LSN, OFFSET, COMMITTED_AT, OP, REFINED_AT = "_cdc_lsn", "_cdc_offset", "_cdc_committed_at", "_cdc_op", "_cdc_refined_at"
METADATA_COLUMNS = (LSN, OFFSET, COMMITTED_AT, OP, REFINED_AT)
DELETED_AT = "_cdc_deleted_at"  # when a soft-deleted row was deleted (deletes: soft)
SHAPE_PROPERTY = "cdc.shape"  # the fingerprint of a shaped refined table's shape
# Where an event came from: what keys an appended event (and its child rows) in event tables.
PARTITION = "_cdc_partition"
EVENT_POSITION = (PARTITION, OFFSET)
SOURCE_POSITION = (LSN, OFFSET)  # a Postgres row's source position, compared in this order
# A MERGE joins its batch with every row of each file a key of the batch falls in; keys spread over
# the table fall in all its files, whose rows its left outer join then shuffles. From this size a
# Bloom filter of the batch's keys, on the table's side of the condition, drops the rows no key
# can match before that shuffle (10,000 changes into 10M rows: MERGE ~5 s instead of ~7 s).
KEY_FILTER_MIN_BYTES = 32 * 1024 * 1024
KEY_FILTER_FALSE_POSITIVES = 0.01
# Every MERGE adds a file (and, with them on, deletion vectors), so a job that runs a batch a second leaves tens of
# thousands a day, and each batch's MERGE reads the state of them all: Delta compacts the small ones
# after a write once there are enough (50), in the writing job. A table's explicit setting is kept.
AUTO_COMPACT_PROPERTY = "delta.autoOptimize.autoCompact"
# What refined tables are created with beyond their features, and what one created
# by an earlier version is given when it lacks it (see cdc/raw/table.py for the checkpoint interval).
MAINTENANCE_PROPERTIES = {AUTO_COMPACT_PROPERTY: "true", **CHECKPOINT_PROPERTIES}


@dataclass(frozen=True)
class TableSettings:
    """What a job declares for a table it writes, and what it has checked of the tables so declared.

    One object per refined table, owned by the job that refines it and shared by the tables beside it
    (history, child and split tables); :meth:`side` gives the side tables under ``_cdc/`` theirs.

    Example::

        settings = TableSettings(TableFeatures(change_data_feed=True), SchemaChangeRules())
        merge_latest(spark, "/data/warehouse/refined/games", settings, rows, ["id"], ["updated_at"])
    """

    features: TableFeatures = dataclass_field(default_factory=TableFeatures)
    """The Delta features the table is created with (and an existing one is given)."""
    schema_rules: SchemaChangeRules = dataclass_field(default_factory=SchemaChangeRules)
    """How the table follows the source's schema changes (:mod:`refine.apply.schema_changes`)."""
    checked: set[str] = dataclass_field(default_factory=set, compare=False)
    """The locations whose Delta properties the job has checked: once per table and job, not per batch."""
    cluster_by: tuple[str, ...] = ()
    """Liquid clustering columns a new table (that has them all) is created with."""
    partition_by: tuple[str, ...] = ()
    """Partition columns a new table (that has them all) is created with."""
    shape_fingerprint: str | None = None
    """What the refined table's declared shape makes of its rows (None: no shape): kept as its property
    ``cdc.shape``; a job declaring another shape is refused until a ``--rebuild``."""

    def side(self) -> TableSettings:
        """The settings of a side table (deleted keys): the same rules and checks, no features or layout."""
        return TableSettings(TableFeatures(), self.schema_rules, self.checked)


def refined_rows(latest: DataFrame, columns: list[str]) -> DataFrame:
    """Rows as the refined table stores them: the row image (``before`` for a delete) and metadata."""
    image = F.when(F.col("op") == Op.DELETE.value, F.col("before")).otherwise(F.col("after"))
    return latest.select(
        *[image[column].alias(column) for column in columns],
        F.col("source_lsn").alias(LSN),
        F.col("kafka_offset").alias(OFFSET),
        F.col("source_committed_at").alias(COMMITTED_AT),
        F.col("op").alias(OP),
        F.current_timestamp().alias(REFINED_AT),
    )


def check_shape(location: str, properties: dict[str, str], fingerprint: str | None) -> None:
    """ConfigError when the refined table (of these ``properties``) was refined with another shape than the
    one of ``fingerprint``: rows shaped one way beside rows shaped another (PII left unmasked, hashes
    that no longer match), where the whole table is refined again instead."""
    if properties.get(SHAPE_PROPERTY) != fingerprint:
        raise ConfigError(
            "the table was refined with another shape (columns, mask, mask_key, computed, where, deletes, "
            "ignore_null_updates, track_history_*, cluster_by, partition_by): refine it again with --rebuild",
            table=location,
        )


def ensure_refined_table(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    schema: StructType,
    kind: str = "refined",
    source_columns: bool = False,
) -> StructType:
    """Create the table (with the ``settings``' features, ``cdc.kind=kind``), or make it take rows of
    ``schema`` as the ``settings``' schema rules say (:mod:`refine.apply.schema_changes`): columns the source
    gained are added, widened ones retyped, renamed and (with ``source_columns``, ``schema`` holding every
    source column) dropped ones followed. Returns the table's schema. An existing table is given the declared
    features (and the maintenance settings an earlier version did not set) once per ``settings``."""
    features = settings.features
    if not is_delta_table(spark, location):
        clear_interrupted_creation(Storage(spark), location)  # a job killed while creating it
        builder = (
            DeltaTable.createIfNotExists(spark).location(location).addColumns(schema).property(KIND_PROPERTY, kind)
        )
        for key, value in {**features.creation_properties(), **MAINTENANCE_PROPERTIES}.items():
            builder = builder.property(key, value)
        if kind == "refined" and settings.shape_fingerprint is not None:
            builder = builder.property(SHAPE_PROPERTY, settings.shape_fingerprint)
        names = set(schema.fieldNames())
        layout = settings.cluster_by or settings.partition_by
        if kind == "refined" and (missing := [c for c in layout if c not in names]):
            key = "cluster_by" if settings.cluster_by else "partition_by"
            raise ConfigError(f"{key}: the table has no column {missing[0]}", table=location)
        # The tables beside it (history, children) take the layout when they have its columns.
        if settings.cluster_by and names.issuperset(settings.cluster_by):
            builder = builder.clusterBy(*settings.cluster_by)
        elif settings.partition_by and names.issuperset(settings.partition_by):
            builder = builder.partitionedBy(*settings.partition_by)
        builder.execute()
        settings.checked.add(location)
        register_table(spark, location)
        return schema
    if location not in settings.checked:
        present = delta_properties(spark, location)
        if kind == "refined":
            check_shape(location, present, settings.shape_fingerprint)
        add_missing_properties(spark, location, MAINTENANCE_PROPERTIES, present)
        apply_features(spark, location, features, present)
        settings.checked.add(location)
        register_table(spark, location)  # a table created before the catalog was on
    stored = DeltaTable.forPath(spark, location).toDF().schema
    rules = settings.schema_rules
    plan = plan_schema_change(location, stored, schema, rules, source_columns)
    mark_absent_columns(spark, location, stored, plan)
    if plan.rewrites:
        # One commit: a job stopped before it finds the table as it was, and plans the same again.
        rewrite_table(spark, location, plan, rules.source_time_zone)
    elif plan.added:
        enable_types(spark, location, [field.dataType for field in plan.added])
        columns = ", ".join(f"{quoted(field.name)} {sql_type(field.dataType)}" for field in plan.added)
        spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({columns})")
    else:
        return stored
    return DeltaTable.forPath(spark, location).toDF().schema


def merge_changes(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    rows: DataFrame,
    key_columns: list[str],
    truncated_at: tuple[int, int] | None,
    position: tuple[str, ...] = SOURCE_POSITION,
    keys: DataFrame | None = None,
    snapshot_at: tuple[int, int] | None = None,
    whole_rows: bool = False,
    soft_deletes: bool = False,
    ignore_nulls: list[str] | None = None,
) -> None:
    """Apply one batch's last change per key (and a truncate, if the batch had one); a change applies
    when its ``position`` columns are at or after the row's. ``soft_deletes``: a delete (or reset) keeps
    the row and sets its ``_cdc_deleted_at`` (the rows hold that column, NULL), a later change revives
    it. ``ignore_nulls``: columns whose NULL in a change to a row the table holds (not soft-deleted)
    keeps the stored value. With ``snapshot_at``, the source position
    of a snapshot's first read in the batch, the rows older than it that the batch does not match go:
    the snapshot did not read them again. ``keys``, cached, holds every key of
    ``rows`` (or more): then a large table's rows that none of them matches skip the MERGE's join
    (:func:`key_filter`). ``whole_rows``: ``rows`` hold every column of the source (Debezium's row images),
    so a column of the table they lack was dropped at the source, and is NULL in the rows they write."""
    table_schema = ensure_refined_table(spark, location, settings, _schema_of(rows), source_columns=whole_rows)
    rows = conformed(rows, table_schema, whole_rows, settings.schema_rules.source_time_zone)
    newer = at_or_after([F.col(f"s.`{c}`") for c in position], [F.col(f"t.`{c}`") for c in position])
    is_delete = F.col(f"s.{OP}") == Op.DELETE.value
    updates: dict[str, str | Column] = {}
    for field in rows.schema:
        source = F.col(f"s.`{field.name}`")
        # A TOAST placeholder keeps the value the row has.
        is_placeholder = placeholder_test(field.dataType)
        updates[f"`{field.name}`"] = (
            source
            if is_placeholder is None
            else F.when(is_placeholder(source), F.col(f"t.`{field.name}`")).otherwise(source)
        )
        if field.name in (ignore_nulls or ()):
            kept = source.isNull() & (F.col(f"t.{DELETED_AT}").isNull() if soft_deletes else F.lit(True))
            updates[f"`{field.name}`"] = F.when(kept, F.col(f"t.`{field.name}`")).otherwise(updates[f"`{field.name}`"])
    condition = reduce(Column.__and__, [F.col(f"t.`{key}`") == F.col(f"s.`{key}`") for key in key_columns])
    # Not with a truncate: its clause reads every row the batch does not match, so none can be dropped.
    filtered = truncated_at is None and snapshot_at is None
    table = DeltaTable.forPath(spark, location)
    with key_filter(spark, location, keys, key_columns) if keys is not None and filtered else nullcontext() as held:
        merge = table.alias("t").merge(rows.alias("s"), condition if held is None else condition & held)
        if soft_deletes:  # the stored row stays, marked; the source's deletion time from the change
            deleted: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in (LSN, OFFSET, COMMITTED_AT, OP, REFINED_AT)}
            deleted[DELETED_AT] = F.coalesce(
                F.col(f"t.{DELETED_AT}"), F.col(f"s.{COMMITTED_AT}"), F.current_timestamp()
            )
            merge = merge.whenMatchedUpdate(is_delete & newer, deleted)
        else:
            merge = merge.whenMatchedDelete(is_delete & newer)
        # Soft: a delete the table has no row for is kept when its row was one the table would hold (its
        # `_cdc_deleted_at` set, refine/apply/shaping.py), so batch boundaries do not decide what stays.
        inserted = (~is_delete | F.col(f"s.{DELETED_AT}").isNotNull()) if soft_deletes else ~is_delete
        merge = merge.whenMatchedUpdate(~is_delete & newer, updates).whenNotMatchedInsert(
            inserted, {f"`{f.name}`": F.col(f"s.`{f.name}`") for f in rows.schema}
        )
        # A truncate, or a snapshot's first read: the rows older than it that the batch does not match go.
        resets = [
            f"(t.{LSN} < {at[0]} OR (t.{LSN} = {at[0]} AND t.{OFFSET} < {at[1]}))"
            for at in (truncated_at, snapshot_at)
            if at is not None
        ]
        if resets and soft_deletes:
            reset = f"t.{DELETED_AT} IS NULL AND ({' OR '.join(resets)})"
            merge = merge.whenNotMatchedBySourceUpdate(
                reset,
                {DELETED_AT: F.current_timestamp(), OP: F.lit(Op.DELETE.value), REFINED_AT: F.current_timestamp()},
            )
        elif resets:
            merge = merge.whenNotMatchedBySourceDelete(" OR ".join(resets))
        merge.execute()


@contextmanager
def key_filter(spark: SparkSession, location: str, keys: DataFrame, key_columns: list[str]) -> Iterator[Column | None]:
    """A condition on the rows of the refined table at ``location`` (alias ``t``) that is false for every
    key ``keys`` lacks, and true for all it holds (and ~1% of the others): a Bloom filter of the keys'
    hashes, valid within the ``with`` block. None where it would not pay: a table under ``KEY_FILTER_MIN_BYTES``, or a
    session without the helpers jar."""
    if not helpers_available() or table_snapshot(spark, location).size_in_bytes < KEY_FILTER_MIN_BYTES:
        yield None
        return
    hashes = keys.select(_key_hash(key_columns, "").alias("key_hash"))
    # Aggregated on the executors into a sketch (~1.2 MB per million keys) that is broadcast to them,
    # and tested by a function registered for this MERGE alone (refinements share a session).
    sketch = hashes._jdf.stat().bloomFilter("key_hash", max(keys.count(), 1), KEY_FILTER_FALSE_POSITIVES)
    broadcast = spark.sparkContext._jsc.broadcast(sketch)
    name = f"cdc_batch_keys_{uuid.uuid4().hex}"
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a live session has its JVM gateway
    function = jvm.cdc.jvm.MightContain(broadcast)
    spark._jsparkSession.udf().register(name, function, spark._jsparkSession.parseDataType(BooleanType().json()))
    try:
        yield F.call_function(name, _key_hash(key_columns, "t."))
    finally:
        spark.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {name}")
        broadcast.destroy()


def _key_hash(key_columns: list[str], prefix: str) -> Column:
    return F.xxhash64(*[F.col(f"{prefix}`{key}`") for key in key_columns])


def _schema_of(rows: DataFrame) -> StructType:
    return StructType([StructField(field.name, field.dataType) for field in rows.schema])


def merge_latest(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    rows: DataFrame,
    key_columns: list[str],
    position: list[str],
) -> None:
    """Upsert one row per key; a row replaces the table's only when its ``position`` (the ordering
    column, then ``_cdc_partition``, ``_cdc_offset``) is at or after the stored one."""
    zone = settings.schema_rules.source_time_zone
    rows = conformed(rows, ensure_refined_table(spark, location, settings, _schema_of(rows)), time_zone=zone)
    newer = at_or_after([F.col(f"s.`{c}`") for c in position], [F.col(f"t.`{c}`") for c in position])
    values: dict[str, str | Column] = {f"`{field.name}`": F.col(f"s.`{field.name}`") for field in rows.schema}
    (
        DeltaTable.forPath(spark, location)
        .alias("t")
        .merge(rows.alias("s"), " AND ".join(f"t.`{key}` = s.`{key}`" for key in key_columns))
        .whenMatchedUpdate(newer, values)
        .whenNotMatchedInsert(values=values)
        .execute()
    )


def append_rows(
    spark: SparkSession, location: str, settings: TableSettings, rows: DataFrame, app_id: str, version: int
) -> None:
    """Append ``rows`` once: a replay of the same (``app_id``, ``version``) writes nothing (Delta's
    idempotent writes, as in raw landing)."""
    ensure_refined_table(spark, location, settings, _schema_of(rows))
    rows.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", version).save(location)


def replace_children(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    children: DataFrame,
    parents: DataFrame,
    key_columns: list[str],
) -> None:
    """Make the child rows of ``parents`` (their key columns) exactly ``children``, in one MERGE:
    changed elements are updated, new ones inserted, and the parent's other child rows (a shrunk
    array, a parent deleted or left with no array) deleted. Other parents' children are untouched."""
    zone = settings.schema_rules.source_time_zone
    children = conformed(
        children, ensure_refined_table(spark, location, settings, _schema_of(children)), time_zone=zone
    )
    match = [*key_columns, POSITION]
    target = DeltaTable.forPath(spark, location)
    gone = (
        target.toDF()
        .join(parents.select(*key_columns), key_columns, "left_semi")
        .join(children.select(*match), match, "left_anti")
        .select(*match)
        .withColumn("_gone", F.lit(True))
    )
    source = children.withColumn("_gone", F.lit(False)).unionByName(gone, allowMissingColumns=True)
    values: dict[str, str | Column] = {f"`{field.name}`": F.col(f"s.`{field.name}`") for field in children.schema}
    (
        target.alias("t")
        .merge(source.alias("s"), " AND ".join(f"t.`{column}` = s.`{column}`" for column in match))
        .whenMatchedDelete("s._gone")
        .whenMatchedUpdate("NOT s._gone", values)
        .whenNotMatchedInsert("NOT s._gone", values)
        .execute()
    )


def refresh_children(
    spark: SparkSession,
    refined: str,
    location: str,
    settings: TableSettings,
    keys: DataFrame,
    key_columns: list[str],
    array_path: str,
    truncated: bool = False,
) -> None:
    """Make the child rows of ``keys`` (a batch's keys) those of the array at ``array_path`` in their
    rows of the ``refined`` table, as the MERGE left them: TOAST placeholders and primary-key changes
    are resolved there, a deleted parent has no row and so no children, and a late change that did not
    apply leaves them as they are. After a truncate, child rows whose parent is gone are deleted too."""
    stored = spark.read.format("delta").load(refined)
    if DELETED_AT in stored.columns:  # a soft-deleted parent has no children
        stored = stored.where(F.col(DELETED_AT).isNull())
    parents = stored.join(keys, key_columns, "left_semi")
    children = child_rows(parents, key_columns, array_path).withColumn(REFINED_AT, F.current_timestamp())
    replace_children(spark, location, settings, children, keys, key_columns)
    if truncated:
        (
            DeltaTable.forPath(spark, location)
            .alias("t")
            .merge(stored.select(*key_columns).alias("s"), " AND ".join(f"t.`{c}` = s.`{c}`" for c in key_columns))
            .whenNotMatchedBySourceDelete()
            .execute()
        )
