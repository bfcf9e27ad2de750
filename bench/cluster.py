"""Raw landing and refine on `local[2]` next to the stack's standalone cluster of two one-core workers.

    .venv/bin/python bench/cluster.py [--messages 500000] [--size 1000] [--changes 300000] [--rounds 1]

Brings the local stack up with its Spark cluster (down at the end, unless all of it was running),
produces the messages once to a new topic of 2 partitions and writes a raw table of Debezium changes
once (as bench/refine_merge.py does), then runs `cdc raw --available-now` and `cdc refine
--available-now` as the user would, each in a `cdc` process of its own, with the session's master
`local[2]` and then the cluster's master. The cores are the same (2), so the cluster's figures show its
overhead: executors in JVMs of their own, the driver's jars fetched by each, tasks and results sent over
the network. Prints each run's wall time (the process's whole life, Spark's start included), rows/s and
the cluster / local ratio of the times.
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
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from raw_landing import produce
from refine_merge import TOPIC as REFINE_TOPIC
from refine_merge import append_raw_changes

from cdc.core.config import Settings, load_settings
from cdc.core.session import build_spark_session
from cdc.core.tables import raw_table_location
from cdc.raw.table import create_raw_table


def run_cdc(master: str, bootstrap: str, *args: str) -> float:
    """Seconds of one `cdc` command on ``master``, from its process's start to its end."""
    conf = {"spark.executor.memory": "768m", "spark.pyspark.python": sys.executable}
    if not master.startswith("local"):
        conf |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    env = {
        **os.environ,
        "CDC_SPARK__MASTER": master,
        "CDC_SPARK__DRIVER_MEMORY": "2g",
        "CDC_SPARK__CONF": json.dumps(conf),
        "CDC_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cdc.cli", *args], env=env, capture_output=True, text=True, check=False
    )
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"`cdc {' '.join(args)}` on {master} failed:\n{result.stdout}{result.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=500_000, help="records landed by `cdc raw`")
    parser.add_argument("--size", type=int, default=1000, help="approximate value size in bytes")
    parser.add_argument("--changes", type=int, default=300_000, help="Debezium changes refined by `cdc refine`")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each master, alternating (default 1)")
    args = parser.parse_args()

    from cdc.stack.local import stack_for_a_run

    settings = load_settings({"stack": {"spark_cluster": {"enabled": True}}})
    with stack_for_a_run(settings.stack):
        measure(args, settings)


def measure(args: argparse.Namespace, settings: Settings) -> None:
    """Land and refine on each master, and print the times."""
    bootstrap = settings.stack.kafka.bootstrap_servers
    masters = {"local[2]": "local[2]", "cluster (2 workers x 1 core)": settings.stack.spark_cluster.master_url}

    topic = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as scratch:
        spark = build_spark_session(settings.spark)
        produce(spark, bootstrap, topic, args.messages, args.size, partitions=2)
        prepared = raw_table_location(scratch + "/prepared", REFINE_TOPIC)
        create_raw_table(spark, prepared, REFINE_TOPIC)
        append_raw_changes(spark, prepared, args.changes, 0, args.changes)
        spark.stop()
        print(f"{args.messages:,} messages of ~{args.size} B in {topic}; {args.changes:,} changes in a raw table")

        seconds: dict[tuple[str, str], list[float]] = {}
        for round_ in range(1, args.rounds + 1):
            for label, master in masters.items():
                warehouse = f"{scratch}/{uuid.uuid4().hex[:8]}"
                landing = run_cdc(
                    master, bootstrap, "raw", "--topic", topic, "--warehouse", warehouse, "--available-now"
                )
                shutil.copytree(prepared, raw_table_location(warehouse, REFINE_TOPIC))
                refining = run_cdc(
                    master, bootstrap, "refine", "--table", REFINE_TOPIC, "--warehouse", warehouse, "--available-now"
                )
                seconds.setdefault(("raw", label), []).append(landing)
                seconds.setdefault(("refine", label), []).append(refining)
                print(
                    f"round {round_} {label:<28} raw {landing:6.1f} s ({args.messages / landing:>9,.0f} rows/s)   "
                    f"refine {refining:6.1f} s ({args.changes / refining:>9,.0f} changes/s)",
                    flush=True,
                )
    local, cluster = masters
    for job in ("raw", "refine"):
        best_local, best_cluster = min(seconds[(job, local)]), min(seconds[(job, cluster)])
        print(
            f"{job}: best {best_local:.1f} s on {local}, {best_cluster:.1f} s on the cluster, "
            f"cluster / local x{best_cluster / best_local:.2f}"
        )


if __name__ == "__main__":
    main()
