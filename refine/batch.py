"""The foreachBatch function of `cdc refine` (:class:`RefineBatch`).

Per micro-batch: the records are parsed and decoded in Spark with the Debezium schemas of the last
batch, in one pass; a batch that holds others (a handful of distinct strings) has them read on the
driver first (:mod:`refine.batch_schemas`), and is parsed with them; undecodable records go to the
quarantine; the changes are applied by the path their table takes, each of which can be rerun or
replayed any number of times: keyed (the last change per key, by LSN then offset, MERGEd with position
guards: :mod:`refine.apply.keyed`, its history: :mod:`refine.apply.history`), keyless (:mod:`refine.apply.keyless`) or
MongoDB documents (:mod:`refine.mongo.documents`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc.core.errors import CdcError, ConfigError
from cdc.core.frames import computed_once
from cdc.core.shared_tables import retrying_conflicts
from cdc.core.streaming import batch_error, counting_spark_jobs
from cdc.core.tables import delta_properties, is_delta_table, raw_table_location
from refine.apply.batch_facts import BatchFacts, batch_facts
from refine.apply.deleted import deleted_location
from refine.apply.flatten import child_table_name
from refine.apply.keyed import KeyedTables, merge_keyed_batch
from refine.apply.keyless import applied_location, merge_keyless_batch
from refine.apply.merge import TableSettings, check_shape
from refine.apply.rules import TableRules, history_table_name
from refine.apply.schema_changes import SchemaChangePolicy, misfit, with_renamed_columns
from refine.apply.shaping import masked_reason
from refine.apply.snapshots import with_lone_snapshot_starts
from refine.batch_schemas import readable_value_schemas
from refine.config import Connector, RefineJobConfig, refined_table_location
from refine.event_log import BatchEvent, EventLog
from refine.mongo.documents import has_bare_mongo_envelopes, is_mongo, refine_mongo_batch
from refine.mongo.unwrapped_documents import (
    as_mongo_envelopes,
    has_unwrapped_documents,
    may_be_unwrapped_documents,
    refuse_mixed_forms,
)
from refine.parse_batch import ParsedBatch, parse_rows, parse_schemaless
from refine.quality.quarantine import quarantine, quarantine_location
from refine.records.envelope import ConnectSchema
from refine.records.flattened import is_flattened, remember_schema, remembered_schema
from refine.records.parse import VALUE_NOT_UTF8, first_wrapper_schemas, record_columns, refused_schema, wrapper_schemas
from refine.state import TableState

_BOTH_FORMS = "holds both the MongoDB connector's envelopes and ExtractNewDocumentState's rows"
UNWRAPPED_ROW = (
    "value is a JSON object but no Debezium envelope: rows flattened by ExtractNewRecordState are refined "
    "with their {schema, payload} wrapper (schemas.enable=true)"
)


def _has_bare_envelopes(records: DataFrame) -> bool:
    """Values that are Debezium envelopes without the ``{schema, payload}`` wrapper."""
    return not records.where(F.get_json_object("value", "$.op").isNotNull()).isEmpty()


class RefineBatch:
    """The foreachBatch function of `cdc refine`: one table's micro-batches, with what its job knows of
    the table between them (``state``: a new job's, unless given)."""

    def __init__(
        self,
        config: RefineJobConfig,
        *,
        raw_location: str | None = None,
        state: TableState | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.config = config
        self.events = events  # where each batch's row goes (refine/event_log.py), if anywhere
        # Another warehouse's raw table: a rebuild (refine/rebuild.py) refines into staging tables.
        self.raw = raw_location or raw_table_location(config.warehouse, config.table)
        self.refined = refined_table_location(config.warehouse, config.target)
        shape = config.shape
        mask_key = shape.mask_key.read() if shape.mask_key is not None else None  # a missing key fails the start
        self.state = state or TableState.of(
            self.refined,
            TableSettings(
                config.features,
                config.schema_rules,
                cluster_by=tuple(shape.cluster_by),
                partition_by=tuple(shape.partition_by),
                shape_fingerprint=shape.fingerprint(mask_key),
            ),
        )
        self.deleted = deleted_location(config.warehouse, config.target)
        self.applied = applied_location(config.warehouse, config.target)
        history = refined_table_location(config.warehouse, history_table_name(config.target))
        self.tables = KeyedTables(
            name=config.target,
            refined=self.refined,
            deleted=self.deleted,
            children={
                path: refined_table_location(config.warehouse, child_table_name(config.target, path))
                for path in config.explode
            },
            history=history if config.history else None,
            settings=self.state.settings,
            shape=shape,
            mask_key=mask_key,
        )
        self.error: CdcError | None = None
        self.rules = config.rules or TableRules(table=config.target, topic=config.table, warehouse=config.warehouse)
        self.batch_id = -1
        self.records_read: dict[int, int] = {}  # records of each batch (by id), counted once
        self.conflicts: dict[int, int] = {}  # how often each batch (by id) ran again after a conflict
        self.spark_jobs: dict[int, int] = {}  # the Spark jobs each batch (by id) ran, its reruns included
        self.facts: BatchFacts | None = None  # the facts of the batch running (or last run)

    def check_shape(self, spark: SparkSession) -> None:
        """ConfigError, before a job starts, when its refined table was refined with another shape."""
        if is_delta_table(spark, self.refined):
            check_shape(self.refined, delta_properties(spark, self.refined), self.state.settings.shape_fingerprint)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.batch_id, self.facts = batch_id, None
        started, clock = datetime.now(UTC), time.monotonic()
        try:
            with counting_spark_jobs(batch.sparkSession, self.spark_jobs, batch_id):
                run_batch_retrying_conflicts(lambda: self._refine_batch(batch), batch_id, self.conflicts)
        except Exception as error:
            # Raised again by watch_refine_queries: Spark's own message would bury it.
            self.error = batch_error(error, self.config.target, batch_id)
            raise
        if self.events is not None:
            self.events.record(self._event(batch_id, started, time.monotonic() - clock))

    def _event(self, batch_id: int, started: datetime, seconds: float) -> BatchEvent:
        """The event log's row of the batch just refined."""
        ended = datetime.now(UTC)
        facts = self.facts
        newest = facts.newest_commit if facts is not None else None
        if newest is not None and newest.tzinfo is None:
            newest = newest.astimezone(UTC)  # PySpark returns the process's local time, without a zone
        return BatchEvent(
            table=self.config.target,
            batch=batch_id,
            started_at=started,
            ended_at=ended,
            changes_read=self.records_read.get(batch_id, facts.records if facts is not None else 0),
            quarantined=facts.problems if facts is not None else 0,
            spark_jobs=self.spark_jobs.get(batch_id, 0),
            seconds=seconds,
            newest_source_commit=newest,
            lag_seconds=None if newest is None else (ended - newest).total_seconds(),
        )

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
        with the wrapper schemas of the last batch (in a new job: of a record of the raw table's newest
        commit, read apart from the batch): most batches hold just those. False, with nothing written, when a
        record holds another, or is no compact wrapper: the batch is then refined as :meth:`_refine` does.

        The one pass saves caching the records (Debezium's JSON, ~2 KB each) and the pass that finds
        their schemas: a warm refine of 300k changes into 1M rows took ~6.9 s instead of ~8.5 s."""
        state = self.state
        if not state.last_schemas_known:
            state.last_schemas = self._newest_wrapper_schemas(spark)
            state.last_schemas_known = True
        if (texts := state.last_schemas) is None:
            return False
        schemas, _, refused = readable_value_schemas(texts["value"])
        if refused or is_mongo(schemas[0]) or self._may_be_documents(schemas[0]):
            return False
        if is_flattened(schemas[0]) and not texts["key"]:
            return False
        schema = schemas[0]
        return self._refine_rows(spark, records, [schema], texts, guessed=True)

    def _newest_wrapper_schemas(self, spark: SparkSession) -> dict[str, list[str]] | None:
        """A new job's guess: the wrapper schemas of a record of the raw table's newest commit (the
        schemas a caught-up table's next batch holds), else of its first record (a newest commit that
        added none: a compaction, a property)."""
        newest = DeltaTable.forPath(spark, self.raw).history(1).select("version").collect()[0][0]
        newest_records = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", newest)
            .option("endingVersion", newest)
            .load(self.raw)
            .where(F.col("_change_type") == "insert")
        )
        guess = first_wrapper_schemas(newest_records)
        return guess if guess is not None else first_wrapper_schemas(spark.read.format("delta").load(self.raw))

    def _refine(self, spark: SparkSession, records: DataFrame) -> None:
        """Refine a batch by the wrapper schemas its records hold: MongoDB documents, Postgres envelopes
        or flattened rows (with or without the wrapper), or, with none readable, records to quarantine."""
        texts = self._wrapper_schemas(records)
        # A table refined from flattened rows keeps their schema: an envelope in its topic is refused.
        remembered = remembered_schema(spark, self.refined)
        schemas, value_texts, refused = readable_value_schemas(texts["value"], holds_rows=remembered is not None)
        self.state.last_schemas = {"value": value_texts[-1:], "key": texts["key"][-1:]} if value_texts else None
        self.state.last_schemas_known = True
        bare_mongo = not texts["value"] and has_bare_mongo_envelopes(records)  # documents need no declared columns
        bare_envelopes = not texts["value"] and not bare_mongo and _has_bare_envelopes(records)
        # ExtractNewDocumentState's rows are refined as the documents they are, each of its own shape.
        if self._unwrapped_documents(
            spark, records, schemas, bare_rows=not (texts["value"] or bare_mongo or bare_envelopes)
        ):
            self._refine_mongo(spark, as_mongo_envelopes(records))
            self.state.unwrapped.set(spark)
            return None
        if bare_envelopes:
            return self._refine_schemaless(spark, records)
        if bare_mongo or (schemas and is_mongo(schemas[-1])):
            self.state.unwrapped.refuse_envelopes(spark)
            if bare_mongo and has_unwrapped_documents(records):
                refuse_mixed_forms(self.refined, _BOTH_FORMS)
            return self._refine_mongo(spark, records)
        schemas = schemas or [known for known in [remembered] if known]
        if not schemas:  # tombstones (their deletes came before them), and values that are no envelope
            return self._quarantine_unreadable(spark, records, refused)
        self._refine_rows(spark, records, schemas, {**texts, "value": value_texts}, refused=refused)

    def _may_be_documents(self, value_schema: ConnectSchema) -> bool:
        """Whether rows of this schema may be ExtractNewDocumentState's (see ``RefineJobConfig.connector``)."""
        if self.config.connector is Connector.MONGODB:
            return is_flattened(value_schema)
        return self.config.connector is Connector.AUTO and may_be_unwrapped_documents(value_schema)

    def _unwrapped_documents(
        self, spark: SparkSession, records: DataFrame, schemas: list[ConnectSchema], bare_rows: bool
    ) -> bool:
        """Whether the batch is ExtractNewDocumentState's rows (see ``RefineJobConfig.connector``), from the
        value schemas it holds, or, with none (``bare_rows``: neither envelopes nor their schemas), from its
        records; a batch of tombstones alone follows the table's mark. Envelopes and such rows in one
        refined table are refused (:func:`refine.mongo.unwrapped_documents.refuse_mixed_forms`)."""
        connector = self.config.connector
        if connector is Connector.POSTGRES or not (bare_rows or any(map(is_flattened, schemas))):
            return False
        if any(map(is_mongo, schemas)):
            refuse_mixed_forms(self.refined, _BOTH_FORMS)
        if self.state.unwrapped.is_set(spark):
            return True
        if connector is Connector.MONGODB:  # rows, not a batch of tombstones alone
            documents = bool(schemas) or not records.where(F.col("value").isNotNull()).isEmpty()
        else:  # a scan of the (cached) records, only where a schema has an _id or no schema tells
            candidates = bare_rows or any(map(may_be_unwrapped_documents, schemas))
            documents = candidates and has_unwrapped_documents(records)
        if documents:
            self.state.unwrapped.refuse_rows(spark)
        return documents

    def _wrapper_schemas(self, records: DataFrame) -> dict[str, list[str]]:
        """The batch's distinct wrapper schemas by column (a handful of strings, not data), found from
        those seen before, which they join."""
        seen = self.state.seen_schemas
        texts = wrapper_schemas(records, {column: seen.get(column, []) for column in ("value", "key")})
        self.state.saw_schemas(texts)
        return texts

    def _refuse_shape(self, kind: str) -> None:
        if self.config.shape.declared:
            raise ConfigError(
                f"{kind} are not shaped yet (columns, except_columns, mask, computed, where, deletes, "
                "ignore_null_updates, cluster_by, partition_by apply to Postgres tables)",
                table=self.config.target,
            )

    def _refine_mongo(self, spark: SparkSession, records: DataFrame) -> None:
        self._refuse_shape("MongoDB collections")
        refine_mongo_batch(
            spark,
            records,
            refined=self.refined,
            settings=self.state.settings,
            raw=self.raw,
            topic=self.config.table,
            quarantine_at=quarantine_location(self.config.warehouse),
            rules=self.rules,
            batch_id=self.batch_id,
            children=self.tables.children,
            history_at=self.tables.history,
        )

    def _quarantine_unreadable(self, spark: SparkSession, records: DataFrame, refused: dict[str, str]) -> None:
        """Quarantine a batch without a readable schema, each record with why (tombstones go nowhere)."""
        problem = F.when(F.col("value").isNull(), F.lit(VALUE_NOT_UTF8))
        if (refusal := refused_schema(F.col("value"), refused)) is not None:
            problem = problem.when(refusal.isNotNull(), refusal)
        row = F.try_variant_get(F.try_parse_json("value"), "$", "map<string,variant>").isNotNull()
        problem = problem.when(row, F.lit(UNWRAPPED_ROW)).otherwise(F.lit("value is not a Debezium JSON envelope"))
        quarantine(
            spark,
            quarantine_location(self.config.warehouse),
            self.raw,
            self.config.table,
            records.where(F.col("value").isNotNull() | F.col("value_bytes").isNotNull()).select(
                *record_columns(), F.col("value").alias("raw_value"), problem.alias("problem")
            ),
        )

    def _refine_rows(
        self,
        spark: SparkSession,
        records: DataFrame,
        schemas: list[ConnectSchema],
        texts: dict[str, list[str]],
        guessed: bool = False,
        refused: dict[str, str] | None = None,
    ) -> bool:
        """Refine Postgres envelopes or flattened rows (:func:`refine.parse_batch.parse_rows`); False, with
        nothing written, when the schemas were ``guessed`` and a record holds another."""
        parsed = parse_rows(
            records,
            schemas,
            texts,
            self.config.columns or {},
            self.raw,
            guessed,
            refused,
            time_zone=self.config.source_time_zone,
        )
        if parsed is None:
            return False
        applied = self._apply(spark, records, parsed, guessed)
        if applied and is_flattened(schemas[-1]) and self.state.flattened_schema != schemas[-1]:
            remember_schema(spark, self.refined, schemas[-1])
            self.state.flattened_schema = schemas[-1]
        return applied

    def _refine_schemaless(self, spark: SparkSession, records: DataFrame) -> None:
        """Values without the ``{schema, payload}`` wrapper: Postgres envelopes read with the declared columns."""
        self._apply(spark, records, parse_schemaless(records, self.config.columns, self.config.key, self.raw))

    def _apply(self, spark: SparkSession, records: DataFrame, batch: ParsedBatch, guessed: bool = False) -> bool:
        """Quarantine the parsed ``batch``'s undecodable records and apply its changes; False, with nothing
        written, when the schemas were ``guessed`` and a record holds another."""
        # Parsed once, for the facts below, the quarantine and the MERGEs; the raw value only where a
        # problem needs it.
        changes = self._follow_renames_and_fits(spark, batch.changes)
        parsed = changes.withColumn("raw_value", F.when(F.col("problem").isNotNull(), F.col("raw_value"))).persist()
        try:
            facts = batch_facts(parsed)
            self.facts = facts
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
                    parsed.where("problem IS NOT NULL").withColumn(
                        "problem", masked_reason(F.col("problem"), self.config.shape)
                    ),
                )
            records.unpersist()  # the parsed changes are cached now
            columns = [field.field_name for field in batch.value_schema.field_named("after").fields or ()]
            if batch.no_readable_key:
                return True
            # The MERGEs plan over a leaf, not the parsing's plan (hundreds of expressions per schema): planned
            # again by each of their queries, it took minutes and most of a 2 GB driver for a batch of 20
            # changes with a history and a child table. Taken from the cache, the leaf has its measured size,
            # not the parsing's estimate (checkpointed in place of the cache, a batch's rerun took 107 s, not 80 s).
            valid = (parsed.where("problem IS NULL") if facts.problems else parsed).drop("raw_value")
            with computed_once(valid) as decoded:
                to_apply, facts = with_lone_snapshot_starts(spark, decoded, facts, self.refined)
                self._merge(spark, to_apply, batch, columns, facts)
            return True
        finally:
            parsed.unpersist()

    def _follow_renames_and_fits(self, spark: SparkSession, changes: DataFrame) -> DataFrame:
        """Parsed ``changes`` with the declared renames followed
        (:func:`refine.apply.schema_changes.with_renamed_columns`) and, under the policy ``ignore``, a problem
        for each value the refined table's column cannot hold."""
        if self.config.schema_changes is not SchemaChangePolicy.IGNORE:  # which follows no rename
            return with_renamed_columns(changes, self.config.renames)
        if not is_delta_table(spark, self.refined):
            return changes
        row_type = changes.schema["after"].dataType
        assert isinstance(row_type, StructType)  # a row of columns
        stored = spark.read.format("delta").load(self.refined).schema
        # A masked or computed column's stored type is the shape's, not the source's.
        shaped = {*self.config.shape.mask, *self.config.shape.computed}
        stored = StructType([f for f in stored.fields if f.name not in shaped])
        images = [(F.col(image), f"{image}.") for image in ("after", "before")]
        reasons = [reason for image, label in images if (reason := misfit(image, label, row_type, stored)) is not None]
        return changes.withColumn("problem", F.coalesce(F.col("problem"), *reasons)) if reasons else changes

    def _merge(
        self,
        spark: SparkSession,
        changes: DataFrame,
        batch: ParsedBatch,
        columns: list[str],
        facts: BatchFacts,
    ) -> None:
        """Apply the parsed ``batch``'s valid ``changes`` (of the source ``columns``) by their table's path:
        keyed, or keyless when the Kafka keys are null."""
        if batch.key_schema is None:
            merge_keyless_batch(
                spark,
                changes,
                columns,
                columns_by_schema=batch.columns_by_schema,
                location=self.refined,
                settings=self.state.settings,
                applied_at=self.applied,
                rules=self.rules,
                explode=self.config.explode,
                history=self.config.history,
                table=self.config.target,
                shape=self.config.shape,
                mask_key=self.tables.mask_key,
            )
        else:
            merge_keyed_batch(spark, changes, batch.key_schema, columns, facts, self.tables, self.rules, self.batch_id)


def run_batch_retrying_conflicts(refine_batch: Callable[[], None], batch_id: int, conflicts: dict[int, int]) -> None:
    """Run a micro-batch, and again while another writer's commit (`cdc optimize` compacting the refined
    table, say) makes Delta refuse one of its writes: a batch replays harmlessly, as after a crash,
    so the job goes on instead of stopping. ``conflicts`` counts the reruns by batch id."""

    def count(_: BaseException) -> None:
        conflicts[batch_id] = conflicts.get(batch_id, 0) + 1

    retrying_conflicts(refine_batch, on_conflict=count)
