"""A landing by pattern: every matching topic in one streaming query (a whole database's tables).

A query per topic gives each topic its own trigger, Kafka polling, planning and thread; hundreds of them do not
fit one driver. Here one query subscribes to the matching topics, and each micro-batch appends each topic's
records to that topic's raw table (:class:`LandTopicsBatch`): one Kafka read, then an append per topic that has
records, a few at a time.

Exactly once, as a query per topic: every append is marked with the query's id and the batch id, and the first
batch of a run (the only one that can be a replay) leaves out the tables it was committed to already.

The query's checkpoint (``<warehouse>/_cdc/checkpoints/raw-by-pattern``; one landing by pattern per warehouse)
is used again only while it knows every topic landed so far: when a matching topic already has rows in its raw
table that the checkpoint never read (landed by a query of its own, or before the pattern took it in), or the
checkpoint reads a topic no longer matched, the query starts again from what each raw table holds: its last
offset per partition (:func:`landed_offsets`), the truth even after a crash in the middle of a batch. A topic's
own checkpoint is removed once the pattern lands it, so that a query of its own started later refuses to land it
again from old offsets. A topic created while the query runs is found every ``TOPIC_RESCAN_S`` and landed from
its first record (the query starts again with it, resuming from its checkpoint).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from cdc.core.config import Continuous
from cdc.core.errors import SourceError, TableError
from cdc.core.source import KafkaTopics, PartitionOffsets
from cdc.core.storage import Storage
from cdc.core.streaming import (
    LandingNews,
    ProgressLine,
    ProgressReports,
    ending_on_request,
    stop_queries,
    with_trigger,
)
from cdc.core.tables import (
    RESET_ALLOWED_PROPERTY,
    checkpoint_location,
    gaps_table_location,
    has_landed_data,
    is_delta_table,
    raw_table_location,
    raw_table_topic,
)
from cdc.raw.checkpoint import Offsets, batch_end_offsets, committed_offsets
from cdc.raw.commits import batch_marker, last_landed_batch
from cdc.raw.config import GapPolicy, RawJobConfig, TopicPattern
from cdc.raw.gaps import OffsetGap, find_gaps, record_gaps, refuse_gaps
from cdc.raw.reader import kafka_stream, raise_landing_failure
from cdc.raw.rows import raw_rows
from cdc.raw.summary import TopicSummary
from cdc.raw.table import create_raw_table

# A continuous run looks for new matching topics this often.
TOPIC_RESCAN_S = 30.0
# Raw tables appended to at once in a micro-batch: each append's time goes mostly to the driver (its commit).
WRITERS = 4
# Spark's Kafka offsets: -2 is the earliest a partition holds.
EARLIEST = -2


def pattern_checkpoint_location(warehouse: str) -> str:
    return f"{warehouse}/_cdc/checkpoints/raw-by-pattern"


class LandTopicsBatch:
    """The foreachBatch function of a landing by pattern: each topic's records of the micro-batch appended to its
    raw table. ``landed`` counts the rows of each topic; ``landing`` is told the topics of each batch."""

    def __init__(self, config: RawJobConfig, checkpoint: str, ready: set[str], landing: LandingNews | None) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.ready = ready  # topics whose raw table exists
        self.landing = landing
        self.first_batch = True  # of this run: the only one that can be a replay
        self.landed: Counter[str] = Counter()
        self.batches: Counter[str] = Counter()

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
        assert query_id is not None  # set in every micro-batch of a query
        records = records.persist()  # read from Kafka once, for the count and each topic's append
        try:
            counts = {row.topic: row["count"] for row in records.groupBy("topic").count().collect()}
            if self.config.on_gap is GapPolicy.RECORD and batch_id > 0:
                self._record_gaps(spark, batch_id)
            replay, self.first_batch = self.first_batch, False

            def append(topic: str) -> None:
                table = raw_table_location(self.config.warehouse, topic)
                if topic not in self.ready:
                    create_raw_table(spark, table, topic)
                    self.ready.add(topic)
                writer = (
                    raw_rows(records.where(F.col("topic") == topic), batch_id)
                    .write.format("delta")
                    .mode("append")
                    .option("userMetadata", batch_marker(query_id, batch_id))
                )
                if replay:
                    landed = last_landed_batch(spark, table, query_id)
                    if landed is not None and landed >= batch_id:
                        return  # committed before the last run died, not yet recorded in the checkpoint
                    if landed is None:  # a table landed without markers: Delta's idempotent write decides
                        writer = writer.option("txnAppId", f"cdc-raw-{query_id}-{topic}").option("txnVersion", batch_id)
                writer.save(table)

            with ThreadPoolExecutor(min(WRITERS, max(1, len(counts)))) as pool:
                list(pool.map(append, sorted(counts)))
        finally:
            records.unpersist()
        for topic, rows in counts.items():
            self.landed[topic] += rows
            self.batches[topic] += 1
        if self.landing is not None and counts:
            self.landing.tell(list(counts))

    def _record_gaps(self, spark: SparkSession, batch_id: int) -> None:
        """failOnDataLoss is off in this mode: record what Kafka deleted before this batch read it."""
        start = batch_end_offsets(Storage(spark), self.checkpoint, batch_id - 1)
        held = KafkaTopics(self.config.kafka).offsets(sorted({topic for topic, _ in start}))
        _record_gaps(spark, self.config.warehouse, find_gaps(start, held))


def _record_gaps(spark: SparkSession, warehouse: str, gaps: list[OffsetGap]) -> None:
    by_topic: dict[str, list[OffsetGap]] = {}
    for gap in gaps:
        by_topic.setdefault(gap.topic, []).append(gap)
    for topic, found in by_topic.items():
        record_gaps(spark, gaps_table_location(warehouse), raw_table_location(warehouse, topic), found)


def landed_offsets(spark: SparkSession, warehouse: str, topic: str) -> dict[int, int]:
    """The next offset to land per partition of ``topic``, from what its raw table holds (none: {})."""
    table = raw_table_location(warehouse, topic)
    if not is_delta_table(spark, table) or not has_landed_data(spark, table):
        return {}
    rows = spark.read.format("delta").load(table).groupBy("partition").agg(F.max("offset").alias("last")).collect()
    return {int(row.partition): int(row["last"]) + 1 for row in rows}


def _checkpoint_topics(storage: Storage, checkpoint: str) -> set[str] | None:
    """The topics the checkpoint's newest offsets (of a batch committed or planned) read; None: no batch yet."""
    batches = [int(name) for name in storage.list_names(f"{checkpoint}/offsets") if name.isdigit()]
    if not batches:
        return None
    return {topic for topic, _ in batch_end_offsets(storage, checkpoint, max(batches))}


def starting_offsets(
    spark: SparkSession, config: RawJobConfig, held: dict[tuple[str, int], PartitionOffsets], topics: list[str]
) -> tuple[str | None, Offsets]:
    """Where the query over ``topics`` (whose partitions Kafka holds as ``held``) starts: None to resume from its
    checkpoint, else Spark's JSON of each partition's next offset (from the raw tables; the checkpoint is then
    removed); and the next offset of each partition that has one (for the gap check)."""
    storage = Storage(spark)
    checkpoint = pattern_checkpoint_location(config.warehouse)
    read = _checkpoint_topics(storage, checkpoint)
    if read is not None and read <= set(topics):
        unread_with_rows = [
            topic
            for topic in sorted(set(topics) - read)
            if is_delta_table(spark, table := raw_table_location(config.warehouse, topic))
            and has_landed_data(spark, table)
        ]
        if not unread_with_rows:
            return None, committed_offsets(storage, checkpoint)
    if storage.exists(checkpoint):
        storage.delete(checkpoint)
    landed = {topic: landed_offsets(spark, config.warehouse, topic) for topic in topics}
    offsets: dict[str, dict[str, int]] = {topic: {} for topic in topics}
    known: Offsets = {}
    for topic, partition in held:
        offsets[topic][str(partition)] = landed[topic].get(partition, EARLIEST)
        if partition in landed[topic]:
            known[(topic, partition)] = landed[topic][partition]
    return json.dumps(offsets), known


def _reset(spark: SparkSession, config: RawJobConfig, topics: list[str]) -> None:
    """Delete the raw tables of ``topics`` and the checkpoints (``--reset --force-destroy-raw-data``)."""
    storage = Storage(spark)
    tables = [t for topic in topics if raw_table_topic(spark, t := raw_table_location(config.warehouse, topic))]
    if tables and not config.force_destroy_raw_data:
        raise TableError(
            f"refusing to reset a raw table ({RESET_ALLOWED_PROPERTY}=false): it may hold the only copy of "
            "records Kafka no longer has; pass --force-destroy-raw-data to delete it anyway",
            table=tables[0],
        )
    for location in [*tables, pattern_checkpoint_location(config.warehouse)]:
        storage.delete(location)


def _start(
    spark: SparkSession, config: RawJobConfig, kafka: KafkaTopics, topics: list[str], batch: LandTopicsBatch
) -> StreamingQuery:
    batch.first_batch = True  # the batch a stopped run cut short runs again
    held = kafka.offsets(topics)
    starting, next_offsets = starting_offsets(spark, config, held, topics)
    storage = Storage(spark)
    for topic in topics:  # a query of its own started later must not land the topic again from its old offsets
        if storage.exists(own := checkpoint_location(config.warehouse, topic)):
            storage.delete(own)
    if config.on_gap is GapPolicy.FAIL:
        refuse_gaps(find_gaps(next_offsets, held), config.warehouse)
    elif starting is not None:  # re-based: the first batch has no batch before it in the checkpoint to compare with
        _record_gaps(spark, config.warehouse, find_gaps(next_offsets, held))
    for topic in topics:
        if topic not in batch.ready and raw_table_topic(spark, raw_table_location(config.warehouse, topic)):
            batch.ready.add(topic)
    reader = kafka_stream(spark, config, subscribe=",".join(topics), starting=starting or "earliest")
    writer = (
        reader.writeStream.queryName("raw by pattern")
        .foreachBatch(batch)
        .option("checkpointLocation", pattern_checkpoint_location(config.warehouse))
    )
    return with_trigger(writer, config.trigger).start()


def land_by_pattern(
    spark: SparkSession,
    config: RawJobConfig,
    say: Callable[[str], None],
    stop: threading.Event,
    landing: LandingNews | None = None,
) -> list[TopicSummary]:
    """Land every topic ``config.topics`` matches in one query until done (available now) or ``stop``; return
    what each landed. ``landing`` is told the topics of each batch."""
    assert isinstance(config.topics, TopicPattern)
    pattern = config.topics.pattern
    kafka = KafkaTopics(config.kafka)
    topics = kafka.matching(pattern)
    if not topics:
        raise SourceError("no topic matches the pattern", pattern=pattern)
    if config.reset:
        _reset(spark, config, topics)
    batch = LandTopicsBatch(config, pattern_checkpoint_location(config.warehouse), set(), landing)
    query: StreamingQuery | None = None
    try:
        with ending_on_request(stop):
            query = _start(spark, config, kafka, topics, batch)
            say(f"raw {len(topics)} topics matching {pattern} -> {config.warehouse}/raw")
            reports, last_scan = ProgressReports(query), time.monotonic()
            while query.isActive and not stop.is_set():
                query.awaitTermination(0.5)  # type: ignore[arg-type]  # seconds, a float works
                raise_landing_failure(query, config, pattern=pattern)
                for line in _progress_lines(reports):
                    say(line)
                if isinstance(config.trigger, Continuous) and time.monotonic() - last_scan > TOPIC_RESCAN_S:
                    if new := sorted(set(kafka.matching(pattern)) - set(topics)):
                        query.stop()  # a batch cut short runs again in the query started now, once
                        topics = sorted({*topics, *new})
                        query = _start(spark, config, kafka, topics, batch)
                        reports = ProgressReports(query)
                        say(f"raw: new topics matching {pattern}: {', '.join(new)}")
                    last_scan = time.monotonic()
            raise_landing_failure(query, config, pattern=pattern)
            for line in _progress_lines(reports):
                say(line)
    finally:
        if query is not None:
            stop_queries([query], stop, say)
    return [
        TopicSummary(topic, raw_table_location(config.warehouse, topic), batch.landed[topic], batch.batches[topic])
        for topic in topics
    ]


def _progress_lines(reports: ProgressReports) -> list[ProgressLine]:
    """A line per micro-batch completed since the last call: its rows, its topics' lag after it."""
    lines = []
    for report in reports.new():
        if not (rows := report["numInputRows"]):  # Spark's idle reports between batches
            continue
        source = report["sources"][0]
        end, latest = (_offsets(source.get(key)) for key in ("endOffset", "latestOffset"))
        lag = sum(max(0, latest.get(key, offset) - offset) for key, offset in end.items())
        lines.append(ProgressLine(f"raw batch {report['batchId']}: {rows:,} rows, lag {lag:,}"))
    return lines


def _offsets(offsets: dict | str | None) -> dict[tuple[str, str], int]:
    """A Kafka source's offsets by (topic, partition), from a progress report (an object, or its JSON text)."""
    parsed = json.loads(offsets) if isinstance(offsets, str) else offsets
    return {(topic, p): o for topic, partitions in (parsed or {}).items() for p, o in partitions.items()}
