"""What the streaming jobs share."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from cdc.core.config import AvailableNow, Continuous, Trigger
from cdc.core.errors import CdcError, StreamError
from cdc.core.functions import quiet_console_logs
from cdc.core.source import redact


class ProgressLine(str):
    """A job's line about a micro-batch, which the job's next one of the same kind makes old: on a
    terminal the CLI draws each over the last (:class:`cdc.cli.common.TerminalLines`); elsewhere it is
    an ordinary line."""


@contextmanager
def counting_spark_jobs(spark: SparkSession, counts: dict[int, int], batch_id: int) -> Iterator[None]:
    """Add to ``counts[batch_id]`` the Spark jobs run inside the block by the calling thread's job group: in a
    streaming query's micro-batch function, the query's run (Spark names the group after its run id). Nothing
    is counted outside a job group. The status store keeps the last jobs only (``spark.ui.retainedJobs``),
    enough for one batch."""
    tracker = spark.sparkContext.statusTracker()
    group = spark.sparkContext.getLocalProperty("spark.jobGroup.id")
    before = set(tracker.getJobIdsForGroup(group)) if group else set()
    try:
        yield
    finally:
        if group:
            counts[batch_id] = counts.get(batch_id, 0) + len(set(tracker.getJobIdsForGroup(group)) - before)


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


def batch_error(error: Exception, table: str, batch_id: int) -> CdcError:
    """What a micro-batch's failure reaches the user as, in one line: a :class:`CdcError` as itself, with
    the batch; anything else (a Spark AnalysisException, a pydantic ValidationError, a bug) as a
    :class:`StreamError` naming its type, the first meaningful line of its message, the table and the
    batch. The original stays its cause, for the traceback under ``--debug``. (Raised from the batch,
    it would reach the driver as "An exception was raised by the Python Proxy", its cause buried.)"""
    if isinstance(error, CdcError):
        error.context.setdefault("batch", batch_id)
        return error
    wrapped = StreamError(f"a refine batch failed: {error_summary(error)}", table=table, batch=batch_id)
    wrapped.__cause__ = error
    return wrapped


def error_summary(error: BaseException) -> str:
    """``<type>: <first meaningful line of its message>`` (a Java exception's own class and message)."""
    from pydantic import ValidationError

    name, message = type(error).__name__, str(error)
    if isinstance(error, ValidationError) and error.errors():
        first = error.errors()[0]
        place = ".".join(str(part) for part in first["loc"])
        message = f"{error.title}: {place + ': ' if place else ''}{first['msg']}"
    elif isinstance(error, Py4JJavaError):
        try:
            java = error.java_exception
            name, message = java.getClass().getName(), java.getMessage() or ""
        except Py4JError:  # the JVM is gone: py4j's own text
            pass
    lines = [line.strip() for line in message.splitlines()]
    line = next(
        (line for line in lines if line and not line.startswith(("Traceback", "An error occurred while calling"))), ""
    )
    return f"{name}: {line}" if line else name


@contextmanager
def ending_on_request(stop: threading.Event) -> Iterator[None]:
    """Watch streaming queries inside this block: once ``stop`` is set, a JVM that no longer answers
    or a query that failed is the stop, not an error.

    A service manager stopping the job signals its whole process group (systemd's default), so the
    JVM gets the same SIGTERM as Python and its shutdown hook stops the SparkContext while Python is
    still stopping the queries. Either way the micro-batch cut short is replayed by the next run.
    """
    try:
        yield
    # py4j raises the socket's own error once the JVM has exited.
    except (Py4JError, ConnectionError, StreamError):
        if not stop.is_set():
            raise


def stop_queries(queries: Iterable[StreamingQuery], stop: threading.Event, say: Callable[[str], None]) -> None:
    """Stop the queries still running; after a stop that was asked for (see :func:`ending_on_request`),
    say so first."""
    if stop.is_set():
        say("stopping: a micro-batch cut short is replayed by the next run")
        with ending_on_request(stop):  # the JVM may be gone already
            quiet_console_logs()
    for query in queries:
        with ending_on_request(stop):
            if query.isActive:
                query.stop()


class JobThreads:
    """Jobs side by side in threads of one process until ``stop``: the first to fail sets ``stop``,
    which ends the others, and :meth:`join` raises its error."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self, name: str, job: Callable[[], object]) -> None:
        def run() -> None:
            try:
                job()
            except BaseException as error:  # noqa: BLE001 - raised in the main thread by join()
                self.errors.append(error)
                self.stop.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        """Wait until every job has ended, then raise the first failure. The waits are short, so the
        main thread goes on handling signals (Ctrl-C, SIGTERM) meanwhile."""
        while any(thread.is_alive() for thread in self.threads):
            for thread in self.threads:
                thread.join(0.5)
        if self.errors:
            raise self.errors[0]


class ProgressReports:
    """A streaming query's progress reports (Spark's JSON, as dicts), each returned once.

    PySpark's ``recentProgress`` converts all retained reports (up to 100, dozens of JVM calls
    each) on every call; polled twice a second, that kept a core of this 2-core machine busy
    while the job itself was idle. This reads the newest reports first and stops at the first one
    already returned: three JVM calls when nothing is new.
    """

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query
        self.last: str | None = None  # trigger time of the newest report returned (ISO 8601, UTC)

    def new(self) -> list[dict[str, Any]]:
        """The reports since the last call, oldest first."""
        retained = self.query._jsq.recentProgress()  # the JVM array, not PySpark's conversion of it
        fresh = []
        for index in range(len(retained) - 1, -1, -1):
            report = json.loads(retained[index].json())
            if self.last is not None and report["timestamp"] <= self.last:
                break
            fresh.append(report)
        if fresh:
            self.last = fresh[0]["timestamp"]
        return fresh[::-1]


class LandingNews:
    """What a landing writes, told as it goes to the refinements of the same process (`cdc sync`): they look
    at a raw table when it has new rows instead of at every table each trigger."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[Collection[str]], None]] = []
        self._lock = threading.Lock()

    def listen(self, listener: Callable[[Collection[str]], None]) -> None:
        """Call ``listener`` with the topics of each batch landed from now on."""
        with self._lock:
            self._listeners.append(listener)

    def tell(self, topics: Collection[str]) -> None:
        """The landing appended rows of ``topics`` to their raw tables."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(topics)
