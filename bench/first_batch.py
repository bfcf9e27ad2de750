"""A fresh process's first refine batch: `cdc refine --available-now` started as a new process.

    .venv/bin/python bench/first_batch.py [--size 1000000] [--changes 100] [--rounds 3]

Builds a refined table of SIZE rows (written directly, as a finished snapshot leaves it) and its raw
table, refines a first set of changes in this process (so the table has a refinement checkpoint, as
a table refined before has), then ROUNDS times: appends CHANGES Debezium envelopes to the raw table
and runs `cdc refine --table ... --available-now` as a new process (a scheduled run, or a job
restarted by its service manager). Prints, per round, the seconds from the process's start to the
refined table's commit of the batch (its Delta commit time), and to the process's exit. The JVM
start is in both. Prints figures; asserts nothing. Needs no running stack.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refine_merge import FEATURES, TOPIC, append_raw_changes, refine, refined_snapshot
from targets import FIRST_BATCH

from cdc.core.config import load_settings
from cdc.core.session import build_spark_session, job_spark_config
from cdc.core.tables import raw_table_location
from cdc.raw.table import create_raw_table
from refine.config import refined_table_location


def last_commit_s(spark: SparkSession, location: str) -> float:
    """The refined table's newest commit time, seconds since the epoch."""
    [row] = spark.sql(f"DESCRIBE HISTORY delta.`{location}` LIMIT 1").select("timestamp").collect()
    return row.timestamp.timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="rows of the refined table")
    parser.add_argument("--changes", type=int, default=100, help="changes in each fresh process's batch")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes (medians are printed)")
    args = parser.parse_args()
    spark = build_spark_session(job_spark_config(load_settings().spark, refines_continuously=False))
    features = FEATURES["plain"]
    with tempfile.TemporaryDirectory(prefix="bench-first-batch-") as warehouse:
        refined, raw = refined_table_location(warehouse, TOPIC), raw_table_location(warehouse, TOPIC)
        refined_snapshot(spark, refined, args.size, None, features)
        create_raw_table(spark, raw, TOPIC)
        append_raw_changes(spark, raw, args.size, 0, 1000)
        refine(spark, warehouse, features)  # the table's first refinement, in this process
        first, to_commit, to_exit = 1000, [], []
        for round_ in range(args.rounds):
            append_raw_changes(spark, raw, args.size, first, args.changes)
            first += args.changes
            started = time.time()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cdc.cli",
                    "refine",
                    "--table",
                    TOPIC,
                    "--warehouse",
                    warehouse,
                    "--available-now",
                ],
                check=True,
                cwd=warehouse,  # its log folder (.cdc/logs) in the scratch warehouse
                stdout=subprocess.DEVNULL,
            )
            to_exit.append(time.time() - started)
            to_commit.append(last_commit_s(spark, refined) - started)
            print(
                f"  round {round_ + 1}: batch of {args.changes:,} committed {to_commit[-1]:.1f} s after the process "
                f"started, process ended after {to_exit[-1]:.1f} s",
                flush=True,
            )
        print(
            f"fresh process, {args.changes:,} changes into {args.size:,} rows: first batch committed after "
            f"{statistics.median(to_commit):.1f} s, process ended after {statistics.median(to_exit):.1f} s "
            f"(medians of {args.rounds})"
        )
        measured = f"{args.changes:,} changes into {args.size:,} rows, median of {args.rounds}"
        print(FIRST_BATCH.verdict(statistics.median(to_commit), measured))


if __name__ == "__main__":
    main()
