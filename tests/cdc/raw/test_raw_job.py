"""`cdc raw` against the real stack: byte-for-byte landing, reruns, kill -9, gaps, protection."""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from pathlib import Path

import psycopg
import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import validate
from cdc.core.errors import OffsetGapError, TableError
from cdc.core.functions import original_bytes
from cdc.core.streaming import ProgressLine
from cdc.core.tables import checkpoint_location, gaps_table_location, is_delta_table, raw_table_location
from cdc.raw.config import RawJobConfig
from cdc.raw.job import run_raw_job
from cdc.stack.events import read_events
from cdc.stack.workload import TABLES, run_workload

RECORD_SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, headers array<struct<key:string,value:binary>>"
)


def raw_job(warehouse: Path, topics: list[str], bootstrap: str, pattern: str | None = None, **fields) -> RawJobConfig:
    document = {
        "topics": {"kind": "pattern", "pattern": pattern} if pattern else {"kind": "topics", "topics": topics},
        "warehouse": str(warehouse),
        "trigger": {"kind": "available_now"},
        "kafka": {"bootstrap_servers": bootstrap},
        **fields,
    }
    return validate(RawJobConfig, document, "raw job settings")


def landed(spark, warehouse: Path, topic: str) -> DataFrame:
    """The raw table as Kafka records: original key and value bytes, headers ([] when there are none)."""
    table = spark.read.format("delta").load(raw_table_location(str(warehouse), topic))
    return table.select(
        "topic",
        "partition",
        "offset",
        original_bytes("key", "key_bytes").alias("key"),
        original_bytes("value", "value_bytes").alias("value"),
        F.coalesce("headers", F.array().cast("array<struct<key:string,value:binary>>")).alias("headers"),
    )


def marked_after_the_workload(dsn: str, kafka, topics: list[str], unique_name: str) -> None:
    """Write a marker to each workload table in one transaction, and wait until each topic's last record is
    its marker: every record of the workload is in Kafka then (one partition per topic)."""
    number = int(unique_name[1:], 16) % 10**6 + 10**6  # an order number no workload uses
    with psycopg.connect(dsn) as conn:
        [customer] = conn.execute("SELECT max(id) FROM shop.customers").fetchone()
        conn.execute("UPDATE shop.customers SET full_name = %s WHERE id = %s", (f"mark-{number}", customer))
        conn.execute("INSERT INTO shop.orders VALUES (%s, %s, 'pending', 0, '2026-01-01')", (customer, number))
        conn.execute("INSERT INTO shop.page_views VALUES (%s, %s, now())", (customer, f"mark-{number}"))
    markers = {"customers": f"mark-{number}", "orders": f'"order_no":{number}', "page_views": f"mark-{number}"}
    for topic in topics:
        marker = markers[topic.rsplit(".", 1)[-1]].encode()
        kafka.wait_for_last_value(topic, lambda value, marker=marker: value is not None and marker in value)


def on_kafka(spark, kafka, topic: str) -> DataFrame:
    return spark.createDataFrame(kafka.records(topic), RECORD_SCHEMA)


def test_debezium_and_event_topics_land_byte_for_byte(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name
):
    run_workload(stack_config.postgres.dsn(), customers=3, seed=3)  # deletes bring tombstones (null values)
    debezium_topics = [f"{postgres_connector.topic_prefix}.shop.{table}" for table in TABLES]
    read_events(kafka.bootstrap_servers, dict.fromkeys(debezium_topics, 1))  # the topics exist
    events = kafka.create_topic(f"{unique_name}.events", partitions=3)
    kafka.produce(
        events,
        [
            (b"watch-1", b'{"time":"2026-01-01T10:00:00Z","model":"fenix","heart_rate":72}', [("source", b"band")]),
            (None, b'{"time":"2026-01-01T10:00:01Z","model":"fenix","heart_rate":75}'),
            (b"\xc3\x28", b"\xff\xfe not utf-8", [("h", b"\x00\x01"), ("h", b"again")]),
            (b"watch-2", b""),
            (b"watch-2", None),
        ],
    )
    marked_after_the_workload(stack_config.postgres.dsn(), kafka, debezium_topics, unique_name)
    topics = [*debezium_topics, events]
    config = raw_job(tmp_path, topics, kafka.bootstrap_servers)

    run_raw_job(spark, config, say=lambda line: None)
    for topic in topics:
        assertDataFrameEqual(landed(spark, tmp_path, topic), on_kafka(spark, kafka, topic))
    tombstones = landed(spark, tmp_path, debezium_topics[0]).where("value IS NULL").count()
    assert tombstones > 0

    # A rerun lands nothing twice; new records land once.
    versions = {
        t: DeltaTable.forPath(spark, raw_table_location(str(tmp_path), t)).history(1).head().version for t in topics
    }
    kafka.produce(events, [(b"watch-3", b'{"heart_rate":80}')])
    run_raw_job(spark, config, say=lambda line: None)
    assertDataFrameEqual(landed(spark, tmp_path, events), on_kafka(spark, kafka, events))
    for topic in debezium_topics:
        table = DeltaTable.forPath(spark, raw_table_location(str(tmp_path), topic))
        assert table.history(1).head().version == versions[topic]


def test_pattern_lands_every_matching_topic(spark, kafka, tmp_path, unique_name):
    for suffix in ("a", "b"):
        kafka.create_topic(f"{unique_name}.game.{suffix}")
        kafka.produce(f"{unique_name}.game.{suffix}", [(b"k", suffix.encode())])
    kafka.create_topic(f"{unique_name}.other")
    config = raw_job(tmp_path, [], kafka.bootstrap_servers, pattern=rf"{unique_name}\.game\..*")
    summaries = run_raw_job(spark, config, say=lambda line: None)
    assert sorted((s.topic, s.rows) for s in summaries) == [(f"{unique_name}.game.a", 1), (f"{unique_name}.game.b", 1)]
    assert not (tmp_path / "raw" / f"{unique_name}.other").exists()


def test_a_catch_up_reports_what_it_landed_out_of_what_kafka_holds(spark, kafka, tmp_path, unique_name):
    """Each micro-batch's line: this run's records landed out of those known (landed + lag), the rate and
    the time left at it; the last batch at 100% and nothing left. Lines the CLI redraws on a terminal."""
    topic = kafka.create_topic(unique_name, partitions=2)
    kafka.produce(topic, [(f"k{i}".encode(), b"v") for i in range(1000)])
    lines: list[str] = []
    config = raw_job(tmp_path, [topic], kafka.bootstrap_servers, max_offsets_per_trigger=300)
    run_raw_job(spark, config, say=lines.append)
    progress = [line for line in lines if isinstance(line, ProgressLine)]
    pattern = re.compile(rf"^raw {re.escape(topic)} batch \d+: ([\d,]+) rows, ([\d,]+)/([\d,]+) \((\d+)%\)")
    seen = [tuple(int(group.replace(",", "")) for group in pattern.match(line).groups()) for line in progress]
    assert len(seen) >= 4  # 1000 records, at most 300 a batch
    assert [landed for _rows, landed, _known, _percent in seen] == list(itertools.accumulate(rows for rows, *_ in seen))
    assert all(known == 1000 and percent == 100 * landed // 1000 for _rows, landed, known, percent in seen)
    assert all(" left, next offsets " in line for line in progress[:-1])
    assert progress[-1].endswith(", lag 0")
    assert " left" not in progress[-1]
    assert not [line for line in lines if line.startswith(f"raw {topic}: ") and isinstance(line, ProgressLine)]


def test_kill_9_at_any_moment_loses_and_duplicates_nothing(spark, kafka, tmp_path, unique_name, cdc_process, wait_for):
    topic = kafka.create_topic(unique_name, partitions=3)
    kafka.produce(topic, [(f"k{i}".encode(), f"value {i} ".encode() * 20) for i in range(30_000)])
    table = Path(raw_table_location(str(tmp_path), topic))
    args = [
        "raw",
        "--topic",
        topic,
        "--warehouse",
        str(tmp_path),
        "--available-now",
        "--max-offsets-per-trigger",
        "3000",
    ]

    def commits() -> int:
        return len(list((table / "_delta_log").glob("*.json")))

    def data_files() -> int:
        return len(list(table.glob("ingest_date=*/*.parquet")))

    # The moments a job can die in: starting up, after writing a batch's files but before its Delta
    # commit, right after a Delta commit before the checkpoint records it, and later on. Each entry
    # makes, when its run starts, the test of whether that moment has come.
    def starting_up():
        deadline = time.monotonic() + 3
        return lambda: time.monotonic() > deadline

    def between_files_and_commit():
        seen = [commits(), data_files()]

        def reached() -> bool:
            now = [commits(), data_files()]
            if now[0] != seen[0]:
                seen[:] = now
                return False
            return now[1] > seen[1]

        return reached

    def commits_after(count: int):
        def kill_point():
            at_start = commits()
            return lambda: commits() >= at_start + count

        return kill_point

    kill_points = {
        "starting up": starting_up,
        "between data files and their commit": between_files_and_commit,
        "right after a Delta commit": commits_after(1),
        "after several batches": commits_after(3),
    }
    for name, kill_point in kill_points.items():
        process = cdc_process(args)
        reached = kill_point()
        wait_for(lambda: reached() or process.poll() is not None, 180, f"kill point {name!r}", 0.01)
        assert process.poll() is None, f"the job ended before kill point {name!r}: {process.wait()}"
        process.signal_group(signal.SIGKILL)
        process.wait()

    # The rerun after the last kill: in this process (a fifth JVM start would test nothing more).
    run_raw_job(
        spark, raw_job(tmp_path, [topic], kafka.bootstrap_servers, max_offsets_per_trigger=3000), say=lambda line: None
    )
    assertDataFrameEqual(landed(spark, tmp_path, topic), on_kafka(spark, kafka, topic))


def test_continuous_run_lands_as_records_arrive_and_stops_on_sigterm(
    spark, kafka, tmp_path, unique_name, cdc_process, wait_for
):
    topic = kafka.create_topic(unique_name)
    process = cdc_process(["raw", "--topic", topic, "--warehouse", str(tmp_path), "--trigger-interval", "0.5"])
    table = raw_table_location(str(tmp_path), topic)
    try:
        for round_ in range(1, 3):
            kafka.produce(topic, [(b"k", f"round {round_} record {i}".encode()) for i in range(100)])
            wait_for(
                lambda: is_delta_table(spark, table) and spark.read.format("delta").load(table).count() == 100 * round_,
                120,
                f"round {round_} to land",
                0.5,
            )
            # A batch's Delta commit is visible before the job's progress report of it: wait for the
            # report, as the job's summary counts what was reported.
            wait_for(
                lambda: reported_rows(process.printed, topic) == 100 * round_,
                60,
                f"the progress line of round {round_}",
                0.1,
            )
        assert "-XX:+UseParallelGC" in jvm_command_line(process.pid)  # `cdc raw`'s own collector
    finally:
        # As a service manager stops a job: SIGTERM to its whole process group, so to the JVM too.
        process.signal_group(signal.SIGTERM)
        output = process.wait(timeout=60)
    assert process.returncode == 0, output
    assert "stopping: a micro-batch cut short is replayed by the next run" in output
    assert "Traceback" not in output, output
    assert f"raw {topic}: landed 200 records" in output, output
    assertDataFrameEqual(landed(spark, tmp_path, topic), on_kafka(spark, kafka, topic))


def jvm_command_line(group: int) -> list[str]:
    """The command line of the JVM in process group ``group`` (a `cdc` job's)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            if arguments[0].endswith(b"/java") and os.getpgid(int(entry.name)) == group:
                return [argument.decode() for argument in arguments]
        except (OSError, ProcessLookupError):
            continue  # a process that ended meanwhile
    raise AssertionError(f"no JVM in process group {group}")


def reported_rows(printed: list[str], topic: str) -> int:
    """The rows a raw job's progress lines (``raw <topic> batch <id>: <rows> rows, ...``) report."""
    pattern = re.compile(rf"^raw {re.escape(topic)} batch \d+: ([\d,]+) rows")
    return sum(int(match[1].replace(",", "")) for line in list(printed) if (match := pattern.match(line)))


def test_retention_gap_stops_the_job_unless_allowed_and_then_is_recorded(spark, kafka, tmp_path, unique_name):
    topic = kafka.create_topic(unique_name)
    kafka.produce(topic, [(None, f"{i}".encode()) for i in range(100)])
    run_raw_job(spark, raw_job(tmp_path, [topic], kafka.bootstrap_servers), say=lambda line: None)
    kafka.produce(topic, [(None, f"{i}".encode()) for i in range(100, 200)])
    kafka.delete_records_before(topic, 0, 150)  # 100-149 never landed

    with pytest.raises(OffsetGapError) as raised:
        run_raw_job(spark, raw_job(tmp_path, [topic], kafka.bootstrap_servers), say=lambda line: None)
    assert raised.value.context == {
        "topic": topic,
        "partition": 0,
        "missing": "100-149",
        "table": raw_table_location(str(tmp_path), topic),
    }

    allowing = raw_job(tmp_path, [topic], kafka.bootstrap_servers, on_gap="record")
    for _ in range(2):  # the rerun records the gap once
        run_raw_job(spark, allowing, say=lambda line: None)
    offsets = [row.offset for row in landed(spark, tmp_path, topic).orderBy("offset").collect()]
    assert offsets == list(range(100)) + list(range(150, 200))
    gaps = spark.read.format("delta").load(gaps_table_location(str(tmp_path))).drop("detected_at")
    expected = [(raw_table_location(str(tmp_path), topic), topic, 0, 100, 149)]
    schema = "table string, topic string, partition int, first_missing long, last_missing long"
    assertDataFrameEqual(gaps, spark.createDataFrame(expected, schema))

    # The topic moves to a landing by pattern, which starts from what the raw table holds: a gap there too is
    # refused, or recorded (a new query's first batch has no batch before it to compare with).
    kafka.produce(topic, [(None, f"{i}".encode()) for i in range(200, 300)])
    kafka.delete_records_before(topic, 0, 250)  # 200-249 never landed
    by_pattern = {"pattern": re.escape(topic)}
    with pytest.raises(OffsetGapError, match="retention deleted them"):
        run_raw_job(spark, raw_job(tmp_path, [], kafka.bootstrap_servers, **by_pattern), say=lambda line: None)
    recording = raw_job(tmp_path, [], kafka.bootstrap_servers, on_gap="record", **by_pattern)
    for _ in range(2):
        run_raw_job(spark, recording, say=lambda line: None)
    offsets = [row.offset for row in landed(spark, tmp_path, topic).orderBy("offset").collect()]
    assert offsets == list(range(100)) + list(range(150, 200)) + list(range(250, 300))
    gaps = spark.read.format("delta").load(gaps_table_location(str(tmp_path))).drop("detected_at")
    expected.append((raw_table_location(str(tmp_path), topic), topic, 0, 200, 249))
    assertDataFrameEqual(gaps, spark.createDataFrame(expected, schema))


def test_raw_tables_refuse_reset_rewrite_and_strangers(spark, kafka, tmp_path, unique_name):
    topic = kafka.create_topic(unique_name)
    kafka.produce(topic, [(b"k", f"{i}".encode()) for i in range(10)])
    config = raw_job(tmp_path, [topic], kafka.bootstrap_servers)
    run_raw_job(spark, config, say=lambda line: None)
    table = raw_table_location(str(tmp_path), topic)

    with pytest.raises(TableError, match=r"refusing to reset a raw table .* --force-destroy-raw-data"):
        run_raw_job(spark, raw_job(tmp_path, [topic], kafka.bootstrap_servers, reset=True), say=lambda line: None)
    assert spark.read.format("delta").load(table).count() == 10

    # Delta itself refuses to rewrite it, whoever asks.
    with pytest.raises(Exception, match="DELTA_CANNOT_MODIFY_APPEND_ONLY"):
        spark.sql(f"DELETE FROM delta.`{table}` WHERE offset = 0")
    with pytest.raises(Exception, match="DELTA_CANNOT_MODIFY_APPEND_ONLY"):
        spark.range(1).write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(table)

    # A lost checkpoint would make the next run land everything again: refused.
    checkpoint = Path(checkpoint_location(str(tmp_path), topic))
    checkpoint.rename(checkpoint.with_name("moved"))
    with pytest.raises(TableError, match="its checkpoint is gone"):
        run_raw_job(spark, config, say=lambda line: None)
    checkpoint.with_name("moved").rename(checkpoint)

    forced = raw_job(tmp_path, [topic], kafka.bootstrap_servers, reset=True, force_destroy_raw_data=True)
    run_raw_job(spark, forced, say=lambda line: None)
    assertDataFrameEqual(landed(spark, tmp_path, topic), on_kafka(spark, kafka, topic))

    other = kafka.create_topic(f"{unique_name}.other")
    spark.range(3).write.format("delta").save(raw_table_location(str(tmp_path), other))
    with pytest.raises(TableError, match="not a raw table"):
        run_raw_job(spark, raw_job(tmp_path, [other], kafka.bootstrap_servers), say=lambda line: None)
