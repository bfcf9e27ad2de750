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

from cdc.core.errors import ConfigError
from cdc.pipeline.config import (
    GROUP_KEYS,
    DebeziumMongoSource,
    DebeziumPostgresSource,
    Pipeline,
    RefinedTable,
    Source,
)

# Topics Debezium and Kafka Connect write for themselves, never a table's: internal ones (`__...`, `_schemas`,
# `_connect-*`), heartbeats (`__debezium-heartbeat.<prefix>`), transaction metadata (`<prefix>.transaction`),
# signals, schema history, Connect's configs/offsets/status and dead-letter queues.
INTERNAL_TOPIC = re.compile(
    r"_.*|.*\.transaction|.*(?:heartbeat|schema-?history|schema-changes|signal|dlq|dead-letter|deadletter).*"
    r"|(?:.*[.-])?connect-(?:configs|offsets|status)(?:[.-].*)?",
    re.IGNORECASE,
)
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
        """Whether a key of ``tables`` names this table: its name, ``schema.table``, or a regex matching either."""
        if selector in (self.table, f"{self.schema}.{self.table}"):
            return True
        regex = re.compile(selector)
        return bool(regex.fullmatch(self.table) or regex.fullmatch(f"{self.schema}.{self.table}"))


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
    made_by = {name: f"sources.{name}" for name in sources} | {name: f"refined.{name}" for name in refined}
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
            if name in made_by or name in pipeline.business:
                other = made_by.get(name, f"business.{name}")
                raise ConfigError(
                    f"refined.{group}: topic {topic} makes the table name {name!r}, which {other} has already "
                    "(name_template, name_prefix, name_suffix tell them apart)"
                )
            overrides = [o for selector, o in table.tables.items() if source_table.selected_by(selector)]
            sources[name] = source.model_copy(update={"topic": topic, "pattern": None, "exclude": []})
            refined[name] = table.for_table(overrides).model_copy(update={"source": name})
            made_by[name] = f"refined.{group} (topic {topic})"
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
        for placeholder in re.findall(r"\{([^{}]*)\}", table.name_template or ""):
            if placeholder not in fields:
                problems.append(
                    (
                        f"refined.{name}.name_template",
                        f"{{{placeholder}}} is not one of {{{'}, {'.join(sorted(fields))}}}",
                    )
                )
    return problems
