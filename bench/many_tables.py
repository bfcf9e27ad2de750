"""A whole database in one `cdc sync`: how fresh N small tables stay under a steady commit rate.

    .venv/bin/python bench/many_tables.py [--tables 50] [--rows 20] [--rate 2] [--seconds 120]
                                          [--trigger-interval 1]

Brings the local stack up, and down at the end (a stack already running is used and left running),
creates a schema of TABLES tables of ROWS rows each, registers the shipped Debezium connector for that
schema, and starts one `cdc sync --pattern` over its topics as a user runs it. Prints:

- the time from the job's start until every refined table holds its snapshot;
- then, with RATE commits per second spread over the tables round-robin (one row inserted per commit) for
  SECONDS seconds: p50, p95 and max from a commit to the Delta commit that made its row visible in its
  refined table (the table's first commit at or after the row's `_cdc_refined_at`; a commit never refined counts
  as infinitely late), and the rows that
  never arrived within the settling time after the last commit (`--settle`);
- the job's peak memory (its Python and its JVM, as the sum of their proportional set sizes: bench/usage.py) and
  CPU seconds over the steady part;
- where the refinement's time went, from the job's event log (`_cdc/events`): refine batches, their seconds
  (p50, p95, sum) and Spark jobs per batch;
- the floor: one bare Delta MERGE of one row into each of the refined tables, one after the other, from
  this process's Spark session, as the time it takes (what refining every table once costs at least), and two
  tables at a time;
- the targets' lines (bench/targets.py): p95 (at up to 50 tables), p95 against the two-at-a-time floor, and
  peak memory.

Figures only.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from delta.tables import DeltaTable
from latency import percentile, start_job, stop_job
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from targets import MANY_TABLES_AGAINST_FLOOR, MANY_TABLES_MEMORY, MANY_TABLES_P95
from usage import cpu_seconds, processes, total_memory_bytes

from cdc.core.config import Settings, load_settings
from cdc.core.session import build_spark_session
from cdc.core.tables import is_delta_table, table_version
from cdc.stack.local import stack_for_a_run
from connectors import definitions
from connectors.client import ConnectClient
from refine.config import refined_table_location


def group_usage(pgid: int) -> tuple[int, float]:
    """(memory bytes, CPU seconds) of the processes of process group ``pgid``: the sum of their proportional
    set sizes (bench/usage.py) and of their CPU times."""
    group = {pid: stat for pid, stat in processes().items() if int(stat[2]) == pgid}
    return total_memory_bytes(group), sum(map(cpu_seconds, group.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=50, help="tables in the schema")
    parser.add_argument("--rows", type=int, default=20, help="rows each table starts with")
    parser.add_argument("--rate", type=float, default=2.0, help="commits per second, over all tables")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long commits are made")
    parser.add_argument("--trigger-interval", type=float, default=1.0, help="the job's trigger interval")
    parser.add_argument(
        "--settle",
        type=float,
        help="seconds after the last commit for the rest to reach their refined tables (default: 60, or 1 s a table)",
    )
    parser.add_argument("--log", type=Path, help="keep the job's output here")
    args = parser.parse_args()
    settings = load_settings()
    with stack_for_a_run(settings.stack):
        measure(args, settings)


def measure(args: argparse.Namespace, settings: Settings) -> None:
    name = f"many{uuid.uuid4().hex[:8]}"
    dsn = settings.stack.postgres.dsn()
    tables = [f"t{i:03}" for i in range(args.tables)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        for table in tables:
            conn.execute(f"CREATE TABLE {name}.{table} (id bigint PRIMARY KEY, note text)")
            conn.execute(f"INSERT INTO {name}.{table} SELECT i, 'row' FROM generate_series(1, {args.rows}) i")
    connector = definitions.postgres_named(name, schema_include_list=name)
    client = ConnectClient(settings.stack.connect.url)
    client.register(connector)
    client.wait_running(name)
    spark = build_spark_session(settings.spark)
    with tempfile.TemporaryDirectory(prefix="bench-many-") as warehouse:
        locations = {t: refined_table_location(warehouse, f"{name}.{name}.{t}") for t in tables}
        pattern = rf"{name}\.{name}\..*"
        args_ = [
            "sync",
            "--pattern",
            pattern,
            "--warehouse",
            warehouse,
            "--trigger-interval",
            str(args.trigger_interval),
        ]
        started = time.monotonic()
        job = start_job(args_, Path(warehouse) / "sync.log")
        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(1.0):
                peak[0] = max(peak[0], group_usage(job.pid)[0])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            fresh_s = wait_until_fresh(spark, locations, args.rows, started, timeout_s=max(900, 6 * args.tables))
            print(
                f"{args.tables} tables of {args.rows} rows: every refined table held its snapshot {fresh_s:.0f} s "
                "after the job started"
            )
            _, cpu_before = group_usage(job.pid)
            committed = commit_steadily(dsn, name, tables, args.rate, args.seconds)
            _, cpu_after = group_usage(job.pid)
            last = {
                t: max(i for (table, i) in committed if table == t) for t in tables if any(c[0] == t for c in committed)
            }
            settle = args.settle or max(60.0, args.tables)
            deadline, seen = time.monotonic() + settle, dict.fromkeys(last, -1)
            while last and time.monotonic() < deadline:  # each table looked at again only once its version moved
                moved = {t for t in last if table_version(spark, locations[t]) != seen[t]}
                seen.update({t: table_version(spark, locations[t]) for t in moved})
                last = {t: i for t, i in last.items() if t not in moved or not has_row(spark, locations[t], i)}
                time.sleep(2)
            steady = (time.time() - args.seconds - settle, time.time())
        finally:
            sampling.set()
            stop_job(job)
            client.delete(name)
            if args.log:
                args.log.write_text((Path(warehouse) / "sync.log").read_text())
        visible = visible_times(spark, locations)
        # A commit never refined counts as later than every other: p50 and p95 are of all commits.
        latencies = [visible[(t, i)] - at if (t, i) in visible else math.inf for (t, i), at in committed.items()]
        missing = latencies.count(math.inf)
        print(
            f"{len(committed)} commits at {args.rate}/s over {args.tables} tables for {args.seconds:.0f} s: "
            f"commit to refined p50 {statistics.median(latencies):.2f} s, p95 {percentile(latencies, 0.95):.2f} s, "
            f"max {max(latencies):.2f} s; {missing} not refined within {settle:.0f} s of the last commit"
        )
        print(
            f"peak memory {peak[0] / 2**30:.2f} GiB; CPU {cpu_after - cpu_before:.0f} s in the "
            f"{args.seconds:.0f} s of commits"
        )
        print(refine_breakdown(spark, warehouse, steady))
        floor, floor_two = merge_floor(spark, locations), merge_floor(spark, locations, workers=2)
        print(
            f"floor: a bare Delta MERGE of one row into each of the {args.tables} tables, one after the other: "
            f"{floor:.1f} s ({floor / args.tables:.2f} s each); two at a time: {floor_two:.1f} s "
            f"({args.tables / floor_two:.2f} tables/s)"
        )
        measured = f"{args.tables} tables at {args.rate:g} commits/s"
        p95 = percentile(latencies, 0.95)
        if args.tables <= 50:
            print(MANY_TABLES_P95.verdict(p95, measured))
        print(MANY_TABLES_AGAINST_FLOOR.verdict(p95 / floor_two, f"{measured}: {p95:.1f} s against {floor_two:.1f} s"))
        print(MANY_TABLES_MEMORY.verdict(peak[0] / 2**30, measured))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def refine_breakdown(spark: SparkSession, warehouse: str, steady: tuple[float, float]) -> str:
    """The refine batches that ended in the ``steady`` window (epoch seconds), from the event log."""
    logged = spark.read.format("delta").load(f"{warehouse}/_cdc/events").collect()
    firsts = [row.seconds for row in logged if row.batch == 0]
    events = [row for row in logged if steady[0] <= row.ended_at.timestamp() <= steady[1]]
    if not events:
        return "refine batches: none in the steady part"
    seconds = [row.seconds for row in events]
    jobs = [row.spark_jobs for row in events]
    return (
        f"refine: each table's first batch (the snapshot) p50 {statistics.median(firsts):.2f} s; batches in the "
        f"steady part: {len(events)}, seconds each p50 {statistics.median(seconds):.2f} "
        f"p95 {percentile(seconds, 0.95):.2f}, {sum(seconds):.0f} s in all; Spark jobs each p50 "
        f"{statistics.median(jobs):.0f}"
    )


def wait_until_fresh(
    spark: SparkSession, locations: dict[str, str], rows: int, started: float, timeout_s: float
) -> float:
    """Seconds from ``started`` until each table holds ``rows`` rows (counted again only when its version moved:
    the polls share the job's cores)."""
    waiting = dict(locations)
    seen: dict[str, int] = {}
    while waiting:
        versions = {t: table_version(spark, loc) if is_delta_table(spark, loc) else -1 for t, loc in waiting.items()}
        moved = {t: loc for t, loc in waiting.items() if versions[t] >= 0 and versions[t] != seen.get(t)}
        seen.update(versions)
        waiting = {t: loc for t, loc in waiting.items() if t not in moved or not has_rows(spark, loc, rows)}
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"{len(waiting)} tables not refined within {timeout_s:.0f} s")
        if waiting:
            time.sleep(2)
    return time.monotonic() - started


def has_rows(spark: SparkSession, location: str, rows: int) -> bool:
    return is_delta_table(spark, location) and spark.read.format("delta").load(location).count() >= rows


def has_row(spark: SparkSession, location: str, row_id: int) -> bool:
    return (
        is_delta_table(spark, location)
        and spark.read.format("delta").load(location).where(F.col("id") == row_id).count() > 0
    )


def commit_steadily(
    dsn: str, schema: str, tables: list[str], rate: float, seconds: float
) -> dict[tuple[str, int], float]:
    """Insert one row per transaction, ``rate`` a second, round-robin over ``tables``; their commit times."""
    committed: dict[tuple[str, int], float] = {}
    start = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        k = 0
        while time.monotonic() - start < seconds:
            table, row_id = tables[k % len(tables)], 1_000_000 + k
            conn.execute(f"INSERT INTO {schema}.{table} VALUES (%s, 'steady')", (row_id,))
            committed[(table, row_id)] = time.time()
            k += 1
            time.sleep(max(0.0, start + k / rate - time.monotonic()))  # the workload's pace
    return committed


def visible_times(spark: SparkSession, locations: dict[str, str]) -> dict[tuple[str, int], float]:
    """When each steady row became visible: its table's first commit at or after the row's `_cdc_refined_at`."""
    visible: dict[tuple[str, int], float] = {}
    for table, location in locations.items():
        if not is_delta_table(spark, location):
            continue
        commits = sorted(
            row.timestamp.timestamp()
            for row in spark.sql(f"DESCRIBE HISTORY delta.`{location}`").collect()
            if row.operation == "MERGE"
        )
        for row in spark.read.format("delta").load(location).where("id >= 1000000").collect():
            refined_at = row._cdc_refined_at.timestamp()
            after = [c for c in commits if c >= refined_at - 0.001]
            if after:
                visible[(table, row.id)] = after[0]
    return visible


def merge_floor(spark: SparkSession, locations: dict[str, str], workers: int = 1) -> float:
    """Seconds of one bare Delta MERGE of one stored row into each table, ``workers`` tables at a time (warm:
    one round first)."""
    sources = {t: spark.read.format("delta").load(loc).limit(1).collect() for t, loc in locations.items()}

    def merge(table: str) -> None:
        location = locations[table]
        source = spark.createDataFrame(sources[table], spark.read.format("delta").load(location).schema)
        DeltaTable.forPath(spark, location).alias("t").merge(
            source.alias("s"), "t.id = s.id"
        ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

    def round_() -> float:
        start = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(merge, locations))
        return time.monotonic() - start

    round_()
    return round_()


if __name__ == "__main__":
    main()
