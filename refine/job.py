"""`cdc refine`: a raw table's Change Data Feed, decoded and MERGEd into its refined table.

Per micro-batch: the batch's Debezium schemas (a handful of distinct strings) are read on the
driver; the records are parsed and decoded with them in Spark; undecodable records go to the
quarantine; the last change per key (by LSN, then offset) is MERGEd with position guards, so the
job can be rerun or replayed any number of times.

Supported so far: Debezium Postgres topics (snapshot reads, creates, updates with TOAST placeholders,
deletes, tombstones, truncates, added columns), with a primary key (primary-key changes:
:mod:`refine.rekey`; deleted keys stay deleted: :mod:`refine.deleted`) or without one (multisets:
:mod:`refine.keyless`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pydantic import Field, field_validator

from cdc.config import _Strict
from cdc.errors import StreamError, TableError
from cdc.raw.config import TOPIC_NAME, Continuous, Trigger
from cdc.raw.table import raw_table_location, raw_table_topic
from cdc.storage import normalize_location
from cdc.streaming import failure, with_trigger
from refine.deleted import (
    deleted_location,
    record_deletes,
    record_truncate,
    with_deleted_images,
    without_resurrections,
)
from refine.envelope import ConnectSchema, Op
from refine.keyless import applied_location, merge_keyless_changes
from refine.latest import latest_per_key
from refine.merge import merge_changes, refined_rows
from refine.parse import parse_changes
from refine.quarantine import quarantine, quarantine_location
from refine.rekey import batch_states, fill_from_old_keys, stored_states


class RefineJobConfig(_Strict):
    """One `cdc refine` run."""

    table: str = Field(pattern=TOPIC_NAME, description="The raw table to refine, named by its topic.")
    warehouse: str = Field(description="Root of the tables: a local path or an object-store URI.")
    trigger: Trigger = Field(default_factory=Continuous, description="Run once over what is there, or continuously.")

    @field_validator("warehouse")
    @classmethod
    def _location(cls, warehouse: str) -> str:
        return normalize_location(warehouse)


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
        self.refined = refined_table_location(config.warehouse, config.table)
        self.deleted = deleted_location(config.warehouse, config.table)
        self.applied = applied_location(config.warehouse, config.table)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
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
            records.groupBy(F.get_json_object("value", "$.schema").alias("value_schema"),
                            F.get_json_object("key", "$.schema").alias("key_schema"))
            .agg(F.max(F.when(F.get_json_object("value", "$.payload.op") == Op.TRUNCATE.value, F.struct(
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
        key_schema = ConnectSchema.model_validate_json(key_texts[-1]) if key_texts else None  # None: no primary key
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
        key_schema: ConnectSchema | None,
        truncated_at: tuple[int, int] | None,
    ) -> None:
        quarantine(spark, quarantine_location(self.config.warehouse), self.raw, self.config.table,
                   changes.where("problem IS NOT NULL"))  # fmt: skip
        records.unpersist()  # the parsed changes are cached now
        columns = [field.field for field in value_schema.field_named("after").fields or ()]
        if key_schema is None:
            merge_keyless_changes(spark, self.refined, self.applied, changes.where("problem IS NULL"), columns)
        else:
            self._merge_keyed(spark, changes.where("problem IS NULL"), key_schema, columns, truncated_at)

    def _merge_keyed(
        self,
        spark: SparkSession,
        changes: DataFrame,
        key_schema: ConnectSchema,
        columns: list[str],
        truncated_at: tuple[int, int] | None,
    ) -> None:
        key_columns = [field.field for field in key_schema.fields or ()]
        row_type = changes.schema["after"].dataType
        stored = stored_states(spark, [self.refined, self.deleted], key_columns, row_type)
        filled = fill_from_old_keys(changes, key_schema, stored)
        latest = with_deleted_images(latest_per_key(filled, key_columns, truncated_at), batch_states(filled), stored)
        rows = refined_rows(latest, columns).persist()  # computed once from the tables as they were
        try:
            record_deletes(spark, self.deleted, rows, key_columns)
            if truncated_at is not None:
                record_truncate(spark, self.deleted, truncated_at)
            guarded = without_resurrections(spark, self.deleted, rows, key_columns)
            merge_changes(spark, self.refined, guarded, key_columns, truncated_at)
        finally:
            rows.unpersist()


def run_refine_job(
    spark: SparkSession, config: RefineJobConfig, say: Callable[[str], None] = print, stop: threading.Event | None = None
) -> int:
    """Refine the raw table into ``<warehouse>/refined/<topic>``; return the number of changes read."""
    stop = stop or threading.Event()
    raw = raw_table_location(config.warehouse, config.table)
    if raw_table_topic(spark, raw) is None:
        raise TableError("no raw table for this topic: run `cdc raw` first", table=raw)
    writer = (
        spark.readStream.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(raw)
        .writeStream.queryName(f"refine {config.table}").foreachBatch(RefineBatch(config))
        .option("checkpointLocation", f"{config.warehouse}/_cdc/checkpoints/refine/{config.table}")
    )  # fmt: skip
    query = with_trigger(writer, config.trigger).start()
    seen: set[int] = set()
    changes = 0
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(0.5)
            for progress in query.recentProgress:
                if progress.batchId not in seen and progress.numInputRows:
                    seen.add(progress.batchId)
                    changes += progress.numInputRows
                    say(f"refine {config.table} batch {progress.batchId}: {progress.numInputRows:,} changes")
        if (message := failure(query)) is not None:
            raise StreamError(f"the refine stream stopped: {message.splitlines()[0]}", table=raw)
    finally:
        if query.isActive:
            query.stop()
    say(f"refine {config.table}: {changes:,} changes -> {refined_table_location(config.warehouse, config.table)}")
    return changes
