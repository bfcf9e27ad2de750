"""A replayed micro-batch is landed once: the batch markers of raw tables' commits (real Delta tables)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest

from cdc.core.config import validate
from cdc.core.tables import checkpoint_location, raw_table_location
from cdc.raw import commits
from cdc.raw.commits import last_landed_batch
from cdc.raw.config import RawJobConfig
from cdc.raw.job import LandBatch
from cdc.raw.rows import raw_rows
from cdc.raw.table import create_raw_table

TOPIC = "shop.orders"
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string, value:binary>>"
)


@pytest.fixture
def raw_table(spark, tmp_path):
    table = raw_table_location(str(tmp_path), TOPIC)
    create_raw_table(spark, table, TOPIC)
    return table


def records(spark, first: int, count: int = 2):
    """Kafka records (as Spark's Kafka source reads them) at offsets ``first``..."""
    at = datetime(2026, 1, 1)
    return spark.createDataFrame(
        [(b"k", f"value {offset}".encode(), TOPIC, 0, offset, at, 0, []) for offset in range(first, first + count)],
        KAFKA_SCHEMA,
    )


def run(spark, tmp_path, table) -> LandBatch:
    """The foreachBatch function of a new run of `cdc raw`."""
    config = validate(
        RawJobConfig, {"topics": {"kind": "topics", "topics": [TOPIC]}, "warehouse": str(tmp_path)}, "raw"
    )
    return LandBatch(config, TOPIC, table, checkpoint_location(config.warehouse, TOPIC))


@contextmanager
def streaming_query(spark, query_id: str):
    """Run as a micro-batch of the streaming query ``query_id`` does."""
    spark.sparkContext.setLocalProperty("sql.streaming.queryId", query_id)
    try:
        yield
    finally:
        spark.sparkContext.setLocalProperty("sql.streaming.queryId", None)


def landed_offsets(spark, table) -> list[int]:
    return sorted(row.offset for row in spark.read.format("delta").load(table).select("offset").collect())


def test_a_batch_committed_before_a_crash_is_not_landed_again_by_its_replay(spark, tmp_path, raw_table, monkeypatch):
    monkeypatch.setattr(commits, "_HISTORY_LIMITS", (2, 4, None))  # the history is read in three pages
    with streaming_query(spark, "query-1"):
        first_run = run(spark, tmp_path, raw_table)
        first_run(records(spark, 0), 0)
        first_run(records(spark, 2), 1)  # committed; then the job dies before its checkpoint records it
        # Maintenance commits push the batch's commit back in the history; their user metadata is no marker.
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", "cdc-raw maintenance by hand")
        try:
            for number in range(5):
                spark.sql(f"ALTER TABLE delta.`{raw_table}` SET TBLPROPERTIES ('maintenance.round' = '{number}')")
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
        assert last_landed_batch(spark, raw_table, "query-1") == 1
        next_run = run(spark, tmp_path, raw_table)
        next_run(records(spark, 2), 1)  # the replay
        next_run(records(spark, 4), 2)
    assert landed_offsets(spark, raw_table) == [0, 1, 2, 3, 4, 5]
    markers = spark.read.format("delta").load(raw_table).groupBy("batch_id").count().orderBy("batch_id").collect()
    assert [(row.batch_id, row["count"]) for row in markers] == [(0, 2), (1, 2), (2, 2)]


def test_a_new_query_is_never_taken_for_a_replay(spark, tmp_path, raw_table):
    with streaming_query(spark, "query-1"):
        run(spark, tmp_path, raw_table)(records(spark, 0, count=0), 0)  # an empty batch, then the checkpoint is lost
    with streaming_query(spark, "query-2"):
        assert last_landed_batch(spark, raw_table, "query-2") == -1
        run(spark, tmp_path, raw_table)(records(spark, 0), 0)
    assert landed_offsets(spark, raw_table) == [0, 1]


def test_a_table_landed_without_markers_falls_back_to_deltas_idempotent_writes(spark, tmp_path, raw_table):
    # How earlier versions of `cdc raw` landed every batch.
    raw_rows(records(spark, 0), 0).write.format("delta").mode("append").option("txnAppId", "cdc-raw-query-1").option(
        "txnVersion", 0
    ).save(raw_table)
    assert last_landed_batch(spark, raw_table, "query-1") is None
    with streaming_query(spark, "query-1"):
        replay = run(spark, tmp_path, raw_table)
        replay(records(spark, 0), 0)
        replay(records(spark, 2), 1)
    assert landed_offsets(spark, raw_table) == [0, 1, 2, 3]
    assert last_landed_batch(spark, raw_table, "query-1") == 1  # the next batch's commit has its marker


def test_a_new_table_lands_its_first_batch_without_deltas_idempotent_write(spark, tmp_path, raw_table):
    assert last_landed_batch(spark, raw_table, "query-1") == -1  # only the table's creation: nothing to replay
    with streaming_query(spark, "query-1"):
        run(spark, tmp_path, raw_table)(records(spark, 0), 0)
    # Delta's idempotent write would have recorded a transaction (and rebuilt the table's state for it).
    first_commit = Path(raw_table, "_delta_log", f"{1:020}.json").read_text().splitlines()
    assert not [action for action in map(json.loads, first_commit) if "txn" in action]
    assert last_landed_batch(spark, raw_table, "query-1") == 0
    assert landed_offsets(spark, raw_table) == [0, 1]
