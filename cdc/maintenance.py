"""Table maintenance: compaction (optionally Z-ordered) and VACUUM with a safe retention floor.

VACUUM deletes the files no version younger than the retention still references: time travel to
older versions, and streaming readers (refinement reads raw tables' Change Data Feed) still behind
them, break. So a retention below :data:`SAFE_RETENTION_HOURS` (Delta's own default, 7 days) is
refused unless explicitly overridden, and never allowed on raw tables, whose files may be the only
copy of their topic's records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from cdc.core.catalog import registered_location
from cdc.core.errors import ConfigError, TableError
from cdc.core.functions import captured_console
from cdc.core.shared_tables import retrying_conflicts
from cdc.core.storage import normalize_location
from cdc.core.tables import KIND_PROPERTY, RAW_KIND, delta_properties, is_delta_table

SAFE_RETENTION_HOURS = 168.0
OVERRIDE_FLAG = "--i-know-vacuum-below-retention-loses-time-travel"
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_DELETED = re.compile(r"Deleted (\d+) files and directories")  # Delta's VACUUM summary line


def resolve_table(spark: SparkSession, table: str, warehouse: str) -> str:
    """The location of ``table``: a path or URI of a Delta table, a path under the warehouse
    (``refined/demo.shop.customers``), or a catalog table's name."""
    for location in (normalize_location(table), f"{warehouse}/{table.strip('/')}"):
        if is_delta_table(spark, location):
            return location
    registered = registered_location(spark, table)
    if registered is not None:
        return registered
    raise TableError(
        "no Delta table at this path, under the warehouse or by this name", table=table, warehouse=warehouse
    )


@dataclass(frozen=True)
class OptimizeResult:
    """What ``cdc optimize`` (:meth:`cdc.Lakehouse.optimize`) did to one table: its location and the files
    its compaction removed and added.

    Example::

        result = lake.optimize("refined/shop.public.orders")
        print(f"{result.location}: {result.files_removed} files compacted into {result.files_added}")
    """

    location: str
    files_removed: int
    files_added: int


@dataclass(frozen=True)
class VacuumResult:
    """What ``cdc vacuum`` (:meth:`cdc.Lakehouse.vacuum`) did to one table: its location and how many files and
    directories it deleted (None when Delta did not say).

    Example::

        result = lake.vacuum("refined/shop.public.orders", retain_hours=240)
        print(f"{result.location}: {result.deleted} files deleted")
    """

    location: str
    deleted: int | None  # files and directories deleted (None: Delta did not say)


def optimize_table(spark: SparkSession, location: str, zorder_by: list[str] | None = None) -> OptimizeResult:
    """Compact the table's small files; with ``zorder_by``, cluster rows by those columns (Z-order).

    A running refinement's MERGE that commits first, changing files being compacted, makes Delta
    refuse the compaction: it runs again on the new version."""
    table = DeltaTable.forPath(spark, location)
    if zorder_by:
        detail = table.detail().select("partitionColumns").collect()[0][0]
        columns = table.toDF().columns
        for column in zorder_by:
            if column not in columns or column in detail:
                why = (
                    "is a partition column" if column in detail else f"is not a column (columns: {', '.join(columns)})"
                )
                raise ConfigError(f"cannot Z-order by {column!r}: it {why}", table=location)
        metrics = retrying_conflicts(lambda: table.optimize().executeZOrderBy(*zorder_by).collect()[0].metrics)
    else:
        metrics = retrying_conflicts(lambda: table.optimize().executeCompaction().collect()[0].metrics)
    return OptimizeResult(location, metrics.numFilesRemoved, metrics.numFilesAdded)


def vacuum_table(
    spark: SparkSession, location: str, retain_hours: float | None = None, below_safe_minimum: bool = False
) -> VacuumResult:
    """Delete files no version within ``retain_hours`` (default: the table's retention) references.

    Below SAFE_RETENTION_HOURS: a ConfigError unless ``below_safe_minimum``; always on raw tables.
    """
    if retain_hours is not None and retain_hours < 0:
        raise ConfigError("the retention cannot be negative", table=location, retain_hours=retain_hours)
    table = DeltaTable.forPath(spark, location)
    if retain_hours is None or retain_hours >= SAFE_RETENTION_HOURS:
        return VacuumResult(location, _vacuum(spark, table, retain_hours))
    if delta_properties(spark, location).get(KIND_PROPERTY) == RAW_KIND:
        raise ConfigError(
            f"refusing to vacuum a raw table with a retention below {SAFE_RETENTION_HOURS:g} hours: "
            "its files may be the only copy of the topic's records",
            table=location,
            retain_hours=retain_hours,
        )
    if not below_safe_minimum:
        raise ConfigError(
            f"refusing a retention below the safe minimum of {SAFE_RETENTION_HOURS:g} hours: time travel "
            f"and streaming readers behind it would break; {OVERRIDE_FLAG} allows it",
            table=location,
            retain_hours=retain_hours,
        )
    previous = spark.conf.get(_RETENTION_CHECK, "true") or "true"
    spark.conf.set(_RETENTION_CHECK, "false")  # Delta's own guard, lifted for this call only
    try:
        return VacuumResult(location, _vacuum(spark, table, retain_hours))
    finally:
        spark.conf.set(_RETENTION_CHECK, previous)


def _vacuum(spark: SparkSession, table: DeltaTable, retain_hours: float | None) -> int | None:
    # VACUUM lists the table's directories in as many tasks as this setting (Spark's default:
    # 10,000, a minute of empty tasks on a small machine); as many as the cluster has cores suffice.
    previous = spark.conf.get(_LISTING_PARALLELISM, None)
    spark.conf.set(_LISTING_PARALLELISM, str(spark.sparkContext.defaultParallelism))
    try:
        with captured_console(spark) as printed:  # Delta prints its summary to standard output
            table.vacuum(retain_hours)
        counts = [int(m.group(1)) for line in printed if (m := _DELETED.match(line))]
        return counts[-1] if counts else None
    finally:
        if previous is None:
            spark.conf.unset(_LISTING_PARALLELISM)
        else:
            spark.conf.set(_LISTING_PARALLELISM, previous)
