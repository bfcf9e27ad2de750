"""Refine throughput, and how one MERGE batch's cost grows with the refined table.

    .venv/bin/python bench/refine_merge.py [--sizes 1000000,10000000] [--changes 1000000] [--batch 10000]
                                           [--features plain,cdf,dv,cdf+dv]

For each refined-table size it builds, in a fresh warehouse:

- a refined table of SIZE rows of a Debezium Postgres table ``bench.accounts`` (written directly, as
  a finished snapshot would leave it);
- a raw table holding CHANGES Debezium envelopes (JsonConverter with schemas, as the connector
  writes them; ~90% updates of existing rows, ~10% inserts of new ids), refined by ``cdc refine
  --available-now`` in one run: changes/s. The updated rows are random over the whole table
  (``--updates uniform``, the default) or over its newest 5% (``--updates recent``: the rows a
  workload keeps changing, such as this week's orders);
- the floor Delta's MERGE sets: the same kind of CHANGES, decoded beforehand into a Delta table (their
  last change per key), applied by Delta's own MERGE alone (matched: update all, else insert; no
  position guards, no quarantine, no key filter): changes/s of that MERGE;
- then ROUNDS more raw appends of BATCH changes each, each refined by its own run: the wall time of
  the run and the MERGE's own time from the Delta history;
- the naive approach on the same table: every batch applied by a full outer join of the whole
  table with the batch, and an overwrite.

Each size is measured once per FEATURES variant of the refined table (its Delta features, see
cdc/core/tables.py): ``plain`` (neither: the default, which every reader opens), ``cdf`` (Change
Data Feed), ``dv`` (deletion vectors), ``cdf+dv`` (both). Delta's MERGE alone runs on the same
table, so each variant has its own floor.

A small unreported round runs first, so that every size is measured on a warm JVM
(``--no-warmup`` measures the first size cold). Prints figures; asserts nothing. Needs no running
stack: the raw tables are written directly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from targets import REFINE_AGAINST_DELTA_MERGE, WARM_SMALL_BATCH

from cdc.core.config import load_settings
from cdc.core.session import build_spark_session, job_spark_config
from cdc.core.tables import TableFeatures, raw_table_location
from cdc.raw.rows import raw_rows
from cdc.raw.table import create_raw_table
from refine.apply.latest import latest_per_key
from refine.apply.merge import LSN, OP, TableSettings, ensure_refined_table, refined_rows
from refine.config import refined_table_location
from refine.job import RefineJobConfig, run_refine_job
from refine.records.envelope import COMMON_SOURCE_FIELDS, ConnectSchema
from refine.records.parse import parse_changes

TOPIC = "bench.bench.accounts"
WARMUP_SIZE = 200_000  # rows of the warm-up round's refined table
# The row and envelope schemas Debezium 3.6's Postgres connector writes for
#   CREATE TABLE bench.accounts (id bigint PRIMARY KEY, name text, balance numeric(12,2),
#                                updated_at timestamptz, status text)
ROW_FIELDS = [
    {"type": "int64", "optional": False, "default": 0, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "12"},
        "field": "balance",
    },
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
        "field": "updated_at",
    },
    {"type": "string", "optional": True, "field": "status"},
]
SOURCE_FIELDS = [
    *COMMON_SOURCE_FIELDS,
    {"type": "string", "optional": False, "field": "schema"},
    {"type": "string", "optional": False, "field": "table"},
    {"type": "int64", "optional": True, "field": "txId"},
    {"type": "int64", "optional": True, "field": "lsn"},
    {"type": "int64", "optional": True, "field": "xmin"},
]
ROW_COLUMNS = [str(field["field"]) for field in ROW_FIELDS]  # the refined table's columns
ROW = {"type": "struct", "fields": ROW_FIELDS, "optional": True, "name": "bench.bench.accounts.Value"}
VALUE_SCHEMA = {
    "type": "struct",
    "optional": False,
    "name": "bench.bench.accounts.Envelope",
    "version": 2,
    "fields": [
        {**ROW, "field": "before"},
        {**ROW, "field": "after"},
        {
            "type": "struct",
            "fields": SOURCE_FIELDS,
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "version": 1,
            "field": "source",
        },
        {
            "type": "struct",
            "optional": True,
            "name": "event.block",
            "version": 1,
            "field": "transaction",
            "fields": [
                {"type": "string", "optional": False, "field": "id"},
                {"type": "int64", "optional": False, "field": "total_order"},
                {"type": "int64", "optional": False, "field": "data_collection_order"},
            ],
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
    ],
}
KEY_SCHEMA = {"type": "struct", "fields": [ROW_FIELDS[0]], "optional": False, "name": "bench.bench.accounts.Key"}
BASE_MICROS = 1_780_000_000_000_000
STATUSES = "array('active', 'frozen', 'closed')"
# The refined table's Delta features, by the name --features gives.
FEATURES = {
    "plain": TableFeatures(deletion_vectors=False, change_data_feed=False),
    "cdf": TableFeatures(deletion_vectors=False, change_data_feed=True),
    "dv": TableFeatures(deletion_vectors=True, change_data_feed=False),
    "cdf+dv": TableFeatures(deletion_vectors=True, change_data_feed=True),
}


def row_image(id_: str, version: str) -> str:
    """SQL of one ``bench.accounts`` row image (a struct), for row ``id_`` at change ``version``."""
    unscaled = f"pmod(xxhash64({id_}, {version}), 2000000000)"
    return (
        f"named_struct('id', {id_}, 'name', concat('account ', {id_}), "
        # Debezium's precise decimal: base64 of the big-endian two's-complement unscaled value.
        f"'balance', base64(unhex(lpad(hex({unscaled}), 8, '0'))), "
        f"'updated_at', date_format(timestamp_micros({BASE_MICROS} + {version} * 1000), "
        "\"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\"), "
        f"'status', element_at({STATUSES}, cast(pmod({id_} + {version}, 3) + 1 as int)))"
    )


def refined_snapshot(
    spark: SparkSession,
    location: str,
    size: int,
    rows_per_file: int | None,
    features: TableFeatures | None = None,
) -> None:
    """The refined table (with ``features``) as a finished snapshot of ``size`` rows leaves it, written
    directly as typed rows (generating and parsing 10M envelopes would only slow the set-up), in key order,
    in files of ``rows_per_file`` rows (None: as many files as Spark has cores)."""
    one = spark.range(1).selectExpr(
        "'r' AS op",
        f"{row_image('id', '0')} AS after",
        "CAST(NULL AS STRUCT<id: BIGINT>) AS before",
        "0L AS source_lsn",
        "0L AS kafka_offset",
        f"timestamp_micros({BASE_MICROS}) AS source_committed_at",
    )
    # The refined table's exact schema: one row through the same decoding refine uses.
    typed = parse_changes(
        envelopes(one), ConnectSchema.model_validate(KEY_SCHEMA), ConnectSchema.model_validate(VALUE_SCHEMA)
    )
    schema = refined_rows(typed, ROW_COLUMNS).schema
    files = -(-size // rows_per_file) if rows_per_file else None
    rows = (
        spark.range(0, size, 1, files)
        .selectExpr(
            "id",
            "concat('account ', id)",
            "pmod(xxhash64(id, 0), 2000000000) / 100",
            f"timestamp_micros({BASE_MICROS})",
            f"element_at({STATUSES}, cast(pmod(id, 3) + 1 as int))",
            "0L",
            "0L",
            f"timestamp_micros({BASE_MICROS})",
            "'r'",
            "current_timestamp()",
        )
        .toDF(*schema.fieldNames())
    )
    ensure_refined_table(spark, location, TableSettings(features or TableFeatures()), schema)
    rows.select(*[F.col(f.name).cast(f.dataType) for f in schema]).write.format("delta").mode("append").save(location)


def envelopes(changes: DataFrame) -> DataFrame:
    """Kafka-like records (key, value as Debezium JSON) of changes (op, after, source_lsn, kafka_offset)."""
    payload = F.to_json(
        F.struct(
            F.col("before"),
            F.col("after"),
            F.struct(
                F.lit("3.6.3.Final").alias("version"),
                F.lit("postgresql").alias("connector"),
                F.lit("bench").alias("name"),
                F.expr("source_lsn DIV 1000 + 1780000000000").alias("ts_ms"),
                F.lit("false").alias("snapshot"),
                F.lit("bench").alias("db"),
                F.lit("bench").alias("schema"),
                F.lit("accounts").alias("table"),
                F.expr("source_lsn DIV 64").alias("txId"),
                F.col("source_lsn").alias("lsn"),
            ).alias("source"),
            F.col("op"),
            F.expr("source_lsn DIV 1000 + 1780000000000").alias("ts_ms"),
        )
    )
    value = F.concat(F.lit('{"schema":' + json.dumps(VALUE_SCHEMA) + ',"payload":'), payload, F.lit("}"))
    key_id = F.coalesce(F.col("after.id"), F.col("before.id"))
    key = F.concat(F.lit('{"schema":' + json.dumps(KEY_SCHEMA) + ',"payload":{"id":'), key_id, F.lit("}}"))
    return changes.select(
        key.alias("key"),
        value.alias("value"),
        F.lit(TOPIC).alias("topic"),
        F.lit(0).alias("partition"),
        F.col("kafka_offset").alias("offset"),
        F.col("source_committed_at").alias("timestamp"),
        F.lit(None).cast("array<struct<key:string,value:binary>>").alias("headers"),
    )


@dataclass(frozen=True)
class Workload:
    """Which changes the raw table gets."""

    updated: str = "uniform"  # the rows updates change: of all ("uniform") or of the newest 5% ("recent")
    deletes: float = 0.0  # the fraction of updates that are deletes instead (``before`` holding the key)


def append_raw_changes(
    spark: SparkSession,
    location: str,
    size: int,
    first: int,
    count: int,
    workload: Workload = Workload(),
) -> None:
    """Append ``count`` changes (from change number ``first``) to the raw table as Kafka records:
    updates of random existing rows, inserts of new ids for ~10%, and deletes (see :class:`Workload`)."""
    hot = size if workload.updated == "uniform" else size // 20  # the rows updates pick from: the last ones
    seq = spark.range(first, first + count)
    changes = (
        seq.selectExpr(
            f"{size - hot} + pmod(xxhash64(id, 17), {hot + hot // 9}) AS row_id",
            "id AS seq",
        )
        .selectExpr(
            f"CASE WHEN row_id >= {size} THEN 'c' "
            f"WHEN pmod(xxhash64(seq, 29), 10000) < {int(workload.deletes * 10000)} THEN 'd' ELSE 'u' END AS op",
            "row_id",
            "seq",
        )
        .selectExpr(
            "op",
            f"CASE WHEN op = 'd' THEN NULL ELSE {row_image('row_id', 'seq + 1')} END AS after",
            "CASE WHEN op = 'd' THEN named_struct('id', row_id) END AS before",
            "1000000 + seq * 8 AS source_lsn",
            "seq AS kafka_offset",
            f"timestamp_micros({BASE_MICROS} + (seq + 1) * 1000) AS source_committed_at",
        )
    )
    records = envelopes(changes).select(
        F.encode("key", "UTF-8").alias("key"),
        F.encode("value", "UTF-8").alias("value"),
        "topic",
        "partition",
        "offset",
        "timestamp",
        F.lit(0).alias("timestampType"),
        "headers",
    )
    raw_rows(records, 0).write.format("delta").mode("append").save(location)


def refine(spark: SparkSession, warehouse: str, features: TableFeatures) -> float:
    """Seconds of one `cdc refine --available-now` run."""
    started = time.monotonic()
    run_refine_job(
        spark,
        RefineJobConfig(table=TOPIC, warehouse=warehouse, trigger={"kind": "available_now"}, features=features),
        say=lambda line: None,
    )
    return time.monotonic() - started


def last_merge_ms(spark: SparkSession, location: str) -> float:
    history = spark.sql(f"DESCRIBE HISTORY delta.`{location}` LIMIT 5").where("operation = 'MERGE'").head()
    assert history is not None, f"no MERGE in the last commits of {location}"
    return float(history.operationMetrics["executionTimeMs"])


def decoded_batch(spark: SparkSession, warehouse: str, size: int, first: int, count: int, workload: Workload) -> str:
    """Location of a Delta table holding ``count`` changes (from change number ``first``) as refined
    rows: their last change per key, decoded as refine decodes them."""
    scratch, location = f"{warehouse}/decoded_raw_{first}", f"{warehouse}/decoded_{first}"
    create_raw_table(spark, scratch, TOPIC)
    append_raw_changes(spark, scratch, size, first, count, workload)
    changes = parse_changes(
        spark.read.format("delta").load(scratch),
        ConnectSchema.model_validate(KEY_SCHEMA),
        ConnectSchema.model_validate(VALUE_SCHEMA),
    )
    rows = refined_rows(latest_per_key(changes, ["id"], None, placeholders=False), ROW_COLUMNS)
    rows.write.format("delta").save(location)
    return location


def delta_merge_alone(spark: SparkSession, location: str, decoded: str) -> float:
    """Seconds of Delta's own MERGE of the decoded rows at ``decoded`` into the table at ``location``
    (deletes delete)."""
    started = time.monotonic()
    source = spark.read.format("delta").load(decoded)
    target = DeltaTable.forPath(spark, location).alias("t")
    is_delete = F.col(f"s.{OP}") == "d"
    (
        target.merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete(is_delete)
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll(~is_delete)
        .execute()
    )
    return time.monotonic() - started


def naive_apply(
    spark: SparkSession, warehouse: str, location: str, size: int, first: int, count: int, workload: Workload
) -> float:
    """The naive way: the batch's last change per key, full-outer-joined with the whole table, overwritten."""
    scratch = f"{warehouse}/naive_raw_{first}"
    create_raw_table(spark, scratch, TOPIC)
    append_raw_changes(spark, scratch, size, first, count, workload)
    started = time.monotonic()
    raw = spark.read.format("delta").load(scratch)
    schema = ConnectSchema.model_validate(VALUE_SCHEMA)
    changes = parse_changes(raw, ConnectSchema.model_validate(KEY_SCHEMA), schema)
    batch = refined_rows(latest_per_key(changes, ["id"], None), ROW_COLUMNS)
    table = spark.read.format("delta").load(location)
    joined = table.alias("t").join(batch.alias("s"), "id", "full_outer")
    newer = F.col(f"s.{LSN}").isNotNull() & (F.col(f"t.{LSN}").isNull() | (F.col(f"s.{LSN}") >= F.col(f"t.{LSN}")))
    columns = [c for c in table.columns if c != "id"]
    merged = joined.select("id", *[F.when(newer, F.col(f"s.{c}")).otherwise(F.col(f"t.{c}")).alias(c) for c in columns])
    merged.where(F.col(OP) != "d").write.format("delta").mode("overwrite").save(location)
    return time.monotonic() - started


def bench_size(
    spark: SparkSession,
    size: int,
    changes: int,
    batch: int,
    rounds: int,
    workload: Workload,
    rows_per_file: int | None,
    features: TableFeatures,
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-refine-") as warehouse:
        refined = refined_table_location(warehouse, TOPIC)
        raw = raw_table_location(warehouse, TOPIC)
        started = time.monotonic()
        refined_snapshot(spark, refined, size, rows_per_file, features)
        print(f"  {size:,}-row refined table written in {time.monotonic() - started:.0f} s", flush=True)
        create_raw_table(spark, raw, TOPIC)
        append_raw_changes(spark, raw, size, 0, changes, workload)
        seconds = refine(spark, warehouse, features)
        result = {"changes_per_s": changes / seconds}
        print(f"  refine of {changes:,} changes: {seconds:.1f} s, {result['changes_per_s']:,.0f} changes/s", flush=True)
        decoded = decoded_batch(spark, warehouse, size, changes, changes, workload)
        result["delta_merge_per_s"] = changes / delta_merge_alone(spark, refined, decoded)
        print(
            f"  Delta's MERGE alone of {changes:,} changes decoded beforehand: "
            f"{result['delta_merge_per_s']:,.0f} changes/s",
            flush=True,
        )
        runs, merges, bare, naive = [], [], [], []
        first = 2 * changes
        for _ in range(rounds):
            append_raw_changes(spark, raw, size, first, batch, workload)
            runs.append(refine(spark, warehouse, features))
            merges.append(last_merge_ms(spark, refined) / 1000)
            # The same rows again, decoded beforehand, by Delta's MERGE alone: they match the same rows and files.
            bare.append(
                delta_merge_alone(spark, refined, decoded_batch(spark, warehouse, size, first, batch, workload))
            )
            first += batch
        for _ in range(rounds):
            naive.append(naive_apply(spark, warehouse, refined, size, first, batch, workload))
            first += batch
        result |= {
            "run_s": statistics.median(runs),
            "merge_s": statistics.median(merges),
            "bare_merge_s": statistics.median(bare),
            "naive_s": statistics.median(naive),
        }
        print(
            f"  batch of {batch:,}: refine run {result['run_s']:.1f} s (its MERGE {result['merge_s']:.1f} s), "
            f"Delta's MERGE alone of the same rows {result['bare_merge_s']:.1f} s, "
            f"naive whole-table join {result['naive_s']:.1f} s (medians of {rounds})",
            flush=True,
        )
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="refined table sizes, comma-separated")
    parser.add_argument("--changes", type=int, default=1_000_000, help="changes refined in one run, per size")
    parser.add_argument("--batch", type=int, default=10_000, help="changes in each timed MERGE batch")
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per size (medians are printed)")
    parser.add_argument(
        "--updates",
        choices=("uniform", "recent"),
        default="uniform",
        help="which rows updates change: random rows of the whole table, or of its newest 5%%",
    )
    parser.add_argument(
        "--deletes", type=float, default=0.0, help="the fraction of updates that are deletes instead (0 to 1)"
    )
    parser.add_argument(
        "--features",
        default=",".join(FEATURES),
        help="the refined table's Delta features, one run per variant: plain, cdf, dv, cdf+dv (comma-separated)",
    )
    parser.add_argument(
        "--rows-per-file", type=int, help="rows per file of the refined table (default: one file per core)"
    )
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="measure from a cold JVM (default: a small unreported round first)",
    )
    args = parser.parse_args()
    workload = Workload(args.updates, args.deletes)
    variants = args.features.split(",")
    if unknown := [name for name in variants if name not in FEATURES]:
        parser.error(f"--features: unknown {', '.join(unknown)} (choose among {', '.join(FEATURES)})")
    # As `cdc refine --available-now` runs: each refine here is such a run (its collector: the parallel one).
    spark = build_spark_session(job_spark_config(load_settings().spark, refines_continuously=False))
    if args.warmup:
        # A fresh JVM compiles for the first minute or so: whichever size came first was measured cold
        # (MERGE of 10,000 changes into 10M rows: 8.8 s first, 6.1 s second, same machine).
        print(f"warm-up (not reported): refined table of {WARMUP_SIZE:,} rows", flush=True)
        bench_size(
            spark,
            WARMUP_SIZE,
            min(args.changes, WARMUP_SIZE),
            args.batch,
            1,
            workload,
            args.rows_per_file,
            FEATURES[variants[0]],
        )
    results = {}
    for size in [int(size) for size in args.sizes.split(",")]:
        for variant in variants:
            print(f"refined table of {size:,} rows, features {variant}", flush=True)
            results[size, variant] = bench_size(
                spark, size, args.changes, args.batch, args.rounds, workload, args.rows_per_file, FEATURES[variant]
            )
    print(
        f"\n{'table rows':>12} {'features':>8} {'changes/s':>10} {'Delta MERGE alone/s':>20} {'ratio':>6} "
        f"{'batch run s':>12} {'MERGE s':>8} {'naive s':>8}"
    )
    for (size, variant), result in results.items():
        print(
            f"{size:>12,} {variant:>8} {result['changes_per_s']:>10,.0f} {result['delta_merge_per_s']:>20,.0f} "
            f"{result['changes_per_s'] / result['delta_merge_per_s']:>6.2f} {result['run_s']:>12.1f} "
            f"{result['merge_s']:>8.1f} {result['naive_s']:>8.1f}"
        )
    for (size, variant), result in results.items():
        ratio = result["changes_per_s"] / result["delta_merge_per_s"]
        print(REFINE_AGAINST_DELTA_MERGE.verdict(ratio, f"{size:,} rows, {variant}, {args.changes:,} changes"))
        if args.batch <= 100:
            measured = f"{size:,} rows, {variant}, batches of {args.batch}, median of {args.rounds}"
            ratio = result["run_s"] / result["bare_merge_s"]
            measured += f": {result['run_s']:.2f} s against {result['bare_merge_s']:.2f} s"
            print(WARM_SMALL_BATCH.verdict(ratio, measured))
    sizes = sorted({size for size, _ in results})
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        for variant in variants:
            for name in ("run_s", "merge_s", "naive_s"):
                ratio = results[large, variant][name] / results[small, variant][name]
                print(f"{variant}: {name} at {large:,} / at {small:,}: {ratio:.2f}")


if __name__ == "__main__":
    main()
