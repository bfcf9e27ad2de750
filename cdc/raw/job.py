"""`cdc raw`: stream each Kafka topic into its raw Delta table, exactly once.

One streaming query per topic, each with its own checkpoint. Every micro-batch's commit is marked
with the query's id and the batch id (:mod:`cdc.raw.commits`): a batch replayed after a crash, at
whatever moment, is written once. A checkpoint deleted by a reset gives a new query id, so a new run
can never be mistaken for a replay.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc.core.errors import TableError
from cdc.core.source import KafkaTopics
from cdc.core.storage import Storage
from cdc.core.streaming import LandingNews, ProgressLine, ProgressReports, ending_on_request, stop_queries, with_trigger
from cdc.core.tables import (
    RESET_ALLOWED_PROPERTY,
    checkpoint_location,
    gaps_table_location,
    has_landed_data,
    raw_table_location,
    raw_table_topic,
)
from cdc.raw.by_pattern import land_by_pattern
from cdc.raw.checkpoint import batch_end_offsets, committed_offsets
from cdc.raw.commits import batch_marker, last_landed_batch
from cdc.raw.config import GapPolicy, RawJobConfig, TopicPattern
from cdc.raw.gaps import find_gaps, record_gaps, refuse_gaps
from cdc.raw.reader import kafka_stream, raise_landing_failure
from cdc.raw.rows import raw_rows
from cdc.raw.summary import TopicSummary
from cdc.raw.table import create_raw_table


@dataclass
class TopicRun:
    """One topic's streaming query and what it landed in this run."""

    topic: str
    table: str
    query: StreamingQuery
    rows: int = 0
    batches: int = 0
    reports: ProgressReports = field(init=False)

    def __post_init__(self) -> None:
        self.reports = ProgressReports(self.query)


class LandBatch:
    """The foreachBatch function: one micro-batch of Kafka records appended to the raw table."""

    def __init__(
        self,
        config: RawJobConfig,
        topic: str,
        table: str,
        checkpoint: str,
        new_table: bool = False,
        landing: LandingNews | None = None,
    ) -> None:
        self.config = config
        self.landing = landing  # told what each batch landed
        self.topic = topic
        self.table = table
        self.checkpoint = checkpoint
        # The first batch of this run is the only one that can be a replay; never into a table this
        # run created (looking it up took ~0.1 s of every run, ~0.8 s on a fresh JVM).
        self.first_batch = not new_table

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
        assert query_id is not None  # set in every micro-batch of a query
        if self.config.on_gap is GapPolicy.RECORD and batch_id > 0:
            # failOnDataLoss is off in this mode: find what Kafka deleted before this batch read it.
            start = batch_end_offsets(Storage(spark), self.checkpoint, batch_id - 1)
            held = KafkaTopics(self.config.kafka).offsets([self.topic])
            record_gaps(spark, gaps_table_location(self.config.warehouse), self.table, find_gaps(start, held))
        writer = (
            raw_rows(records, batch_id)
            .write.format("delta")
            .mode("append")
            .option("userMetadata", batch_marker(query_id, batch_id))
        )
        if self.first_batch:
            self.first_batch = False
            landed = last_landed_batch(spark, self.table, query_id)
            if landed is not None and landed >= batch_id:
                return  # committed before the last run died, not yet recorded in the checkpoint
            if landed is None:  # a table landed without markers: Delta's idempotent write decides
                writer = writer.option("txnAppId", f"cdc-raw-{query_id}").option("txnVersion", batch_id)
        writer.save(self.table)
        if self.landing is not None:
            self.landing.tell([self.topic])


def prepare_topic(spark: SparkSession, config: RawJobConfig, kafka: KafkaTopics, topic: str) -> tuple[str, str, bool]:
    """Check or create the topic's table and checkpoint; return (table, checkpoint) locations and
    whether the table was created now."""
    storage = Storage(spark)
    table = raw_table_location(config.warehouse, topic)
    checkpoint = checkpoint_location(config.warehouse, topic)
    existing_topic = raw_table_topic(spark, table)
    if config.reset and existing_topic is not None:
        if not config.force_destroy_raw_data:
            raise TableError(
                f"refusing to reset a raw table ({RESET_ALLOWED_PROPERTY}=false): it may hold the only copy of "
                "records Kafka no longer has; pass --force-destroy-raw-data to delete it anyway",
                table=table,
            )
        storage.delete(table)
        storage.delete(checkpoint)
    elif existing_topic is not None and not storage.exists(f"{checkpoint}/commits") and has_landed_data(spark, table):
        raise TableError(
            "the raw table holds data but its checkpoint is gone: landing from the earliest offsets again would "
            "duplicate records; restore the checkpoint (or reset with --reset --force-destroy-raw-data)",
            table=table,
            checkpoint=checkpoint,
        )
    create_raw_table(spark, table, topic)
    # A checkpoint without committed batches starts from the earliest offsets: no gap to look for.
    if config.on_gap is GapPolicy.FAIL and (committed := committed_offsets(storage, checkpoint)):
        refuse_gaps(find_gaps(committed, kafka.offsets([topic])), config.warehouse)
    return table, checkpoint, existing_topic is None


def start_query(
    spark: SparkSession,
    config: RawJobConfig,
    topic: str,
    table: str,
    checkpoint: str,
    new_table: bool,
    landing: LandingNews | None = None,
) -> StreamingQuery:
    writer = (
        kafka_stream(spark, config, subscribe=topic)
        .writeStream.queryName(f"raw {topic}")
        .foreachBatch(LandBatch(config, topic, table, checkpoint, new_table, landing))
        .option("checkpointLocation", checkpoint)
    )
    return with_trigger(writer, config.trigger).start()


def progress_lines(run: TopicRun) -> list[ProgressLine]:
    """A line per micro-batch completed since the last call: its rows, this run's records landed out of
    those known (landed plus the lag, Kafka's latest offsets read at the batch), the rate and the time
    left at that rate, the next offsets; updates the run's totals."""
    lines = []
    for report in run.reports.new():
        batch, rows = report["batchId"], report["numInputRows"]
        if rows == 0:  # Spark's idle reports between batches
            continue
        run.rows += rows
        run.batches += 1
        source = report["sources"][0]
        end, latest = (
            _topic_offsets(source.get("endOffset"), run.topic),
            _topic_offsets(source.get("latestOffset"), run.topic),
        )
        lag = sum(max(0, latest.get(partition, offset) - offset) for partition, offset in end.items())
        offsets = " ".join(
            f"p{partition}:{offset}" for partition, offset in sorted(end.items(), key=lambda kv: int(kv[0]))
        )
        rate = report.get("processedRowsPerSecond")
        known = run.rows + lag
        line = f"raw {run.topic} batch {batch}: {rows:,} rows, {run.rows:,}/{known:,} ({100 * run.rows // known}%)"
        if rate:
            line += f", {rate:,.0f} rows/s" + (f", {_duration(lag / rate)} left" if lag else "")
        lines.append(ProgressLine(f"{line}, next offsets {offsets}, lag {lag:,}"))
    return lines


def _duration(seconds: float) -> str:
    """``seconds`` as people read a time left: 45 s, 12 min 5 s, 3 h 20 min."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _topic_offsets(offsets: dict | str | None, topic: str) -> dict[str, int]:
    """A Kafka source's offsets of ``topic`` by partition, from a progress report (an object, or
    its JSON text when Spark could not parse it)."""
    parsed = json.loads(offsets) if isinstance(offsets, str) else offsets
    return (parsed or {}).get(topic, {})


def run_raw_job(
    spark: SparkSession,
    config: RawJobConfig,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
    landing: LandingNews | None = None,
) -> list[TopicSummary]:
    """Land the configured topics; return what each landed. Topics by pattern are landed by one query
    (:mod:`cdc.raw.by_pattern`), topics by name by a query each. ``landing`` is told the topics of each batch.

    A continuous run goes on until ``stop`` is set (the CLI sets it on SIGINT and SIGTERM); then
    the queries stop, and a micro-batch cut short is replayed by the next run.

    Example (:class:`cdc.Lakehouse`'s ``land`` builds the config and calls this)::

        config = RawJobConfig(topics={"topics": ["demo.shop.orders"]}, warehouse="/data/warehouse")
        run_raw_job(spark, config, stop=stop_event)  # continuous until stop_event is set
    """
    stop = stop or threading.Event()
    Storage(spark).ensure_writable(config.warehouse)
    if isinstance(config.topics, TopicPattern):
        summaries = land_by_pattern(spark, config, say, stop, landing)
    else:
        summaries = _land_each(spark, config, config.topics.topics, say, stop, landing)
    for summary in summaries:
        say(
            f"raw {summary.topic}: landed {summary.rows:,} records in {summary.batches} micro-batches "
            f"-> {summary.table}"
        )
    return summaries


def _land_each(
    spark: SparkSession,
    config: RawJobConfig,
    topics: list[str],
    say: Callable[[str], None],
    stop: threading.Event,
    landing: LandingNews | None,
) -> list[TopicSummary]:
    """A streaming query per topic."""
    kafka = KafkaTopics(config.kafka)
    kafka.require(topics)
    runs: dict[str, TopicRun] = {}
    try:
        with ending_on_request(stop):
            for topic in topics:
                table, checkpoint, new_table = prepare_topic(spark, config, kafka, topic)
                query = start_query(spark, config, topic, table, checkpoint, new_table, landing)
                runs[topic] = TopicRun(topic, table, query)
                say(f"raw {topic} -> {table}")
            while any(run.query.isActive for run in runs.values()) and not stop.is_set():
                for run in runs.values():
                    # (a timeout in seconds, any number: pyspark's annotation says int)
                    run.query.awaitTermination(0.5)  # type: ignore[arg-type]
                    _raise_failure(run, config)
                    for line in progress_lines(run):
                        say(line)
            for run in runs.values():
                _raise_failure(run, config)
                for line in progress_lines(run):
                    say(line)
    finally:
        stop_queries([run.query for run in runs.values()], stop, say)
    return [TopicSummary(run.topic, run.table, run.rows, run.batches) for run in runs.values()]


def _raise_failure(run: TopicRun, config: RawJobConfig) -> None:
    raise_landing_failure(run.query, config, topic=run.topic, table=run.table)
