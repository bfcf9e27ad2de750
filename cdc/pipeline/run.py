"""Running what a pipeline file declares: `cdc raw --pipeline` and `cdc refine --pipeline`.

Refined tables of Debezium Postgres and MongoDB sources go through :mod:`refine.batch` (which tells
MongoDB topics by the envelope), those of JSON, Avro and Protobuf event sources through
:mod:`cdc.pipeline.events.job` (Avro decoded by :mod:`cdc.pipeline.events.avro`, Protobuf by
:mod:`cdc.pipeline.events.protobuf`), each with its expectations, exploded child tables and history
(:mod:`refine.apply.rules`). Business tables (:mod:`cdc.pipeline.business`) are refreshed after the refined
tables when run once, on their own interval when run continuously. A declaration that cannot be run
(``scd: 2`` on an event table without ``keys``) is refused up front, named by its key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from datetime import UTC, datetime

from pydantic import Field
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc.core.config import AvailableNow, Continuous, KafkaConnection, Trigger, checked
from cdc.core.errors import ConfigError
from cdc.core.storage import Storage
from cdc.core.streaming import JobThreads, LandingNews, stop_queries
from cdc.core.tables import TableFeatures, is_delta_table
from cdc.pipeline.business import BusinessTableConfig, run_business_tables
from cdc.pipeline.checks import expanded_pipeline, table_names
from cdc.pipeline.config import (
    AvroEvents,
    DebeziumMongoSource,
    DebeziumPostgresSource,
    JsonEvents,
    Pipeline,
    ProtobufEvents,
    ScdType,
    Source,
)
from cdc.pipeline.database import has_patterns, landing_pattern
from cdc.pipeline.events.job import EventsBatch, EventsRefineJobConfig, events_batch, history_spec
from cdc.pipeline.sql_text import sql_tables
from cdc.raw.config import GapPolicy, RawJobConfig, TopicList, TopicPattern
from refine.apply.rules import TableRules
from refine.apply.schema_changes import SchemaChangePolicy
from refine.apply.shaping import TableShape
from refine.batch import RefineBatch
from refine.config import Connector, RefineJobConfig, RefineRun, refined_table_location
from refine.event_log import EventLog
from refine.job import fail_if_quarantined, start_refine_query, summarize_run, watch_refine_queries
from refine.quality.expectations import Expectation
from refine.rebuild import rebuild_refined_table
from refine.tables_loop import RefineLoop

RefineJob = RefineJobConfig | EventsRefineJobConfig


class PipelineRefineConfig(RefineRun):
    """One `cdc refine --pipeline` run (what the pipeline file does not say)."""

    reinfer_schema: bool = Field(
        default=False, description="Infer the kept schemas of event sources without a given schema again."
    )
    rebuild: bool = Field(
        default=False,
        description=(
            "First rebuild every refined table of a Debezium source (with its history and child tables) from its raw "
            "table's current contents (refine/rebuild.py); event tables are refined as usual."
        ),
    )
    schema_changes: SchemaChangePolicy | None = Field(
        default=None,
        description="The schema-change policy of every Debezium table, over the pipeline file's (unset: the file's).",
    )


def raw_job_config(
    pipeline: Pipeline,
    *,
    warehouse: str,
    trigger: Trigger,
    kafka: KafkaConnection | None = None,
    on_gap: GapPolicy | None = None,
    max_offsets_per_trigger: int | None = None,
    reset: bool = False,
    force_destroy_raw_data: bool = False,
) -> RawJobConfig:
    """`cdc raw` over every source's topic: the file's landing settings (``on_gap``,
    ``max_offsets_per_trigger``) unless given, and where, when and how to land as :class:`RawJobConfig` has them.

    Example::

        config = raw_job_config(
            load_pipeline("pipelines/shop.yaml"),
            warehouse="/data",
            trigger=AvailableNow(),
            kafka=KafkaConnection(bootstrap_servers="broker:9092"),
        )
    """
    topics: TopicList | TopicPattern = (
        TopicPattern(pattern=landing_pattern(pipeline))
        if has_patterns(pipeline)
        else TopicList(topics=[source.topic for source in pipeline.sources.values() if source.topic is not None])
    )
    with checked("raw job settings"):
        return RawJobConfig(
            topics=topics,
            warehouse=warehouse,
            trigger=trigger,
            kafka=kafka or KafkaConnection(),
            on_gap=on_gap or pipeline.raw.on_gap,
            max_offsets_per_trigger=max_offsets_per_trigger or pipeline.raw.max_offsets_per_trigger,
            reset=reset,
            force_destroy_raw_data=force_destroy_raw_data,
        )


def _debezium(source: Source) -> bool:
    return isinstance(source, (DebeziumPostgresSource, DebeziumMongoSource))


def _not_run_yet(pipeline: Pipeline) -> list[str]:
    problems = []
    for name, table in pipeline.refined.items():
        source = pipeline.sources[table.source]
        if table.scd is ScdType.HISTORY and not table.keys and not _debezium(source):
            problems.append(f"refined.{name}.scd: SCD type 2 needs `keys` (without keys every event is kept anyway)")
    return problems


def table_rules(pipeline: Pipeline, name: str, warehouse: str) -> TableRules:
    """The expectations (and, for SCD type 2, the history) of refined table ``name``."""
    table = pipeline.refined[name]
    expectations = [
        Expectation(name=key, condition=expectation.constraint, action=expectation.action.value)
        for key, expectation in pipeline.expectations.items()
        if expectation.table == name
    ]
    # Debezium tables keep their history by their primary key, known once the job reads the topic.
    history = (
        history_spec(table) if table.scd is ScdType.HISTORY and not _debezium(pipeline.sources[table.source]) else None
    )
    return TableRules(
        table=name,
        topic=pipeline.sources[table.source].topic,
        warehouse=warehouse,
        expectations=expectations,
        history=history,
    )


def table_features(pipeline: Pipeline, name: str) -> TableFeatures:
    """The Delta features of refined table ``name``: its own, else the pipeline's; a Change Data Feed
    left unset is on when a business query reads the table (or a child table of it): its incremental
    refresh reads the feed (cdc/pipeline/business.py)."""
    features = pipeline.refined[name].features.over(pipeline.features)
    if features.change_data_feed is None and name.lower() in _read_by_business(pipeline):
        features = features.model_copy(update={"change_data_feed": True})
    return features


def _read_by_business(pipeline: Pipeline) -> set[str]:
    """The refined tables a business query names, itself or by one of its child tables."""
    return {
        table.split("__")[0].lower() for business in pipeline.business.values() for table in sql_tables(business.sql)
    }


def refine_jobs(pipeline: Pipeline, config: PipelineRefineConfig) -> list[RefineJob]:
    """One job per refined table (Debezium Postgres and MongoDB sources: :class:`RefineJobConfig`,
    event sources: :class:`EventsRefineJobConfig`); a ConfigError names each declared feature that is
    not run yet."""
    if problems := _not_run_yet(pipeline):
        raise ConfigError("the pipeline declares what `cdc refine` does not run yet: " + "; ".join(problems))
    jobs: list[RefineJob] = []
    for name, table in pipeline.refined.items():
        source = pipeline.sources[table.source]
        common = {
            "warehouse": config.warehouse,
            "trigger": config.trigger,
            "rules": table_rules(pipeline, name, config.warehouse),
            "features": table_features(pipeline, name),
        }
        if isinstance(source, JsonEvents):
            jobs.append(
                EventsRefineJobConfig(
                    name=name,
                    topic=source.topic,
                    table=table,
                    schema_ddl=source.schema_,
                    reinfer_schema=config.reinfer_schema,
                    **common,
                )
            )
        elif isinstance(source, AvroEvents):  # its schema is given: nothing to infer
            jobs.append(
                EventsRefineJobConfig(
                    name=name, topic=source.topic, table=table, format="avro", wire_schema=source.schema_, **common
                )
            )
        elif isinstance(source, ProtobufEvents):  # decoded in Python: spark-protobuf is not on Maven Central here
            jobs.append(
                EventsRefineJobConfig(
                    name=name,
                    topic=source.topic,
                    table=table,
                    format="protobuf",
                    wire_schema=source.schema_,
                    message=source.message,
                    **common,
                )
            )
        else:
            jobs.append(
                RefineJobConfig(
                    table=source.topic,
                    name=name,
                    connector=Connector.MONGODB if isinstance(source, DebeziumMongoSource) else Connector.POSTGRES,
                    explode=table.explode,
                    history=table.scd is ScdType.HISTORY,
                    schema_changes=config.schema_changes or table.schema_changes or pipeline.schema_changes,
                    renames=table.renames,
                    drop_columns=table.drop_columns,
                    shape=TableShape(**{key: getattr(table, key) for key in TableShape.model_fields}),
                    source_time_zone=source.source_time_zone if isinstance(source, DebeziumPostgresSource) else None,
                    **common,
                )
            )
    return jobs


def _start(
    spark: SparkSession, job: RefineJob, events: EventLog | None = None
) -> tuple[StreamingQuery, RefineBatch | EventsBatch]:
    batch = events_batch(spark, job) if isinstance(job, EventsRefineJobConfig) else RefineBatch(job, events=events)
    if isinstance(batch, RefineBatch):
        batch.check_shape(spark)
    topic = job.topic if isinstance(job, EventsRefineJobConfig) else job.table
    return start_refine_query(spark, job.warehouse, topic, job.target, batch, job.trigger), batch


# A continuous run by pattern (a pipeline's, `cdc sync --pattern`) looks for newly landed tables this often.
TABLE_RESCAN_S = 5.0


def landed_topics(spark: SparkSession, warehouse: str, known: Collection[str] = ()) -> list[str]:
    """The topics landed in ``warehouse``: its raw tables (a folder per topic, once its first commit is in:
    the log's folder is made before it). Those ``known`` landed already are not read again: a raw table
    stays one, and a rescan then costs a listing and the new folders' logs."""
    storage = Storage(spark)
    raw = f"{warehouse}/raw"
    if not storage.exists(raw):
        return []
    return [t for t in storage.list_names(raw) if t in known or is_delta_table(spark, f"{raw}/{t}")]


def _new_tables(
    spark: SparkSession, declared: Pipeline, config: PipelineRefineConfig, known: set[str], say: Callable[[str], None]
) -> Callable[[], list[RefineJobConfig]]:
    """The jobs of the tables of ``declared``'s patterns landed since the last call (not in ``known``, which it
    adds them to), for :class:`RefineLoop`'s ``discover``. A new topic the pipeline cannot take (its name
    collides) is said once, and the tables refined go on."""
    said: set[str] = set()
    landed: list[str] = []

    def new() -> list[RefineJobConfig]:
        nonlocal landed
        landed = landed_topics(spark, config.warehouse, set(landed))
        try:
            tables = expanded_pipeline(declared, landed)
        except ConfigError as error:
            if str(error) not in said:
                said.add(str(error))
                say(f"cdc: new tables not refined: {error}")
            return []
        jobs = [job for job in refine_jobs(tables, config) if job.target not in known]
        known.update(job.target for job in jobs)
        return [job for job in jobs if isinstance(job, RefineJobConfig)]  # patterns are Debezium sources'

    return new


def business_location(warehouse: str, name: str) -> str:
    return f"{warehouse}/business/{name}"


def _table_location(pipeline: Pipeline, warehouse: str, name: str) -> str:
    if name in pipeline.business:
        return business_location(warehouse, name)
    return refined_table_location(warehouse, name)


def _split(pipeline: Pipeline, name: str) -> bool:
    """A refined (or child) table written per value of a column: a folder of tables."""
    parent = pipeline.refined.get(name.split("__")[0])
    return parent is not None and parent.split_by is not None


def business_tables(pipeline: Pipeline, warehouse: str) -> list[BusinessTableConfig]:
    """The business tables, each after those it reads; the tables a query names become temp views."""
    known = table_names(pipeline)
    ordered: list[str] = []

    def visit(name: str) -> None:  # the file is checked: no cycles
        for used in sorted(sql_tables(pipeline.business[name].sql) & pipeline.business.keys()):
            visit(used)
        if name not in ordered:
            ordered.append(name)

    for name in pipeline.business:
        visit(name)
    configs = []
    for name in ordered:
        used = sorted(sql_tables(pipeline.business[name].sql) & known.keys())
        configs.append(
            BusinessTableConfig(
                name=name,
                query=pipeline.business[name].sql,
                location=business_location(warehouse, name),
                views={t: _table_location(pipeline, warehouse, t) for t in used if not _split(pipeline, t)},
                split_views={t: _table_location(pipeline, warehouse, t) for t in used if _split(pipeline, t)},
            )
        )
    return configs


def run_pipeline_refine(
    spark: SparkSession,
    pipeline: Pipeline,
    config: PipelineRefineConfig,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
    landing: LandingNews | None = None,
) -> dict[str, int]:
    """Refine every refined table of the pipeline and refresh its business tables; return the
    records each refined table read. ``landing``: what a landing in this process writes (`cdc sync`), so that
    a whole database's tables are looked at only when they have changes.

    Run once (available now), the tables are refined one after the other, then the business tables
    are refreshed in dependency order; continuously, all refined tables at once and each business
    table on its own ``trigger_interval_s``.
    """
    stop = stop or threading.Event()
    since = datetime.now(UTC)
    declared = pipeline
    pipeline = expanded_pipeline(declared, landed_topics(spark, config.warehouse))
    jobs = refine_jobs(pipeline, config)
    if config.rebuild:
        for job in jobs:
            if isinstance(job, RefineJobConfig) and not stop.is_set():
                rebuild_refined_table(spark, job, say)
    business = business_tables(pipeline, config.warehouse)
    once = isinstance(config.trigger, AvailableNow)
    # Continuously, or with patterns (a whole database), the Debezium tables are refined by one loop
    # (refine/tables_loop.py); the others by a query each. A query per table gave each its own planning and
    # thread: in a `cdc sync` that lived a minute, none committed a refined batch.
    discovering = has_patterns(declared)
    looping = discovering or not once
    looped = [job for job in jobs if looping and isinstance(job, RefineJobConfig)]
    streamed = [job for job in jobs if not (looping and isinstance(job, RefineJobConfig))]
    groups = [[job] for job in streamed] if once else [streamed] if streamed else []
    # Run continuously, each business table is refreshed on its own interval in a thread until ``stop``.
    threads = JobThreads(stop)

    def refresh(table: BusinessTableConfig, interval: Continuous) -> Callable[[], object]:
        return lambda: run_business_tables(spark, [table], interval, stop, say)

    for table in [] if once else business:
        interval = Continuous(interval_s=pipeline.business[table.name].trigger_interval_s)
        threads.start(f"business {table.name}", refresh(table, interval))
    counts: dict[str, int] = {}
    # The event log's rows of all the tables, appended together (refine/event_log.py).
    with EventLog.of(config.warehouse).kept_flushed(spark, continuous=not once) as events:

        def refine(group: list[RefineJob]) -> None:
            queries: dict[str, StreamingQuery] = {}
            batches: dict[str, object] = {}
            try:
                for job in group:
                    queries[job.target], batches[job.target] = _start(spark, job, events)
            except BaseException:
                stop_queries(queries.values(), stop, say)
                raise
            counts.update(watch_refine_queries(queries, say, stop, batches, config.warehouse))

        loop = None
        if looping and (
            looped or discovering
        ):  # with patterns, tables created at the source while this runs are refined once landed
            loop = RefineLoop(
                spark,
                config.trigger,
                say,
                stop,
                events=events,
                told_what_landed=landing is not None,
                discover=_new_tables(spark, declared, config, {job.target for job in jobs}, say)
                if discovering and not once
                else None,
                discover_every_s=TABLE_RESCAN_S,
            )
            for job in looped:
                loop.add(job)
            if landing is not None:
                landing.listen(loop.landed)
            if not once:
                threads.start("refine loop", loop.run)
        try:
            for group in groups:
                refine(group)
            if loop is not None:
                if once and not stop.is_set():
                    loop.run()
                elif not once:
                    threads.join()  # until stopped, or a table's refinement fails
        finally:
            if loop is not None:
                counts.update(loop.changes())
            if threads.threads:
                stop.set()
                threads.join()
    quarantined = summarize_run(spark, config.warehouse, counts, since, say, stop)
    if once and not stop.is_set():
        run_business_tables(spark, business, config.trigger, stop, say)
    fail_if_quarantined(config, quarantined)
    return counts
