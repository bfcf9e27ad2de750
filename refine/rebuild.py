"""`cdc refine --rebuild`: a refined table made again from its raw table's current contents.

A refined table written by a version with a bug holds wrong values that no later batch corrects (a
change applied wrongly is never sent again). The raw table still holds every record as it came, so
the way out is to refine it all again:

1. the raw table is read as it is now (version ``V``: its current files, not its Change Data Feed, so
   this works after ``OPTIMIZE`` and ``VACUUM`` of the raw table), in chunks of whole raw micro-batches
   in landing order (``batch_id``), each refined as one micro-batch into *staging* tables under
   ``<warehouse>/_cdc/rebuild/<name>``: the refined table, its history and child tables, and its side
   tables (deleted keys, the keyless stream mark);
2. each live table is then replaced by its staged copy in one Delta commit (an overwrite: readers
   see the old or the new table, never a mix, and the old version stays for time travel,
   ``VERSION AS OF``);
3. the refined table records ``V`` (:data:`REBUILT_FROM_PROPERTY`). The refinement goes on from its
   checkpoint: the raw versions up to ``V`` it has not read yet are in the tables already, and its
   guards leave them out (a position guard per row, the keyless stream mark, whose batch counter goes
   on). Without a checkpoint (removed, or never made) it starts after ``V``.

Records the rebuild quarantines join the warehouse's quarantine (a record already there is not added
twice); its expectation counts are not added to the job's (they counted the records once already).
A rebuild cut short changes nothing it had not swapped yet, and running it again starts over; a live
table already swapped is consistent on its own, and a refinement continuing from the old checkpoint
meanwhile only replays changes its position guards drop.

Stop the table's `cdc refine` (or `cdc sync`) before rebuilding it: both write the same tables. A
refinement that commits to a live table while the rebuild runs would have its changes overwritten
(and its checkpoint has moved past them), so the rebuild checks: a live table whose version moved
since the rebuild started stops it before anything is replaced, and a commit that slips in between
that check and a table's swap is found from the swap's commit (it read another version) and stops
the rebuild too. Both say to stop the refinement and run the rebuild again, which reads the raw
table as it is then and so includes every change the refinement had applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.core.catalog import register_table
from cdc.core.errors import TableError
from cdc.core.storage import Storage
from cdc.core.tables import (
    CHANGE_DATA_FEED_PROPERTY,
    DELETION_VECTORS_PROPERTY,
    delta_properties,
    is_delta_table,
    raw_table_location,
    raw_table_topic,
    table_version,
)
from refine.apply.deleted import deleted_location
from refine.apply.flatten import child_table_name
from refine.apply.keyless import applied_location, read_applied, write_applied
from refine.apply.rules import TableRules, history_table_name
from refine.batch import RefineBatch
from refine.config import RefineJobConfig, refined_table_location
from refine.quality.quarantine import add_quarantined, quarantine_location

# Raw records refined as one micro-batch of the rebuild (whole raw micro-batches: a chunk may hold more).
RECORDS_PER_BATCH = 2_000_000
# Table properties Delta manages itself: not copied from a staged table to its live one.
_PROTOCOL_PROPERTIES = ("delta.minReaderVersion", "delta.minWriterVersion", "delta.feature.")
# A table's Delta features: a new live table takes the staged one's (its job's); an existing one keeps
# its own, and its job applies those it declares at its first batch (refine/apply/merge.py).
_FEATURE_PROPERTIES = (CHANGE_DATA_FEED_PROPERTY, DELETION_VECTORS_PROPERTY)

# On a rebuilt refined table: the raw table's version it was rebuilt from (its stream goes on after it).
REBUILT_FROM_PROPERTY = "cdc.rebuilt_from_raw_version"


@dataclass(frozen=True)
class RebuiltTable:
    """One live table a rebuild replaced: its Delta versions before (None: it did not exist) and after.

    Example::

        for table in Lakehouse("/data/warehouse").rebuild("demo.shop.customers"):
            print(f"{table.location}: version {table.version_before} -> {table.version_after}")
    """

    location: str
    version_before: int | None
    version_after: int


def rebuild_location(warehouse: str, name: str) -> str:
    """Where a rebuild of refined table ``name`` stages its tables."""
    return f"{warehouse}/_cdc/rebuild/{name}"


def rebuild_refined_table(
    spark: SparkSession,
    config: RefineJobConfig,
    say: Callable[[str], None] = print,
    records_per_batch: int = RECORDS_PER_BATCH,
) -> list[RebuiltTable]:
    """Refine the raw table of ``config`` again, from its current contents, into its refined table and
    the tables beside it (history, children, side tables), replacing each in one commit; the next run
    of the refinement continues after the raw version read. Returns the tables replaced.

    Example::

        config = RefineJobConfig(table="demo.shop.customers", warehouse="/lake", history=True)
        for table in rebuild_refined_table(spark, config):
            print(table.location, table.version_before, "->", table.version_after)
    """
    raw = raw_table_location(config.warehouse, config.table)
    if raw_table_topic(spark, raw) is None:
        raise TableError("no raw table for this topic: run `cdc raw` first", table=raw)
    raw_version = table_version(spark, raw)
    records = spark.read.format("delta").option("versionAsOf", raw_version).load(raw)
    staging = rebuild_location(config.warehouse, config.target)
    storage = Storage(spark)
    storage.delete(staging)  # what a rebuild cut short left
    pairs = _table_pairs(config, staging)
    started = {live: _version_if_table(spark, live) for live, _ in pairs}
    rules = config.rules or TableRules(table=config.target, topic=config.table, warehouse=config.warehouse)
    staged = config.model_copy(update={"warehouse": staging, "rules": rules.model_copy(update={"warehouse": staging})})
    batch = RefineBatch(staged, raw_location=raw)
    chunks = raw_chunks(records, records_per_batch)
    for number, chunk in enumerate(chunks):
        batch(chunk.withColumn("_change_type", F.lit("insert")), number)
        say(f"rebuild {config.target}: raw batches {number + 1}/{len(chunks)} refined into {staging}")
    for live, version in started.items():
        if _version_if_table(spark, live) != version:
            raise TableError(_WRITTEN_MEANWHILE + "; nothing was replaced", table=live)
    applied = applied_location(config.warehouse, config.target)
    counted = read_applied(spark, applied)
    replaced = [rebuilt for live, copy in pairs if (rebuilt := _replace(spark, live, copy, started[live])) is not None]
    _keep_batch_counter(spark, applied, counted)
    _keep_quarantined(spark, quarantine_location(staging), quarantine_location(config.warehouse))
    refined = refined_table_location(config.warehouse, config.target)
    if is_delta_table(spark, refined):
        spark.sql(f"ALTER TABLE delta.`{refined}` SET TBLPROPERTIES ('{REBUILT_FROM_PROPERTY}' = '{raw_version}')")
    storage.delete(staging)
    for table in replaced:
        before = "new" if table.version_before is None else f"version {table.version_before} -> {table.version_after}"
        say(f"rebuild {config.target}: {table.location} replaced ({before})")
    say(f"rebuild {config.target}: done, from raw version {raw_version}")
    return replaced


def raw_chunks(records: DataFrame, records_per_batch: int) -> list[DataFrame]:
    """``records`` (a raw table's rows) in chunks of whole raw micro-batches, in landing order, of about
    ``records_per_batch`` records each (one chunk when they are fewer)."""
    total = records.count()
    if total <= records_per_batch:
        return [records]
    parts = -(-total // records_per_batch)
    bounds = records.approxQuantile("batch_id", [i / parts for i in range(1, parts)], 0.001)
    edges = sorted({int(bound) for bound in bounds})
    chunks, lower = [], None
    for edge in edges:
        chunks.append(
            records.where(F.col("batch_id") <= edge)
            if lower is None
            else records.where((F.col("batch_id") > lower) & (F.col("batch_id") <= edge))
        )
        lower = edge
    chunks.append(records if lower is None else records.where(F.col("batch_id") > lower))
    return chunks


def _table_pairs(config: RefineJobConfig, staging: str) -> list[tuple[str, str]]:
    """(live, staged) locations of every table a refinement of ``config`` writes for its table."""
    names = [config.target, *[child_table_name(config.target, path) for path in config.explode]]
    if config.history:
        names.append(history_table_name(config.target))
    pairs = [(refined_table_location(config.warehouse, name), refined_table_location(staging, name)) for name in names]
    pairs.extend(
        (side(config.warehouse, config.target), side(staging, config.target))
        for side in (deleted_location, applied_location)
    )
    return pairs


def _replace(spark: SparkSession, live: str, staged: str, started: int | None) -> RebuiltTable | None:
    """Make the table at ``live`` hold what the table at ``staged`` holds, in one commit for its rows (None
    when neither exists). A live table the rebuild wrote nothing for is emptied. ``started``: the live
    table's version when the rebuild began; the swap must be made on top of it."""
    if not is_delta_table(spark, staged):
        if not is_delta_table(spark, live):
            return None
        emptied_from = table_version(spark, live)
        DeltaTable.forPath(spark, live).delete()
        _check_swapped_on(spark, live, started)
        return RebuiltTable(live, emptied_from, table_version(spark, live))
    properties = {
        key: value for key, value in delta_properties(spark, staged).items() if not key.startswith(_PROTOCOL_PROPERTIES)
    }
    rows = spark.read.format("delta").load(staged)
    before = table_version(spark, live) if is_delta_table(spark, live) else None
    if before is not None:
        properties = {key: value for key, value in properties.items() if key not in _FEATURE_PROPERTIES}
    if before is not None:  # the live table's columns keep their order (a column added mid-stream stays last)
        kept = [c for c in spark.read.format("delta").load(live).columns if c in rows.columns]
        rows = rows.select(*[F.col(f"`{c}`") for c in [*kept, *[c for c in rows.columns if c not in kept]]])
    # The staged table's layout (a shaped table's cluster_by or partition_by): an overwrite keeps neither.
    layout = spark.sql(f"DESCRIBE DETAIL delta.`{staged}`").select("partitionColumns", "clusteringColumns").collect()[0]
    partitions, clustering = list(layout.partitionColumns or []), list(layout.clusteringColumns or [])
    if before is None:  # created as the refinement creates it (Change Data Feed first: its readers see every row)
        builder = DeltaTable.createIfNotExists(spark).location(live).addColumns(rows.schema)
        for key, value in properties.items():
            builder = builder.property(key, value)
        if clustering:
            builder = builder.clusterBy(*clustering)
        elif partitions:
            builder = builder.partitionedBy(*partitions)
        builder.execute()
    writer = rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    (writer.partitionBy(*partitions) if partitions else writer).save(live)
    _check_swapped_on(spark, live, started)
    if clustering:
        spark.sql(f"ALTER TABLE delta.`{live}` CLUSTER BY ({', '.join(f'`{c}`' for c in clustering)})")
    register_table(spark, live)
    current = delta_properties(spark, live)
    changed = {key: value for key, value in properties.items() if current.get(key) != value}
    if changed:
        assignments = ", ".join(f"'{key}' = '{_escaped(value)}'" for key, value in changed.items())
        spark.sql(f"ALTER TABLE delta.`{live}` SET TBLPROPERTIES ({assignments})")
    gone = [key for key in current if key.startswith("cdc.") and key not in properties]
    if gone:  # a mark of the old refinement (a truncate's position, say) the rebuild did not make
        spark.sql(f"ALTER TABLE delta.`{live}` UNSET TBLPROPERTIES IF EXISTS ({', '.join(repr(k) for k in gone)})")
    return RebuiltTable(live, before, table_version(spark, live))


def _keep_batch_counter(spark: SparkSession, applied: str, before: tuple[int | None, int, int, int] | None) -> None:
    """A keyless table's batch counter goes on from where it was: the live table has Delta transactions of
    the refinement's app id up to it, and a batch numbered at or below would be skipped by Delta as done."""
    mark = read_applied(spark, applied)
    if before is not None and mark is not None and mark[-1] < before[-1]:
        write_applied(spark, applied, *mark[:-1], before[-1])


def _keep_quarantined(spark: SparkSession, staged: str, live: str) -> None:
    """Add the records the rebuild quarantined to the warehouse's quarantine (once each)."""
    if is_delta_table(spark, staged):
        add_quarantined(spark, live, spark.read.format("delta").load(staged))


_WRITTEN_MEANWHILE = (
    "another writer committed to this table while the rebuild ran (a `cdc refine` or `cdc sync` of it?): "
    "stop it and run the rebuild again"
)


def _version_if_table(spark: SparkSession, location: str) -> int | None:
    return table_version(spark, location) if is_delta_table(spark, location) else None


def _check_swapped_on(spark: SparkSession, live: str, started: int | None) -> None:
    """Raise when the swap just committed to ``live`` was made on top of another version than the one the
    rebuild started from (None: the table did not exist then, and the rebuild created it)."""
    if started is None:
        return
    read = DeltaTable.forPath(spark, live).history(1).select("readVersion").collect()[0][0]
    if read != started:
        raise TableError(_WRITTEN_MEANWHILE + " (during its swap)", table=live)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
