"""Business tables: a SQL query over refined tables, materialised as a Delta table and kept fresh.

The query reads refined tables by Delta path (``delta.`/wh/refined/T```) or by the temp views the
config registers (name -> Delta location). Each refresh is one of:

- **unchanged**: the query and the version of every Delta table it reads are those of the last
  refresh: nothing is read or written (no new Delta version);
- **incremental**, when the query allows it. The rule: the query is one ``GROUP BY`` aggregate over a
  single Delta table with Change Data Feed on, with only filters and projections between them, every
  grouping expression a plain column of that table (renaming it in the output is fine), every
  aggregate one of ``count``, ``sum``, ``min``, ``max``, ``avg`` and every expression deterministic,
  no ``HAVING``, no subquery. Then only the groups whose keys appear in the table's Change Data
  Feed since the last refreshed version (before and after images, so a row moving between groups
  refreshes both) are recomputed from the table's current rows (only theirs are aggregated) and MERGEd:
  a group that is gone is deleted. Since whole groups are recomputed, min and max stay exact under updates and deletes;
- **full** otherwise (joins, windows, unions, a changed query, the first refresh, a Change Data Feed
  that no longer covers the versions): the query's result atomically overwrites the table.

State lives in the business table's properties (``cdc.kind=business``, ``cdc.business.query_sha256``,
``cdc.business.sources``: the version of each Delta table read), set right after the data commit.
The versions are taken before the query runs, so a change committed meanwhile is refreshed again next
time; a crash between the two commits recomputes the same groups again: both harmless. A query
reading anything but Delta tables (files, JDBC) cannot be versioned and is refreshed fully each time.

The shape is found in Spark's analysed plan (through the JVM), on the driver: classic Spark only,
not Spark Connect.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from delta.tables import DeltaTable
from pydantic import Field, field_validator
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.core.catalog import register_table
from cdc.core.config import AvailableNow, Continuous, Trigger, _Strict
from cdc.core.errors import ConfigError, TableError
from cdc.core.storage import Storage, normalize_location
from cdc.core.tables import KIND_PROPERTY, delta_properties, is_delta_table, table_version
from cdc.pipeline.sql_text import reads_column
from refine.apply.merge import DELETED_AT
from refine.apply.schema_changes import absent_columns

BUSINESS_KIND = "business"
QUERY_PROPERTY, SOURCES_PROPERTY = "cdc.business.query_sha256", "cdc.business.sources"
INCREMENTAL_AGGREGATES = {"Count", "Sum", "Min", "Max", "Average"}
_PASS_THROUGH = {"Project", "Filter", "SubqueryAlias", "View"}
_CONSTANT_LEAVES = {"LocalRelation", "OneRowRelation", "Range"}


class BusinessTableConfig(_Strict):
    """One business table: its query and where it is materialised."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,200}$", description="Names the table in messages.")
    query: str = Field(min_length=1, description="Spark SQL over refined tables (Delta paths or the views below).")
    location: str = Field(description="Where the Delta table is written: a path or an object-store URI.")
    views: dict[str, str] = Field(
        default_factory=dict, description="Temp views registered before the query runs: view name -> Delta location."
    )
    split_views: dict[str, str] = Field(
        default_factory=dict,
        description="Temp views over split tables: view name -> a folder whose sub-folders each hold a Delta table "
        "(one per split value); the view is their union by column name, listed again at each refresh.",
    )

    @field_validator("location")
    @classmethod
    def _location(cls, location: str) -> str:
        return normalize_location(location)


class RefreshMode(str, Enum):
    UNCHANGED = "unchanged"
    INCREMENTAL = "incremental"
    FULL = "full"


@dataclass(frozen=True)
class RefreshResult:
    mode: RefreshMode
    reason: str  # why this mode
    warnings: tuple[str, ...] = ()  # lines to show: columns the query reads that their source no longer has


@dataclass(frozen=True)
class GroupedAggregate:
    """An incrementalisable query: its one source table and its grouping keys (output name -> source column)."""

    source: str
    keys: dict[str, str]


# --- the query's analysed plan, walked through py4j (metadata only) ---------------------------------


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _name(node: Any) -> str:
    return node.getClass().getSimpleName()


def _expressions(expression: Any) -> Iterator[Any]:
    yield expression
    for child in _seq(expression.children()):
        yield from _expressions(child)


def _nodes(plan: Any) -> Iterator[Any]:
    """Every node of ``plan`` and of the plans of its subqueries."""
    yield plan
    for expression in _seq(plan.expressions()):
        for part in _expressions(expression):
            if "Subquery" in _name(part) or _name(part) in ("Exists", "ListQuery"):
                yield from _nodes(part.plan())
    for child in _seq(plan.children()):
        yield from _nodes(child)


def _delta_location(relation: Any) -> str | None:
    if _name(relation) != "LogicalRelation" or not _name(relation.relation().location()).startswith("Tahoe"):
        return None
    return normalize_location(relation.relation().location().rootPaths().apply(0).toString().removeprefix("file:"))


def delta_sources(plan: Any) -> list[str] | None:
    """The Delta tables ``plan`` reads; None when it reads anything else that could change."""
    sources = set()
    for node in _nodes(plan):
        if _seq(node.children()) or _name(node) in _CONSTANT_LEAVES:
            continue
        if (location := _delta_location(node)) is None:
            return None
        sources.add(location)
    return sorted(sources)


def grouped_aggregate(plan: Any) -> GroupedAggregate | str:
    """The query's shape when it can be refreshed incrementally, else the reason it cannot."""
    while _name(plan) == "SubqueryAlias":
        plan = plan.child()
    if _name(plan) != "Aggregate":
        return f"the query is not a single GROUP BY aggregate (its root is {_name(plan)})"
    node = plan.child()
    while _name(node) in _PASS_THROUGH:
        node = node.child()
    if (source := _delta_location(node)) is None:
        return f"the aggregate does not read one Delta table through filters and projections ({_name(node)})"
    for part in (e for n in _nodes(plan) for x in _seq(n.expressions()) for e in _expressions(x)):
        if not part.deterministic() or "Subquery" in _name(part) or _name(part) in ("Exists", "ListQuery"):
            return f"the query has a non-deterministic or subquery expression: {part.sql()}"
        if _name(part) == "AggregateExpression" and _name(part.aggregateFunction()) not in INCREMENTAL_AGGREGATES:
            return f"the aggregate {part.sql()} is not one of count, sum, min, max, avg"
    columns = {attribute.exprId().id(): attribute.name() for attribute in _seq(node.output())}
    outputs: dict[Any, Any] = {}
    for output in _seq(plan.aggregateExpressions()):
        inner = output.child() if _name(output) == "Alias" else output
        if _name(inner) == "AttributeReference":
            outputs.setdefault(inner.exprId().id(), output.name())
    keys = {}
    if not _seq(plan.groupingExpressions()):  # one row over the whole table: no group to recompute alone
        return "the query aggregates the whole table (no GROUP BY)"
    for grouping in _seq(plan.groupingExpressions()):
        if _name(grouping) != "AttributeReference" or grouping.exprId().id() not in columns:
            return f"the grouping expression {grouping.sql()} is not a column of {source}"
        if grouping.exprId().id() not in outputs:
            return f"the grouping column {grouping.sql()} is not in the query's output"
        keys[outputs[grouping.exprId().id()]] = columns[grouping.exprId().id()]
    return GroupedAggregate(source, keys)


# --- refreshing ----------------------------------------------------------------------------------


def _query_sha256(config: BusinessTableConfig) -> str:
    views = [config.views, config.split_views] if config.split_views else config.views  # unchanged hash without
    return hashlib.sha256(json.dumps([config.query, views], sort_keys=True).encode()).hexdigest()


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _state(spark: SparkSession, location: str) -> dict[str, str] | None:
    """The business table's properties; None when there is no table yet."""
    if not is_delta_table(spark, location):
        return None
    properties = delta_properties(spark, location)
    if properties.get(KIND_PROPERTY) != BUSINESS_KIND:
        raise TableError(
            "a Delta table exists there but it is not a business table (no cdc.kind=business)", table=location
        )
    return properties


def _live_rows(table: DataFrame) -> DataFrame:
    """A table's rows without those soft-deleted (``deletes: soft``): business SQL reads those through
    ``delta.`<location>``` when it asks for them."""
    return table.where(F.col(DELETED_AT).isNull()) if DELETED_AT in table.columns else table


def _register_views(spark: SparkSession, config: BusinessTableConfig) -> str | None:
    """Register the query's views; return the location of one that has no table yet (nothing registered then)."""
    tables: dict[str, list[str]] = {view: [normalize_location(location)] for view, location in config.views.items()}
    storage = Storage(spark)
    for view, split_folder in config.split_views.items():
        folder = normalize_location(split_folder)
        locations = [f"{folder}/{name}" for name in storage.list_names(folder)]
        tables[view] = [location for location in locations if is_delta_table(spark, location)]
        if not tables[view]:
            return folder
    if missing := next(
        (locations[0] for locations in tables.values() if not is_delta_table(spark, locations[0])), None
    ):
        return missing
    for view, locations in tables.items():
        frames = [_live_rows(spark.read.format("delta").load(location)) for location in locations]
        functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames).createOrReplaceTempView(view)
    return None


def refresh_business_table(
    spark: SparkSession, config: BusinessTableConfig, registered: set[str] | None = None
) -> RefreshResult:
    """Bring the business table up to date with its query: unchanged, incrementally, or fully.
    ``registered``: the locations a job running refreshes has registered in the catalog (this one is
    added), so that an unchanged table is registered once per job rather than per refresh."""
    if (missing := _register_views(spark, config)) is not None:
        return RefreshResult(RefreshMode.UNCHANGED, f"{missing} has no table yet")
    try:
        result = spark.sql(config.query)
        plan = result._jdf.queryExecution().analyzed()
    except AnalysisException as error:
        raise ConfigError(
            f"the query of business table {config.name} is not valid: {str(error).splitlines()[0]}",
            table=config.location,
        ) from None
    sources = delta_sources(plan)
    versions = None if sources is None else {source: table_version(spark, source) for source in sources}
    state = _state(spark, config.location)
    query = _query_sha256(config)
    same_query = state is not None and state.get(QUERY_PROPERTY) == query
    refreshed = json.loads(state.get(SOURCES_PROPERTY, "{}")) if same_query and state is not None else {}
    if same_query and versions is not None and refreshed == versions:
        if registered is None or config.location not in registered:  # refreshed before the catalog was on
            register_table(spark, config.location)
            if registered is not None:
                registered.add(config.location)
        return RefreshResult(RefreshMode.UNCHANGED, "no source changed since the last refresh")
    warnings = _absent_columns_read(spark, config, sources)
    outcome = _incremental(spark, config, result, plan, refreshed, versions) if same_query else "a new or changed query"
    if isinstance(outcome, str):
        result.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(config.location)
    properties = {KIND_PROPERTY: BUSINESS_KIND, QUERY_PROPERTY: query, SOURCES_PROPERTY: json.dumps(versions or {})}
    assignments = ", ".join(f"{_sql_string(key)} = {_sql_string(value)}" for key, value in properties.items())
    spark.sql(f"ALTER TABLE delta.`{config.location}` SET TBLPROPERTIES ({assignments})")
    register_table(spark, config.location)
    if registered is not None:
        registered.add(config.location)
    if isinstance(outcome, str):
        return RefreshResult(RefreshMode.FULL, outcome, warnings)
    return dataclasses.replace(outcome, warnings=warnings)


def _absent_columns_read(
    spark: SparkSession, config: BusinessTableConfig, sources: list[str] | None
) -> tuple[str, ...]:
    """A line for each column the query names that a source table keeps though the table's own source no longer
    has it (dropped or renamed there, kept by the ``lenient`` policy: NULL in rows written since)."""
    names = {normalize_location(location): view for view, location in config.views.items()}
    return tuple(
        f"business {config.name}: its query reads column {column!r} of {names.get(source, source)}, which the "
        "source no longer has "
        "(dropped or renamed there): rows written since hold NULL in it"
        for source in sources or []
        for column in absent_columns(DeltaTable.forPath(spark, source).toDF().schema)
        if reads_column(config.query, names.get(source, source), column)
    )


def _incremental(
    spark: SparkSession,
    config: BusinessTableConfig,
    result: DataFrame,
    plan: Any,
    refreshed: dict[str, int],
    versions: dict[str, int] | None,
) -> RefreshResult | str:
    """MERGE the recomputed changed groups, or say why a full refresh is needed instead."""
    shape = grouped_aggregate(plan)
    if isinstance(shape, str):
        return shape
    if versions is None or shape.source not in refreshed:
        return "the last refresh recorded no version of the source"
    if versions[shape.source] < refreshed[shape.source]:
        return "the source's version went back (the table was recreated)"
    try:
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", refreshed[shape.source] + 1)
            .option("endingVersion", versions[shape.source])
            .load(shape.source)
        )
        changed = changes.select(*[F.col(f"`{column}`").alias(key) for key, column in shape.keys.items()]).distinct()
        _ = changed.schema  # analysed now: a feed that does not cover the versions fails here
    except AnalysisException as error:
        return f"the source's Change Data Feed does not cover the versions: {str(error).splitlines()[0]}"
    merge_changed_groups(spark, config.location, result, changed, list(shape.keys))
    return RefreshResult(
        RefreshMode.INCREMENTAL, f"groups changed in {shape.source} since version {refreshed[shape.source]}"
    )


def _same_keys(left: str, right: str, keys: list[str]) -> list[Any]:
    return [F.col(f"{left}.`{key}`").eqNullSafe(F.col(f"{right}.`{key}`")) for key in keys]


def changed_groups(spark: SparkSession, result: DataFrame, changed: DataFrame, keys: list[str]) -> DataFrame:
    """``result``'s rows of the ``changed`` groups (keys compared null-safely). Written as a correlated
    EXISTS, which Spark turns into a semi-join below the aggregate: only those groups' rows are read
    and aggregated (a DataFrame semi-join above it would aggregate the whole table first)."""
    suffix = uuid.uuid4().hex
    result_view, changed_view = f"_cdc_result_{suffix}", f"_cdc_changed_{suffix}"
    result.createOrReplaceTempView(result_view)
    changed.createOrReplaceTempView(changed_view)
    try:
        match = " AND ".join(f"c.`{key}` <=> r.`{key}`" for key in keys)
        return spark.sql(f"SELECT * FROM {result_view} r WHERE EXISTS (SELECT 1 FROM {changed_view} c WHERE {match})")
    finally:  # the returned DataFrame holds the views' plans
        spark.catalog.dropTempView(result_view)
        spark.catalog.dropTempView(changed_view)


def merge_changed_groups(
    spark: SparkSession, location: str, result: DataFrame, changed: DataFrame, keys: list[str]
) -> None:
    """Replace the business table's rows of the ``changed`` groups by their recomputed ``result`` rows
    (a group with no result row any more is deleted). Grouping keys compare null-safely."""
    recomputed = changed_groups(spark, result, changed, keys)
    values = [column for column in result.columns if column not in keys]
    updates = (
        changed.alias("c")
        .join(recomputed.withColumn("_present", F.lit(True)).alias("r"), _same_keys("c", "r", keys), "left")
        .select(*[F.col(f"c.`{key}`") for key in keys], *[F.col(f"r.`{value}`") for value in values], "_present")
    )
    every_column: dict[str, Any] = {f"`{column}`": F.col(f"s.`{column}`") for column in result.columns}
    (
        DeltaTable.forPath(spark, location)
        .alias("t")
        .merge(updates.alias("s"), " AND ".join(f"t.`{key}` <=> s.`{key}`" for key in keys))
        .whenMatchedDelete("s._present IS NULL")
        .whenMatchedUpdate(set=every_column)
        .whenNotMatchedInsert("s._present", values=every_column)
        .execute()
    )


def run_business_tables(
    spark: SparkSession,
    tables: list[BusinessTableConfig],
    trigger: Trigger,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Refresh every table once (available now), or every ``interval_s`` seconds until ``stop`` is
    set; return the number of refreshes that wrote something."""
    stop = stop or threading.Event()
    written = 0
    registered: set[str] = set()
    while not stop.is_set():
        for table in tables:
            outcome = refresh_business_table(spark, table, registered)
            if outcome.mode is not RefreshMode.UNCHANGED:
                written += 1
                say(f"business {table.name}: {outcome.mode.value} refresh ({outcome.reason})")
                for warning in outcome.warnings:
                    say(warning)
        match trigger:
            case AvailableNow():
                break
            case Continuous(interval_s=interval_s):
                stop.wait(interval_s)
    return written
