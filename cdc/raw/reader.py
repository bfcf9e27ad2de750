"""The Kafka stream a landing reads, and its failures as the landing's errors."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc.core.errors import OffsetGapError, StreamError
from cdc.core.streaming import failure
from cdc.raw.config import GapPolicy, RawJobConfig


def kafka_stream(spark: SparkSession, config: RawJobConfig, subscribe: str, starting: str = "earliest") -> DataFrame:
    """The records of the topics ``subscribe`` names (comma-separated), from ``starting`` (Spark's
    ``startingOffsets``: used by a new checkpoint only)."""
    reader = (
        spark.readStream.format("kafka")
        # Larger fetches: on loopback these read ~1 KB records ~40% faster than Kafka's defaults.
        .option("kafka.max.partition.fetch.bytes", str(16 << 20))
        .option("kafka.fetch.max.bytes", str(64 << 20))
        # With Kafka's default fetch.max.wait.ms (500 ms), a task reading a few records spent ~0.5 s
        # of its ~0.55 s idle, waiting out a fetch the broker held open for want of newer records:
        # reading one record took ~0.65 s, ~0.15 s with 10 ms. A fetch with records returns at once.
        .option("kafka.fetch.max.wait.ms", "10")
        .options(**config.kafka.spark_options())
        .option("subscribe", subscribe)
        .option("startingOffsets", starting)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(config.on_gap is GapPolicy.FAIL).lower())
        # Split large partitions into several tasks so every core writes, even for one partition.
        .option("minPartitions", spark.sparkContext.defaultParallelism)
    )
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", config.max_offsets_per_trigger)
    return reader.load()


def raise_landing_failure(query: StreamingQuery, config: RawJobConfig, **context: object) -> None:
    """The landing's error when ``query`` failed (``context`` names its topic and table): an
    :class:`OffsetGapError` when Kafka lost offsets it had not landed, else a :class:`StreamError`."""
    message = failure(query, config.kafka.secrets())
    if message is None:
        return
    first_line = message.splitlines()[0]
    if "data may have been lost" in message or "data loss" in message.lower():
        raise OffsetGapError(
            f"Kafka no longer holds offsets the raw table has not landed: {first_line}; "
            "rerun with --allow-gaps to continue and record the gap",
            **context,
        )
    raise StreamError(f"the raw stream stopped: {first_line}", **context)
