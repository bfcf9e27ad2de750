"""A long-running refinement's small MERGEs, with the refined table's file compaction and without.

    .venv/bin/python bench/small_merges.py [--merges 400] [--rows 1000] [--window 50]

A continuous `cdc refine` (or `cdc sync`) commits a MERGE of a few changes about every second, and
each adds a file and deletion vectors to the refined table. Two refined tables of ROWS rows (as a
snapshot leaves them): one as refined tables are created (Delta's auto compaction on), one with it
off. MERGES batches of two changes (updates of existing rows) are applied to each, alternating
between the tables so that the machine's noise falls on both alike. Prints, per WINDOW batches of
each table, the median and p90 of `merge_changes` (wall time, compactions included) and the table's
file count. Figures only; asserts nothing. Needs no running stack.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from refine_merge import refined_snapshot

from cdc.core.config import load_settings
from cdc.core.session import build_spark_session
from refine.apply.merge import AUTO_COMPACT_PROPERTY, LSN, TableSettings, merge_changes


def merge_two_rows(spark: SparkSession, location: str, rows: int, batch: int) -> float:
    """Seconds of one MERGE updating two rows of the table (picked by ``batch``)."""
    changes = (
        spark.read.format("delta")
        .load(location)
        .where(f"id IN ({batch % rows}, {batch * 7 % rows})")
        .withColumn(LSN, F.lit(10**9 + batch).cast("bigint"))
        .persist()
    )
    changes.count()  # as the job hands the MERGE a cached batch
    started = time.monotonic()
    merge_changes(spark, location, TableSettings(), changes, ["id"], None, keys=changes.select("id"))
    elapsed = time.monotonic() - started
    changes.unpersist()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merges", type=int, default=400, help="MERGEs into each table")
    parser.add_argument("--rows", type=int, default=1000, help="rows of each refined table")
    parser.add_argument("--window", type=int, default=50, help="MERGEs per reported line")
    args = parser.parse_args()
    spark = build_spark_session(load_settings().spark)
    warehouse = tempfile.mkdtemp(prefix="cdc-bench-small-merges-")
    tables = {"compaction on": f"{warehouse}/compacted", "compaction off": f"{warehouse}/uncompacted"}
    for name, location in tables.items():
        refined_snapshot(spark, location, args.rows, None)
        if name == "compaction off":
            spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ('{AUTO_COMPACT_PROPERTY}' = 'false')")
    times: dict[str, list[float]] = {name: [] for name in tables}
    print(f"{args.merges} MERGEs of 2 changes into each refined table of {args.rows:,} rows, alternating")
    for batch in range(1, args.merges + 1):
        for name, location in tables.items():
            times[name].append(merge_two_rows(spark, location, args.rows, batch))
        if batch % args.window == 0:
            for name, location in tables.items():
                window = sorted(times[name][-args.window :])
                files = spark.sql(f"DESCRIBE DETAIL delta.`{location}`").collect()[0].numFiles
                print(
                    f"MERGEs {batch - args.window + 1:4d}-{batch:<4d} {name:15s} "
                    f"median {statistics.median(window):.3f} s, "
                    f"p90 {window[int(len(window) * 0.9)]:.3f} s, max {window[-1]:.3f} s, {files} files",
                    flush=True,
                )


if __name__ == "__main__":
    main()
