"""The pipeline file: one YAML document declaring sources, raw landing, refined tables, business
tables and expectations (see examples/pipelines/ and the README's "Pipelines" section).

These models check each part on its own (types, enums, names, SQL present); references between
parts (a refined table's source, the tables a business query reads, cycles, column paths of a
given schema) are checked by :mod:`cdc.pipeline.checks`.
"""

from __future__ import annotations

import re
from enum import Enum, IntEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pyspark.sql.types import StructType

from cdc.core.config import TOPIC_NAME, _kafka_topic_name, _Strict
from cdc.core.ddl import DdlError, parse_schema
from cdc.core.tables import TableFeatures
from cdc.raw.config import GapPolicy
from refine.apply.schema_changes import SchemaChangePolicy, TimeZoneName
from refine.apply.shaping import TableShape

NAME_RULE = "letters, digits and single underscores, starting with a letter (`__` is kept for child tables)"


def _table_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) or "__" in name or len(name) > 128:
        raise ValueError(f"{name!r} is not a valid name: {NAME_RULE}")
    return name


def _column_path(path: str) -> str:
    if not path or any(not part for part in path.split(".")):
        raise ValueError(f"{path!r} is not a column path (field names joined by '.', e.g. device.os)")
    return path


Name = Annotated[str, AfterValidator(_table_name)]
ColumnPath = Annotated[str, AfterValidator(_column_path)]
Topic = Annotated[str, Field(pattern=TOPIC_NAME), AfterValidator(_kafka_topic_name)]


class _Model(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=True)


# --- sources -----------------------------------------------------------------------------------


class SchemaFile(_Model):
    """An Avro (.avsc) or Protobuf (.proto) schema in a file: the values are plain encodings, no header."""

    kind: Literal["file"] = Field(
        description="The schema is in a file; each value is one plain record of it (no wire-format header)."
    )
    path: Path = Field(description="The schema file; a relative path is relative to the pipeline file.")


class SchemaRegistry(_Model):
    """A Confluent-compatible schema registry: the values are in Confluent's wire format (magic byte 0,
    the 4-byte id of the schema they were written with, then the record)."""

    kind: Literal["registry"] = Field(
        description="The schema is in a schema registry; each value is in Confluent's wire format (magic byte 0, "
        "4-byte schema id, record) and is read as the subject's latest schema."
    )
    url: str = Field(description="The registry's base URL, http:// or https:// (no credentials are sent).")
    subject: str | None = Field(default=None, description="The subject; default `<topic>-value`.")

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/")


WireSchema = Annotated[SchemaFile | SchemaRegistry, Field(discriminator="kind")]


def _regex(pattern: str) -> str:
    try:
        re.compile(f"(?:x)|(?:{pattern})")  # as the landing joins them: a global flag must be scoped, (?i:...)
    except re.error as error:
        raise ValueError(f"{pattern!r} is not a regular expression (scope a flag: (?i:...)): {error}") from None
    return pattern


Regex = Annotated[str, AfterValidator(_regex)]


class _DebeziumTopics(_Model):
    """A Debezium connector's topic (one table), or every topic of its tables that a pattern matches (a whole
    database: :mod:`cdc.pipeline.database`)."""

    topic: Topic | None = Field(default=None, description="The Kafka topic (one table); or give `pattern`.")
    pattern: Regex | None = Field(
        default=None,
        description="A regular expression matched against whole topic names: every matching topic of a table is "
        "a source table (Debezium's own topics left out), refined into a table of its own; or give `topic`.",
    )
    exclude: list[Regex] = Field(
        default_factory=list, description="With `pattern`: regular expressions of whole topic names left out."
    )

    @model_validator(mode="after")
    def _topic_or_pattern(self) -> _DebeziumTopics:
        if (self.topic is None) == (self.pattern is None):
            raise ValueError("give one of `topic` (one table) or `pattern` (every table whose topic matches)")
        if self.exclude and self.pattern is None:
            raise ValueError("`exclude` applies with `pattern` only")
        return self


class DebeziumPostgresSource(_DebeziumTopics):
    """A topic of Debezium's Postgres connector (one table), or its topics a pattern matches."""

    kind: Literal["debezium_postgres"] = Field(description="Debezium Postgres change events.")
    source_time_zone: TimeZoneName | None = Field(
        default=None,
        description="The database's time zone (an IANA name, e.g. Europe/Berlin): needed to follow a `timestamp -> "
        "timestamptz` ALTER, whose stored wall-clock times are read in it; without it that change is refused.",
    )


class DebeziumMongoSource(_DebeziumTopics):
    """A topic of Debezium's MongoDB connector (one collection), or its topics a pattern matches."""

    kind: Literal["debezium_mongodb"] = Field(description="Debezium MongoDB change events.")


class JsonEvents(_Model):
    """Plain JSON events: each Kafka value one JSON object."""

    kind: Literal["events"] = Field(description="Plain events.")
    format: Literal["json"] = Field(description="Each value is a JSON object.")
    topic: Topic = Field(description="The Kafka topic.")
    schema_: str | None = Field(
        default=None,
        alias="schema",
        description="The events' schema as a Spark DDL string (`time timestamp, device struct<os: string>`); "
        "when absent it is inferred once from the raw table and kept under <warehouse>/_cdc/schemas/.",
    )

    @field_validator("schema_")
    @classmethod
    def _ddl(cls, ddl: str | None) -> str | None:
        if ddl is not None:
            try:
                parse_schema(ddl)
            except DdlError as error:
                raise ValueError(f"not a Spark DDL schema: {error}") from None
        return ddl


class AvroEvents(_Model):
    """Avro-encoded events, each value one record (decoded by :mod:`cdc.pipeline.events.avro`)."""

    kind: Literal["events"] = Field(description="Plain events.")
    format: Literal["avro"] = Field(
        description="Each value is one Avro record: plain with a schema file, Confluent's wire format with a registry."
    )
    topic: Topic = Field(description="The Kafka topic.")
    schema_: WireSchema = Field(
        alias="schema",
        description="Where the Avro schema (a record) is: a file (values are plain Avro) or a schema registry "
        "(values are in Confluent's wire format; each is read with its writer schema, resolved to the latest).",
    )


class ProtobufEvents(_Model):
    """Protobuf-encoded events, each value one message (decoded in Spark's Python workers by
    :mod:`cdc.pipeline.events.protobuf`: Spark's spark-protobuf module is not on Maven Central as this
    project's machines reach it)."""

    kind: Literal["events"] = Field(description="Plain events.")
    format: Literal["protobuf"] = Field(
        description="Each value is one Protobuf message: plain with a schema file, Confluent's wire format (magic "
        "byte 0, 4-byte schema id, message indexes, message) with a registry."
    )
    topic: Topic = Field(description="The Kafka topic.")
    schema_: WireSchema = Field(
        alias="schema",
        description="Where the .proto schema is: a file (values are plain messages; its imports are looked up beside "
        "it and among the well-known types) or a schema registry (values are in Confluent's wire format; each is read "
        "with the subject's latest schema). Recursive messages are refused.",
    )
    message: str | None = Field(
        default=None,
        description="The events' message, fully qualified (package.Message, nested: package.Outer.Inner); default the "
        "schema file's first message. With a registry, values of other messages are quarantined.",
    )


EventSource = Annotated[JsonEvents | AvroEvents | ProtobufEvents, Field(discriminator="format")]
Source = Annotated[DebeziumPostgresSource | DebeziumMongoSource | EventSource, Field(discriminator="kind")]


# --- raw landing -------------------------------------------------------------------------------


class RawLanding(_Model):
    """How every source's topic lands in its raw table, ``<warehouse>/raw/<topic>`` (`cdc raw`)."""

    on_gap: GapPolicy = Field(
        default=GapPolicy.FAIL,
        description="When Kafka has deleted offsets not landed yet: fail (stop, naming them) or record (go on, "
        "recording the gap in <warehouse>/_cdc/raw_gaps).",
    )
    max_offsets_per_trigger: int | None = Field(
        default=None, ge=1, description="At most this many records per micro-batch and topic; default no limit."
    )


# --- refined tables ----------------------------------------------------------------------------


class ScdType(IntEnum):
    """How a refined table keeps changes."""

    CURRENT = 1  # SCD type 1: one row per key, its current state
    HISTORY = 2  # SCD type 2: every version, with valid_from, valid_to, is_current


class Flatten(_Model):
    """How nested structs become columns: ``a.b`` becomes ``a_b``."""

    enabled: bool = Field(default=True, description="Flatten nested structs into columns (false: keep them nested).")
    keep: list[ColumnPath] = Field(
        default_factory=list, description="Struct paths kept as one struct column instead of being flattened."
    )

    def kept(self, schema: StructType) -> tuple[str, ...]:
        """The struct paths not flattened: ``keep``, or every top-level column when flattening is off."""
        return tuple(self.keep) if self.enabled else tuple(field.name for field in schema.fields)


class RefinedTable(TableShape, _Model):
    """A refined table, ``<warehouse>/refined/<name>`` (per split value: ``<warehouse>/refined/<name>/<value>``).
    Its shaping keys (``columns``, ``except_columns``, ``mask``, ``computed``, ``where``, ``deletes``,
    ``ignore_null_updates``, ``cluster_by``, ``partition_by``) are :class:`refine.apply.shaping.TableShape`'s."""

    source: Name = Field(description="The source (a key of `sources`) whose raw table is refined.")
    keys: list[ColumnPath] = Field(
        default_factory=list,
        description="Event sources: the columns identifying an entity; its latest event (by `ordering`) is kept. "
        "Empty: every event is appended. Debezium sources take their key from the source's primary key.",
    )
    ordering: ColumnPath | None = Field(
        default=None,
        description="Event sources with keys: the column ordering an entity's events (an event time or version); "
        "an older event never overwrites a newer one.",
    )
    flatten: Flatten = Field(default_factory=Flatten, description="Flatten rules for nested structs.")
    explode: list[ColumnPath] = Field(
        default_factory=list,
        description="Array columns that become child tables `<name>__<array>`, keyed by the parent's keys and `pos`.",
    )
    scd: ScdType = Field(default=ScdType.CURRENT, description="1: current state per key; 2: history of versions.")
    split_by: ColumnPath | None = Field(
        default=None,
        description="Event sources: write one table per value of this column, at <warehouse>/refined/<name>/<value>; "
        "a new value creates its table on the fly.",
    )
    features: TableFeatures = Field(
        default_factory=TableFeatures,
        description="The Delta features of this table and of its child and history tables; what is unset here is "
        "the pipeline's `features`.",
    )
    schema_changes: SchemaChangePolicy | None = Field(
        default=None,
        description="Debezium sources: what the table does when a source column changes type, is dropped or renamed "
        "(evolve, lenient, exception, ignore; docs/concepts/refine.md#schema-changes); unset: the pipeline's.",
    )
    renames: dict[str, str] = Field(
        default_factory=dict,
        description="Debezium Postgres sources: source column renames, old name to new; the new column takes the old "
        "one's values.",
    )
    drop_columns: bool = Field(
        default=False,
        description="Debezium Postgres sources: remove a column the source dropped (default: keep it, NULL in rows "
        "written after the drop).",
    )
    name_template: str | None = Field(
        default=None,
        description="Sources with a `pattern`: each source table's refined table name, from `{prefix}` (the topic "
        "prefix), `{schema}` and `{table}` (Postgres), `{db}` and `{collection}` (MongoDB); default `{table}` "
        "(`{collection}`). Characters a name cannot hold become `_`.",
    )
    name_prefix: str = Field(default="", description="Sources with a `pattern`: put before every table's name.")
    name_suffix: str = Field(default="", description="Sources with a `pattern`: put after every table's name.")
    tables: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Sources with a `pattern`: keys of single tables, by their source table's name (`{table}`, "
        "or `{schema}.{table}`) or a regular expression matching it whole; every match applies, in file order.",
    )

    @field_validator("keys", "explode")
    @classmethod
    def _unique(cls, paths: list[str]) -> list[str]:
        repeated = sorted({path for path in paths if paths.count(path) > 1})
        if repeated:
            raise ValueError(f"listed more than once: {', '.join(repeated)}")
        return paths

    @model_validator(mode="after")
    def _ordering_needs_keys(self) -> RefinedTable:
        if self.ordering and not self.keys:
            raise ValueError("`ordering` only applies together with `keys` (without keys every event is appended)")
        return self

    @model_validator(mode="after")
    def _overrides_are_keys_of_a_table(self) -> RefinedTable:
        for selector, override in self.tables.items():
            _regex(selector)
            for key in override:
                if key not in type(self).model_fields or key in ("source", *GROUP_KEYS):
                    raise ValueError(f"tables.{selector}.{key}: not a key a single table of a pattern can set")
            try:
                self.for_table([override])
            except ValidationError as error:
                first = error.errors()[0]
                raise ValueError(f"tables.{selector}.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        return self

    def for_table(self, overrides: list[dict[str, Any]]) -> RefinedTable:
        """This table's keys for one source table of its pattern: ``overrides`` (its matches in ``tables``) over
        the keys given here, a mapping (``mask``, ``computed``, ``features``, ``renames``, ...) key by key, any
        other value whole."""
        keys = self.model_dump(exclude_unset=True, exclude=set(GROUP_KEYS), by_alias=True)
        for override in overrides:
            for key, value in override.items():
                given = keys.get(key)
                keys[key] = {**given, **value} if isinstance(given, dict) and isinstance(value, dict) else value
        return RefinedTable(**keys)


# The keys of a refined table that name the tables of a pattern (cdc.pipeline.database).
GROUP_KEYS = ("name_template", "name_prefix", "name_suffix", "tables")


# --- business tables and expectations ----------------------------------------------------------


class BusinessTable(_Model):
    """A table computed by SQL over refined tables (and other business tables), by their names."""

    sql: str = Field(min_length=1, description="A Spark SQL query naming refined, child and business tables.")
    trigger_interval_s: float = Field(default=300.0, gt=0, description="Seconds between refreshes.")


class ExpectationAction(str, Enum):
    """What happens to a row that breaks an expectation."""

    WARN = "warn"  # keep it, count it
    DROP = "drop"  # move it to the quarantine, with the expectation's name
    FAIL = "fail"  # stop the job


class Expectation(_Model):
    """A SQL boolean constraint on a refined table's rows."""

    table: Name = Field(description="The refined (or child) table the rows belong to.")
    constraint: str = Field(min_length=1, description="A Spark SQL boolean expression over the table's columns.")
    action: ExpectationAction = Field(default=ExpectationAction.WARN, description="warn, drop or fail.")


# --- the pipeline ------------------------------------------------------------------------------


class Pipeline(_Model):
    """One pipeline file: its sources, refined tables, expectations and business tables.

    Example::

        from cdc import Lakehouse
        from cdc import load_pipeline

        pipeline = load_pipeline("examples/pipelines/shop.yaml")
        print(sorted(pipeline.sources))
        Lakehouse("/data/warehouse").sync(pipeline=pipeline)
    """

    name: Name = Field(description="The pipeline's name.")
    description: str | None = Field(default=None, description="What the pipeline is for.")
    sources: dict[Name, Source] = Field(min_length=1, description="Topics by source name.")
    raw: RawLanding = Field(default_factory=RawLanding, description="How the sources' topics land in raw tables.")
    refined: dict[Name, RefinedTable] = Field(default_factory=dict, description="Refined tables by name.")
    features: TableFeatures = Field(
        default_factory=TableFeatures,
        description="The Delta features of every refined table (its own `features` override them). Unset: no "
        "deletion vectors, and a Change Data Feed only on a table a business table reads.",
    )
    schema_changes: SchemaChangePolicy = Field(
        default=SchemaChangePolicy.LENIENT,
        description="What every Debezium table does when a source column changes type, is dropped or renamed (a "
        "table's own `schema_changes` overrides it; `cdc refine --schema-changes` both).",
    )
    business: dict[Name, BusinessTable] = Field(default_factory=dict, description="Business tables by name.")
    expectations: dict[Name, Expectation] = Field(default_factory=dict, description="Expectations by name.")
