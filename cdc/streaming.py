"""What the streaming jobs share."""

from __future__ import annotations

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from cdc.raw.config import AvailableNow, Continuous, Trigger
from cdc.source import redact


def with_trigger(writer: DataStreamWriter, trigger: Trigger) -> DataStreamWriter:
    """``writer`` set to run once over what is there, or every ``interval_s`` seconds."""
    match trigger:
        case AvailableNow():
            return writer.trigger(availableNow=True)
        case Continuous(interval_s=interval_s):
            return writer.trigger(processingTime=f"{interval_s} seconds")
    raise AssertionError(f"unknown trigger {trigger!r}")


def failure(query: StreamingQuery, secrets: list[str] | None = None) -> str | None:
    """The error a query stopped on, with ``secrets`` redacted; None while it has none."""
    try:
        error = query.exception()
    except StreamingQueryException as raised:  # some versions raise instead of returning it
        error = raised
    if error is None:
        return None
    message = redact(str(getattr(error, "desc", None) or error), secrets or []).strip()
    return message or type(error).__name__
