"""What every stack backend (local processes, Docker Compose) offers and reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from cdc.core.config import StackConfig

# Component names, in start order; `down` stops them in reverse.
POSTGRES = "postgres"
KAFKA = "kafka"
CONNECT = "connect"
OBJECT_STORE = "s3"
COMPONENTS = (POSTGRES, KAFKA, CONNECT, OBJECT_STORE)
# The optional standalone Spark cluster (cdc/stack/spark_cluster.py): its master, and its workers "spark-worker-N".
SPARK_MASTER = "spark-master"
SPARK_WORKER = "spark-worker"


@dataclass(frozen=True)
class ComponentStatus:
    """One component as `cdc stack status` reports it."""

    name: str
    address: str
    up: bool
    pid: int | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Stack(Protocol):
    """A running CDC stack: Postgres, Kafka and Kafka Connect with Debezium, reachable on 127.0.0.1."""

    config: StackConfig

    def up(self) -> list[ComponentStatus]:
        """Start what is not running; return once every component answers. Idempotent."""
        ...

    def down(self) -> None:
        """Stop every component; no process is left behind."""
        ...

    def status(self) -> list[ComponentStatus]:
        """Each component, up or down, with its address."""
        ...
