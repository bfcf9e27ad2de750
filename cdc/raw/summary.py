"""What a landing run landed of each topic."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicSummary:
    """What one run landed of one topic: its raw table, the records appended and the micro-batches.

    Example::

        for summary in run_raw_job(spark, config):  # or Lakehouse(...).land([...])
            print(f"{summary.topic}: {summary.rows} records in {summary.batches} batches -> {summary.table}")
    """

    topic: str
    table: str
    rows: int
    batches: int
