"""`cdc sync`: land topics (`cdc raw`) and refine them (`cdc refine`) in one Spark application.

Why one process: `cdc raw` and `cdc refine` side by side start two JVMs, and each compiles Spark's
and Delta's code on the same cores, competing with each other and with Kafka. In one JVM that work
is done once: over a continuous run's first minute, a Postgres commit reached its refined table in
6.6-8.1 s at p95 instead of 11.1 s (bench/latency.py, README). A scheduled run starts one JVM, not two.

Run once (available now), the topics are landed, then refined. Run continuously, landing and each
refinement run side by side in threads of one Spark session, sharing ``stop``: the first failure
sets it, which ends the others, and is raised. A refinement starts once its raw tables exist (and,
for an event source whose schema is inferred, hold rows).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pyspark.sql import SparkSession

from cdc.core.config import AvailableNow, Continuous, _Strict
from cdc.core.streaming import JobThreads, LandingNews
from cdc.core.tables import has_landed_data, is_delta_table, raw_table_location
from cdc.pipeline.config import JsonEvents, Pipeline
from cdc.pipeline.database import has_patterns
from cdc.pipeline.run import TABLE_RESCAN_S, PipelineRefineConfig, landed_topics, run_pipeline_refine
from cdc.raw.config import RawJobConfig, TopicList, TopicPattern
from cdc.raw.job import TopicSummary, run_raw_job
from refine.config import RefineRun
from refine.event_log import EventLog
from refine.job import RefineJobConfig, fail_if_quarantined, run_refine_job, summarize_run
from refine.records.schemas import infers_schema
from refine.tables_loop import RefineLoop


class TopicsRefinement(_Strict):
    """Refine each landed topic as `cdc refine --table TOPIC` does (Debezium topics): those named, or every
    topic the landing's pattern lands, each as it is landed (``each``)."""

    kind: Literal["topics"] = "topics"
    jobs: list[RefineJobConfig] = Field(default_factory=list, description="One refine job per topic named.")
    each: RefineJobConfig | None = Field(
        default=None,
        description="With a landing by pattern: the refine job of every topic it lands (its `table` replaced by the "
        "topic); a table created at the source while the job runs is refined once landed.",
    )

    @model_validator(mode="after")
    def _jobs_or_each(self) -> TopicsRefinement:
        if bool(self.jobs) == (self.each is not None):
            raise ValueError("give the refine jobs of the topics named, or `each` for a pattern's")
        return self


class PipelineRefinement(_Strict):
    """Refine a pipeline file's tables as `cdc refine --pipeline FILE` does."""

    kind: Literal["pipeline"] = "pipeline"
    pipeline: Pipeline = Field(description="The pipeline file's declarations.")
    run: PipelineRefineConfig = Field(description="Where the tables are and when to run.")


Refinement = Annotated[TopicsRefinement | PipelineRefinement, Field(discriminator="kind")]


class SyncJobConfig(_Strict):
    """One `cdc sync` run: the landing of some topics and the refinement of what it lands."""

    raw: RawJobConfig = Field(description="The landing, as `cdc raw` runs it (topics by name).")
    refine: Refinement = Field(description="The refinement of the landed topics.")

    @model_validator(mode="after")
    def _one_run(self) -> SyncJobConfig:
        if isinstance(self.refine, PipelineRefinement):
            runs: list[RefineRun] = [self.refine.run]
            whole_database = has_patterns(self.refine.pipeline)
        else:
            runs = [*self.refine.jobs, *([self.refine.each] if self.refine.each else [])]
            whole_database = self.refine.each is not None
        if whole_database:  # the tables of its patterns are refined as they are landed
            if not isinstance(self.raw.topics, TopicPattern):
                raise ValueError("raw.topics: a pipeline with a `pattern` lands by pattern")
        elif not isinstance(self.raw.topics, TopicList):
            raise ValueError("raw.topics: sync lands topics named up front (its refinements need them)")
        for run in runs:
            if run.warehouse != self.raw.warehouse:
                raise ValueError(f"refine: warehouse {run.warehouse} is not the landing's {self.raw.warehouse}")
            if run.trigger != self.raw.trigger:
                raise ValueError("refine: the trigger differs from the landing's")
        if isinstance(self.raw.topics, TopicPattern):
            pattern = re.compile(self.raw.topics.pattern)
            unlanded = sorted(topic for topic in self.refined_topics if not pattern.fullmatch(topic))
        else:
            unlanded = sorted(set(self.refined_topics) - set(self.raw.topics.topics))
        if unlanded:
            raise ValueError(f"refine: topics {', '.join(unlanded)} are not landed by raw.topics")
        return self

    @property
    def refined_topics(self) -> list[str]:
        """The topics refined by name (a pipeline's `pattern` sources: those it finds landed)."""
        if isinstance(self.refine, PipelineRefinement):
            return [s.topic for s in self.refine.pipeline.sources.values() if s.topic is not None]
        return [job.table for job in self.refine.jobs]


def run_sync_job(
    spark: SparkSession, config: SyncJobConfig, say: Callable[[str], None] = print, stop: threading.Event | None = None
) -> list[TopicSummary]:
    """Land and refine until done (available now) or until ``stop`` is set; return what was landed."""
    stop = stop or threading.Event()
    lock = threading.Lock()

    def say_whole(line: str) -> None:  # threads print whole lines
        with lock:
            say(line)

    if isinstance(config.raw.trigger, AvailableNow):
        landed = run_raw_job(spark, config.raw, say_whole, stop)
        for refine in _refinements(spark, config, say_whole, stop, None).values():
            if not stop.is_set():
                refine()
        return landed
    landed = []
    threads = JobThreads(stop)
    # The landing tells a whole database's refinement which raw tables it wrote (refine/tables_loop.py).
    landing = LandingNews()
    threads.start("raw", lambda: landed.extend(run_raw_job(spark, config.raw, say_whole, stop, landing)))
    for name, refine in _refinements(spark, config, say_whole, stop, landing).items():
        threads.start(f"refine {name}", refine)
    threads.join()
    return landed


def _refinements(
    spark: SparkSession,
    config: SyncJobConfig,
    say: Callable[[str], None],
    stop: threading.Event,
    landing: LandingNews | None,
) -> dict[str, Callable[[], object]]:
    """Each refinement, by name, as a call that first waits (until ``stop``) for the raw tables it reads.
    Without a ``landing`` beside it (after a landing run once) it starts at once: a table still missing or empty
    is the refinement's own clear error, not a wait that never ends."""
    wait = landing is not None

    def once_landed(
        topics: list[str], refine: Callable[[], object], with_rows: Collection[str] = ()
    ) -> Callable[[], object]:
        """``refine`` once the raw tables of ``topics`` exist, and those of ``with_rows`` hold rows."""
        if not wait:
            return refine

        def run() -> None:
            waiting = {raw_table_location(config.raw.warehouse, topic): topic in with_rows for topic in topics}
            while waiting:
                waiting = {
                    table: rows
                    for table, rows in waiting.items()
                    if not is_delta_table(spark, table) or (rows and not has_landed_data(spark, table))
                }
                if waiting and stop.wait(0.5):
                    return
            refine()

        return run

    match config.refine:
        case PipelineRefinement(pipeline=pipeline, run=run):
            refine_all = lambda: run_pipeline_refine(spark, pipeline, run, say, stop, landing)  # noqa: E731
            # An event source without a schema has it inferred from its first rows (refine/records/schemas.py).
            inferred = [
                source.topic
                for source in pipeline.sources.values()
                if isinstance(source, JsonEvents)
                and infers_schema(spark, run.warehouse, source.topic, source.schema_, run.reinfer_schema)
            ]
            return {pipeline.name: once_landed(config.refined_topics, refine_all, inferred)}
        case TopicsRefinement(jobs=jobs, each=each):
            if each is not None:
                assert isinstance(config.raw.topics, TopicPattern)  # checked by SyncJobConfig
                pattern = config.raw.topics.pattern
                return {pattern: lambda: _refine_each_landed(spark, pattern, each, say, stop, landing)}
            if landing is not None:  # continuous: one loop for them all, each table joining once landed
                return {"topics": lambda: _refine_named(spark, jobs, say, stop, landing)}
            return {
                job.target: once_landed([job.table], partial(run_refine_job, spark, job, say, stop)) for job in jobs
            }
    raise AssertionError(f"unknown refinement {config.refine!r}")


# The `table` of a refine job standing for each topic of a pattern (TopicsRefinement.each), replaced by it.
EACH_TOPIC = "cdc.each-topic"


def _refine_each_landed(
    spark: SparkSession,
    pattern: str,
    each: RefineJobConfig,
    say: Callable[[str], None],
    stop: threading.Event,
    landing: LandingNews | None,
) -> None:
    """Refine every landed topic ``pattern`` matches with ``each``'s settings (its `table` replaced by the topic),
    all in one loop (refine/tables_loop.py): run once, those landed now; continuously, those landed later too
    (looked for every ``TABLE_RESCAN_S``), until ``stop``."""
    regex = re.compile(pattern)
    started: set[str] = set()

    def new_tables() -> list[RefineJobConfig]:
        landed = [t for t in landed_topics(spark, each.warehouse, started) if regex.fullmatch(t) and t not in started]
        started.update(landed)
        return [each.model_copy(update={"table": topic}) for topic in landed]

    _refine_in_a_loop(spark, each, new_tables, say, stop, landing)


def _refine_named(
    spark: SparkSession,
    jobs: list[RefineJobConfig],
    say: Callable[[str], None],
    stop: threading.Event,
    landing: LandingNews,
) -> None:
    """Refine the topics named, continuously, in one loop (refine/tables_loop.py), each table from the first round
    after its raw table exists. A query per table gave each its own planning and thread: in a process that lived
    a minute, the landing and the queries' first batches shared the cores and no refined table was committed."""
    waiting = {job.target: job for job in jobs}

    def landed_tables() -> list[RefineJobConfig]:
        landed = [
            job for job in waiting.values() if is_delta_table(spark, raw_table_location(job.warehouse, job.table))
        ]
        for job in landed:
            del waiting[job.target]
        return landed

    _refine_in_a_loop(spark, jobs[0], landed_tables, say, stop, landing)


def _refine_in_a_loop(
    spark: SparkSession,
    run: RefineJobConfig,
    discover: Callable[[], list[RefineJobConfig]],
    say: Callable[[str], None],
    stop: threading.Event,
    landing: LandingNews | None,
) -> None:
    """The tables ``discover`` finds, refined by one :class:`RefineLoop` with ``run``'s warehouse, trigger and
    quarantine policy; its summary said at the end."""
    since = datetime.now(UTC)
    continuous = isinstance(run.trigger, Continuous)
    with EventLog.of(run.warehouse).kept_flushed(spark, continuous) as events:
        loop = RefineLoop(
            spark,
            run.trigger,
            say,
            stop,
            events=events,
            told_what_landed=landing is not None,
            discover=discover,
            discover_every_s=TABLE_RESCAN_S,
        )
        if landing is not None:
            landing.listen(loop.landed)
        changes = loop.run()
    fail_if_quarantined(run, summarize_run(spark, run.warehouse, changes, since, say, stop))
