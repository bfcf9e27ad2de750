"""What the streaming jobs share."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from cdc.errors import CdcError
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


# The typed error a foreachBatch function raised, by query id: Spark hands the query's failure back as
# text, so the error is kept here (foreachBatch runs in this process) to be raised as it was.
_RAISED_IN_BATCH: dict[str, CdcError] = {}


def keeping_typed_errors(batch: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """``batch`` (a foreachBatch function) keeping the CdcError it raises for :func:`typed_failure`."""

    def run(rows: DataFrame, batch_id: int) -> None:
        try:
            batch(rows, batch_id)
        except CdcError as error:
            _RAISED_IN_BATCH[rows.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")] = error
            raise

    return run


def typed_failure(query: StreamingQuery) -> CdcError | None:
    """The CdcError the query's foreachBatch function stopped it with, if that is how it stopped."""
    return _RAISED_IN_BATCH.pop(str(query.id), None) if failure(query) is not None else None
