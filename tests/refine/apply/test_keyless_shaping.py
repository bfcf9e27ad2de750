"""A shaped table without a primary key, against a Python model of the source: its live rows are the
source's rows that match `where`, as the shape makes them (masks by Python's hashlib), as many of each as
the source has; under soft deletes each image also keeps, marked deleted, the copies it had at most at
once and has no longer. Neither depends on how the changes fall into batches."""

import hashlib
import random
from collections import Counter
from datetime import datetime, timedelta

import pytest
from pyspark.sql import functions as F

from refine.apply.keyless import merge_keyless_changes
from refine.apply.merge import TableSettings
from refine.apply.shaping import DeleteMode, TableShape

CHANGES = (
    "op string, before struct<a:int,b:string,n:int>, after struct<a:int,b:string,n:int>, source_lsn long, "
    "kafka_offset long, kafka_partition int, source_committed_at timestamp, source_last_commit_lsn long, "
    "source_snapshot_start boolean"
)
SHAPE = TableShape(except_columns=["n"], computed={"big": "a >= 2"}, where="a > 0", mask={"b": "sha256"})
START = datetime(2026, 1, 1)


def _workload(rng: random.Random, steps: int) -> list[tuple]:
    """Random inserts, updates and deletes of a few possible rows (so equal rows abound), as Debezium's
    records of a table with REPLICA IDENTITY FULL; a truncate now and then."""
    rows: list[tuple[int, str, int]] = []
    changes = []
    for _ in range(steps):
        row = (rng.randint(0, 3), rng.choice(["x", "y"]), rng.randint(0, 1))
        kind = rng.random()
        if kind < 0.03:
            rows.clear()
            changes.append(("t", None, None))
        elif kind < 0.5 or not rows:
            rows.append(row)
            changes.append(("c", None, row))
        elif kind < 0.75:
            old = rows.pop(rng.randrange(len(rows)))
            rows.append(row)
            changes.append(("u", old, row))
        else:
            changes.append(("d", rows.pop(rng.randrange(len(rows))), None))
    return [
        (op, before, after, 100 + step, step, 0, START + timedelta(seconds=step), 100 + step, False)
        for step, (op, before, after) in enumerate(changes, start=1)
    ]


def _shaped(row: tuple[int, str, int]) -> tuple[int, str, bool] | None:
    a, b, _ = row
    return (a, hashlib.sha256(b.encode()).hexdigest(), a >= 2) if a > 0 else None


def _model(changes: list[tuple]) -> tuple[Counter, Counter]:
    """The shaped rows the source holds, and per shaped row the most copies it ever had at once (under soft
    deletes a truncate marks every copy deleted, and they stay counted)."""
    live, most = Counter(), Counter()
    for op, before, after, *_ in changes:
        if op == "t":
            live.clear()
            continue
        if before is not None and (image := _shaped(before)) is not None:
            live[image] -= 1
        if after is not None and (image := _shaped(after)) is not None:
            live[image] += 1
            most[image] = max(most[image], live[image])
    return +live, most


def _split(changes: list[tuple], rng: random.Random) -> list[list[tuple]]:
    cuts = sorted(rng.sample(range(1, len(changes)), 4))
    return [changes[i:j] for i, j in zip([0, *cuts], [*cuts, len(changes)], strict=True)]


@pytest.mark.parametrize("soft", [False, True])
def test_a_shaped_keyless_table_follows_the_source_whatever_the_batches(spark, tmp_path, soft):
    rng = random.Random(7 + soft)
    shape = SHAPE.model_copy(update={"deletes": DeleteMode.SOFT if soft else DeleteMode.HARD})
    changes = _workload(rng, 80)
    live, most = _model(changes)
    tables = []
    for run, batches in enumerate([[changes], _split(changes, rng)]):
        location, applied = f"{tmp_path}/t{run}", f"{tmp_path}/applied{run}"
        for batch in batches:
            frame = spark.createDataFrame(batch, CHANGES)
            merge_keyless_changes(spark, location, TableSettings(), applied, frame, ["a", "b", "n"], shape=shape)
        table = spark.read.format("delta").load(location)
        assert "n" not in table.columns
        is_live = F.col("_cdc_deleted_at").isNull() if soft else F.lit(True)
        rows = Counter((r.a, r.b, r.big) for r in table.where(is_live).collect())
        assert rows == live
        if soft:
            deleted = Counter((r.a, r.b, r.big) for r in table.where(~is_live).collect())
            assert deleted == +(most - live)
            copies = table.groupBy("_cdc_row_hash").agg(
                F.max("_cdc_copy").alias("top"),
                F.count("*").alias("n"),
                F.max(F.when(is_live, F.col("_cdc_copy"))).alias("top_live"),
                F.count(F.when(is_live, 1)).alias("n_live"),
            )
            # Copies 1..n, the live ones first.
            assert copies.where("top <> n OR coalesce(top_live, 0) <> n_live").count() == 0
        else:
            assert "_cdc_deleted_at" not in table.columns
        tables.append(table.select("a", "b", "big", "_cdc_copy", is_live.alias("live")))
    for other in tables[1:]:  # the batches decide nothing
        assert sorted(other.collect()) == sorted(tables[0].collect())
