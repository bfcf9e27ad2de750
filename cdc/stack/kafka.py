"""Apache Kafka in KRaft mode: one process that is both broker and controller, on 127.0.0.1."""

from __future__ import annotations

import base64
import subprocess
import uuid

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from cdc.core.config import StackConfig
from cdc.core.errors import StackError
from cdc.stack.base import KAFKA
from cdc.stack.component import Component
from cdc.stack.jvm import java_command, properties_text
from cdc.stack.process import port_open


def new_cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64, as `kafka-storage random-uuid` prints.

    Like Kafka's own ``Uuid.randomUuid``, never one that starts with "-": the format command would
    read it as an option and fail (1 time in 64).
    """
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


class KafkaServer(Component):
    name = KAFKA

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config, config.kafka.port)
        self.settings = config.kafka
        self.data_dir = self.home / "data"
        self.properties_file = self.home / "server.properties"

    def server_properties(self) -> dict[str, object]:
        controller = f"127.0.0.1:{self.settings.controller_port}"
        return {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{controller}",
            "listeners": f"PLAINTEXT://{self.address},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.address}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            # A single node: every internal topic has one replica.
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "true",
            "log.retention.check.interval.ms": 10_000,
        }

    def command(self) -> list[str]:
        return java_command("kafka.Kafka", str(self.properties_file), heap=self.settings.heap, home=self.home)

    def is_up(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            admin = KafkaAdminClient(bootstrap_servers=self.settings.bootstrap_servers, request_timeout_ms=3000)
        except KafkaError:
            return False
        try:
            admin.list_topics()
            return True
        except KafkaError:
            return False
        finally:
            admin.close()

    def prepare(self) -> None:
        """Write the broker's settings and format its storage the first time."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(properties_text(self.server_properties()))
        if (self.data_dir / "meta.properties").exists():
            return
        format_command = java_command(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            new_cluster_id(),
            "-c",
            str(self.properties_file),
            heap="256m",
            home=self.home,
        )
        result = subprocess.run(format_command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(
                "formatting Kafka's storage failed",
                component=self.name,
                log_tail=(result.stdout + result.stderr)[-3000:],
            )
