"""A landing by pattern (cdc/raw/by_pattern.py) on real Delta tables: each topic's records of a micro-batch in its
own raw table, once even when a run dies in the middle of a batch, and where a new checkpoint starts."""

from __future__ import annotations

from datetime import datetime

from cdc.core.config import validate
from cdc.core.tables import raw_table_location
from cdc.raw.by_pattern import LandTopicsBatch, landed_offsets, pattern_checkpoint_location
from cdc.raw.commits import batch_marker
from cdc.raw.config import RawJobConfig
from cdc.raw.rows import raw_rows
from cdc.raw.table import create_raw_table
from tests.cdc.raw.test_commits import KAFKA_SCHEMA, streaming_query

TOPICS = ("shop.public.orders", "shop.public.items")


def records(spark, batch: dict[str, range]):
    """Kafka records (as Spark's Kafka source reads them) of each topic at the offsets given."""
    at = datetime(2026, 1, 1)
    rows = [(b"k", f"{t} {o}".encode(), t, 0, o, at, 0, []) for t, offsets in batch.items() for o in offsets]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def new_run(tmp_path, told: list) -> LandTopicsBatch:
    config = validate(
        RawJobConfig, {"topics": {"kind": "pattern", "pattern": r"shop\..*"}, "warehouse": str(tmp_path)}, "raw"
    )

    class Told:
        def tell(self, topics):
            told.append(sorted(topics))

    return LandTopicsBatch(config, pattern_checkpoint_location(str(tmp_path)), set(), Told())


def offsets(spark, tmp_path, topic: str) -> list[int]:
    table = raw_table_location(str(tmp_path), topic)
    return sorted(row.offset for row in spark.read.format("delta").load(table).select("offset").collect())


def test_each_topic_lands_in_its_table_once_though_a_run_died_in_the_middle_of_a_batch(spark, tmp_path):
    orders, items = TOPICS
    told: list = []
    with streaming_query(spark, "query-1"):
        first = new_run(tmp_path, told)
        first(records(spark, {orders: range(2), items: range(1)}), 0)
        # Batch 1 reached the orders table, and the run died before the items table and the checkpoint.
        raw_rows(records(spark, {orders: range(2, 3)}), 1).write.format("delta").mode("append").option(
            "userMetadata", batch_marker("query-1", 1)
        ).save(raw_table_location(str(tmp_path), orders))
        replay = new_run(tmp_path, told)
        replay(records(spark, {orders: range(2, 3), items: range(1, 3)}), 1)
        replay(records(spark, {items: range(3, 4)}), 2)
    assert offsets(spark, tmp_path, orders) == [0, 1, 2]
    assert offsets(spark, tmp_path, items) == [0, 1, 2, 3]
    assert told == [[*sorted(TOPICS)], [*sorted(TOPICS)], [items]]
    assert (replay.landed[orders], replay.landed[items]) == (1, 3)  # what the batches held


def test_a_new_checkpoint_starts_after_what_each_raw_table_holds(spark, tmp_path):
    orders, items = TOPICS
    table = raw_table_location(str(tmp_path), orders)
    create_raw_table(spark, table, orders)
    assert landed_offsets(spark, str(tmp_path), orders) == {}  # created, nothing landed: from the earliest
    rows = records(spark, {orders: range(5, 9)}).unionByName(
        records(spark, {orders: range(3)}).selectExpr(
            "key", "value", "topic", "1 AS partition", "offset", "timestamp", "timestampType", "headers"
        )
    )
    raw_rows(rows, 0).write.format("delta").mode("append").save(table)
    assert landed_offsets(spark, str(tmp_path), orders) == {0: 9, 1: 3}
    assert landed_offsets(spark, str(tmp_path), items) == {}
