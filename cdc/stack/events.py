"""Reading the Debezium change events that land in Kafka (the demo shows them; tests check them)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from cdc.core.errors import StackError
from cdc.stack.base import KAFKA
from refine.records.envelope import TOMBSTONE, Op


@dataclass(frozen=True)
class ChangeEvent:
    """One Kafka record of a Debezium topic, with its envelope's payload parsed."""

    topic: str
    partition: int
    offset: int
    key: Any
    payload: dict[str, Any] | None
    headers: dict[str, bytes]

    @property
    def op(self) -> str:
        return TOMBSTONE if self.payload is None else self.payload["op"]


def _parse(raw: bytes | None) -> Any:
    if raw is None:
        return None
    document = json.loads(raw)
    # JsonConverter with schemas.enable=true wraps the data as {schema, payload}.
    return document["payload"] if isinstance(document, dict) and "payload" in document else document


def read_events(
    bootstrap_servers: str,
    expected: dict[str, int],
    start: dict[tuple[str, int], int] | None = None,
    timeout_s: float = 60.0,
    skip_snapshot: bool = False,
) -> dict[str, list[ChangeEvent]]:
    """Read at least ``expected[topic]`` records of each topic from ``start`` ((topic, partition) ->
    offset; default: the beginning). With ``skip_snapshot``, snapshot reads (op ``r``) are left out:
    a connector just registered may still be writing its snapshot after ``start``.

    Fails naming the topics that fell short when ``timeout_s`` runs out.
    """
    start = start or {}
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    received: dict[str, list[ChangeEvent]] = {topic: [] for topic in expected}
    try:
        deadline = time.monotonic() + timeout_s
        assigned: set[TopicPartition] = set()
        while any(len(received[topic]) < count for topic, count in expected.items()):
            if time.monotonic() > deadline:
                short = {topic: f"{len(received[topic])}/{count}" for topic, count in expected.items()}
                raise StackError(f"Debezium events missing after {timeout_s:.0f} s: {short}", component=KAFKA)
            # Topics appear when Debezium first writes to them: (re)assign as they do.
            wanted = {
                TopicPartition(topic, partition)
                for topic in expected
                for partition in consumer.partitions_for_topic(topic) or ()
            }
            if wanted != assigned:
                consumer.assign(sorted(wanted))
                for partition in wanted - assigned:
                    consumer.seek(partition, start.get((partition.topic, partition.partition), 0))
                assigned = wanted
            for partition, records in consumer.poll(timeout_ms=500).items():
                events = (
                    ChangeEvent(
                        record.topic,
                        record.partition,
                        record.offset,
                        _parse(record.key),
                        _parse(record.value),
                        dict(record.headers or []),
                    )
                    for record in records
                )
                received[partition.topic].extend(
                    event for event in events if not (skip_snapshot and event.op == Op.READ.value)
                )
        return received
    finally:
        consumer.close()
