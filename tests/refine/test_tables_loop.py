"""Many tables refined by one loop (refine/tables_loop.py), on real Delta tables: each table's new raw versions
refined once, a table without any left alone, a batch cut short run again as it was, and the hand-over with a
table's streaming query both ways."""

from __future__ import annotations

import json
import threading
import time

import pytest
from py4j.protocol import Py4JError
from pyspark.sql import functions as F

from cdc.core.config import Continuous
from cdc.core.errors import CdcError
from cdc.core.storage import Storage
from cdc.core.tables import is_delta_table, raw_table_location, table_version
from cdc.raw.rows import raw_rows
from cdc.raw.table import create_raw_table
from cdc.stack.envelopes import postgres_envelope
from refine.apply.deleted import deleted_location
from refine.config import RefineJobConfig, refined_table_location
from refine.job import run_refine_job
from refine.progress import (
    RefinedUpTo,
    read_marker,
    refine_checkpoint_location,
    refined_table_status,
    write_marker,
)
from refine.tables_loop import RefineLoop

COLUMNS = {"id": "bigint", "name": "string"}


def land(spark, warehouse: str, topic: str, changes: list[tuple[str, int, dict | None, dict | None]]) -> int:
    """Append Debezium envelopes (op, lsn, before, after) of ``topic`` as one landing commit; its raw version."""
    location = raw_table_location(warehouse, topic)
    create_raw_table(spark, location, topic)
    first = spark.read.format("delta").load(location).count()
    rows = [
        (
            json.dumps({"id": (after or before)["id"]}).encode(),
            json.dumps(postgres_envelope(op, lsn, before=before, after=after)).encode(),
            topic,
            0,
            first + i,
        )
        for i, (op, lsn, before, after) in enumerate(changes)
    ]
    records = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset long")
    records = records.selectExpr(
        "*",
        "current_timestamp() AS timestamp",
        "0 AS timestampType",
        "CAST(NULL AS array<struct<key:string,value:binary>>) AS headers",
    )
    raw_rows(records, first).write.format("delta").mode("append").save(location)
    return table_version(spark, location)


def job(warehouse: str, topic: str, trigger: str = "available_now") -> RefineJobConfig:
    return RefineJobConfig(
        table=topic, warehouse=warehouse, trigger={"kind": trigger}, columns=COLUMNS, key=["id"], connector="postgres"
    )


def refined(spark, warehouse: str, topic: str) -> list[tuple]:
    rows = spark.read.format("delta").load(refined_table_location(warehouse, topic)).collect()
    return sorted((row.id, row.name) for row in rows)


def run_loop(spark, warehouse: str, topics: list[str]) -> tuple[dict[str, int], list[str]]:
    said: list[str] = []
    loop = RefineLoop(spark, job(warehouse, topics[0]).trigger, said.append)
    for topic in topics:
        loop.add(job(warehouse, topic))
    return loop.run(), said


def test_one_loop_refines_each_table_s_new_versions_once_and_leaves_the_others(spark, tmp_path):
    warehouse = str(tmp_path)
    topics = [f"demo.shop.t{i}" for i in range(3)]
    for i, topic in enumerate(topics):
        land(spark, warehouse, topic, [("c", 10, None, {"id": n, "name": f"{topic}-{n}"}) for n in range(i + 1)])
    changes, _ = run_loop(spark, warehouse, topics)
    assert changes == {topic: i + 1 for i, topic in enumerate(topics)}
    for i, topic in enumerate(topics):
        assert refined(spark, warehouse, topic) == [(n, f"{topic}-{n}") for n in range(i + 1)]

    # Only t1 moves: a new loop (a new process) refines its new version, and nothing of the others.
    version = land(spark, warehouse, topics[1], [("u", 20, {"id": 0, "name": "x"}, {"id": 0, "name": "moved"})])
    changes, said = run_loop(spark, warehouse, topics)
    assert changes == {topics[0]: 0, topics[1]: 1, topics[2]: 0}
    assert said == [f"refine {topics[1]} batch 1: 1 changes"]
    assert refined(spark, warehouse, topics[1]) == [(0, "moved"), (1, f"{topics[1]}-1")]
    assert read_marker(Storage(spark), warehouse, topics[1]) == RefinedUpTo(1, version)
    status = refined_table_status(spark, warehouse, topics[1])
    assert (status.last_batch, status.raw_version, status.behind) == (1, version, 0)


def test_a_batch_cut_short_runs_again_over_the_same_versions_with_the_same_id(spark, tmp_path):
    warehouse, topic = str(tmp_path), "demo.shop.cut"
    land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    run_loop(spark, warehouse, [topic])
    begun = land(spark, warehouse, topic, [("u", 20, {"id": 1, "name": "a"}, {"id": 1, "name": "b"})])
    # The marker as a crash leaves it: batch 1 begun over the versions up to ``begun``, not done.
    write_marker(Storage(spark), warehouse, topic, RefinedUpTo(0, begun - 1, begun_to=begun))
    land(spark, warehouse, topic, [("u", 30, {"id": 1, "name": "b"}, {"id": 1, "name": "c"})])
    changes, said = run_loop(spark, warehouse, [topic])
    assert said == [f"refine {topic} batch 1: 1 changes", f"refine {topic} batch 2: 1 changes"]
    assert changes == {topic: 2}
    assert refined(spark, warehouse, topic) == [(1, "c")]


def test_a_table_hands_over_between_its_streaming_query_and_the_loop_both_ways(spark, tmp_path):
    """Each refines only what the other has not: a streaming query after the loop starts after the loop's marker
    (it read every change again from the start), and the loop after the query starts after its last committed
    batch and removes its offsets (a query started later would resume from them)."""
    warehouse, topic = str(tmp_path), "demo.shop.handed"
    land(spark, warehouse, topic, [("c", 10, None, {"id": n, "name": "a"}) for n in range(3)])
    assert run_loop(spark, warehouse, [topic])[0] == {topic: 3}

    land(spark, warehouse, topic, [("u", 20, {"id": 0, "name": "a"}, {"id": 0, "name": "b"})])
    said: list[str] = []
    assert run_refine_job(spark, job(warehouse, topic), say=lambda line: said.append(str(line))) == 1
    checkpoint = refine_checkpoint_location(warehouse, topic)
    assert Storage(spark).list_names(f"{checkpoint}/commits")
    # Batch ids go on from the loop's (expectation counts are kept by batch id, and were overwritten).
    assert f"refine {topic} batch 1: 1 changes" in said
    assert refined_table_status(spark, warehouse, topic).last_batch == 1

    version = land(spark, warehouse, topic, [("d", 30, {"id": 1, "name": "a"}, None)])
    assert run_loop(spark, warehouse, [topic]) == ({topic: 1}, [f"refine {topic} batch 2: 1 changes"])
    assert not Storage(spark).exists(f"{checkpoint}/commits")
    assert read_marker(Storage(spark), warehouse, topic) == RefinedUpTo(2, version)

    land(spark, warehouse, topic, [("c", 40, None, {"id": 7, "name": "z"})])
    assert run_refine_job(spark, job(warehouse, topic), say=lambda line: None) == 1
    assert refined(spark, warehouse, topic) == [(0, "b"), (2, "a"), (7, "z")]
    assert refined_table_status(spark, warehouse, topic).last_batch == 3


def test_a_raw_table_holding_only_its_creation_runs_no_batch(spark, tmp_path):
    """A whole database's landing creates a topic's raw table before it appends to it: the loop may find it
    then, and has nothing to refine (a batch over the creation alone ran, and looked for a schema in vain)."""
    warehouse, topic = str(tmp_path), "demo.shop.empty"
    create_raw_table(spark, raw_table_location(warehouse, topic), topic)
    assert run_loop(spark, warehouse, [topic]) == ({topic: 0}, [])
    assert read_marker(Storage(spark), warehouse, topic) is None
    land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    assert run_loop(spark, warehouse, [topic])[0] == {topic: 1}


def test_each_table_refines_in_a_session_of_its_own_that_reads_versions_past_retention(spark, tmp_path):
    """Two tables' batches run side by side in one driver: a setting one batch sets for its write (the keyless
    MERGE's txnAppId) must not reach the other's, nor the job's session. And a raw version older than
    ``delta.deletedFileRetentionDuration`` (a loop a week behind) is still read: Delta refuses a batch read of
    the feed there by default, which would stop every table for good."""
    warehouse = str(tmp_path)
    topics = ["demo.shop.s0", "demo.shop.s1"]
    for topic in topics:
        land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    loop = RefineLoop(spark, job(warehouse, topics[0]).trigger, lambda line: None)
    for topic in topics:
        loop.add(job(warehouse, topic))
    first, second = (loop.tables[topic].session for topic in topics)
    first.conf.set("spark.databricks.delta.write.txnAppId", "first-table")
    assert second.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    first.conf.unset("spark.databricks.delta.write.txnAppId")

    raw = raw_table_location(warehouse, topics[0])
    spark.sql(
        f"ALTER TABLE delta.`{raw}` SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = 'interval 1 seconds')"
    )
    land(spark, warehouse, topics[0], [("u", 20, {"id": 1, "name": "a"}, {"id": 1, "name": "b"})])
    time.sleep(2)
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
    with pytest.raises(Exception, match=r"(?i)retention"):  # the job's own session refuses
        feed.load(raw).count()
    assert loop.run() == {topics[0]: 2, topics[1]: 1}
    assert refined(spark, warehouse, topics[0]) == [(1, "b")]


def test_a_replay_after_a_delete_stays_out_when_the_guard_is_left_out_for_newer_batches(spark, tmp_path):
    """A batch whose creates and updates all come after every recorded delete skips the deleted keys' join
    (refine/apply/deleted.py DeletedBound); a later batch replaying an older create of a deleted key still
    meets it, in the same loop, and a side table written by another job meanwhile is read again."""
    warehouse, topic = str(tmp_path), "demo.shop.bound"
    land(spark, warehouse, topic, [("c", 10, None, {"id": n, "name": "a"}) for n in range(3)])
    loop = RefineLoop(spark, job(warehouse, topic).trigger, lambda line: None)
    loop.add(job(warehouse, topic))
    table = loop.tables[topic]
    table.refine_new()
    land(spark, warehouse, topic, [("d", 20, {"id": 0, "name": "a"}, None)])
    table.refine_new()
    land(spark, warehouse, topic, [("u", 30, {"id": 1, "name": "a"}, {"id": 1, "name": "b"})])
    table.refine_new()  # newer than every delete: no guard needed
    assert refined(spark, warehouse, topic) == [(1, "b"), (2, "a")]
    # Debezium delivers the create of id 0 again (its old position, a later offset).
    land(spark, warehouse, topic, [("c", 10, None, {"id": 0, "name": "a"}), ("c", 40, None, {"id": 5, "name": "e"})])
    table.refine_new()
    assert refined(spark, warehouse, topic) == [(1, "b"), (2, "a"), (5, "e")]
    # Another writer records a delete of id 2 at a later position: the bound no longer holds, and is read again.
    side_table = deleted_location(warehouse, topic)
    entry = spark.read.format("delta").load(side_table).limit(1)
    entry = entry.withColumn("id", F.lit(2).cast(entry.schema["id"].dataType)).withColumn(
        "_cdc_lsn", F.lit(60).cast("long")
    )
    entry.write.format("delta").mode("append").save(side_table)
    land(spark, warehouse, topic, [("u", 50, {"id": 2, "name": "a"}, {"id": 2, "name": "late"})])
    table.refine_new()
    assert refined(spark, warehouse, topic) == [(1, "b"), (2, "a"), (5, "e")]


def test_a_take_over_cut_short_between_the_checkpoints_folders_leaves_the_table_refinable(spark, tmp_path):
    """A take-over that wrote its marker and removed the streaming query's offsets, and died before its commits
    went, left commits without offsets: every later start of the loop failed reading them."""
    warehouse, topic = str(tmp_path), "demo.shop.cut_over"
    land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    assert run_refine_job(spark, job(warehouse, topic), say=lambda line: None) == 1
    checkpoint = refine_checkpoint_location(warehouse, topic)
    storage = Storage(spark)
    write_marker(storage, warehouse, topic, RefinedUpTo(0, table_version(spark, raw_table_location(warehouse, topic))))
    storage.delete(f"{checkpoint}/offsets")
    land(spark, warehouse, topic, [("u", 20, {"id": 1, "name": "a"}, {"id": 1, "name": "b"})])
    assert run_loop(spark, warehouse, [topic]) == ({topic: 1}, [f"refine {topic} batch 1: 1 changes"])
    assert refined(spark, warehouse, topic) == [(1, "b")]
    assert not storage.exists(f"{checkpoint}/commits")


class FailingBatch:
    """A table's batch function that fails as py4j does (setting ``stop`` first, if given)."""

    error = None

    def __init__(self, message: str, stop: threading.Event | None = None) -> None:
        self.message, self.stop = message, stop

    def __call__(self, rows, batch_id: int) -> None:
        if self.stop is not None:
            self.stop.set()
        raise Py4JError(self.message)


def test_a_batch_the_stop_cuts_short_is_no_failure_and_runs_again(spark, tmp_path):
    """A service manager's SIGTERM reaches the JVM too, which exits under the batch running: once the stop is set,
    its failure is the stop (no error, no failure recorded for `cdc status`), and the next run refines it."""
    warehouse, topic = str(tmp_path), "demo.shop.stopped"
    land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    stop = threading.Event()
    loop = RefineLoop(spark, job(warehouse, topic).trigger, lambda line: None, stop)
    loop.add(job(warehouse, topic))
    table = loop.tables[topic]
    refine_batch = table.batch
    table.batch = FailingBatch("Answer from Java side is empty", stop)  # what a batch sees when the JVM exits
    assert loop.run() == {topic: 0}
    assert refined_table_status(spark, warehouse, topic).last_error is None
    table.batch = refine_batch
    assert run_loop(spark, warehouse, [topic]) == ({topic: 1}, [f"refine {topic} batch 0: 1 changes"])
    assert refined(spark, warehouse, topic) == [(1, "a")]


def test_a_batch_that_fails_without_a_stop_is_the_loop_s_error(spark, tmp_path):
    warehouse, topic = str(tmp_path), "demo.shop.failing"
    land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    loop = RefineLoop(spark, job(warehouse, topic).trigger, lambda line: None)
    loop.add(job(warehouse, topic))
    loop.tables[topic].batch = FailingBatch("a genuine failure")
    with pytest.raises(CdcError, match="a genuine failure"):
        loop.run()
    assert "a genuine failure" in refined_table_status(spark, warehouse, topic).last_error.error


def test_a_slow_batch_holds_no_other_table_back(spark, tmp_path, wait_for):
    """Continuously, a table's batch starts as soon as a worker is free: while one table's batch runs long (a
    first batch with history and child tables), another table is refined batch after batch."""
    warehouse, slow, quick = str(tmp_path), "demo.shop.slow", "demo.shop.quick"
    for topic in (slow, quick):
        land(spark, warehouse, topic, [("c", 10, None, {"id": 1, "name": "a"})])
    stop, release = threading.Event(), threading.Event()
    loop = RefineLoop(spark, Continuous(interval_s=0.2), lambda line: None, stop)
    for topic in (slow, quick):
        loop.add(job(warehouse, topic, "continuous"))
    slow_table = loop.tables[slow]
    refine_batch = slow_table.batch

    class HeldBatch:
        error = None

        def __call__(self, rows, batch_id: int) -> None:
            release.wait(300)
            slow_table.batch = refine_batch
            refine_batch(rows, batch_id)

    slow_table.batch = HeldBatch()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            loop.run()
        except BaseException as error:  # noqa: BLE001 - asserted below
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        quick_location = refined_table_location(warehouse, quick)
        first = lambda: is_delta_table(spark, quick_location) and refined(spark, warehouse, quick) == [(1, "a")]  # noqa: E731
        wait_for(lambda: failures or first(), 120, "the quick table's first batch", 0.5)
        land(spark, warehouse, quick, [("c", 20, None, {"id": 2, "name": "b"})])
        # Before the slow batch ends: a round waiting for its slowest batch timed out here.
        second = lambda: refined(spark, warehouse, quick) == [(1, "a"), (2, "b")]  # noqa: E731
        wait_for(lambda: failures or second(), 60, "the quick table's second batch", 0.5)
        assert not failures, failures
        release.set()
        slow_location = refined_table_location(warehouse, slow)
        wait_for(lambda: failures or is_delta_table(spark, slow_location), 120, "the slow table's batch", 0.5)
    finally:
        release.set()
        stop.set()
        thread.join(120)
    assert not failures, failures
    assert refined(spark, warehouse, slow) == [(1, "a")]
