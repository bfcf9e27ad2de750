"""The local stack: Postgres, Kafka, Kafka Connect and an S3 object store as real processes on 127.0.0.1."""

from __future__ import annotations

from cdc.core.config import StackConfig
from cdc.stack.base import ComponentStatus
from cdc.stack.component import Component
from cdc.stack.connect import ConnectWorker
from cdc.stack.kafka import KafkaServer
from cdc.stack.object_store import ObjectStoreServer
from cdc.stack.postgres import PostgresServer


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

    def up(self) -> list[ComponentStatus]:
        for component in self.components:
            component.start()
        return self.status()

    def down(self) -> None:
        for component in reversed(self.components):
            component.stop()

    def status(self) -> list[ComponentStatus]:
        return [component.status() for component in self.components]
