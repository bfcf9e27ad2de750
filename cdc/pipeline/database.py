"""Whole-database sources: a Debezium source with a ``pattern`` is every table whose topic the pattern
matches, each refined into a table of its own.

A pipeline declaring such a source is turned, for the topics Kafka has now, into the pipeline it stands
for (:func:`expanded`): one source per matching topic and, for each refined table reading the pattern
source, one refined table per topic, named by its ``name_template`` (``{prefix}``, ``{schema}``,
``{table}``; ``{db}``, ``{collection}`` for MongoDB) between ``name_prefix`` and ``name_suffix``, with the
keys its ``tables`` give that table. Everything downstream (raw landing, refinement, business tables,
status) reads the expanded pipeline. Debezium's own topics (heartbeats, transaction metadata, signals,
schema history, Kafka Connect's internal topics, dead-letter queues) never match.

Example::

    pipeline = load_pipeline("pipelines/shop.yaml")  # sources.shop.pattern: 'demo\\.shop\\..*'
    tables = expanded(pipeline, ["demo.shop.customers", "demo.shop.orders", "demo.transaction"])
    sorted(tables.refined)  # ['customers', 'orders']
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from string import Formatter

from pydantic import ValidationError

from cdc.core.errors import ConfigError
from cdc.pipeline.config import (
    GROUP_KEYS,
    DebeziumMongoSource,
    DebeziumPostgresSource,
    Pipeline,
    RefinedTable,
    Source,
)

# Topics Debezium and Kafka Connect write for themselves, never a table's, by their shapes (a table's topic is
# `<prefix>.<schema>.<table>`, its words are the user's): internal ones (`__debezium-heartbeat.<prefix>`,
# `_schemas`, `__consumer_offsets`), those of fewer than three parts (`<prefix>.transaction`, Connect's
# `connect-offsets`, signal and schema-history topics), and dead-letter queues named after a topic
# (`<topic>.dlq`, `<topic>-dlq`, `dlq-<topic>`, `...dead-letter...`).
INTERNAL_TOPIC = re.compile(
    r"_.*|[^.]*|[^.]*\.[^.]*|(?:dlq|dead-?letter(?:-queue)?)[.-].*|.*[.-](?:dlq|dead-?letter(?:-queue)?)",
    re.IGNORECASE,
)
MAX_NAME = 128  # as cdc.pipeline.config's names
# What a name may hold: refined table names are letters, digits and single underscores (cdc.pipeline.config).
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_]+")


@dataclass(frozen=True)
class SourceTable:
    """One table (or collection) of a pattern source, from its topic ``<prefix>.<schema>.<table>``."""

    topic: str
    prefix: str
    schema: str
    table: str

    @classmethod
    def of(cls, topic: str) -> SourceTable | None:
        """The table a Debezium topic is of; None for a topic of no table (fewer than three parts)."""
        parts = topic.rsplit(".", 2)
        if len(parts) < 3 or not all(parts):
            return None
        return cls(topic, *parts)

    def name(self, table: RefinedTable, mongodb: bool) -> str:
        """The refined table's name for this source table: the template's, made a valid name."""
        template = table.name_template or ("{collection}" if mongodb else "{table}")
        fields = {"prefix": self.prefix, "schema": self.schema, "table": self.table}
        fields |= {"db": self.schema, "collection": self.table}
        text = table.name_prefix + template.format(**fields) + table.name_suffix
        name = re.sub("_{2,}", "_", _NOT_IN_NAME.sub("_", text)).strip("_")
        return name if name[:1].isalpha() else f"t_{name}"

    def selected_by(self, selector: str) -> bool:
        """Whether a key of ``tables`` names this table: a name (no regex character but `.`) is its name or
        ``schema.table``; anything else a regex matching either whole."""
        names = (self.table, f"{self.schema}.{self.table}")
        if LITERAL_SELECTOR.fullmatch(selector):
            return selector in names
        return any(re.fullmatch(selector, name) for name in names)


# A `tables` key that names a table (dots between names), not a regular expression.
LITERAL_SELECTOR = re.compile(r"[\w$-]+(?:\.[\w$-]+)?")


def is_pattern(source: Source) -> bool:
    """Whether ``source`` is a whole-database source (a ``pattern``, not one ``topic``)."""
    return isinstance(source, (DebeziumPostgresSource, DebeziumMongoSource)) and source.pattern is not None


def has_patterns(pipeline: Pipeline) -> bool:
    return any(is_pattern(source) for source in pipeline.sources.values())


def matches(source: DebeziumPostgresSource | DebeziumMongoSource, topic: str) -> bool:
    """Whether ``topic`` is one of the pattern ``source``'s tables."""
    assert source.pattern is not None
    return (
        re.fullmatch(source.pattern, topic) is not None
        and INTERNAL_TOPIC.fullmatch(topic) is None
        and not any(re.fullmatch(excluded, topic) for excluded in source.exclude)
        and SourceTable.of(topic) is not None
    )


def tables_of_pattern(pattern: str, exclude: Iterable[str] = ()) -> str:
    """A regular expression matching the topics ``pattern`` matches but Debezium's own (and ``exclude``'s)."""
    excluded = "|".join([f"(?i:{INTERNAL_TOPIC.pattern})", *[f"(?:{e})" for e in exclude]])
    return rf"(?!(?:{excluded})\Z)(?:{pattern})"


def landing_pattern(pipeline: Pipeline) -> str:
    """One regular expression for every topic the pipeline lands: its sources' topics and, for pattern
    sources, their matching topics (exclusions and Debezium's own topics left out)."""
    parts = []
    for source in pipeline.sources.values():
        if is_pattern(source):
            assert isinstance(source, (DebeziumPostgresSource, DebeziumMongoSource))
            assert source.pattern is not None
            parts.append(tables_of_pattern(source.pattern, source.exclude))
        else:
            assert source.topic is not None  # a source without a pattern has one topic
            parts.append(re.escape(source.topic))
    return "|".join(f"(?:{part})" for part in parts)


def expanded(pipeline: Pipeline, topics: Iterable[str]) -> Pipeline:
    """The pipeline a whole-database pipeline stands for, given the ``topics`` Kafka has (or the raw tables
    landed): every pattern source becomes one source per matching topic, and every refined table reading
    it one refined table per topic. ConfigError when two topics would make one table name, or a name is
    already taken."""
    if not has_patterns(pipeline):
        return pipeline
    topics = sorted(set(topics))
    sources: dict[str, Source] = {name: s for name, s in pipeline.sources.items() if not is_pattern(s)}
    refined: dict[str, RefinedTable] = {
        name: t for name, t in pipeline.refined.items() if not is_pattern(pipeline.sources[t.source])
    }
    # Names compared case-folded: Spark's views of them (business SQL) and some stores' paths ignore case.
    made_by = (
        {name.casefold(): f"sources.{name}" for name in sources}
        | {name.casefold(): f"refined.{name}" for name in refined}
        | {name.casefold(): f"business.{name}" for name in pipeline.business}
    )
    for group, table in pipeline.refined.items():
        source = pipeline.sources[table.source]
        if not is_pattern(source):
            continue
        assert isinstance(source, (DebeziumPostgresSource, DebeziumMongoSource))
        mongodb = isinstance(source, DebeziumMongoSource)
        for topic in topics:
            if not matches(source, topic):
                continue
            source_table = SourceTable.of(topic)
            assert source_table is not None  # matches() says so
            name = source_table.name(table, mongodb)
            if len(name) > MAX_NAME:
                raise ConfigError(
                    f"refined.{group}: topic {topic} makes the table name {name!r}, longer than {MAX_NAME} characters "
                    "(name_template, name_prefix, name_suffix)"
                )
            if (other := made_by.get(name.casefold())) is not None:
                raise ConfigError(
                    f"refined.{group}: topic {topic} makes the table name {name!r}, which {other} has already "
                    "(names differing in case only collide; name_template, name_prefix, name_suffix tell them apart)"
                )
            selected = [(selector, o) for selector, o in table.tables.items() if source_table.selected_by(selector)]
            try:
                refined[name] = table.for_table([o for _, o in selected]).model_copy(update={"source": name})
            except ValidationError as error:
                keys = ", ".join(f"refined.{group}.tables.{selector}" for selector, _ in selected)
                problem = error.errors()[0]
                where = ".".join(map(str, problem["loc"]))
                raise ConfigError(
                    f"{keys}: together, for topic {topic}: {where + ': ' if where else ''}{problem['msg']}"
                ) from None
            sources[name] = source.model_copy(update={"topic": topic, "pattern": None, "exclude": []})
            made_by[name.casefold()] = f"refined.{group} (topic {topic})"
    return pipeline.model_copy(update={"sources": sources, "refined": refined})


def group_keys_problems(pipeline: Pipeline) -> list[tuple[str, str]]:
    """(key path, reason) for the keys naming a pattern's tables on a table whose source has one topic, and
    templates naming fields they cannot."""
    problems = []
    for name, table in pipeline.refined.items():
        source = pipeline.sources.get(table.source)
        if source is None:
            continue
        if not is_pattern(source):
            problems += [
                (f"refined.{name}.{key}", "applies to a source with a `pattern` only")
                for key in GROUP_KEYS
                if key in table.model_fields_set
            ]
            continue
        fields = {"prefix", "schema", "table", "db", "collection"}
        try:
            placeholders = [f for _, f, _, _ in Formatter().parse(table.name_template or "") if f is not None]
        except ValueError as error:
            problems.append((f"refined.{name}.name_template", f"not a template: {error}"))
            continue
        for placeholder in placeholders:
            if placeholder not in fields:
                problems.append(
                    (
                        f"refined.{name}.name_template",
                        f"{{{placeholder}}} is not one of {{{'}, {'.join(sorted(fields))}}}",
                    )
                )
    return problems
