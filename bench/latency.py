"""Commit-to-refined latency: from a Postgres commit until its row is in the refined table.

    .venv/bin/python bench/latency.py [--jobs sync|raw+refine] [--warmup 180] [--commits 120] [--every 1.0]
                                      [--trigger-interval 1]

Brings the local stack up, and down at the end (a stack already running is used and left running),
creates a table of its own, registers a Debezium connector for it, and starts the jobs as a user
runs them: `cdc sync` (landing and refinement in one process, the default), or `cdc raw` and `cdc
refine` as two continuous processes. Once a first row has come through, it
commits one row every EVERY seconds. Each row's latency is the commit time of the refined table's
Delta version that made it visible (read from the table's Change Data Feed afterwards, so nothing
polls the table while it is measured) minus the moment Postgres acknowledged the commit. Prints
p50, p95 and max of the first WARMUP commits (fresh JVMs: the JIT still compiles, ~3 minutes here)
and of the COMMITS after them (the steady state of a long-running job), each also split where the
row was on its way: in Kafka (the record's time, stamped by Connect's producer), in the raw table
(the commit that landed it). Figures only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from targets import COMMIT_TO_REFINED_P95

from cdc.core.config import Settings, load_settings
from cdc.core.session import build_spark_session
from cdc.core.source import KafkaTopics
from cdc.core.tables import raw_table_location
from cdc.stack.local import stack_for_a_run
from connectors import definitions
from connectors.client import ConnectClient
from refine.config import refined_table_location


def start_job(args: list[str], log: Path) -> subprocess.Popen:
    """`cdc ARGS` of this checkout (not the installed command's), so that a second worktree measures its own code."""
    root = str(Path(__file__).resolve().parents[1])
    # -P: not the working directory first, where another checkout may be.
    command = [sys.executable, "-P", "-c", "import sys; from cdc.cli import main; sys.exit(main())", *args]
    return subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": root},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_job(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def wait_for_row(spark: SparkSession, location: str, row_id: int, timeout_s: float, column: str = "id") -> None:
    """Poll until the table has a row whose ``column`` is ``row_id``."""
    deadline = time.monotonic() + timeout_s
    while True:
        # The log folder exists before its first commit does.
        if (
            Path(location, "_delta_log", f"{0:020}.json").is_file()
            and spark.read.format("delta").load(location).where(F.col(column) == row_id).count()
        ):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"row {row_id} did not reach {location} within {timeout_s:.0f} s")
        time.sleep(1)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=180, help="rows committed first, reported apart")
    parser.add_argument("--commits", type=int, default=120, help="rows committed after them, one per transaction")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between commits")
    parser.add_argument("--trigger-interval", type=float, default=1.0, help="trigger interval of both jobs")
    parser.add_argument(
        "--jobs",
        choices=["sync", "raw+refine"],
        default="sync",
        help="one `cdc sync` process (default), or `cdc raw` and `cdc refine` processes",
    )
    parser.add_argument("--logs", type=Path, help="copy the jobs' logs (sync.log, or raw.log and refine.log) here")
    args = parser.parse_args()

    settings = load_settings()
    with stack_for_a_run(settings.stack):
        measure(args, settings)


def measure(args: argparse.Namespace, settings: Settings) -> None:
    """Run the two jobs against the running stack, commit rows, and print the latencies."""
    name = f"lat{uuid.uuid4().hex[:8]}"
    dsn = settings.stack.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        conn.execute(f"CREATE TABLE bench.{name} (id bigint PRIMARY KEY, note text)")
        conn.execute(f"INSERT INTO bench.{name} VALUES (0, 'first')")
    connector = definitions.postgres_named(name, schema_include_list="bench", table_include_list=f"bench.{name}")
    client = ConnectClient(settings.stack.connect.url)
    client.register(connector)
    client.wait_running(name)
    topic = f"{name}.bench.{name}"
    spark = build_spark_session(settings.spark)
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as warehouse:
        refined = refined_table_location(warehouse, topic)
        interval = str(args.trigger_interval)
        logs = Path(warehouse)
        # The topic exists once the snapshot of the first row is in Kafka.
        deadline = time.monotonic() + 60
        while topic not in KafkaTopics(settings.kafka).matching(".*"):
            if time.monotonic() > deadline:
                raise SystemExit(f"Debezium did not create {topic}")
            time.sleep(0.5)
        continuous = ["--topic", topic, "--warehouse", warehouse, "--trigger-interval", interval]
        if args.jobs == "sync":
            jobs = [start_job(["sync", *continuous], logs / "sync.log")]
        else:
            jobs = [start_job(["raw", *continuous], logs / "raw.log")]
        try:
            if args.jobs == "raw+refine":
                # `cdc refine` refuses to start before `cdc raw` has created the raw table.
                wait_for_row(spark, raw_table_location(warehouse, topic), 0, timeout_s=180, column="offset")
                jobs.append(start_job(["refine", "--table", *continuous[1:]], logs / "refine.log"))
            wait_for_row(spark, refined, 0, timeout_s=180)
            # The latencies are read from the refined table's Change Data Feed, off by default: on from
            # here (a job's MERGE meeting this commit runs again), as on a table a business table reads.
            spark.sql(f"ALTER TABLE delta.`{refined}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
            feed_from = spark.sql(f"DESCRIBE HISTORY delta.`{refined}` LIMIT 1").collect()[0].version
            committed: dict[int, float] = {}
            with psycopg.connect(dsn, autocommit=True) as conn:
                for row_id in range(1, args.warmup + args.commits + 1):
                    conn.execute(f"INSERT INTO bench.{name} VALUES (%s, 'row')", (row_id,))
                    committed[row_id] = time.time()
                    time.sleep(args.every)  # the workload's pace, not a wait for a result
            wait_for_row(spark, refined, args.warmup + args.commits, timeout_s=120)
        finally:
            for job in jobs:
                stop_job(job)
            client.delete(name)
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in logs.glob("*.log"):
                    shutil.copy(log, args.logs / log.name)
        visible = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", feed_from)
            .load(refined)
            .where("_change_type = 'insert' AND id > 0")
            .groupBy("id")
            .agg(F.min(F.unix_millis("_commit_timestamp")).alias("visible_ms"))
            .collect()
        )
        # Where each row was on its way: Kafka's record time (Connect's producer stamps it) and the
        # raw table's commit that landed it.
        landed = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", 0)
            .load(raw_table_location(warehouse, topic))
            .where("_change_type = 'insert'")
            .select(
                F.get_json_object("value", "$.payload.after.id").cast("long").alias("id"),
                F.unix_millis("timestamp").alias("kafka_ms"),
                F.unix_millis("_commit_timestamp").alias("raw_ms"),
            )
            .where("id > 0")
            .groupBy("id")
            .agg(F.min("kafka_ms").alias("kafka_ms"), F.min("raw_ms").alias("raw_ms"))
            .collect()
        )
    at_kafka = {row.id: row.kafka_ms / 1000 for row in landed}
    at_raw = {row.id: row.raw_ms / 1000 for row in landed}
    at_refined = {row.id: row.visible_ms / 1000 for row in visible}
    segments = {
        "latency": (committed, at_refined),
        "  Postgres -> Kafka (Debezium)": (committed, at_kafka),
        "  Kafka -> raw table (cdc raw)": (at_kafka, at_raw),
        "  raw -> refined table (cdc refine)": (at_raw, at_refined),
    }
    print(f"jobs: {args.jobs}; one commit every {args.every} s, landing and refinement triggered every {interval} s")
    total = args.warmup + args.commits
    # Blocks of 60 commits show how long the fresh JVMs take to settle.
    blocks = [
        (f"commits {start}-{min(start + 59, total)}", range(start, min(start + 60, total + 1)))
        for start in range(1, total + 1, 60)
    ]
    whole, steady = f"all {total} commits", f"next {args.commits} commits (steady)"
    p95: dict[str, float] = {}  # commit-to-visible, by label
    for label, ids in [
        *blocks,
        (whole, range(1, total + 1)),
        (f"first {args.warmup} commits (warm-up)", range(1, args.warmup + 1)),
        (steady, range(args.warmup + 1, total + 1)),
    ]:
        for segment, (start, end) in segments.items():
            measured = [end[row_id] - start[row_id] for row_id in ids if row_id in start and row_id in end]
            if measured:
                if segment == "latency":
                    p95[label] = percentile(measured, 0.95)
                print(
                    f"{label if segment == 'latency' else '':<34} {segment:<36} "
                    f"p50 {statistics.median(measured):6.2f} s, "
                    f"p95 {percentile(measured, 0.95):6.2f} s, max {max(measured):6.2f} s"
                )
    for label in (whole, steady):
        if label in p95:
            print(COMMIT_TO_REFINED_P95.verdict(p95[label], f"{args.jobs}, {label}"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"SELECT pg_drop_replication_slot('{name}') WHERE EXISTS "
            f"(SELECT 1 FROM pg_replication_slots WHERE slot_name = '{name}' AND NOT active)"
        )
        conn.execute(f"DROP TABLE bench.{name}")


if __name__ == "__main__":
    main()
