"""`cdc refine` of a plain event topic (JSON, Avro or Protobuf values, no Debezium envelope).

Per micro-batch of the raw table's Change Data Feed: JSON values are parsed with the events' schema
(:mod:`refine.records.schemas`), Avro values decoded with theirs (:mod:`cdc.pipeline.events.avro`), Protobuf values
with their message's (:mod:`cdc.pipeline.events.protobuf`); a record that
is not an event of that schema, or lacks a key, the ordering or the split value, goes to the
quarantine with the reason; the others are flattened (:mod:`refine.apply.flatten`) and written:

- with ``keys``: the latest event per key (by the ordering column, then Kafka partition and
  offset) is MERGEd; an event older than the stored one never overwrites it;
- without: every event is appended, once (Delta's idempotent writes: a replayed batch adds nothing).

Exploded arrays go to child tables whose rows follow their parent event (replaced with it).
With ``split_by`` each value of that column gets its own tables, ``<warehouse>/refined/<name>/<value>``
(and ``<warehouse>/refined/<name>__<array>/<value>``), created when the value first appears.
Refined rows carry ``_cdc_partition`` and ``_cdc_offset`` (the Kafka record of the event) and
``_cdc_refined_at``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field, model_validator
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from cdc.core.config import TOPIC_NAME
from cdc.core.errors import CdcError, ConfigError
from cdc.core.streaming import batch_error
from cdc.core.tables import TableFeatures, raw_table_location
from cdc.pipeline.checks import table_shape_problems
from cdc.pipeline.config import Name, RefinedTable, WireSchema
from cdc.pipeline.events.avro import AvroDecoder
from cdc.pipeline.events.protobuf import ProtobufDecoder
from refine.apply.flatten import child_rows, child_table_name, column, flat_name, flatten
from refine.apply.history import HistorySpec
from refine.apply.merge import (
    EVENT_POSITION,
    OFFSET,
    PARTITION,
    REFINED_AT,
    TableSettings,
    append_rows,
    merge_latest,
    replace_children,
)
from refine.apply.rules import TableRules, history_table_name
from refine.batch import run_batch_retrying_conflicts
from refine.config import RefineRun, refined_table_location
from refine.quality.quarantine import quarantine, quarantine_location
from refine.records.schemas import event_schema

CORRUPT = "_cdc_corrupt_record"
# A split value names folders: Kafka's rule for topic names, which cannot climb out of the folder.
SPLIT_VALUE = r"^[A-Za-z0-9._-]{1,200}$"


class EventsRefineJobConfig(RefineRun):
    """One refined table of an event topic (`cdc refine --pipeline` builds one per refined table)."""

    name: Name = Field(description="The refined table: <warehouse>/refined/<name> (per split value: .../<value>).")
    topic: str = Field(pattern=TOPIC_NAME, description="The raw table to refine, named by its topic.")
    table: RefinedTable = Field(description="Keys, ordering, flatten and explode rules, split column.")
    schema_ddl: str | None = Field(default=None, description="The events' schema (Spark DDL); None: inferred, kept.")
    reinfer_schema: bool = Field(default=False, description="Infer the kept schema again from the raw table first.")
    rules: TableRules | None = Field(default=None, description="Expectations and history (SCD type 2) of the table.")
    features: TableFeatures = Field(
        default_factory=TableFeatures,
        description="The Delta features of the table and the tables beside it (the pipeline's, resolved per table).",
    )
    format: Literal["json", "avro", "protobuf"] = Field(
        default="json",
        description="How values are encoded: JSON text (schema_ddl), Avro or Protobuf binary (wire_schema).",
    )
    wire_schema: WireSchema | None = Field(
        default=None,
        description="Avro and Protobuf: where the schema is; a file means plain values, a schema registry Confluent's "
        "wire format (magic byte 0, schema id, [Protobuf: message indexes,] record; see cdc.pipeline.events.avro and "
        "cdc.pipeline.events.protobuf).",
    )
    message: str | None = Field(
        default=None,
        description="Protobuf: the events' message, fully qualified (package.Message); default the schema's first.",
    )

    @model_validator(mode="after")
    def _schema_of_the_format(self) -> EventsRefineJobConfig:
        binary = {"avro": "Avro", "protobuf": "Protobuf"}.get(self.format)
        if binary and (self.wire_schema is None or self.schema_ddl is not None or self.reinfer_schema):
            raise ValueError(f"{binary} events take their schema from wire_schema (no schema_ddl, nothing to infer)")
        if self.format == "json" and self.wire_schema is not None:
            raise ValueError("wire_schema applies to Avro and Protobuf events; JSON events take schema_ddl")
        if self.format != "protobuf" and self.message is not None:
            raise ValueError("message applies to Protobuf events only")
        return self

    @property
    def target(self) -> str:
        return self.name


def _json_at(value: Column, name: str) -> Column:
    return F.try_variant_get(value, "$['" + name.replace("'", "\\'") + "']", "variant")


def parse_events(records: DataFrame, schema: StructType, table: RefinedTable) -> DataFrame:
    """Raw rows as ``event`` (a struct of ``schema``), Kafka coordinates, ``raw_value`` and a
    ``problem`` (null for a good event) naming the field and the reason."""
    return with_table_problems(decode_json(records, schema), table)


def decode_json(records: DataFrame, schema: StructType) -> DataFrame:
    """:func:`parse_events` without the table's problems: those of the value only."""
    with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType())])
    parsed = records.select(
        F.col("value").alias("raw_value"),
        F.col("value_bytes"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.try_parse_json("value").alias("json"),
        F.from_json("value", with_corrupt, {"columnNameOfCorruptRecord": CORRUPT}).alias("event"),
    )
    problem = (
        F.when(F.col("raw_value").isNull() & F.col("value_bytes").isNull(), F.lit("no value (a null record)"))
        .when(F.col("raw_value").isNull(), F.lit("the value is not UTF-8 text"))
        .when(F.col("json").isNull(), F.lit("the value is not valid JSON"))
        .when(~F.schema_of_variant("json").startswith("OBJECT<"), F.lit("the value is not a JSON object"))
    )
    for field in schema.fields:
        found = _json_at(F.col("json"), field.name)
        problem = problem.when(
            F.col(f"event.`{field.name}`").isNull() & found.isNotNull() & ~F.is_variant_null(found),
            F.concat(
                F.lit(f"field {field.name}: cannot read "),
                F.to_json(found),
                F.lit(f" as {field.dataType.simpleString()}"),
            ),
        )
    problem = problem.when(F.col(f"event.{CORRUPT}").isNotNull(), F.lit("the value does not match the schema"))
    return parsed.select(
        F.col("event").dropFields(CORRUPT).alias("event"),
        "kafka_partition",
        "kafka_offset",
        problem.alias("problem"),
        "raw_value",
    )


def with_table_problems(events: DataFrame, table: RefinedTable) -> DataFrame:
    """Decoded ``events`` whose ``problem`` also names a null key, ordering or split value, or a split
    value that cannot name a table (a problem of the value itself comes first)."""
    checks = [
        (column(f"event.{path}").isNull(), F.lit(f"{role} {path} is null"))
        for role, path in [
            *[("key", key) for key in table.keys],
            ("ordering column", table.ordering),
            ("split_by column", table.split_by),
        ]
        if path is not None
    ]
    if table.split_by is not None:
        split = column(f"event.{table.split_by}").cast("string")
        checks.append(
            (
                ~split.rlike(SPLIT_VALUE) | split.isin(".", ".."),
                F.concat(
                    F.lit(f"split_by column {table.split_by}: "),
                    split,
                    F.lit(" is not usable as a table name (letters, digits, '.', '_', '-')"),
                ),
            )
        )
    if not checks:
        return events
    problem = F.when(*checks[0])
    for condition, reason in checks[1:]:
        problem = problem.when(condition, reason)
    return events.withColumn("problem", F.coalesce(F.col("problem"), problem))


def latest_events(events: DataFrame, key_paths: list[str], ordering: str) -> DataFrame:
    """The last event per key: greatest ordering value, then Kafka partition and offset."""
    order = Window.partitionBy(*[column(path) for path in key_paths]).orderBy(
        column(ordering).desc(), F.col(PARTITION).desc(), F.col(OFFSET).desc()
    )
    return events.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")


def expectation_keys(table: RefinedTable) -> list[str]:
    """The columns naming an offending row: the keys, or the Kafka record of an appended event."""
    return [flat_name(path) for path in table.keys] or list(EVENT_POSITION)


def history_spec(table: RefinedTable) -> HistorySpec:
    """An event table's versions: by key, ordered (and dated) by the ordering column, then the Kafka record."""
    assert table.ordering is not None  # required with keys (cdc/pipeline/checks.py), which a history needs
    return HistorySpec(
        key_columns=[flat_name(path) for path in table.keys],
        position_columns=[flat_name(table.ordering), *EVENT_POSITION],
    )


def event_rows_schema(schema: StructType) -> StructType:
    """The good events' columns: the event's fields and where it came from."""
    return StructType([*schema.fields, StructField(PARTITION, IntegerType()), StructField(OFFSET, LongType())])


Decode = Callable[[DataFrame], DataFrame]


class EventsBatch:
    """The foreachBatch function refining an event topic.

    ``decode`` turns a batch's raw rows into ``event``, Kafka coordinates, ``problem`` and ``raw_value``
    (:func:`decode_json`, the default, :meth:`AvroDecoder.decode` or :meth:`ProtobufDecoder.decode`); the table's
    problems are added to it.
    """

    def __init__(self, config: EventsRefineJobConfig, schema: StructType, decode: Decode | None = None) -> None:
        self.config = config
        self.schema = schema
        self.decode = decode or (lambda records: decode_json(records, schema))
        self.raw = raw_table_location(config.warehouse, config.topic)
        # Its tables' (history, child and split tables too), for the job's life.
        self.settings = TableSettings(config.features)
        self.rules = config.rules or TableRules(table=config.name, topic=config.topic, warehouse=config.warehouse)
        self.error: CdcError | None = None
        self.conflicts: dict[int, int] = {}  # how often each batch (by id) ran again after a conflict

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            run_batch_retrying_conflicts(lambda: self._refine(batch, batch_id), batch_id, self.conflicts)
        except Exception as error:
            # Raised again by watch_refine_queries: Spark's own message would bury it.
            self.error = batch_error(error, self.config.name, batch_id)
            raise

    def _refine(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        app_id = f"cdc-refine-{spark.sparkContext.getLocalProperty('sql.streaming.queryId')}"
        records = batch.where(F.col("_change_type") == "insert")  # raw tables only append
        events = with_table_problems(self.decode(records), self.config.table)
        events = events.persist()  # read once: quarantine and tables
        try:
            quarantine(
                spark,
                quarantine_location(self.config.warehouse),
                self.raw,
                self.config.topic,
                events.where("problem IS NOT NULL"),
            )
            good = events.where("problem IS NULL").select(
                "event.*", F.col("kafka_partition").alias(PARTITION), F.col("kafka_offset").alias(OFFSET)
            )
            rows = self.flat_rows(good)
            with self.rules.passing_events(spark, good, rows, expectation_keys(self.config.table), batch_id) as good:
                split = self.config.table.split_by
                if split is None:
                    self._write(spark, good, None, app_id, batch_id)
                    return
                value = column(split).cast("string")
                # The batch's distinct split values: a handful of names, not data.
                for (name,) in good.select(value).distinct().orderBy(value).collect():
                    self._write(spark, good.where(value == name), name, app_id, batch_id)
        finally:
            events.unpersist()

    def _location(self, name: str, split_value: str | None) -> str:
        location = refined_table_location(self.config.warehouse, name)
        return f"{location}/{split_value}" if split_value is not None else location

    def flat_rows(self, events: DataFrame) -> DataFrame:
        """Events as the refined table's rows (exploded arrays left out)."""
        return flatten(events, tuple(self.config.table.explode), self.config.table.flatten.kept(events.schema))

    def _write(
        self, spark: SparkSession, events: DataFrame, split_value: str | None, app_id: str, batch_id: int
    ) -> None:
        table = self.config.table
        nested = events
        if table.keys:
            assert table.ordering is not None  # required with keys (cdc/pipeline/checks.py)
            nested = latest_events(events, table.keys, table.ordering)
        parents = self.flat_rows(nested).withColumn(REFINED_AT, F.current_timestamp())
        location = self._location(self.config.name, split_value)
        if not table.keys:
            append_rows(spark, location, self.settings, parents, app_id, batch_id)
            for path in table.explode:
                children = child_rows(nested, list(EVENT_POSITION), path).withColumn(REFINED_AT, F.current_timestamp())
                append_rows(
                    spark,
                    self._location(child_table_name(self.config.name, path), split_value),
                    self.settings,
                    children,
                    app_id,
                    batch_id,
                )
            return
        keys = [flat_name(path) for path in table.keys]
        assert table.ordering is not None  # required with keys (cdc/pipeline/checks.py)
        position = [flat_name(table.ordering), *EVENT_POSITION]
        merge_latest(spark, location, self.settings, parents, keys, position)
        history = self._location(history_table_name(self.config.name), split_value)
        # Every event of the batch: a version.
        self.rules.record_history(spark, history, self.settings, self.flat_rows(events))
        if not table.explode:
            return
        # The parents whose event is now the stored one: a replayed older event changes no children.
        stored = spark.read.format("delta").load(location).select(*keys, *position)
        applied = parents.select(*keys, *position).join(stored, [*keys, *position], "left_semi").persist()
        try:
            for path in table.explode:
                children = child_rows(nested, table.keys, path, carry=EVENT_POSITION)
                children = children.join(applied.select(*keys, *EVENT_POSITION), [*keys, *EVENT_POSITION], "left_semi")
                replace_children(
                    spark,
                    self._location(child_table_name(self.config.name, path), split_value),
                    self.settings,
                    children.withColumn(REFINED_AT, F.current_timestamp()),
                    applied,
                    keys,
                )
        finally:
            applied.unpersist()


def events_batch(spark: SparkSession, config: EventsRefineJobConfig) -> EventsBatch:
    """Read (or infer) the schema, check the table's column paths and expectations against it."""
    decode: Decode | None = None
    if config.format == "avro":
        assert config.wire_schema is not None  # binary events have one (EventsRefineJobConfig's validation)
        decoder = AvroDecoder(spark, config.wire_schema, config.topic)
        schema, decode = decoder.event_schema, decoder.decode
    elif config.format == "protobuf":
        assert config.wire_schema is not None
        protobuf = ProtobufDecoder(config.wire_schema, config.topic, config.message)
        schema, decode = protobuf.event_schema, protobuf.decode
    else:
        schema = event_schema(spark, config.warehouse, config.topic, config.schema_ddl, config.reinfer_schema)
    if problems := table_shape_problems(schema, config.table):
        raise ConfigError(
            "the events' schema does not fit the refined table: "
            + "; ".join(f"refined.{config.name}.{field}: {reason}" for field, reason in problems),
            topic=config.topic,
        )
    batch = EventsBatch(config, schema, decode)
    no_rows = spark.createDataFrame([], event_rows_schema(schema))
    batch.rules.check(spark, batch.flat_rows(no_rows), expectation_keys(config.table))  # before any row is read
    return batch
