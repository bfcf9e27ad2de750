"""`cdc raw` and `cdc refine` (with a business table) on the stack's standalone Spark cluster: a driver of
their own (a `cdc` process, as the suite's session is local), executors in the workers' JVMs, the jars
shipped to them by the driver.

The warehouse is on the stack's S3 server (s3a://): the executors read and write the tables there, nothing
through the driver's disk; the tables are read back with delta-rs from the S3 server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from cdc.core import jars
from cdc.stack.local import LocalStack
from cdc.stack.spark_cluster import SparkWorker

ORDERS = 6_000  # several raw batches of 1,500 records, each a task that an executor runs


def cluster_env(cluster, kafka) -> dict[str, str]:
    """A `cdc` job's environment: its session on the cluster's master, executors small enough for the workers."""
    conf = {
        # The executors' Python workers use this interpreter (the project's venv); on a real cluster, an
        # interpreter of the workers' own with the package installed.
        "spark.pyspark.python": sys.executable,
        "spark.executor.memory": "768m",
        # The driver's own servers (block manager, file server) on loopback, where the executors reach them.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # Drivers and executors that live a minute or two: the C1 compiler alone (C2 compiles for long runs,
        # on the cores the job needs now). The executor-kill test alone: 300 s instead of 359 s (one run each).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }
    return {
        **os.environ,
        "CDC_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "CDC_SPARK__MASTER": cluster.master_url,
        "CDC_SPARK__DRIVER_MEMORY": "1g",
        "CDC_SPARK__SHUFFLE_PARTITIONS": "2",
        "CDC_SPARK__CONF": json.dumps(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def run_cdc(env: dict[str, str], *args: str) -> str:
    """Run a `cdc` command to its end; fail with its output unless it exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "cdc.cli", *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


# The last change of each workload: once it is in Kafka, every change before it is too.
MARKER = (-1, -1)


def insert_orders(dsn: str, count: int) -> None:
    """``count`` orders inserted, a tenth updated, a seventh deleted; then the marker order."""
    with psycopg.connect(dsn) as conn:
        conn.execute("DELETE FROM shop.orders")
        conn.execute(
            "INSERT INTO shop.orders SELECT mod(n, 97), n, 'paid', n / 100.0, "
            "timestamp '2026-01-01' + n * interval '1 s' FROM generate_series(1, %s) AS n",
            (count,),
        )
        conn.execute("UPDATE shop.orders SET status = 'shipped' WHERE order_no % 10 = 0")
        conn.execute("DELETE FROM shop.orders WHERE order_no % 7 = 0")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO shop.orders VALUES (%s, %s, 'pending', 0, '2026-01-01')", MARKER)


def wait_for_marker(bootstrap_servers: str, topic: str, timeout_s: float = 240) -> None:
    """Poll until the topic's last record is the marker order's insert (reading only the last record)."""
    from kafka import KafkaConsumer, TopicPartition

    marker = f'"customer_id":{MARKER[0]},"order_no":{MARKER[1]}'.encode()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            if partitions:
                ends = consumer.end_offsets(partitions)
                consumer.assign(partitions)
                for partition in partitions:
                    consumer.seek(partition, max(ends[partition] - 1, 0))
                last = [r.value or b"" for records in consumer.poll(timeout_ms=1000).values() for r in records]
                if any(marker in value for value in last):
                    return
            assert time.monotonic() < deadline, f"the marker order did not reach {topic}"
            time.sleep(0.5)
    finally:
        consumer.close()


def assert_each_offset_landed_once(read_s3_table, warehouse: str, topic: str, kafka) -> None:
    from cdc.core.tables import raw_table_location

    raw = read_s3_table(raw_table_location(warehouse, topic))
    landed = sorted((row.partition, row.offset) for row in raw.select("partition", "offset").collect())
    assert landed == [(partition, offset) for _, partition, offset, *_ in kafka.records(topic)]


_RUNNING = re.compile(r"Running task \S+ in stage \S+ \(TID (\d+)\)")
_ENDED = re.compile(r"(?:Finished task|Exception in task|Executor killed task) \S+ in stage \S+ \(TID (\d+)\)")


class ExecutorLog:
    """An executor's log (its ``stderr``), read from where the last read ended: the tasks it shows started
    and not ended."""

    def __init__(self, pid: int) -> None:
        self.path = Path(os.readlink(f"/proc/{pid}/cwd")) / "stderr"
        self.offset, self.pending = 0, ""
        self.started: set[int] = set()
        self.ended: set[int] = set()

    def tasks_running(self) -> set[int]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            added = log.read()
        self.offset += len(added)
        lines = (self.pending + added.decode(errors="replace")).split("\n")
        self.pending = lines.pop()  # a line still being written
        text = "\n".join(lines)
        self.started |= {int(tid) for tid in _RUNNING.findall(text)}
        self.ended |= {int(tid) for tid in _ENDED.findall(text)}
        return self.started - self.ended


def kill_an_executor_mid_task(workers: list[SparkWorker], job: subprocess.Popen, timeout_s: float = 300) -> int:
    """SIGKILL the first executor seen running a task of ``job``'s application; return that task's id.

    Executors are looked for every half second (a scan of /proc), their logs read every 10 ms (a task
    may take less than 0.1 s): the loop takes little CPU from the job it waits for on two cores."""
    deadline = time.monotonic() + timeout_s
    logs: dict[int, ExecutorLog] = {}
    next_scan = 0.0
    while time.monotonic() < deadline:
        assert job.poll() is None, "the job ended before an executor could be killed mid-task"
        if time.monotonic() >= next_scan:
            for pid in {pid for worker in workers for pid in worker.executor_pids()} - logs.keys():
                with contextlib.suppress(OSError):  # it just ended
                    logs[pid] = ExecutorLog(pid)
            next_scan = time.monotonic() + 0.5
        for pid, log in list(logs.items()):
            try:
                running = log.tasks_running()
            except OSError:
                del logs[pid]  # it ended
                continue
            if running:
                os.kill(pid, signal.SIGKILL)
                return min(running)
        time.sleep(0.01)
    raise AssertionError("no executor ran a task of the job within the timeout")


def test_stack_up_with_the_spark_cluster_keeps_the_running_processes(
    stack, spark_cluster, stack_config, monkeypatch, capsys
):
    from cdc.cli import main

    cluster = stack_config.spark_cluster
    for name, value in {
        "STATE_DIR": stack_config.state_dir,
        "POSTGRES__PORT": stack_config.postgres.port,
        "KAFKA__PORT": stack_config.kafka.port,
        "CONNECT__PORT": stack_config.connect.port,
        "OBJECT_STORE__PORT": stack_config.object_store.port,
        "SPARK_CLUSTER__MASTER_PORT": cluster.master_port,
        "SPARK_CLUSTER__MASTER_UI_PORT": cluster.master_ui_port,
        "SPARK_CLUSTER__WORKER_PORTS_FROM": cluster.worker_ports_from,
    }.items():
        monkeypatch.setenv(f"CDC_STACK__{name}", str(value))
    running = {status.name: status.pid for status in LocalStack(stack_config).status()}
    assert main(["stack", "up", "--spark-cluster", "--json"]) == 0
    components = json.loads(capsys.readouterr().out)["components"]
    assert {c["name"]: c["pid"] for c in components} == running
    assert [(c["name"], c["up"], c["address"]) for c in components][4:] == [
        ("spark-master", True, f"127.0.0.1:{cluster.master_port}"),
        ("spark-worker-1", True, f"127.0.0.1:{cluster.worker_ports_from}"),
        ("spark-worker-2", True, f"127.0.0.1:{cluster.worker_ports_from + 2}"),
    ]


def assert_task_lost_and_run_again(event_log_dir: Path, task_id: int) -> None:
    """The driver's event log (Spark's own record) shows task ``task_id`` ended by its executor's loss, and
    another attempt of the same task of the same stage succeeding."""
    files = sorted(event_log_dir.rglob("events_*"))  # Spark 4's rolling event log: eventlog_v2_<app>/events_<n>_<app>
    events = [json.loads(line) for file in files for line in file.read_text().splitlines()]
    ends = [e for e in events if e["Event"] == "SparkListenerTaskEnd"]
    [lost] = [e for e in ends if e["Task Info"]["Task ID"] == task_id]
    assert lost["Task End Reason"]["Reason"] == "ExecutorLostFailure", lost["Task End Reason"]
    assert any(
        e["Stage ID"] == lost["Stage ID"]
        and e["Task Info"]["Index"] == lost["Task Info"]["Index"]
        and e["Task End Reason"]["Reason"] == "Success"
        for e in ends
    ), f"task {task_id} was not run again"


def test_raw_and_refine_on_the_cluster_survive_an_executor_killed_mid_batch(
    spark_cluster, kafka, stack_config, postgres_connector, orders_pipeline, s3_warehouse, read_s3_table, tmp_path
):
    """Each job runs on the cluster while one of its executors is killed (SIGKILL) in the middle of a task:
    the driver runs the task again on an executor, the job ends well, and a rerun of refine changes nothing. Each
    Kafka offset is landed once, the refined table equals Postgres, and so does the business table on it
    (refreshed on the cluster by the pipeline's refine)."""
    dsn = stack_config.postgres.dsn()
    insert_orders(dsn, ORDERS)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    wait_for_marker(kafka.bootstrap_servers, topic)
    warehouse, s3_env, stored = s3_warehouse
    env = {**cluster_env(spark_cluster, kafka), **s3_env}
    common = ["--available-now"]
    jobs = {
        "raw": ["raw", "--topic", topic, "--max-offsets-per-trigger", "1500", *common],
        "refine": ["refine", "--pipeline", str(orders_pipeline.write(tmp_path / "p.yaml", "cluster", topic)), *common],
    }
    for name, args in jobs.items():
        event_log_dir = tmp_path / f"events-{name}"
        event_log_dir.mkdir()
        conf = {
            **json.loads(env["CDC_SPARK__CONF"]),
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": event_log_dir.as_uri(),
            "spark.eventLog.compress": "false",
        }
        job = subprocess.Popen(
            [sys.executable, "-m", "cdc.cli", *args],
            env={**env, "CDC_SPARK__CONF": json.dumps(conf)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        printed: list[str] = []
        reader = threading.Thread(target=lambda job=job: printed.extend(job.stdout), daemon=True)
        reader.start()
        try:
            killed_task = kill_an_executor_mid_task(spark_cluster.workers, job)
            job.wait(timeout=600)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        reader.join(timeout=30)
        output = "".join(printed)
        # The driver saw the task lost with its executor, and ran it again: the job ends well.
        assert job.returncode == 0, f"{name}: {output}"
        assert_task_lost_and_run_again(event_log_dir, killed_task)
    # A rerun changes nothing (raw's reruns on S3: tests/cdc/core/test_object_store.py). The driver's log
    # lines go to its log file on a cluster's master too: the job's own lines alone.
    rerun = run_cdc(env, *jobs["refine"])
    spark_lines = [line for line in rerun.splitlines() if re.search(r"\b(WARN|INFO)\b|log4j|setLogLevel", line)]
    assert not spark_lines, spark_lines
    assert_each_offset_landed_once(read_s3_table, warehouse, topic, kafka)
    orders_pipeline.assert_equal_to_postgres(warehouse)
    assert {path.name for path in stored.iterdir()} >= {"raw", "refined", "business", "_cdc"}  # all on S3

    # The work ran in both workers' executors, which fetched the project's JVM helpers from the driver.
    executor_dirs = [d for worker in spark_cluster.workers for d in worker.work_dir.glob("app-*/*") if d.is_dir()]
    assert {d.parent.parent for d in executor_dirs} == {worker.work_dir for worker in spark_cluster.workers}
    assert any((d / jars.HELPERS_JAR).exists() for d in executor_dirs)
    # `cdc stack status` shows the running cluster, though the stack's settings do not enable it.
    statuses = {status.name: status.up for status in LocalStack(stack_config).status()}
    assert [statuses.get(name) for name in ("spark-master", "spark-worker-1", "spark-worker-2")] == [True] * 3
