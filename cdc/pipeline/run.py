"""Running what a pipeline file declares: `cdc raw --pipeline` and `cdc refine --pipeline`.

Refined tables of Debezium Postgres sources go through :mod:`refine.job`, those of JSON event
sources through :mod:`refine.events`. What is declared but not run yet (MongoDB sources, Avro and
Protobuf decoding, SCD type 2, exploding Debezium tables) is refused up front, each named by its key.
Business tables and expectations are declared, checked and drawn; running them is not part of
these commands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pydantic import Field

from cdc.config import validate
from cdc.errors import ConfigError
from cdc.pipeline.config import DebeziumMongoSource, DebeziumPostgresSource, JsonEvents, Pipeline, ScdType
from cdc.raw.config import AvailableNow, RawJobConfig
from refine.events import EventsRefineJobConfig, start_events_query
from refine.job import RefineBatch, RefineJobConfig, RefineRun, refined_table_location, start_refine_query, watch_refine_queries

RefineJob = RefineJobConfig | EventsRefineJobConfig


class PipelineRefineConfig(RefineRun):
    """One `cdc refine --pipeline` run (what the pipeline file does not say)."""

    reinfer_schema: bool = Field(
        default=False, description="Infer the kept schemas of event sources without a given schema again."
    )


def raw_job_config(pipeline: Pipeline, options: dict[str, Any]) -> RawJobConfig:
    """`cdc raw` over every source's topic: the file's landing settings, then ``options`` (warehouse,
    trigger, kafka, reset...; those that are None leave the file's setting)."""
    document = {
        "topics": {"kind": "topics", "topics": [source.topic for source in pipeline.sources.values()]},
        "on_gap": pipeline.raw.on_gap.value,
        "max_offsets_per_trigger": pipeline.raw.max_offsets_per_trigger,
        **{key: value for key, value in options.items() if value is not None},
    }
    return validate(RawJobConfig, document, "raw job settings")


def _not_run_yet(pipeline: Pipeline) -> list[str]:
    problems = []
    for name, source in pipeline.sources.items():
        if getattr(source, "format", "json") != "json":
            problems.append(f"sources.{name}.format: decoding {source.format} events is not implemented yet "
                            "(the schema settings are validated; the refine job reads json only)")  # fmt: skip
    for name, table in pipeline.refined.items():
        source = pipeline.sources[table.source]
        if isinstance(source, DebeziumMongoSource):
            problems.append(f"refined.{name}.source: MongoDB topics are not refined yet")
        if table.scd is ScdType.HISTORY:
            problems.append(f"refined.{name}.scd: SCD type 2 tables are not run by `cdc refine` yet")
        if isinstance(source, DebeziumPostgresSource) and table.explode:
            problems.append(f"refined.{name}.explode: exploding arrays of Debezium tables is not run yet")
    return problems


def refine_jobs(pipeline: Pipeline, config: PipelineRefineConfig) -> list[RefineJob]:
    """One job per refined table; a ConfigError names each declared feature that is not run yet."""
    if problems := _not_run_yet(pipeline):
        raise ConfigError("the pipeline declares what `cdc refine` does not run yet: " + "; ".join(problems))
    jobs: list[RefineJob] = []
    for name, table in pipeline.refined.items():
        source = pipeline.sources[table.source]
        common = {"warehouse": config.warehouse, "trigger": config.trigger}
        if isinstance(source, JsonEvents):
            jobs.append(EventsRefineJobConfig(name=name, topic=source.topic, table=table, schema_ddl=source.schema_,
                                              reinfer_schema=config.reinfer_schema, **common))  # fmt: skip
        else:
            jobs.append(RefineJobConfig(table=source.topic, name=name, **common))
    return jobs


def _start(spark: SparkSession, job: RefineJob) -> StreamingQuery:
    if isinstance(job, EventsRefineJobConfig):
        return start_events_query(spark, job)
    return start_refine_query(spark, job.warehouse, job.table, job.target, RefineBatch(job), job.trigger)


def run_pipeline_refine(
    spark: SparkSession,
    pipeline: Pipeline,
    config: PipelineRefineConfig,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> dict[str, int]:
    """Refine every refined table of the pipeline; return the records each read.

    Run once (available now), the tables are refined one after the other; continuously, all at once.
    """
    stop = stop or threading.Event()
    jobs = refine_jobs(pipeline, config)
    groups = [[job] for job in jobs] if isinstance(config.trigger, AvailableNow) else [jobs]
    counts: dict[str, int] = {}
    for group in groups:
        queries: dict[str, StreamingQuery] = {}
        try:
            for job in group:
                queries[job.target] = _start(spark, job)
        except BaseException:
            for query in queries.values():
                query.stop()
            raise
        counts |= watch_refine_queries(queries, say, stop)
    for name, count in counts.items():
        say(f"refine {name}: {count:,} records -> {refined_table_location(config.warehouse, name)}")
    return counts
