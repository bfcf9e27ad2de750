"""References between the parts of a pipeline, checked before anything runs.

Each check yields ``(key path, reason)``: ``("refined.players.source", "unknown source 'x' ...")``.
The same column-path checks run again at refine time on an inferred schema
(:func:`table_shape_problems`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from cdc.core.ddl import parse_schema
from cdc.core.errors import ConfigError
from cdc.pipeline.config import (
    DebeziumMongoSource,
    DebeziumPostgresSource,
    JsonEvents,
    Pipeline,
    RefinedTable,
    ScdType,
    SchemaFile,
)
from cdc.pipeline.database import expanded, group_keys_problems, has_patterns, is_pattern
from cdc.pipeline.sql_text import reads_column, sql_tables
from refine.apply.flatten import array_element, child_columns, child_table_name, field_type, flat_columns
from refine.apply.merge import EVENT_POSITION
from refine.apply.schema_changes import SchemaChangePolicy
from refine.apply.shaping import TableShape

Problem = tuple[str, str]
RESERVED_PREFIX = "_cdc_"


def pipeline_problems(pipeline: Pipeline, base_dir: Path) -> list[Problem]:
    """Every problem of the pipeline file. The tables of a source with a `pattern` are known once Kafka's
    topics are (:func:`expanded_pipeline`): until then SQL and expectations may name tables not declared."""
    tables_known = not has_patterns(pipeline)
    return [
        *_topic_problems(pipeline),
        *_schema_file_problems(pipeline, base_dir),
        *_refined_problems(pipeline),
        *group_keys_problems(pipeline),
        *_override_problems(pipeline),
        *_name_problems(pipeline),
        *(_business_problems(pipeline) if tables_known else _cycle_problems(pipeline)),
        *(_expectation_problems(pipeline) if tables_known else ()),
    ]


def _override_problems(pipeline: Pipeline) -> Iterator[Problem]:
    """The problems of each single table's keys (``tables.<selector>``) of a pattern's refined table, as the
    table they make would have them."""
    for group, table in pipeline.refined.items():
        source = pipeline.sources.get(table.source)
        if source is None or not is_pattern(source):
            continue
        for selector, override in table.tables.items():
            single = pipeline.model_copy(update={"refined": {group: table.for_table([override])}})
            for key, reason in _refined_problems(single):
                field = key.removeprefix(f"refined.{group}.").split(".")[0].split("[")[0]
                if field in override:
                    yield key.replace(f"refined.{group}.", f"refined.{group}.tables.{selector}.", 1), reason


def expanded_pipeline(pipeline: Pipeline, topics: Iterable[str]) -> Pipeline:
    """The pipeline with its pattern sources' tables for ``topics`` (:func:`cdc.pipeline.database.expanded`),
    its SQL and expectations checked against them: ConfigError naming each problem."""
    tables = expanded(pipeline, topics)
    if tables is not pipeline:
        problems = [*_refined_problems(tables), *_business_problems(tables), *_expectation_problems(tables)]
        if problems:
            raise ConfigError(
                "the pipeline's tables for the topics Kafka has: " + "; ".join(f"{k}: {r}" for k, r in problems)
            )
    return tables


def _topic_problems(pipeline: Pipeline) -> Iterator[Problem]:
    owners: dict[str, str] = {}
    for name, source in pipeline.sources.items():
        if source.topic is None:  # a pattern: its topics are known once Kafka's are
            continue
        if source.topic in owners:
            yield (
                f"sources.{name}.topic",
                f"topic {source.topic!r} is already the topic of sources.{owners[source.topic]}",
            )
        owners.setdefault(source.topic, name)


def _schema_file_problems(pipeline: Pipeline, base_dir: Path) -> Iterator[Problem]:
    for name, source in pipeline.sources.items():
        schema = getattr(source, "schema_", None)
        if isinstance(schema, SchemaFile) and not (base_dir / schema.path).is_file():
            yield f"sources.{name}.schema.path", f"no such file: {base_dir / schema.path}"


def _refined_problems(pipeline: Pipeline) -> Iterator[Problem]:
    for name, table in pipeline.refined.items():
        where = f"refined.{name}"
        source = pipeline.sources.get(table.source)
        if source is None:
            yield f"{where}.source", f"unknown source {table.source!r} (sources: {', '.join(pipeline.sources)})"
            continue
        if isinstance(source, (DebeziumPostgresSource, DebeziumMongoSource)):
            for field in ("keys", "ordering", "split_by"):
                if getattr(table, field):
                    yield (
                        f"{where}.{field}",
                        (
                            f"applies to event sources only: a Debezium table's key is its primary key and its changes "
                            f"are ordered by their source position (source {table.source!r} is {source.kind})"
                        ),
                    )
            if isinstance(source, DebeziumMongoSource):
                for field in SHAPE_KEYS:
                    if field in table.model_fields_set:
                        yield f"{where}.{field}", "applies to Debezium Postgres sources only (not yet to MongoDB)"
            else:
                yield from _shape_problems(where, table, pipeline)
            if isinstance(source, DebeziumMongoSource):
                for field in ("renames", "drop_columns"):
                    if field in table.model_fields_set:
                        yield (
                            f"{where}.{field}",
                            (
                                "applies to Debezium Postgres sources only: a MongoDB field that changes type becomes "
                                "JSON text, and a document's fields come and go"
                            ),
                        )
            if isinstance(source, DebeziumMongoSource) and "flatten" in table.model_fields_set:
                yield (
                    f"{where}.flatten",
                    (
                        "applies to event sources only: a MongoDB table keeps nested documents as struct columns, "
                        "typed from Extended JSON"
                    ),
                )
            continue
        for field in ("schema_changes", "renames", "drop_columns", *SHAPE_KEYS):
            if field in table.model_fields_set:
                yield (
                    f"{where}.{field}",
                    (
                        f"applies to Debezium Postgres sources only: an event source's schema is declared or inferred "
                        f"(source {table.source!r} is {source.kind})"
                    ),
                )
        if table.keys and not table.ordering:
            yield f"{where}.ordering", "required with `keys`: the column that orders an entity's events"
        if table.scd is ScdType.HISTORY and not table.keys:
            yield f"{where}.scd", "SCD type 2 needs `keys` (the entity whose versions are kept)"
        if isinstance(source, JsonEvents) and source.schema_ is not None:
            for field, reason in table_shape_problems(parse_schema(source.schema_), table):
                yield f"{where}.{field}", reason


def table_shape_problems(schema: StructType, table: RefinedTable) -> list[Problem]:
    """Column paths of ``table`` checked against the events' ``schema``: (field of the table, reason)."""
    problems: list[Problem] = []
    scalars = [(f"keys[{i}]", path) for i, path in enumerate(table.keys)]
    scalars += [(field, getattr(table, field)) for field in ("ordering", "split_by") if getattr(table, field)]
    for field, path in scalars:
        try:
            data_type = field_type(schema, path)
        except ConfigError as error:
            problems.append((field, error.message))
            continue
        if isinstance(data_type, (StructType, ArrayType, MapType)):
            problems.append((field, f"{path!r} is a {data_type.simpleString()}: it must be a single value"))
    for i, path in enumerate(table.flatten.keep):
        problems += [(f"flatten.keep[{i}]", reason) for reason in _struct_problem(schema, path)]
    exploded = []
    for i, path in enumerate(table.explode):
        try:
            array_element(schema, path)
            child_columns(schema, table.keys or list(EVENT_POSITION), path)
            exploded.append(path)
        except ConfigError as error:
            problems.append((f"explode[{i}]", error.message))
    try:
        columns = flat_columns(schema, tuple(exploded), table.flatten.kept(schema))
    except ConfigError as error:
        problems.append(("flatten", error.message))
    else:
        problems += [
            (
                "flatten",
                f"column {column!r} (from {path!r}) uses the prefix {RESERVED_PREFIX!r}, kept for the tool's own",
            )
            for path, column in columns
            if column.startswith(RESERVED_PREFIX)
        ]
    return problems


def _struct_problem(schema: StructType, path: str) -> list[str]:
    try:
        data_type: DataType = field_type(schema, path)
    except ConfigError as error:
        return [error.message]
    return [] if isinstance(data_type, StructType) else [f"{path!r} is a {data_type.simpleString()}, not a struct"]


def table_names(pipeline: Pipeline) -> dict[str, str]:
    """Every table SQL may name (refined, child, business) -> the key declaring it."""
    names: dict[str, str] = {}
    for name, table in pipeline.refined.items():
        names.setdefault(name, f"refined.{name}")
        for i, path in enumerate(table.explode):
            names.setdefault(child_table_name(name, path), f"refined.{name}.explode[{i}]")
    for name in pipeline.business:
        names.setdefault(name, f"business.{name}")
    return names


def _name_problems(pipeline: Pipeline) -> Iterator[Problem]:
    for name in pipeline.business:
        if name in pipeline.refined:
            yield f"business.{name}", f"the name {name!r} is already used by refined.{name}"


def _business_problems(pipeline: Pipeline) -> Iterator[Problem]:
    known = table_names(pipeline)
    for name, table in pipeline.business.items():
        for unknown in sorted(sql_tables(table.sql) - known.keys()):
            yield f"business.{name}.sql", f"unknown table {unknown!r} (tables: {', '.join(sorted(known))})"
    yield from _cycle_problems(pipeline)


def _cycle_problems(pipeline: Pipeline) -> Iterator[Problem]:
    for cycle in _cycles(
        {name: sql_tables(table.sql) & pipeline.business.keys() for name, table in pipeline.business.items()}
    ):
        yield f"business.{cycle[0]}.sql", f"cycle: {' -> '.join(cycle)}"
    yield from _renamed_column_problems(pipeline)


def _renamed_column_problems(pipeline: Pipeline) -> Iterator[Problem]:
    """Business SQL that reads a refined table by a column the source renamed (its ``renames``): rows written
    since the rename hold the value under the new name only."""
    for name, business in pipeline.business.items():
        for table in sorted(sql_tables(business.sql) & pipeline.refined.keys()):
            for old, new in pipeline.refined[table].renames.items():
                if reads_column(business.sql, table, old):
                    yield (
                        f"business.{name}.sql",
                        (
                            f"uses column {old!r} of refined.{table}, which the source renamed to {new!r} "
                            f"(refined.{table}.renames): rows written since hold it as {new!r} only"
                        ),
                    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle once, as a path that returns to its first (smallest) node."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(edges.get(node, ())):
            if target == path[0]:
                members = frozenset(path)
                if members not in seen and path[0] == min(path):
                    seen.add(members)
                    found.append([*path, target])
            elif target not in path:
                visit(target, [*path, target])

    for start in sorted(edges):
        visit(start, [start])
    return found


def _expectation_problems(pipeline: Pipeline) -> Iterator[Problem]:
    refined = {name for name, where in table_names(pipeline).items() if where.startswith("refined.")}
    for name, expectation in pipeline.expectations.items():
        if expectation.table not in refined:
            yield (
                f"expectations.{name}.table",
                (f"unknown refined table {expectation.table!r} (refined tables: {', '.join(sorted(refined))})"),
            )


# The refined-table keys of refine.apply.shaping.TableShape.
SHAPE_KEYS = tuple(TableShape.model_fields)


def _shape_problems(where: str, table: RefinedTable, pipeline: Pipeline) -> Iterator[Problem]:
    """A Debezium Postgres table's shaping keys that contradict its other keys."""
    for path in table.explode:
        column = path.split(".")[0]
        if not table.keeps(column):
            yield f"{where}.explode", f"{column} is left out of the table (columns/except_columns): nothing to explode"
        if column in table.mask:
            yield f"{where}.explode", f"{column} is masked: a masked array cannot be exploded"
    for field in ("track_history_columns", "track_history_except_columns"):
        if field in table.model_fields_set and table.scd is not ScdType.HISTORY:
            yield f"{where}.{field}", "applies with `scd: 2` only: without a history there are no versions to track"
    overlap = sorted(set(table.computed) & set(table.renames.values()))
    if overlap:
        yield f"{where}.computed", f"{overlap[0]} is also a rename's new name"
    evolve = (table.schema_changes or pipeline.schema_changes) is SchemaChangePolicy.EVOLVE
    if (table.cluster_by or table.partition_by) and (table.drop_columns or evolve):
        layout = "cluster_by" if table.cluster_by else "partition_by"
        dropping = "`drop_columns: true`" if table.drop_columns else "`schema_changes: evolve`"
        yield (
            f"{where}.{layout}",
            f"a clustering or partition column cannot be dropped: {dropping} would drop it if the source did",
        )
