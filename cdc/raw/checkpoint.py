"""What a raw table's streaming checkpoint says about Kafka offsets.

Spark writes ``offsets/<batch>`` before a micro-batch runs (a version line, a metadata line, then
one JSON line per source: ``{"topic": {"partition": next offset}}``) and ``commits/<batch>`` once
the batch's output is committed. The offsets of the newest committed batch are where the next run
starts reading.
"""

from __future__ import annotations

import json

from cdc.core.storage import Storage

Offsets = dict[tuple[str, int], int]  # (topic, partition) -> the next offset to read


def batch_end_offsets(storage: Storage, checkpoint: str, batch_id: int) -> Offsets:
    """Where micro-batch ``batch_id`` stops reading (exclusive), per partition."""
    text = storage.read_text(f"{checkpoint}/offsets/{batch_id}")
    source = json.loads(text.splitlines()[-1])
    return {
        (topic, int(partition)): offset
        for topic, partitions in source.items()
        for partition, offset in partitions.items()
    }


def committed_offsets(storage: Storage, checkpoint: str) -> Offsets:
    """The next offset to read per partition after the last committed batch ({} before the first)."""
    batches = [int(name) for name in storage.list_names(f"{checkpoint}/commits") if name.isdigit()]
    return batch_end_offsets(storage, checkpoint, max(batches)) if batches else {}
