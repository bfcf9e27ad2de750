"""Shared tables (raw gaps, quarantine, expectation counts) written by several streams at once."""

import os
import shutil
import threading
import time
from types import SimpleNamespace

from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import AnalysisException
from pyspark.sql.types import LongType, StringType, StructField, StructType
from pyspark.testing import assertDataFrameEqual

from cdc.core import shared_tables, tables
from cdc.core.shared_tables import merge_into_shared_table
from cdc.maintenance import optimize_table

SCHEMA = StructType([StructField("stream", StringType(), False), StructField("batch", LongType(), False)])


def merge_from_threads(spark, location: str, streams: int, batches: int) -> list[BaseException]:
    """``streams`` threads, each MERGEing its ``batches`` rows one at a time, in step with the others."""
    errors: list[BaseException] = []
    in_step = threading.Barrier(streams)

    def stream(name: str) -> None:
        try:
            for batch in range(batches):
                rows = spark.createDataFrame([(name, batch)], SCHEMA)
                in_step.wait()
                merge_into_shared_table(
                    spark,
                    location,
                    SCHEMA,
                    lambda table: (
                        table.alias("t")
                        .merge(rows.alias("s"), "t.stream = s.stream AND t.batch = s.batch")
                        .whenNotMatchedInsertAll()
                    ),
                )
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
            in_step.abort()

    threads = [threading.Thread(target=stream, args=(f"s{i}",)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_concurrent_merges_into_a_new_shared_table_all_land_once(spark, tmp_path):
    location = str(tmp_path / "shared")
    errors = merge_from_threads(spark, location, streams=3, batches=2)
    assert not errors, errors[0]
    expected = spark.createDataFrame([(f"s{i}", b) for i in range(3) for b in range(2)], SCHEMA)
    assertDataFrameEqual(spark.read.format("delta").load(location), expected)


def test_without_retries_concurrent_merges_conflict(spark, tmp_path, monkeypatch):
    """The conflict the retries absorb is real: the same MERGEs, tried once each, fail."""
    monkeypatch.setattr(shared_tables, "CONFLICT_RETRIES", 1)
    errors = merge_from_threads(spark, str(tmp_path / "shared"), streams=3, batches=2)
    assert errors, "no MERGE conflicted"
    first = errors[0]
    assert shared_tables.is_conflict(first), f"{type(first).__name__} {shared_tables.condition_of(first)}: {first!r}"


def test_a_creation_under_way_and_a_concurrent_commit_are_conflicts_but_other_errors_are_not():
    assert shared_tables.is_conflict(
        RuntimeError(
            "[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] Cannot create table ('`delta`.`/w/shared`'). The associated "
            "location ('/w/shared') is not empty and also not a Delta table."
        )
    )
    assert shared_tables.is_conflict(RuntimeError("io.delta.exceptions.ConcurrentAppendException: Files were added"))
    assert not shared_tables.is_conflict(RuntimeError("[DELTA_MERGE_UNRESOLVED_EXPRESSION] Cannot resolve s.x"))


def converted_without_message(java_exception) -> AnalysisException:
    """PySpark's exception for a Java one whose message was null: its own message is then empty."""
    error = AnalysisException.__new__(AnalysisException)
    error._desc, error._stackTrace, error._origin, error._cause = "", "", java_exception, None
    return error


def test_a_conflict_without_a_message_is_told_by_its_condition_or_its_java_exception(spark):
    jvm = spark.sparkContext._jvm
    refused = converted_without_message(jvm.io.delta.exceptions.ProtocolChangedException(None))
    assert str(refused) == ""
    assert shared_tables.condition_of(refused) == "DELTA_PROTOCOL_CHANGED"
    assert shared_tables.is_conflict(refused)
    # Delta's conflicts extend ConcurrentModificationException, here as the cause of another error.
    wrapped = converted_without_message(
        jvm.java.lang.RuntimeException(None, jvm.java.util.ConcurrentModificationException())
    )
    assert str(wrapped) == ""
    assert shared_tables.is_conflict(wrapped)
    assert not shared_tables.is_conflict(converted_without_message(jvm.java.lang.RuntimeException()))
    assert shared_tables.is_conflict(Py4JJavaError("", jvm.io.delta.exceptions.ConcurrentAppendException("")))


def test_a_table_another_stream_is_still_creating_is_a_conflict(spark, tmp_path):
    """Its log folder exists before its first commit: the location holds no table yet, for a moment."""
    (tmp_path / "shared" / "_delta_log").mkdir(parents=True)
    try:
        DeltaTable.forPath(spark, str(tmp_path / "shared"))
    except AnalysisException as error:
        assert shared_tables.is_conflict(error)  # noqa: PT017 - pytest.raises would need a new import here, f"{shared_tables.condition_of(error)}: {error!r}"
    else:
        raise AssertionError("a folder with an empty log was read as a Delta table")


def insert_row(name: str, batch: int):
    def merge(table: DeltaTable):
        rows = table.toDF().sparkSession.createDataFrame([(name, batch)], SCHEMA)
        return table.alias("t").merge(rows.alias("s"), "t.stream = s.stream").whenNotMatchedInsertAll()

    return merge


def leave_interrupted_creation(location) -> None:
    """What a job killed while Delta created a table leaves: the log's folders, a commit's temporary file."""
    (location / "_delta_log" / "_staged_commits").mkdir(parents=True)
    (location / "_delta_log" / f".{0:020d}.json.8c1f.tmp").write_text("{")


def test_a_shared_table_whose_creation_a_killed_job_left_unfinished_is_created(spark, tmp_path):
    location = tmp_path / "quarantine"
    leave_interrupted_creation(location)
    killed_at = time.time() - shared_tables.ABANDONED_CREATION_SECONDS - 1
    for entry in [location / "_delta_log", *(location / "_delta_log").rglob("*")]:
        os.utime(entry, (killed_at, killed_at))
    merge_into_shared_table(spark, str(location), SCHEMA, insert_row("s", 1))
    assertDataFrameEqual(spark.read.format("delta").load(str(location)), spark.createDataFrame([("s", 1)], SCHEMA))


def test_a_shared_table_another_writer_is_creating_is_waited_for_not_cleared(spark, tmp_path, monkeypatch):
    """A log without a version that changed a moment ago may be another job's creation under way:
    its first commit is awaited, and the table it creates is the one merged into."""
    other = tmp_path / "other"
    DeltaTable.createIfNotExists(spark).location(str(other)).addColumns(SCHEMA).execute()
    other_table_id = DeltaTable.forPath(spark, str(other)).detail().head()["id"]
    location = tmp_path / "shared"
    leave_interrupted_creation(location)
    waiting = threading.Event()

    def sleep(seconds: float) -> None:  # the merge waiting for the creation under way
        waiting.set()
        time.sleep(seconds)

    monkeypatch.setattr(tables, "time", SimpleNamespace(time=time.time, sleep=sleep))

    def commit_first_version() -> None:  # as the other writer does, once the merge waits for it
        assert waiting.wait(timeout=120), "the merge never waited for the creation under way"
        shutil.copy(other / "_delta_log" / f"{0:020d}.json", location / "_delta_log" / f"{0:020d}.json")

    creating = threading.Thread(target=commit_first_version)
    creating.start()
    try:
        merge_into_shared_table(spark, str(location), SCHEMA, insert_row("s", 1))
    finally:
        creating.join()
    assert waiting.is_set()
    assert DeltaTable.forPath(spark, str(location)).detail().head()["id"] == other_table_id
    assertDataFrameEqual(spark.read.format("delta").load(str(location)), spark.createDataFrame([("s", 1)], SCHEMA))


def test_a_merge_refused_by_a_concurrent_optimize_runs_again(spark, tmp_path):
    """`cdc optimize` compacting a table a job MERGEs into: a MERGE that read files the compaction
    replaced is refused (a real conflict) and runs again on the new version."""
    location = str(tmp_path / "compacted")
    spark.createDataFrame([("s", -1)], SCHEMA).write.format("delta").save(location)
    stop, conflicts, optimize_errors = threading.Event(), [], []

    def optimize() -> None:
        while not stop.is_set():
            try:
                optimize_table(spark, location)  # `cdc optimize`: it runs again when a MERGE commits first
            except BaseException as error:  # noqa: BLE001 - reported by the test
                optimize_errors.append(error)

    compacting = threading.Thread(target=optimize)
    compacting.start()
    try:
        batch = 0
        while not conflicts and batch < 60:  # here one of the first few MERGEs conflicts
            appended = spark.createDataFrame([("appended", 2 * batch), ("appended", 2 * batch + 1)], SCHEMA)
            appended.repartition(2).write.format("delta").mode("append").save(location)  # files to compact
            rows = spark.createDataFrame([("merged", batch)], SCHEMA)
            shared_tables.retrying_conflicts(
                lambda: (
                    DeltaTable.forPath(spark, location)
                    .alias("t")
                    .merge(rows.alias("s"), "t.stream = s.stream AND t.batch = s.batch")
                    .whenNotMatchedInsertAll()
                    .execute()
                ),
                on_conflict=conflicts.append,
            )
            batch += 1
    finally:
        stop.set()
        compacting.join()
    assert conflicts, f"no conflict in {batch} MERGEs"
    assert all(shared_tables.is_conflict(error) for error in conflicts), conflicts
    assert not optimize_errors, optimize_errors[0]
    expected = [("s", -1)] + [("appended", b) for b in range(2 * batch)] + [("merged", b) for b in range(batch)]
    assertDataFrameEqual(spark.read.format("delta").load(location), spark.createDataFrame(expected, SCHEMA))
