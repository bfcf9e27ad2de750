"""What the streaming jobs share."""

from __future__ import annotations

from pyspark.sql.streaming import DataStreamWriter

from cdc.raw.config import AvailableNow, Continuous, Trigger


def with_trigger(writer: DataStreamWriter, trigger: Trigger) -> DataStreamWriter:
    """``writer`` set to run once over what is there, or every ``interval_s`` seconds."""
    match trigger:
        case AvailableNow():
            return writer.trigger(availableNow=True)
        case Continuous(interval_s=interval_s):
            return writer.trigger(processingTime=f"{interval_s} seconds")
    raise AssertionError(f"unknown trigger {trigger!r}")
