"""Filling primary-key changes' TOAST placeholders from their old keys, for chains of key changes.

    .venv/bin/python bench/key_changes.py [--chains 2000] [--depths 1,4,16,64] [--rounds 3] [--others 0]

For each depth D, a batch of CHAINS rows each inserted with a large value, then D times updated
(the large value left alone: Debezium's placeholder) and re-keyed (a delete, and a create carrying
the placeholder and the old key), the chains interleaved in source order, after OTHERS changes of
rows no key change touches (an insert, then updates with the placeholder: a batch's usual work). Prints, per depth, the
batch's changes and the median seconds of `refine.apply.rekey.fill_from_old_keys` over the batch (read
from Parquet, its result written to Spark's no-op sink), and checks every create and update got the
inserted value. Prints figures; asserts nothing else. Needs no running stack.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import functions as F

from cdc.core.config import load_settings
from cdc.core.session import build_spark_session, job_spark_config
from refine.apply.rekey import OLD_KEY_HEADER, fill_from_old_keys
from refine.records.envelope import ConnectSchema
from refine.records.toast import TOAST_PLACEHOLDER

KEY_SCHEMA = ConnectSchema.model_validate({"type": "struct", "fields": [{"type": "int64", "field": "id"}]})
CHANGES = (
    "op string, key struct<id:bigint>, after struct<id:bigint, note:string, n:int>, source_lsn bigint, "
    "kafka_offset bigint, kafka_partition int, kafka_headers array<struct<key:string, value:binary>>"
)


def chained_changes(chains: int, depth: int, others: int = 0) -> list[tuple]:
    """The changes of ``others`` rows never re-keyed (one insert and three updates each, ``others``
    changes in all), then of ``chains`` rows each re-keyed ``depth`` times, interleaved (hop by hop)."""
    changes: list[tuple] = []

    def emit(op: str, key: int, after: tuple | None, headers: list) -> None:
        offset = len(changes)
        changes.append((op, (key,), after, offset, offset, 0, headers))

    unkeyed_from = (depth + 1) * chains  # keys no chain reaches
    for change in range(others):
        row = unkeyed_from + change // 4
        emit(
            "u" if change % 4 else "c",
            row,
            (row, TOAST_PLACEHOLDER if change % 4 else f"large value of row {row}", change % 4),
            [],
        )
    for chain in range(chains):
        emit("c", chain, (chain, f"large value of row {chain}", 0), [])
    for hop in range(1, depth + 1):
        for chain in range(chains):
            old, new = (hop - 1) * chains + chain, hop * chains + chain
            emit("u", old, (old, TOAST_PLACEHOLDER, hop), [])
            emit("d", old, None, [])
            emit("c", new, (new, TOAST_PLACEHOLDER, hop), [(OLD_KEY_HEADER, json.dumps({"id": old}).encode())])
    return changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=2000, help="rows re-keyed, each a chain of key changes")
    parser.add_argument("--depths", default="1,4,16,64", help="key changes per row (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per depth (the median is printed)")
    parser.add_argument(
        "--others", type=int, default=0, help="changes of rows no key change touches, also in the batch"
    )
    args = parser.parse_args()
    spark = build_spark_session(job_spark_config(load_settings().spark, refines_continuously=False))
    print(f"{'depth':>6} {'changes':>9} {'seconds':>8}  filled")
    with tempfile.TemporaryDirectory(prefix="bench-key-changes-") as folder:
        for depth in (int(d) for d in args.depths.split(",")):
            path = f"{folder}/changes-{depth}.parquet"
            spark.createDataFrame(chained_changes(args.chains, depth, args.others), CHANGES).write.parquet(path)
            changes = spark.read.parquet(path)
            seconds = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                fill_from_old_keys(changes, KEY_SCHEMA, None).write.format("noop").mode("overwrite").save()
                seconds.append(time.perf_counter() - started)
            filled = fill_from_old_keys(changes, KEY_SCHEMA, None).where("after IS NOT NULL")
            wrong = filled.where(~F.col("after.note").startswith("large value")).count()
            print(
                f"{depth:>6} {changes.count():>9} {statistics.median(seconds):>8.1f}  "
                + ("all" if wrong == 0 else f"{wrong} WRONG")
            )
    spark.stop()


if __name__ == "__main__":
    main()
