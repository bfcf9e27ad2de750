"""`cdc refine`: a raw table's Change Data Feed, decoded and MERGEd into its refined table.

Per micro-batch: the records are parsed and decoded in Spark with the Debezium schemas of the last
batch, in one pass; a batch that holds others (a handful of distinct strings) has them read on the
driver first, and is parsed with them; undecodable records go to the quarantine; the last change
per key (by LSN, then offset) is MERGEd with position guards, so the job can be rerun or replayed
any number of times.

Supported so far: Debezium Postgres topics (snapshot reads, creates, updates with TOAST placeholders,
deletes, tombstones, truncates, added columns), with a primary key (primary-key changes:
:mod:`refine.rekey`; deleted keys stay deleted: :mod:`refine.deleted`) or without one (multisets:
:mod:`refine.keyless`), with or without the ``{schema, payload}`` wrapper (:mod:`refine.columns`);
MongoDB topics (:mod:`refine.mongo`); rows flattened by ExtractNewRecordState /
ExtractNewDocumentState (:mod:`refine.flattened`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Annotated, NamedTuple

from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from cdc.config import _Strict
from cdc.errors import CdcError, ConfigError, StreamError, TableError
from cdc.raw.config import TOPIC_NAME, Continuous, Trigger
from cdc.raw.table import delta_properties, is_delta_table, raw_table_location, raw_table_topic
from cdc.shared_tables import retrying_conflicts
from cdc.storage import Storage, normalize_location
from cdc.streaming import ProgressReports, batch_error, ending_on_request, failure, stop_queries, with_trigger
from refine.columns import connect_type, declared_schemas, declared_types
from refine.deleted import (
    deleted_location,
    record_deletes,
    record_snapshot_removals,
    record_truncate,
    with_deleted_images,
    without_resurrections,
)
from refine.envelope import ConnectSchema, ConnectType, Op
from refine.flattened import (
    as_envelope,
    has_lsn,
    is_flattened,
    parse_flattened,
    remember_schema,
    remembered_schema,
    with_key_columns,
)
from refine.keyless import applied_location, merge_keyless_changes
from refine.latest import (
    SnapshotStart,
    at_or_after,
    from_snapshot_start,
    last_snapshot_start,
    latest_per_key,
    resets_table,
)
from refine.flatten import array_element, child_table_name
from refine.history import (
    CHANGE,
    ChangeOp,
    apply_history,
    closing_versions,
    debezium_history_spec,
    debezium_versions,
)
from refine.merge import COMMITTED_AT, OP, REFINED_AT, SOURCE_POSITION, merge_changes, refined_rows, refresh_children
from refine.toast import has_placeholder, placeholder_test
from refine.mongo import has_bare_mongo_envelopes, is_mongo, refine_mongo_batch
from refine.decode import decoded_type
from refine.parse import (
    OTHER_SCHEMA,
    first_wrapper_schemas,
    parse_changes,
    record_columns,
    refused_schema,
    wrapper_schemas,
)
from refine.quarantine import quarantine, quarantine_location
from refine.rekey import batch_states, fill_from_old_keys, is_key_change, stored_states
from refine.rules import TableRules, history_table_name


def _readable_type(spark_type: str) -> str:
    connect_type(spark_type)  # ValueError naming the type and the supported ones
    return spark_type


ColumnType = Annotated[str, AfterValidator(_readable_type)]
_KNOWN = 16  # wrapper schemas remembered per raw table and column

# Wrapper schemas each raw table showed, by column, for the life of the process: a later run of
# the table in the same process (`--available-now`, a pipeline's refresh) starts from them.
_SCHEMAS_SEEN: dict[str, dict[str, list[str]]] = {}
# The wrapper schemas, by column, of each raw table's last batch (the newest of them, when it held
# several): the guess the next batch is parsed with (RefineBatch._refine_with_guessed_schemas); None
# when it held no readable one.
_LAST_SCHEMAS: dict[str, dict[str, list[str]] | None] = {}


class RefineRun(_Strict):
    """Where the tables are and when to run: what every refine job's settings hold."""

    warehouse: str = Field(description="Root of the tables: a local path or an object-store URI.")
    trigger: Trigger = Field(default_factory=Continuous, description="Run once over what is there, or continuously.")

    @field_validator("warehouse")
    @classmethod
    def _location(cls, warehouse: str) -> str:
        return normalize_location(warehouse)


class RefineJobConfig(RefineRun):
    """One `cdc refine` run of a Debezium topic."""

    table: str = Field(pattern=TOPIC_NAME, description="The raw table to refine, named by its topic.")
    name: str | None = Field(
        default=None,
        pattern=TOPIC_NAME,
        description="The refined table's name, <warehouse>/refined/<name> (and its checkpoint's); default the topic.",
    )
    columns: dict[str, ColumnType] | None = Field(
        default=None,
        description=(
            "Column types in Spark SQL (bigint, decimal(12,2), timestamp...; timestamp_ntz(p) and time(p) take the "
            "Postgres precision, which picks Debezium's encoding: milliseconds up to 3). For values written without a "
            "schema (schemas.enable=false) they are the row's schema, and `key` is required; with a schema they "
            "override decoded types (e.g. a decimal.handling.mode=string column declared decimal(12,2)). "
            "See refine/columns.py."
        ),
    )
    rules: TableRules | None = Field(default=None, description="Expectations checked before the MERGE (pipelines).")
    key: list[str] | None = Field(
        default=None,
        min_length=1,
        description=("The primary-key columns of a topic written without a schema (each one of `columns`)."),
    )
    explode: list[str] = Field(
        default_factory=list,
        description=(
            "Array columns (paths through nested documents for MongoDB) that become child tables "
            "<warehouse>/refined/<name>__<column>, one row per element keyed by the primary key and `pos`."
        ),
    )
    history: bool = Field(
        default=False,
        description=(
            "Keep every version of each row in <warehouse>/refined/<name>__history (SCD type 2, refine/history.py)."
        ),
    )

    @property
    def target(self) -> str:
        return self.name or self.table

    @model_validator(mode="after")
    def _key_in_columns(self) -> RefineJobConfig:
        if self.key is not None:
            missing = [name for name in self.key if name not in (self.columns or {})]
            if missing:
                raise ValueError(f"key: {', '.join(missing)} not among the declared columns")
        return self


# On a rebuilt refined table: the raw table's version it was rebuilt from (its stream goes on after it).
REBUILT_FROM_PROPERTY = "cdc.rebuilt_from_raw_version"


def refined_table_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/refined/{topic}"


def merged_schema(schemas: list[ConnectSchema]) -> ConnectSchema:
    """One envelope schema covering a batch's schemas: a column added mid-batch is in it (optional, as
    the records before it hold none)."""
    latest = schemas[-1]
    rows = [schema.field_named("after") for schema in schemas]
    fields: dict[str | None, dict] = {}
    for row in rows:
        for column in row.fields or ():
            fields.setdefault(column.field, column.model_dump(exclude_none=True))
    for name, field in fields.items():  # a column added or dropped within the batch: null in some records
        if not all(any(f.field == name for f in row.fields or ()) for row in rows):
            field["optional"] = True
    after = {**rows[-1].model_dump(exclude_none=True), "fields": list(fields.values())}
    envelope = latest.model_dump(exclude_none=True)
    envelope["fields"] = [
        {**after, "field": field["field"]} if field.get("field") in ("before", "after") else field
        for field in envelope["fields"]
    ]
    return ConnectSchema.model_validate(envelope)


def read_schema(text: str) -> tuple[ConnectSchema | None, str | None]:
    """A wrapper schema (JSON text) as a :class:`ConnectSchema`, or None and why it is none, naming the field."""
    try:
        return ConnectSchema.model_validate_json(text), None
    except ValidationError as error:
        first = error.errors()[0]
        names, node = [], None
        try:
            node = json.loads(text)
        except ValueError:
            pass
        for part in first["loc"]:  # the Connect field names along the error's path
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
                if isinstance(node, dict) and "field" in node:
                    names.append(str(node["field"]))
            else:
                break
        found = f" (found {first['input']!r})" if isinstance(first.get("input"), (str, int, float)) else ""
        where = f"field {'.'.join(names)}: " if names else ""
        return None, f"{where}the schema is no Kafka Connect schema: {first['msg']}{found}"


def _envelope_problem(schema: ConnectSchema) -> str | None:
    """Why a Debezium envelope's schema cannot be read (its row images are no structs)."""
    for image in ("before", "after"):
        field = schema.field_named(image)
        if field.type != ConnectType.STRUCT:
            return f"field {image}: the schema's type is {field.type.value}, not struct"
    return None


def readable_value_schemas(texts: list[str]) -> tuple[list[ConnectSchema], list[str], dict[str, str]]:
    """The value schemas of a batch that can be read, their texts, and the others' texts with why.
    When some are Debezium envelopes, schemas of another kind (rows, another connector's) are refused:
    one topic holds one kind."""
    read = {text: read_schema(text) for text in texts}
    refused = {text: f"value {why}" for text, (_, why) in read.items() if why is not None}
    valid = {text: schema for text, (schema, _) in read.items() if schema is not None}
    envelopes = {text: schema for text, schema in valid.items() if not is_flattened(schema) and not is_mongo(schema)}
    if envelopes:
        for text, schema in valid.items():
            if text not in envelopes:
                refused[text] = (
                    "value schema is no Debezium envelope (before, after, source, op), as the topic's others are"
                )
            elif (why := _envelope_problem(schema)) is not None:
                refused[text] = f"value schema: {why}"
    kept = [text for text in texts if text in valid and text not in refused]
    return [valid[text] for text in kept], kept, refused


def readable_key_schemas(texts: list[str], value_schema: ConnectSchema) -> tuple[list[str], dict[str, str]]:
    """The key schemas of a batch whose fields are all columns of the value's rows, of the same type;
    the others' texts with why (a change is applied by its key's columns)."""
    columns = {field.field: field for field in value_schema.field_named("after").fields or ()}
    refused = {}
    for text in texts:
        schema, why = read_schema(text)
        if schema is not None:
            for field in schema.fields or () if schema.type == ConnectType.STRUCT else ():
                if field.field not in columns:
                    why = f"field {field.field} of the key's schema is no column of the value's rows"
                elif decoded_type(field) != decoded_type(columns[field.field]):
                    why = (
                        f"field {field.field} is {decoded_type(field).simpleString()} in the key's schema and "
                        f"{decoded_type(columns[field.field]).simpleString()} in the value's"
                    )
                if why:
                    break
        if why is not None:
            refused[text] = f"key {why}"
    return [text for text in texts if text not in refused], refused


class BatchFacts(NamedTuple):
    """What a batch's parsed changes hold, read in one pass: which steps it needs."""

    problems: int  # records that did not decode
    truncated_at: tuple[int, int] | None  # source position of the last truncate
    snapshot_from: SnapshotStart | None  # the last snapshot start (see resets_table)
    key_changes: bool  # a primary-key change (Debezium's key headers)
    deletes: bool
    placeholders: bool  # a TOAST placeholder in a row image after a change
    other_schemas: int  # records of a schema the parser was not built for (only_schemas)
    records: int


def batch_facts(changes: DataFrame) -> BatchFacts:
    after_type = changes.schema["after"].dataType
    assert isinstance(after_type, StructType)  # a row
    [row] = changes.agg(
        F.count(F.when(F.col("problem").isNotNull(), 1)).alias("problems"),
        F.max(F.when(F.col("op") == Op.TRUNCATE.value, F.struct("source_lsn", "kafka_offset"))).alias("truncate"),
        last_snapshot_start().alias("snapshot"),
        F.coalesce(F.max(is_key_change(F.col("kafka_headers"))), F.lit(False)).alias("key_changes"),
        F.coalesce(F.max(F.col("op") == Op.DELETE.value), F.lit(False)).alias("deletes"),
        F.coalesce(F.max(has_placeholder(F.col("after"), after_type)), F.lit(False)).alias("toast"),
        F.count(F.when(F.col("problem") == OTHER_SCHEMA, 1)).alias("other_schemas"),
        F.count(F.lit(1)).alias("records"),
    ).collect()
    truncate = tuple(row.truncate) if row.truncate else None
    return BatchFacts(
        row.problems,
        truncate,
        SnapshotStart.of(row.snapshot),
        row.key_changes,
        row.deletes,
        row.toast,
        row.other_schemas,
        row.records,
    )


def _has_bare_envelopes(records: DataFrame) -> bool:
    """Values that are Debezium envelopes without the ``{schema, payload}`` wrapper."""
    return not records.where(F.get_json_object("value", "$.op").isNotNull()).isEmpty()


class RefineBatch:
    """The foreachBatch function of `cdc refine`."""

    def __init__(self, config: RefineJobConfig, *, raw_location: str | None = None) -> None:
        self.config = config
        # Another warehouse's raw table: a rebuild (refine/rebuild.py) refines into staging tables.
        self.raw = raw_location or raw_table_location(config.warehouse, config.table)
        self.refined = refined_table_location(config.warehouse, config.target)
        self.deleted = deleted_location(config.warehouse, config.target)
        self.applied = applied_location(config.warehouse, config.target)
        self.error: CdcError | None = None
        self.rules = config.rules or TableRules(table=config.target, topic=config.table, warehouse=config.warehouse)
        self.batch_id = -1
        self.records_read: dict[int, int] = {}  # records of each batch (by id), counted once
        self.conflicts: dict[int, int] = {}  # how often each batch (by id) ran again after a conflict
        # Wrapper schemas seen, by column: the next batch's start (a hint: only those found are used).
        self.known_schemas = _SCHEMAS_SEEN.setdefault(self.raw, {})

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.batch_id = batch_id
        try:
            run_batch_retrying_conflicts(lambda: self._refine_batch(batch), batch_id, self.conflicts)
        except Exception as error:
            # Raised again by watch_refine_queries: Spark's own message would bury it.
            self.error = batch_error(error, self.config.target, batch_id)
            raise

    def _refine_batch(self, batch: DataFrame) -> None:
        spark = batch.sparkSession
        records = batch.where(F.col("_change_type") == "insert")  # raw tables only append
        try:
            if not self._refine_with_guessed_schemas(spark, records):
                # Cached: read from the raw table once (Spark counts a source's rows per read).
                records = records.persist()
                self._refine(spark, records)
        finally:
            records.unpersist()

    def _refine_with_guessed_schemas(self, spark: SparkSession, records: DataFrame) -> bool:
        """Refine a batch of Postgres envelopes or flattened rows in one pass over its records, parsed
        with the wrapper schemas of the last batch (in a new process: of the raw table's first record,
        read apart from the batch): most batches hold just those. False, with nothing written, when a
        record holds another, or is no compact wrapper: the batch is then refined as :meth:`_refine` does.

        The one pass saves caching the records (Debezium's JSON, ~2 KB each) and the pass that finds
        their schemas: a warm refine of 300k changes into 1M rows took ~6.9 s instead of ~8.5 s."""
        if self.raw not in _LAST_SCHEMAS:
            _LAST_SCHEMAS[self.raw] = first_wrapper_schemas(spark.read.format("delta").load(self.raw))
        if (texts := _LAST_SCHEMAS[self.raw]) is None:
            return False
        schemas, _, refused = readable_value_schemas(texts["value"])
        if refused or is_mongo(schemas[0]) or (is_flattened(schemas[0]) and not texts["key"]):
            return False
        schema = schemas[0]
        return self._refine_rows(spark, records, [schema], texts, guessed=True)

    def _refine(self, spark: SparkSession, records: DataFrame) -> None:
        # The batch's distinct schemas (a handful of strings, not data), found from those seen before.
        texts = wrapper_schemas(records, {column: self.known_schemas.get(column, []) for column in ("value", "key")})
        for column, found in texts.items():
            self.known_schemas[column] = list(dict.fromkeys([*found, *self.known_schemas.get(column, ())]))[:_KNOWN]
        schemas, value_texts, refused = readable_value_schemas(texts["value"])
        _LAST_SCHEMAS[self.raw] = {"value": value_texts[-1:], "key": texts["key"][-1:]} if value_texts else None
        bare_mongo = not texts["value"] and has_bare_mongo_envelopes(records)  # documents need no declared columns
        if not texts["value"] and not bare_mongo and _has_bare_envelopes(records):
            return self._refine_schemaless(spark, records)
        if bare_mongo or (schemas and is_mongo(schemas[-1])):
            refine_mongo_batch(
                spark,
                records,
                refined=self.refined,
                raw=self.raw,
                topic=self.config.table,
                quarantine_at=quarantine_location(self.config.warehouse),
                rules=self.rules,
                batch_id=self.batch_id,
                children={path: self._child_location(path) for path in self.config.explode},
                history_at=self._history_location() if self.config.history else None,
            )
            return
        schemas = schemas or [known for known in [remembered_schema(spark, self.refined)] if known]
        if not schemas:  # tombstones (their deletes came before them), and values that are no envelope
            problem = F.when(
                F.col("value").isNull(), F.lit("value is not UTF-8 text (its bytes are in the raw table's value_bytes)")
            )
            if (refusal := refused_schema(F.col("value"), refused)) is not None:
                problem = problem.when(refusal.isNotNull(), refusal)
            problem = problem.otherwise(F.lit("value is not a Debezium JSON envelope"))
            quarantine(
                spark,
                quarantine_location(self.config.warehouse),
                self.raw,
                self.config.table,
                records.where(F.col("value").isNotNull() | F.col("value_bytes").isNotNull()).select(
                    *record_columns(), F.col("value").alias("raw_value"), problem.alias("problem")
                ),
            )
            return
        self._refine_rows(spark, records, schemas, {**texts, "value": value_texts}, refused=refused)

    def _refine_rows(
        self,
        spark: SparkSession,
        records: DataFrame,
        schemas: list[ConnectSchema],
        texts: dict[str, list[str]],
        guessed: bool = False,
        refused: dict[str, str] | None = None,
    ) -> bool:
        """Refine Postgres envelopes or flattened rows of the value ``schemas`` (in order of appearance)
        and the wrapper schema ``texts``; ``guessed``: see :meth:`_apply`; ``refused``: value schema
        texts the batch cannot be read with, and why (their records go to the quarantine)."""
        flattened = is_flattened(schemas[-1])
        value_schema = merged_schema([as_envelope(schema) if flattened else schema for schema in schemas])
        key_texts, refused_keys = texts["key"], {}
        if not flattened:
            key_texts, refused_keys = readable_key_schemas(texts["key"], value_schema)
            if guessed and refused_keys:
                return False
        # None: no primary key (or none readable: then only the quarantine is written, see _apply)
        key_schema = ConnectSchema.model_validate_json(key_texts[-1]) if key_texts else None
        if flattened:
            if key_schema is None:
                raise TableError(
                    "flattened rows (ExtractNewRecordState) of a table without a primary key cannot "
                    "be refined: without `before`, a delete cannot say which row it removes",
                    table=self.raw,
                )
            value_schema = with_key_columns(value_schema, key_schema)
        changes = (
            parse_flattened(records, key_schema, value_schema, has_lsn(schemas[-1]), texts, only_schemas=guessed)
            if flattened
            else parse_changes(
                records,
                key_schema,
                value_schema,
                schema_texts={**texts, "key": key_texts},
                only_schemas=guessed,
                refused_schemas={"value": refused or {}, "key": refused_keys},
            )
        )
        applied = self._apply(
            spark,
            records,
            declared_types(changes, self.config.columns or {}),
            value_schema,
            key_schema,
            guessed,
            no_readable_key=bool(refused_keys) and key_schema is None,
        )
        if applied and flattened:
            remember_schema(spark, self.refined, schemas[-1])
        return applied

    def _refine_schemaless(self, spark: SparkSession, records: DataFrame) -> None:
        """Values without the ``{schema, payload}`` wrapper: Postgres envelopes read with the declared columns."""
        if not self.config.columns or not self.config.key:
            raise TableError(
                "the topic's values carry no schema (schemas.enable=false): declare the refined table's `columns` "
                "(name: Spark type) and its `key` in the refine job's configuration",
                table=self.raw,
            )
        value_schema, key_schema = declared_schemas(self.config.columns, self.config.key)
        changes = parse_changes(records, key_schema, value_schema, wrapped=False)
        self._apply(spark, records, declared_types(changes, self.config.columns), value_schema, key_schema)

    def _apply(
        self,
        spark: SparkSession,
        records: DataFrame,
        changes: DataFrame,
        value_schema: ConnectSchema,
        key_schema: ConnectSchema | None,
        guessed: bool = False,
        no_readable_key: bool = False,
    ) -> bool:
        """Apply the batch's parsed changes; False, with nothing written, when the schemas were
        ``guessed`` and a record holds another. ``no_readable_key``: the batch's keys have schemas that
        cannot be read (so went to the quarantine): the table is keyed, and only the quarantine is written."""
        # Parsed once, for the facts below, the quarantine and the MERGEs; the raw value only where a
        # problem needs it.
        parsed = changes.withColumn("raw_value", F.when(F.col("problem").isNotNull(), F.col("raw_value"))).persist()
        try:
            facts = batch_facts(parsed)
            if guessed and facts.other_schemas:
                return False
            # Spark counts a record each time the batch is read: a batch parsed again would count twice.
            self.records_read[self.batch_id] = facts.records
            if facts.problems:
                quarantine(
                    spark,
                    quarantine_location(self.config.warehouse),
                    self.raw,
                    self.config.table,
                    parsed.where("problem IS NOT NULL"),
                )
            records.unpersist()  # the parsed changes are cached now
            valid = (parsed.where("problem IS NULL") if facts.problems else parsed).drop("raw_value")
            columns = [field.field for field in value_schema.field_named("after").fields or ()]
            if no_readable_key:
                return True
            if key_schema is None:
                self.rules.refuse_unchecked("tables without a primary key")
                self._refuse_keyless()
                merge_keyless_changes(spark, self.refined, self.applied, valid, columns)
            else:
                self._merge_keyed(spark, valid, key_schema, columns, facts)
            return True
        finally:
            parsed.unpersist()

    def _refuse_keyless(self) -> None:
        for wanted, setting in [(self.config.explode, "explode"), (self.config.history, "SCD type 2 (history)")]:
            if wanted:
                raise ConfigError(
                    f"{setting} needs a primary key: the source table has none (Kafka keys are null)",
                    table=self.config.target,
                )

    def _history_location(self) -> str:
        return refined_table_location(self.config.warehouse, history_table_name(self.config.target))

    def _child_location(self, path: str) -> str:
        return refined_table_location(self.config.warehouse, child_table_name(self.config.target, path))

    def _check_explode(self, row_type: StructType) -> None:
        for path in self.config.explode:
            try:
                array_element(row_type, path)
            except ConfigError as error:
                raise ConfigError(f"explode: {error.message}", table=self.config.target) from None

    def _merge_keyed(
        self, spark: SparkSession, changes: DataFrame, key_schema: ConnectSchema, columns: list[str], facts: BatchFacts
    ) -> None:
        key_columns = [field.field for field in key_schema.fields or ()]
        self._check_explode(changes.schema["after"].dataType)
        truncated_at, reset = facts.truncated_at, facts.truncated_at is not None or facts.snapshot_from is not None
        filled, stored = changes, None
        if facts.key_changes:  # only then are stored rows read (a scan of the refined table)
            stored = stored_states(spark, [self.refined, self.deleted], key_columns, changes.schema["after"].dataType)
            filled = fill_from_old_keys(changes, key_schema, stored)
        latest = latest_per_key(filled, key_columns, truncated_at, facts.placeholders, facts.snapshot_from)
        if facts.deletes:
            latest = with_deleted_images(latest, batch_states(filled), stored)
        with self.rules.enforced_changes(spark, latest, columns, key_columns, self.batch_id) as rows:
            rows = rows.persist()  # computed once from the tables as they were
            try:
                if facts.deletes:
                    record_deletes(spark, self.deleted, rows, key_columns)
                if truncated_at is not None:
                    record_truncate(spark, self.deleted, truncated_at)
                snapshot_at = None if facts.snapshot_from is None else facts.snapshot_from.position
                if snapshot_at is not None:
                    record_snapshot_removals(spark, self.deleted, self.refined, rows, key_columns, snapshot_at)
                guarded = without_resurrections(spark, self.deleted, rows, key_columns)
                keys = rows.select(*[F.col(f"`{key}`") for key in key_columns])  # cached with rows
                merge_changes(
                    spark, self.refined, guarded, key_columns, truncated_at, keys=keys, snapshot_at=snapshot_at
                )
                for path in self.config.explode:
                    refresh_children(
                        spark, self.refined, self._child_location(path), keys, key_columns, path, truncated=reset
                    )
            finally:
                rows.unpersist()
        if self.config.history:
            self._record_history(spark, filled, key_columns, columns, truncated=reset)

    def _record_history(
        self, spark: SparkSession, changes: DataFrame, key_columns: list[str], columns: list[str], truncated: bool
    ) -> None:
        """Every change of the batch as a version of its row (TOAST placeholders take the previous
        version's value); each truncate (or snapshot start) closes the versions open before it."""
        spec = debezium_history_spec(key_columns, list(SOURCE_POSITION))
        row_changes = changes.where(F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value))
        versions = debezium_versions(refined_rows(row_changes, columns))
        versions = self.rules.passing_versions(versions, F.col(CHANGE) == ChangeOp.DELETE.value)
        unchanged = {
            f.name: test
            for f in versions.schema
            if f.name in columns and (test := placeholder_test(f.dataType)) is not None
        }
        location = self._history_location()
        position = [F.col(c) for c in SOURCE_POSITION]
        # The batch's resets, in order: a handful of positions, not data.
        truncates = (
            []
            if not truncated
            else (
                changes.where(resets_table())
                .select("source_lsn", "kafka_offset", "kafka_partition", "source_committed_at", "op")
                .distinct()
                .orderBy("source_lsn", "kafka_offset")
                .collect()
            )
        )
        done = None  # versions up to here are applied
        for truncate in truncates:
            at = [F.lit(truncate.source_lsn), F.lit(truncate.kafka_offset)]
            part = versions.where(~at_or_after(position, at))
            apply_history(
                spark, location, part if done is None else part.where(at_or_after(position, done)), spec, unchanged
            )
            history = spark.read.format("delta").load(location)
            if truncate.op == Op.READ.value and not history.where(at_or_after(position, at)).isEmpty():
                done = at
                continue  # a replayed old snapshot: the history already holds what came after it
            closing = closing_versions(
                history,
                spec,
                versions.schema,
                dict(zip(SOURCE_POSITION, truncate[:2])),
                {
                    COMMITTED_AT: F.lit(truncate.source_committed_at),
                    OP: F.lit(truncate.op),
                    REFINED_AT: F.current_timestamp(),
                },
            )
            if truncate.op == Op.READ.value:  # a snapshot: the keys the batch changes from its first read on stay open
                start = SnapshotStart(truncate.kafka_partition, truncate.kafka_offset, truncate.source_lsn)
                changed = row_changes.where(from_snapshot_start(start)).select(
                    *[F.col(f"key.`{k}`").alias(k) for k in key_columns]
                )
                closing = closing.join(changed, key_columns, "left_anti")
            apply_history(spark, location, closing, spec, unchanged)
            done = at
        apply_history(
            spark, location, versions if done is None else versions.where(at_or_after(position, done)), spec, unchanged
        )


def run_batch_retrying_conflicts(refine_batch: Callable[[], None], batch_id: int, conflicts: dict[int, int]) -> None:
    """Run a micro-batch, and again while another writer's commit (`cdc optimize` compacting the refined
    table, say) makes Delta refuse one of its writes: a batch replays harmlessly, as after a crash,
    so the job goes on instead of stopping. ``conflicts`` counts the reruns by batch id."""

    def count(_: BaseException) -> None:
        conflicts[batch_id] = conflicts.get(batch_id, 0) + 1

    retrying_conflicts(refine_batch, on_conflict=count)


def refine_checkpoint_location(warehouse: str, name: str) -> str:
    return f"{warehouse}/_cdc/checkpoints/refine/{name}"


def starting_raw_version(spark: SparkSession, refined: str, raw: str) -> int:
    """The raw table's first version a new checkpoint of the refined table's stream reads: after the one
    a rebuild made it from (:mod:`refine.rebuild`), else 0. (An existing checkpoint knows its own.)
    Delta refuses to start after its last version: until the raw table has a newer one, the stream starts
    at the rebuild's, whose changes the refined table holds already (a replay its guards leave out)."""
    if not is_delta_table(spark, refined):
        return 0
    rebuilt_from = delta_properties(spark, refined).get(REBUILT_FROM_PROPERTY)
    if rebuilt_from is None:
        return 0
    latest = DeltaTable.forPath(spark, raw).history(1).select("version").collect()[0][0]
    return min(int(rebuilt_from) + 1, latest)


def start_refine_query(
    spark: SparkSession,
    warehouse: str,
    topic: str,
    name: str,
    batch: Callable[[DataFrame, int], None],
    trigger: Trigger,
) -> StreamingQuery:
    """Stream the raw table of ``topic``'s Change Data Feed through ``batch`` (a foreachBatch
    function), with a tool-managed checkpoint at ``<warehouse>/_cdc/checkpoints/refine/<name>``."""
    raw = raw_table_location(warehouse, topic)
    if raw_table_topic(spark, raw) is None:
        raise TableError("no raw table for this topic: run `cdc raw` first", table=raw)
    checkpoint = refine_checkpoint_location(warehouse, name)
    starting = (
        0
        if Storage(spark).exists(checkpoint)
        else starting_raw_version(spark, refined_table_location(warehouse, name), raw)
    )
    writer = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", starting)
        .load(raw)
        .writeStream.queryName(f"refine {name}")
        .foreachBatch(batch)
        .option("checkpointLocation", checkpoint)
    )
    return with_trigger(writer, trigger).start()


def watch_refine_queries(
    queries: dict[str, StreamingQuery],
    say: Callable[[str], None],
    stop: threading.Event,
    batches: dict[str, object] | None = None,
) -> dict[str, int]:
    """Report each query's micro-batches until all have stopped (or ``stop`` is set); return the
    changes each read. A query that failed stops the others and raises, naming its table."""
    changes = dict.fromkeys(queries, 0)
    reports = {name: ProgressReports(query) for name, query in queries.items()}
    try:
        with ending_on_request(stop):
            while any(query.isActive for query in queries.values()) and not stop.is_set():
                for name, query in queries.items():
                    try:
                        query.awaitTermination(0.5)
                    except StreamingQueryException:
                        pass  # reported just below, by _raise_failure
                    read = getattr((batches or {}).get(name), "records_read", {})
                    conflicts = getattr((batches or {}).get(name), "conflicts", {})
                    for report in reports[name].new():
                        batch, rows = report["batchId"], read.pop(report["batchId"], report["numInputRows"])
                        if rows:  # not one of Spark's idle reports between batches
                            changes[name] += rows
                            rerun = conflicts.pop(batch, 0)
                            say(
                                f"refine {name} batch {batch}: {rows:,} changes"
                                + (
                                    f" (run again after {rerun} conflicting commit(s) by another writer)"
                                    if rerun
                                    else ""
                                )
                            )
                    _raise_failure(name, query, batches)
            for name, query in queries.items():  # one may have failed while another was awaited
                _raise_failure(name, query, batches)
    finally:
        stop_queries(queries.values(), stop, say)
    return changes


def _raise_failure(name: str, query: StreamingQuery, batches: dict[str, object] | None) -> None:
    if (message := failure(query)) is not None:
        # A micro-batch's own failure (batch_error) reaches the user as itself: Spark's message would bury it.
        if (error := getattr((batches or {}).get(name), "error", None)) is not None:
            raise error
        raise StreamError(f"the refine stream stopped: {message.splitlines()[0]}", table=name)


def run_refine_job(
    spark: SparkSession,
    config: RefineJobConfig,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> int:
    """Refine the raw table into ``<warehouse>/refined/<name>``; return the number of changes read."""
    batch = RefineBatch(config)
    query = start_refine_query(spark, config.warehouse, config.table, config.target, batch, config.trigger)
    counts = watch_refine_queries({config.target: query}, say, stop or threading.Event(), {config.target: batch})
    changes = counts[config.target]
    say(f"refine {config.target}: {changes:,} changes -> {refined_table_location(config.warehouse, config.target)}")
    return changes
