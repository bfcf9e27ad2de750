"""The local stack: Postgres, Kafka, Kafka Connect and an S3 object store as real processes on 127.0.0.1,
and, when enabled, a standalone Spark cluster (cdc/stack/spark_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cdc.core.config import StackConfig
from cdc.stack.base import ComponentStatus
from cdc.stack.component import Component
from cdc.stack.connect import ConnectWorker
from cdc.stack.kafka import KafkaServer
from cdc.stack.object_store import ObjectStoreServer
from cdc.stack.postgres import PostgresServer
from cdc.stack.spark_cluster import SparkCluster


class LocalStack:
    """Every component a process supervised through pid files under ``config.state_dir``."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.components: list[Component] = [
            PostgresServer(config),
            KafkaServer(config),
            ConnectWorker(config),
            ObjectStoreServer(config),
        ]
        self.spark_cluster = SparkCluster(config)

    def _started(self) -> list[Component]:
        """The components `up` starts: the cluster's only when it is enabled."""
        return self.components + (self.spark_cluster.components if self.config.spark_cluster.enabled else [])

    def up(self) -> list[ComponentStatus]:
        for component in self._started():
            component.start()
        return self.status()

    def down(self) -> None:
        # The cluster too when it runs though not enabled now (started by `up --spark-cluster`).
        for component in reversed(self.components + self.spark_cluster.components):
            component.stop()

    def status(self) -> list[ComponentStatus]:
        shown = self._started() + [
            component
            for component in self.spark_cluster.components
            if component not in self._started() and component.process.pid() is not None
        ]
        return [component.status() for component in shown]


@contextmanager
def stack_for_a_run(config: StackConfig) -> Iterator[LocalStack]:
    """The local stack up for the block (a bench, a script); stopped afterwards, unless all of it was
    running before, which is left running.

    Example::

        with stack_for_a_run(load_settings().stack) as stack:
            print(stack.config.kafka.bootstrap_servers)
    """
    stack = LocalStack(config)
    was_running = all(component.up for component in stack.status())
    stack.up()
    try:
        yield stack
    finally:
        if not was_running:
            stack.down()
