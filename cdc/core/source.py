"""Kafka as the source: connection settings (with secrets), topic discovery and offsets.

Secrets (SASL password, key and trust store passwords) are pydantic ``SecretStr``: they print as
``**********`` and reach only the Kafka clients. :func:`redact` scrubs them from any error text
before it is shown.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError
from pydantic import ValidationError

from cdc.core.config import KafkaConnection
from cdc.core.errors import SourceError
from cdc.core.secrets import invalid_secrets, read_secrets_file


def load_secrets_file(path: Path) -> dict[str, Any]:
    """Kafka settings from a YAML or JSON file (keys as in :class:`KafkaConnection`)."""
    document = read_secrets_file(path, "Kafka")
    try:
        KafkaConnection.model_validate(document)
    except ValidationError as error:
        raise invalid_secrets(path, "Kafka", error) from None
    return document


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "**********")
    return text


class PartitionOffsets(NamedTuple):
    earliest: int  # the oldest offset Kafka still holds
    end: int  # the offset the next record will get


class KafkaTopics:
    """Topic metadata and offsets, read on the driver (metadata only, never records)."""

    def __init__(self, connection: KafkaConnection) -> None:
        self.connection = connection

    @contextmanager
    def _consumer(self) -> Iterator[KafkaConsumer]:
        try:
            consumer = KafkaConsumer(**self.connection.client_options(), bootstrap_timeout_ms=10000)
        except KafkaTimeoutError:
            raise self._unanswered() from None
        except KafkaError as error:
            raise SourceError(
                f"cannot connect to Kafka: {type(error).__name__}", bootstrap_servers=self.connection.bootstrap_servers
            ) from None
        try:
            yield consumer
        finally:
            consumer.close()

    def _unanswered(self) -> SourceError:
        """Why the client got no answer: no broker listens, or one listens and the handshake failed."""
        servers = self.connection.bootstrap_servers
        listening = [server for server in servers.split(",") if _accepts_connections(server.strip())]
        if not listening:
            return SourceError("no Kafka broker answers", bootstrap_servers=servers)
        return SourceError(
            f"a Kafka broker accepts connections at {listening[0]} but the client's handshake with "
            f"security_protocol={self.connection.security_protocol.value} got no answer: check the security "
            "protocol, the SASL mechanism and credentials, and the TLS settings against the broker's listener",
            bootstrap_servers=servers,
        )

    def names(self) -> set[str]:
        with self._consumer() as consumer:
            return {topic for topic in consumer.topics() if not topic.startswith("__")}

    def matching(self, pattern: str) -> list[str]:
        """Topics whose whole name matches ``pattern`` (internal ``__`` topics excluded)."""
        regex = re.compile(pattern)
        return sorted(topic for topic in self.names() if regex.fullmatch(topic))

    def require(self, topics: list[str]) -> None:
        """Fail naming the first topic that does not exist."""
        existing = self.names()
        for topic in topics:
            if topic not in existing:
                raise SourceError("unknown topic", topic=topic, bootstrap_servers=self.connection.bootstrap_servers)

    def offsets(self, topics: list[str]) -> dict[tuple[str, int], PartitionOffsets]:
        """Earliest and end offset of every partition of ``topics``, by (topic, partition)."""
        with self._consumer() as consumer:
            partitions = [
                TopicPartition(topic, partition)
                for topic in topics
                for partition in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            earliest = consumer.beginning_offsets(partitions)
            end = consumer.end_offsets(partitions)
        return {(tp.topic, tp.partition): PartitionOffsets(earliest[tp], end[tp]) for tp in partitions}


def _accepts_connections(server: str, timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens (a listener is there, whatever it speaks)."""
    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False
