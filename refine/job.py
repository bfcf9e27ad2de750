"""`cdc refine`: a raw table's Change Data Feed, decoded and MERGEd into its refined table.

Per micro-batch: the batch's Debezium schemas (a handful of distinct strings) are read on the
driver; the records are parsed and decoded with them in Spark; undecodable records go to the
quarantine; the last change per key (by LSN, then offset) is MERGEd with position guards, so the
job can be rerun or replayed any number of times.

Supported so far: Debezium Postgres topics of tables with a primary key (snapshot reads, creates,
updates with TOAST placeholders, deletes, tombstones, truncates, added columns).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql import functions as F
from pydantic import Field, field_validator

from cdc.config import _Strict
from cdc.errors import StreamError, TableError
from cdc.raw.config import TOPIC_NAME, Continuous, Trigger
from cdc.raw.table import raw_table_location, raw_table_topic
from cdc.storage import normalize_location
from cdc.streaming import failure, keeping_typed_errors, typed_failure, with_trigger
from refine.envelope import ConnectSchema, Op
from refine.latest import latest_per_key
from refine.merge import merge_changes
from refine.parse import parse_changes, wrapped_schema
from refine.quarantine import quarantine, quarantine_location
from refine.rules import TableRules


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
        default=None, pattern=TOPIC_NAME,
        description="The refined table's name, <warehouse>/refined/<name> (and its checkpoint's); default the topic.",
    )  # fmt: skip
    rules: TableRules | None = Field(default=None, description="Expectations checked before the MERGE (pipelines).")

    @property
    def target(self) -> str:
        return self.name or self.table


def refined_table_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/refined/{topic}"


def merged_schema(schemas: list[ConnectSchema]) -> ConnectSchema:
    """One envelope schema covering a batch's schemas: a column added mid-batch is in it."""
    latest = schemas[-1]
    rows = [schema.field_named("after") for schema in schemas]
    fields: dict[str, dict] = {}
    for row in rows:
        for field in row.fields or ():
            fields.setdefault(field.field, field.model_dump(exclude_none=True))
    after = {**rows[-1].model_dump(exclude_none=True), "fields": list(fields.values())}
    envelope = latest.model_dump(exclude_none=True)
    envelope["fields"] = [
        {**after, "field": field["field"]} if field.get("field") in ("before", "after") else field
        for field in envelope["fields"]
    ]
    return ConnectSchema.model_validate(envelope)


class RefineBatch:
    """The foreachBatch function of `cdc refine`."""

    def __init__(self, config: RefineJobConfig) -> None:
        self.config = config
        self.raw = raw_table_location(config.warehouse, config.table)
        self.refined = refined_table_location(config.warehouse, config.target)
        self.rules = config.rules or TableRules(table=config.target, topic=config.table, warehouse=config.warehouse)
        self.batch_id = -1

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        self.batch_id = batch_id
        # Cached: read from the raw table once (Spark counts a source's rows per read).
        records = batch.where(F.col("_change_type") == "insert").persist()  # raw tables only append
        try:
            self._refine(spark, records)
        finally:
            records.unpersist()

    def _refine(self, spark: SparkSession, records: DataFrame) -> None:
        # One pass over the raw text: the batch's distinct schemas (a handful of strings, not data)
        # and the source position of its last truncate.
        summary = (
            records.groupBy(wrapped_schema(F.col("value")).alias("value_schema"),
                            wrapped_schema(F.col("key")).alias("key_schema"))
            # The text test is cheap and lets the JSON parse run only where a truncate can be.
            .agg(F.max(F.when(F.col("value").contains(f'"op":"{Op.TRUNCATE.value}"') & (
                F.get_json_object("value", "$.payload.op") == Op.TRUNCATE.value), F.struct(
                F.get_json_object("value", "$.payload.source.lsn").try_cast("long").alias("lsn"),
                F.col("offset").alias("offset"),
            ))).alias("truncate"))
            .collect()
        )  # fmt: skip
        schemas = [row for row in summary if row.value_schema]
        if not schemas:
            return  # only tombstones: their deletes came before them
        value_schema = merged_schema([ConnectSchema.model_validate_json(row.value_schema) for row in schemas])
        key_texts = [row.key_schema for row in schemas if row.key_schema]
        if not key_texts:
            raise TableError("tables without a primary key are not refined yet", table=self.raw)
        key_schema = ConnectSchema.model_validate_json(key_texts[-1])
        truncates = [tuple(row.truncate) for row in summary if row.truncate]
        changes = parse_changes(records, key_schema, value_schema).persist()  # parsed once: quarantine and MERGE
        try:
            self._apply(spark, records, changes, value_schema, key_schema, max(truncates) if truncates else None)
        finally:
            changes.unpersist()

    def _apply(
        self,
        spark: SparkSession,
        records: DataFrame,
        changes: DataFrame,
        value_schema: ConnectSchema,
        key_schema: ConnectSchema,
        truncated_at: tuple[int, int] | None,
    ) -> None:
        quarantine(spark, quarantine_location(self.config.warehouse), self.raw, self.config.table,
                   changes.where("problem IS NOT NULL"))  # fmt: skip
        records.unpersist()  # the parsed changes are cached now
        key_columns = [field.field for field in key_schema.fields or ()]
        columns = [field.field for field in value_schema.field_named("after").fields or ()]
        latest = latest_per_key(changes.where("problem IS NULL"), key_columns, truncated_at)
        with self.rules.enforced_changes(spark, latest, columns, key_columns, self.batch_id) as rows:
            merge_changes(spark, self.refined, rows, key_columns, truncated_at)


def start_refine_query(
    spark: SparkSession, warehouse: str, topic: str, name: str, batch: Callable[[DataFrame, int], None], trigger: Trigger
) -> StreamingQuery:
    """Stream the raw table of ``topic``'s Change Data Feed through ``batch`` (a foreachBatch
    function), with a tool-managed checkpoint at ``<warehouse>/_cdc/checkpoints/refine/<name>``."""
    raw = raw_table_location(warehouse, topic)
    if raw_table_topic(spark, raw) is None:
        raise TableError("no raw table for this topic: run `cdc raw` first", table=raw)
    writer = (
        spark.readStream.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(raw)
        .writeStream.queryName(f"refine {name}").foreachBatch(keeping_typed_errors(batch))
        .option("checkpointLocation", f"{warehouse}/_cdc/checkpoints/refine/{name}")
    )  # fmt: skip
    return with_trigger(writer, trigger).start()


def watch_refine_queries(
    queries: dict[str, StreamingQuery], say: Callable[[str], None], stop: threading.Event
) -> dict[str, int]:
    """Report each query's micro-batches until all have stopped (or ``stop`` is set); return the
    changes each read. A query that failed stops the others and raises, naming its table."""
    seen: set[tuple[str, int]] = set()
    changes = dict.fromkeys(queries, 0)
    try:
        while any(query.isActive for query in queries.values()) and not stop.is_set():
            for name, query in queries.items():
                try:
                    query.awaitTermination(0.5)
                except StreamingQueryException:
                    pass  # raised below, naming the table (or as the typed error the batch raised)
                for progress in query.recentProgress:
                    if (name, progress.batchId) not in seen and progress.numInputRows:
                        seen.add((name, progress.batchId))
                        changes[name] += progress.numInputRows
                        say(f"refine {name} batch {progress.batchId}: {progress.numInputRows:,} changes")
                _raise_failure(name, query)
        for name, query in queries.items():  # one may have failed while another was awaited
            _raise_failure(name, query)
    finally:
        for query in queries.values():
            if query.isActive:
                query.stop()
    return changes


def _raise_failure(name: str, query: StreamingQuery) -> None:
    if (typed := typed_failure(query)) is not None:
        raise typed
    if (message := failure(query)) is not None:
        raise StreamError(f"the refine stream stopped: {message.splitlines()[0]}", table=name)


def run_refine_job(
    spark: SparkSession, config: RefineJobConfig, say: Callable[[str], None] = print, stop: threading.Event | None = None
) -> int:
    """Refine the raw table into ``<warehouse>/refined/<name>``; return the number of changes read."""
    query = start_refine_query(spark, config.warehouse, config.table, config.target, RefineBatch(config), config.trigger)
    changes = watch_refine_queries({config.target: query}, say, stop or threading.Event())[config.target]
    say(f"refine {config.target}: {changes:,} changes -> {refined_table_location(config.warehouse, config.target)}")
    return changes
