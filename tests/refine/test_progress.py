"""A refined table's progress as `cdc status` reports it: its last batch, the raw version refined up to,
the raw changes it has not refined yet (counted from the raw table's history; compared with the rows
read back), and its last failure until a batch commits again."""

from __future__ import annotations

import shutil
import time

import pytest

from cdc import Lakehouse, StreamError
from cdc.core.storage import Storage
from cdc.stack.workload import run_workload
from refine.progress import RefinedUpTo, read_marker, refined_table_statuses, write_marker


def test_status_follows_a_refined_tables_batches_lag_and_last_error(
    spark, kafka, stack_config, postgres_connector, tmp_path
):
    run_workload(stack_config.postgres.dsn(), customers=2, seed=61)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    warehouse = str(tmp_path)
    lake = Lakehouse(warehouse, spark=spark, kafka={"bootstrap_servers": kafka.bootstrap_servers}, say=lambda _: None)
    lake.land([topic])
    raw_rows = spark.read.format("delta").load(f"{warehouse}/raw/{topic}").count()

    # A file where the refined table goes: the first batch fails.
    (tmp_path / "refined").mkdir()
    (tmp_path / "refined" / topic).write_text("not a table")
    with pytest.raises(StreamError):
        lake.refine(topic)
    [failed] = refined_table_statuses(spark, warehouse)
    assert (failed.name, failed.raw, failed.refined) == (
        topic,
        f"{warehouse}/raw/{topic}",
        f"{warehouse}/refined/{topic}",
    )
    assert (failed.last_batch, failed.raw_version, failed.behind) == (None, None, raw_rows)
    assert failed.last_error is not None
    assert failed.last_error.batch == 0
    assert "a refine batch failed" in failed.last_error.error

    (tmp_path / "refined" / topic).unlink()
    shutil.rmtree(tmp_path / "_cdc" / "checkpoints" / "refine" / topic, ignore_errors=True)
    assert lake.refine(topic) == raw_rows
    [refined] = lake.status().refined_tables
    raw_version = spark.sql(f"DESCRIBE HISTORY delta.`{warehouse}/raw/{topic}` LIMIT 1").first()["version"]
    assert (refined.last_batch, refined.raw_version, refined.behind, refined.last_error) == (0, raw_version, 0, None)

    # New changes landed and not refined yet are counted as behind.
    before = len(kafka.records(topic))
    more = run_workload(stack_config.postgres.dsn(), customers=1, seed=62).expected_events("orders")
    deadline = time.monotonic() + 60
    while len(kafka.records(topic)) < before + more:
        assert time.monotonic() < deadline, "the second workload's changes did not reach Kafka"
        time.sleep(0.5)
    newly = sum(summary.rows for summary in lake.land([topic]))
    assert newly == more
    [behind] = lake.status().refined_tables
    assert (behind.last_batch, behind.behind) == (0, newly)


def test_changes_not_refined_are_counted_when_the_raw_feed_is_past_its_file_retention(spark, tmp_path):
    """Delta refuses a batch read of the Change Data Feed from a version older than the table's
    deletedFileRetentionDuration: a refine that far behind is still reported, with its count."""
    from refine.progress import _changes_after

    raw = str(tmp_path / "raw")
    properties = {
        "delta.appendOnly": "true",
        "delta.enableChangeDataFeed": "true",
        "delta.deletedFileRetentionDuration": "interval 1 seconds",
    }
    for rows in (3, 4):
        values = spark.range(rows).selectExpr("string(id) AS value")
        values.write.format("delta").options(**properties).mode("append").save(raw)
    time.sleep(1.5)  # the first appends are now older than the table's file retention
    assert (_changes_after(spark, raw, None), _changes_after(spark, raw, 0), _changes_after(spark, raw, 1)) == (7, 4, 0)


class _CutShort(Storage):
    """A storage whose next file write stops halfway, as a process killed in the middle of it leaves the file."""

    cut = False

    def _write(self, fs, path, data: bytes) -> None:
        if not self.cut:
            return super()._write(fs, path, data)
        super()._write(fs, path, data[: len(data) // 2])
        raise OSError("killed in the middle of a write")


def test_a_marker_write_cut_short_leaves_the_last_whole_marker(spark, tmp_path):
    """A torn marker sent its table back to the first raw version (every change refined again)."""
    warehouse, name = str(tmp_path), "demo.shop.torn"
    storage = _CutShort(spark)
    write_marker(storage, warehouse, name, RefinedUpTo(4, 40))
    storage.cut = True
    with pytest.raises(OSError, match="killed"):
        write_marker(storage, warehouse, name, RefinedUpTo(5, 40, begun_to=45))
    assert read_marker(Storage(spark), warehouse, name) == RefinedUpTo(4, 40)
    storage.cut = False
    write_marker(storage, warehouse, name, RefinedUpTo(5, 45))
    assert read_marker(Storage(spark), warehouse, name) == RefinedUpTo(5, 45)
