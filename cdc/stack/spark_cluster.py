"""A standalone Spark cluster beside the local stack: one master and its workers, each started with
pyspark's own ``spark-class`` (no Spark distribution to install) and bound to 127.0.0.1.

Each worker starts its executors as child JVMs in its work folder (``<state_dir>/spark-worker-N/work``),
so stopping a worker's process group stops its executors too. Jobs reach the cluster with
``CDC_SPARK__MASTER=spark://127.0.0.1:<master_port>``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from cdc.core.config import StackConfig
from cdc.stack.base import SPARK_MASTER, SPARK_WORKER
from cdc.stack.component import Component
from cdc.stack.process import port_open

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_class() -> str:
    """pyspark's ``spark-class`` launcher (it finds pyspark's jars as its Spark home)."""
    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


# How long the master's web UI may take to answer: on a busy host (a job's executors and drivers on the same
# cores) a running master's page can take seconds; a short timeout reported a running cluster as down.
MASTER_UI_TIMEOUT_S = 15.0


def master_state(ui_port: int, timeout_s: float = MASTER_UI_TIMEOUT_S) -> dict[str, Any] | None:
    """The master's JSON status (its state and workers), or None when it does not answer within ``timeout_s``
    (a port nobody listens on answers at once: starting, which polls this, is not slowed by it)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=timeout_s) as response:
            state: dict[str, Any] = json.load(response)
            return state
    except (OSError, urllib.error.URLError, ValueError):
        return None


class _SparkDaemon(Component):
    """What the master and the workers share: pyspark's launcher, loopback only, a small heap."""

    main_class: str

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def command(self) -> list[str]:
        return [spark_class(), self.main_class, *self.arguments()]

    def env(self) -> dict[str, str]:
        cluster = self.config.spark_cluster
        return {
            # Every server of the daemon (its RPC port, its web UI) on loopback only.
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": cluster.daemon_memory,
            # Spark's own defaults otherwise (a conf folder of the user's Spark installation).
            "SPARK_CONF_DIR": str(self.home / "conf"),
        }

    def prepare(self) -> None:
        (self.home / "conf").mkdir(parents=True, exist_ok=True)


class SparkMaster(_SparkDaemon):
    name = SPARK_MASTER
    main_class = MASTER_CLASS

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config, config.spark_cluster.master_port)

    def arguments(self) -> list[str]:
        cluster = self.config.spark_cluster
        return ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(cluster.master_ui_port)]

    def is_up(self) -> bool:
        if not port_open(self.port):
            return False
        state = master_state(self.config.spark_cluster.master_ui_port)
        return state is not None and state.get("status") == "ALIVE"


class SparkWorker(_SparkDaemon):
    main_class = WORKER_CLASS

    def __init__(self, config: StackConfig, index: int) -> None:
        self.name = f"{SPARK_WORKER}-{index + 1}"
        super().__init__(config, config.spark_cluster.worker_ports_from + 2 * index)
        self.work_dir = self.home / "work"

    def arguments(self) -> list[str]:
        cluster = self.config.spark_cluster
        return [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.port + 1),
            "--cores",
            str(cluster.worker_cores),
            "--memory",
            cluster.worker_memory,
            "--work-dir",
            str(self.work_dir),
            cluster.master_url,
        ]

    def is_up(self) -> bool:
        """Up once the master lists this worker as alive (it registered and takes executors)."""
        state = master_state(self.config.spark_cluster.master_ui_port) if port_open(self.port) else None
        return state is not None and any(
            worker.get("host") == "127.0.0.1" and worker.get("port") == self.port and worker.get("state") == "ALIVE"
            for worker in state.get("workers", [])
        )

    def executor_pids(self) -> list[int]:
        """The pids of the executor JVMs this worker runs now (CoarseGrainedExecutorBackend, in its work folder)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                command = (proc / "cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in command and Path(cwd).is_relative_to(
                self.work_dir
            ):
                pids.append(int(proc.name))
        return sorted(pids)


class SparkCluster:
    """The master and its workers, started and stopped together (workers after the master, before it)."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.master = SparkMaster(config)
        self.workers = [SparkWorker(config, index) for index in range(config.spark_cluster.workers)]

    @property
    def master_url(self) -> str:
        return self.config.spark_cluster.master_url

    @property
    def components(self) -> list[Component]:
        return [self.master, *self.workers]
