"""Soak: the random workload of the differential test, refined by a continuous `cdc sync` while
`cdc sync`, Kafka and Kafka Connect are killed (SIGKILL) at random moments, then compared with Postgres.

    .venv/bin/python bench/soak.py [--minutes 10] [--seed N] [--fault-every 40] [--keep]

Brings the local stack up, and down at the end (a stack already running is used and left running;
its ports come from the usual CDC_STACK__... settings), creates the workload's three tables
(cdc/stack/random_workload.py: keyed with a child table and history, composite key with history,
keyless; TOASTed columns), registers a Debezium connector of its own for them, and starts `cdc sync
--pipeline` (continuous) on a warehouse of its own. For MINUTES it commits random transactions
(key changes and chains of them, deletes and re-inserts, truncates, ADD COLUMN, a transaction held
open while others commit); every ~FAULT_EVERY seconds (at random, exponentially distributed) it
kills one of `cdc sync`, Kafka or Kafka Connect with SIGKILL and starts it again (Connect's failed
tasks are restarted as an operator would). At the end it waits until every change is in Kafka,
stops the continuous job, runs `cdc sync --available-now` once so that everything is refined, and
compares the refined tables, the history's current versions and the child table with Postgres.

Prints a summary: transactions and changes, faults by kind, rows compared, mismatches (with
samples), and the seed (``--seed`` replays the same statements; the faults' moments differ from run
to run, as timing does). Exits 1 when a table disagrees. ``--keep`` keeps the warehouse and logs.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from cdc.core.config import Settings, load_settings
from cdc.core.errors import CdcError
from cdc.core.session import build_spark_session
from cdc.stack.local import LocalStack, stack_for_a_run
from cdc.stack.process import port_open
from cdc.stack.random_workload import SCHEMA, RandomTables, RandomWorkload, compare, wait_for_marks
from connectors import definitions
from connectors.client import ConnectClient

PIPELINE = """name: soak
sources:
  keyed: {{kind: debezium_postgres, topic: {keyed_topic}}}
  pair: {{kind: debezium_postgres, topic: {pair_topic}}}
  bag: {{kind: debezium_postgres, topic: {bag_topic}}}
refined:
  {keyed}: {{source: keyed, explode: [tags], scd: 2}}
  {pair}: {{source: pair, scd: 2}}
  {bag}: {{source: bag}}
"""


def start_sync(pipeline: Path, warehouse: str, bootstrap_servers: str, log: Path, *more: str) -> subprocess.Popen:
    """`cdc sync` of this checkout, in a process group of its own (its Spark JVM included)."""
    root = str(Path(__file__).resolve().parents[1])
    command = [
        sys.executable,
        "-P",
        "-c",
        "import sys; from cdc.cli import main; sys.exit(main())",
        "sync",
        "--pipeline",
        str(pipeline),
        "--warehouse",
        warehouse,
        *more,
    ]
    env = {**os.environ, "PYTHONPATH": root, "CDC_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers}
    with log.open("a") as out:
        out.write(f"{RUN_STARTS} {' '.join(more)}\n")  # where this run's lines begin (runs_refined reads them)
    return subprocess.Popen(command, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


RUN_STARTS = "soak: cdc sync started"


def runs_refined(log: Path, tables: Sequence[str]) -> list[dict[str, int]]:
    """For each continuous run of `cdc sync` in ``log``, the refine batches it reported per table."""
    runs: list[dict[str, int]] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(RUN_STARTS):
            runs.append(dict.fromkeys(tables, 0) if "--trigger-interval" in line else {})
        elif runs and runs[-1] and (found := re.match(r"refine (\S+) batch \d+: ", line)) and found[1] in runs[-1]:
            runs[-1][found[1]] += 1
    return [run for run in runs if run]


def kill_group(process: subprocess.Popen, signal_number: int = signal.SIGKILL) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal_number)
    process.wait()


def restart_failed_tasks(client: ConnectClient, name: str, timeout_s: float = 180) -> None:
    """Wait until the connector runs again, restarting it and its tasks while they have failed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = client.status(name)
        except Exception:  # noqa: BLE001 - the worker is still starting
            time.sleep(1)
            continue
        states = [status["connector"]["state"]] + [task["state"] for task in status.get("tasks", [])]
        if "FAILED" in states:
            client._request("POST", f"/connectors/{name}/restart?includeTasks=true&onlyFailed=true")
        elif states[1:] and all(state == "RUNNING" for state in states):
            return
        time.sleep(1)
    raise SystemExit(f"connector {name} did not run again within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the workload and the faults go on")
    parser.add_argument("--seed", type=int, help="the workload's seed (default: a fresh one, printed)")
    parser.add_argument("--fault-every", type=float, default=40.0, help="mean seconds between faults")
    parser.add_argument("--keep", action="store_true", help="keep the warehouse and the job's log")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"soak: seed {seed}", flush=True)
    settings = load_settings()
    with stack_for_a_run(settings.stack) as stack:
        return soak(args, settings, stack, seed)


def soak(args: argparse.Namespace, settings: Settings, stack: LocalStack, seed: int) -> int:
    rng, faults_rng = random.Random(seed), random.Random()
    name = f"soak{uuid.uuid4().hex[:8]}"
    dsn, bootstrap = settings.stack.postgres.dsn(), settings.stack.kafka.bootstrap_servers
    tables = RandomTables(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        tables.create(conn)
    connector = definitions.postgres_named(
        name, table_include_list=",".join(f"{SCHEMA}.{table}" for table in tables.names)
    )
    client = ConnectClient(settings.stack.connect.url)
    client.register(connector)
    client.wait_running(name)
    topics = [tables.topic(name, table) for table in tables.names]
    warehouse = tempfile.mkdtemp(prefix="soak-")
    log = Path(warehouse) / "sync.log"
    pipeline = Path(warehouse) / "soak.yaml"
    pipeline.write_text(
        PIPELINE.format(
            keyed=tables.keyed,
            pair=tables.pair,
            bag=tables.bag,
            keyed_topic=topics[0],
            pair_topic=topics[1],
            bag_topic=topics[2],
        )
    )
    workload = RandomWorkload(dsn, tables, rng)
    faults: Counter[str] = Counter()
    kafka, connect = (next(c for c in stack.components if c.name == part) for part in ("kafka", "connect"))
    status = 1
    try:
        wait_for_marks(bootstrap, topics, workload.mark())  # the topics exist
        sync = start_sync(pipeline, warehouse, bootstrap, log, "--trigger-interval", "1")
        lifetimes, started = [], time.monotonic()
        end = time.monotonic() + args.minutes * 60
        next_fault = time.monotonic() + faults_rng.expovariate(1 / args.fault_every)
        while time.monotonic() < end:
            workload.transaction()
            time.sleep(faults_rng.uniform(0, 0.3))  # the workload's pace
            if sync.poll() is not None:  # it stopped by itself (Kafka gone too long, say): started again
                faults["cdc sync stopped by itself"] += 1
                lifetimes.append(time.monotonic() - started)
                started = time.monotonic()
                sync = start_sync(pipeline, warehouse, bootstrap, log, "--trigger-interval", "1")
            if time.monotonic() < next_fault:
                continue
            victim = faults_rng.choice(["cdc sync", "kafka", "kafka connect"])
            faults[victim] += 1
            print(f"soak: {workload.counts.transactions} transactions; kill -9 {victim}", flush=True)
            if victim == "cdc sync":
                kill_group(sync)
                lifetimes.append(time.monotonic() - started)
                sync = start_sync(pipeline, warehouse, bootstrap, log, "--trigger-interval", "1")
                started = time.monotonic()
            else:
                component = kafka if victim == "kafka" else connect
                pid = component.status().pid
                assert pid is not None, f"{victim} is not running"
                os.killpg(pid, signal.SIGKILL)
                while component.status().pid is not None:
                    time.sleep(0.1)
                try:
                    os.waitpid(pid, os.WNOHANG)  # our child when this run started the stack
                except ChildProcessError:
                    pass
                # A killed JVM's memory is torn down before its sockets close: its port can still answer.
                deadline = time.monotonic() + 60
                while port_open(component.port) and time.monotonic() < deadline:
                    time.sleep(0.1)
                component.start()
                restart_failed_tasks(client, name)
            next_fault = time.monotonic() + faults_rng.expovariate(1 / args.fault_every)
        while workload.held_for:
            workload.transaction()
        restart_failed_tasks(client, name)
        wait_for_marks(bootstrap, topics, workload.mark(), timeout_s=600)
        kill_group(sync, signal.SIGTERM)
        lifetimes.append(time.monotonic() - started)
        once = start_sync(pipeline, warehouse, bootstrap, log, "--available-now")
        if once.wait() != 0:
            print(f"soak: the last `cdc sync --available-now` failed (exit {once.returncode}); log: {log}")
            args.keep = True
            return 1
        spark = build_spark_session(settings.spark)
        results = compare(spark, dsn, tables, warehouse, {table: table for table in tables.names})
        spark.stop()
        mismatches = sum(result.mismatches for result in results)
        print(
            f"soak: seed {seed}; {workload.counts.transactions} transactions, {workload.counts.changes} changed rows "
            f"({', '.join(f'{kind} {count}' for kind, count in sorted(workload.counts.statements.items()))})"
        )
        fault_counts = ", ".join(f"{kind} {count}" for kind, count in faults.items()) or "none"
        print(f"soak: faults: {sum(faults.values())} ({fault_counts})")
        print(
            f"soak: rows compared: {sum(result.rows for result in results)} "
            f"({', '.join(f'{result.name} {result.rows}' for result in results)})"
        )
        refined = runs_refined(log, tables.names)
        print(
            f"soak: continuous runs of cdc sync: {len(refined)}; refine batches each (seconds it lived): "
            + "; ".join(f"{sum(run.values())} ({lived:.0f} s)" for run, lived in zip(refined, lifetimes, strict=False))
            + f"; runs that refined none of the tables: {sum(1 for run in refined if not any(run.values()))}"
        )
        print(f"soak: mismatches: {mismatches}")
        for result in results:
            if result.mismatches:
                print(result.describe())
        status = 1 if mismatches else 0
        return status
    finally:
        workload.close()
        for process in [locals().get("sync"), locals().get("once")]:
            if process is not None and process.poll() is None:
                kill_group(process)
        try:  # a failed cleanup is said, not raised: it would hide what stopped the soak
            client.delete(name)
            restart_deadline = time.monotonic() + 60
            with psycopg.connect(dsn, autocommit=True) as conn:
                while conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)
                ).fetchone() == (True,):
                    if time.monotonic() > restart_deadline:
                        break
                    time.sleep(0.5)
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,)
                )
                conn.execute(f'DROP PUBLICATION IF EXISTS "{name}"')
                tables.drop(conn)
        except (CdcError, psycopg.Error) as error:
            print(f"soak: cleanup failed: {error}", flush=True)
        finally:
            if args.keep or status:
                print(f"soak: warehouse and log kept in {warehouse}")
            else:
                shutil.rmtree(warehouse, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
