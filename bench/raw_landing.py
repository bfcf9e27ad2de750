"""Raw landing throughput: `cdc raw --available-now` next to a plain Spark kafka -> delta stream.

    .venv/bin/python bench/raw_landing.py [--messages 1000000] [--size 1000] [--partitions 4] [--collector g1]

Brings the local stack up (down at the end, unless all of it was running), produces the messages once
to a new topic, then lands that topic twice with each variant in a worker process of its own, with the
same Spark settings but for the JVM's garbage collector (each variant's own, unless `--collector` names one):
cold (the first landing of a fresh JVM, as a scheduled `--available-now` run) and warm (the second,
as a long-running job after the JIT compiled its hot paths). Prints rows/s of each
landing (Spark start-up excluded), the CPU seconds it took (which, unlike wall time, barely move
when other work shares the machine) and the peak memory of each worker's whole process
tree (Python and its JVM, the sum of their proportional set sizes: bench/usage.py).
`--class-archive both` runs every variant also without the driver JVM's class archive (see README,
Configuration), to show what it saves of a fresh JVM; the start column is the Spark session's start.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import SparkSession
from targets import RAW_AGAINST_PLAIN_STREAM, RAW_RATE
from usage import tree_cpu_seconds, tree_memory_bytes

from cdc.core.config import Settings, load_settings
from cdc.core.session import build_spark_session, job_spark_config

VARIANTS = ("cdc raw", "plain stream")


def produce(spark: SparkSession, bootstrap: str, topic: str, messages: int, size: int, partitions: int) -> None:
    """``messages`` JSON values of about ``size`` bytes, written by Spark's Kafka sink (the Java producer)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    admin.close()
    hashes = max(1, (size - 60) // 64)
    value = (
        'concat(\'{"id":\', id, \',"at":"\', current_timestamp(), \'","payload":"\', '
        + ", ".join(f"sha2(cast(id * {i + 1} as string), 256)" for i in range(hashes))
        + ", '\"}')"
    )
    (
        spark.range(messages, numPartitions=partitions * 2)
        .selectExpr("cast(id % 100000 as string) AS key", f"{value} AS value")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        # Uncompressed, as Debezium's Kafka Connect producers send by default.
        .option("kafka.linger.ms", "20")
        .option("kafka.batch.size", "1048576")
        .save()
    )


def land(spark: SparkSession, variant: str, topic: str, bootstrap: str, warehouse: str) -> int:
    """Land all of ``topic`` into a new table under ``warehouse`` with ``variant``; return the rows landed."""
    if variant == "cdc raw":
        from cdc.core.config import validate
        from cdc.raw.config import RawJobConfig
        from cdc.raw.job import run_raw_job

        config = validate(
            RawJobConfig,
            {
                "topics": {"kind": "topics", "topics": [topic]},
                "warehouse": warehouse,
                "trigger": {"kind": "available_now"},
                "kafka": {"bootstrap_servers": bootstrap},
            },
            "raw job settings",
        )
        return sum(summary.rows for summary in run_raw_job(spark, config, say=lambda line: None))
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("delta")
        .option("checkpointLocation", f"{warehouse}/_checkpoint")
        .trigger(availableNow=True)
        .start(f"{warehouse}/plain")
    )
    query.awaitTermination()
    return sum(progress.numInputRows for progress in query.recentProgress)


def worker(variant: str, topic: str, bootstrap: str, warehouse: str) -> None:
    """Land ``topic`` with ``variant`` twice in one JVM; print one JSON line with rows, seconds and CPU of each.

    The first landing runs on a cold JVM, as a scheduled `--available-now` run does; the second
    shows the steady state of a long-running job, after the JIT compiled the hot paths (on two
    cores, compiling alone takes ~20 CPU s of the first million records).
    """
    started = time.monotonic()
    settings = load_settings()
    # Each variant's JVM as it ships: `cdc raw`'s collector is its job's choice, the plain stream's the JVM's default.
    as_shipped = (
        job_spark_config(settings.spark, refines_continuously=False) if variant == "cdc raw" else settings.spark
    )
    spark = build_spark_session(as_shipped)
    result: dict[str, float] = {"start_seconds": time.monotonic() - started}
    for run in ("cold", "warm"):
        started, cpu_before = time.monotonic(), tree_cpu_seconds(os.getpid())
        rows = land(spark, variant, topic, bootstrap, f"{warehouse}/{run}")
        result |= {
            f"{run}_rows": rows,
            f"{run}_seconds": time.monotonic() - started,
            f"{run}_cpu_seconds": tree_cpu_seconds(os.getpid()) - cpu_before,
        }
        shutil.rmtree(f"{warehouse}/{run}", ignore_errors=True)  # a landing of 1M ~1 KB records is ~1 GB
    print(json.dumps(result), flush=True)


def run_worker(variant: str, topic: str, bootstrap: str, class_archive: bool, collector: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as warehouse:
        process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                variant,
                "--topic",
                topic,
                "--bootstrap",
                bootstrap,
                "--warehouse",
                warehouse,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={
                **os.environ,
                "CDC_SPARK__CLASS_ARCHIVE": str(class_archive).lower(),
                **({} if collector == "as-shipped" else {"CDC_SPARK__GARBAGE_COLLECTOR": collector}),
            },
        )
        peak = 0.0

        def sample() -> None:
            nonlocal peak
            while process.poll() is None:
                peak = max(peak, tree_memory_bytes(process.pid))
                time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        output, _ = process.communicate()
        sampler.join()
        if process.returncode != 0:
            raise SystemExit(f"{variant} worker failed with exit code {process.returncode}")
        result = json.loads(output.strip().splitlines()[-1])
        return {**result, "peak_mib": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1000, help="approximate value size in bytes")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the benchmark topic")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating (default 2)")
    parser.add_argument(
        "--class-archive",
        choices=("on", "off", "both"),
        default="on",
        help="start the workers' JVMs from the class archive (default), without it, or both ways",
    )
    parser.add_argument(
        "--collector",
        choices=("as-shipped", "g1", "parallel"),
        default="as-shipped",
        help="the workers' garbage collector: each variant's own (`cdc raw`: parallel; the plain "
        "stream: the JVM's default, G1), or the same for both",
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--warehouse", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.topic, args.bootstrap, args.warehouse)
        return

    from cdc.stack.local import stack_for_a_run

    settings = load_settings()
    with stack_for_a_run(settings.stack):
        measure(args, settings)


def measure(args: argparse.Namespace, settings: Settings) -> None:
    """Produce the topic, land it with each variant, and print the figures."""
    bootstrap = settings.stack.kafka.bootstrap_servers
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    spark = build_spark_session(settings.spark)
    started = time.monotonic()
    produce(spark, bootstrap, topic, args.messages, args.size, args.partitions)
    print(
        f"produced {args.messages:,} messages of ~{args.size} B to {topic} ({args.partitions} partitions) "
        f"in {time.monotonic() - started:.1f} s"
    )
    spark.stop()
    # Alternating rounds: this machine's speed drifts, and neither variant should always go first.
    archives = {"on": [True], "off": [False], "both": [True, False]}[args.class_archive]
    workers = {
        variant + ("" if archive else ", no archive"): (variant, archive)
        for variant in VARIANTS
        for archive in archives
    }
    width = max(map(len, workers))
    print(
        f"{'variant':<{width}} {'round':>5} {'start s':>7} {'rows':>10} {'cold s':>7} {'cold rows/s':>12} {'CPU s':>6} "
        f"{'warm s':>7} {'warm rows/s':>12} {'CPU s':>6} {'peak MiB':>13}"
    )
    results: dict[str, list[dict[str, float]]] = {label: [] for label in workers}
    for round_ in range(1, args.rounds + 1):
        for label, (variant, archive) in workers.items():
            result = run_worker(variant, topic, bootstrap, archive, args.collector)
            for run in ("cold", "warm"):
                result[f"{run}_rows_per_s"] = result[f"{run}_rows"] / result[f"{run}_seconds"]
            results[label].append(result)
            print(
                f"{label:<{width}} {round_:>5} {result['start_seconds']:>7.1f} "
                f"{result['cold_rows']:>10,} {result['cold_seconds']:>7.1f} "
                f"{result['cold_rows_per_s']:>12,.0f} {result['cold_cpu_seconds']:>6.1f} "
                f"{result['warm_seconds']:>7.1f} "
                f"{result['warm_rows_per_s']:>12,.0f} {result['warm_cpu_seconds']:>6.1f} "
                f"{result['peak_mib']:>13,.0f}",
                flush=True,
            )
    for run in ("cold", "warm"):
        best = {variant: max(runs, key=lambda result: result[f"{run}_rows_per_s"]) for variant, runs in results.items()}
        for label, result in best.items():
            print(
                f"best {run} {label:<{width}} {result[f'{run}_rows_per_s']:>10,.0f} rows/s, "
                f"{result[f'{run}_cpu_seconds']:.1f} CPU s"
            )
        for suffix in {label.removeprefix(VARIANTS[0]) for label in workers if label.startswith(VARIANTS[0])}:
            ratio = best[VARIANTS[0] + suffix][f"{run}_rows_per_s"] / best[VARIANTS[1] + suffix][f"{run}_rows_per_s"]
            print(f"{run}: cdc raw / plain stream{suffix}: {ratio:.2f}")
            measured = f"{run}, best of {args.rounds}{suffix}"
            print(RAW_AGAINST_PLAIN_STREAM.verdict(ratio, measured))
            rate = best[VARIANTS[0] + suffix][f"{run}_rows_per_s"]
            print(RAW_RATE.verdict(rate, f"{measured}, {args.messages:,} messages of ~{args.size} B"))
    for label, runs in results.items():
        peak = max(result["peak_mib"] for result in runs)
        print(f"peak memory {label}: {peak:,.0f} MiB (Python and its JVM, both landings)")


if __name__ == "__main__":
    main()
