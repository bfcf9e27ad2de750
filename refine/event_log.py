"""The event log: one row per refine batch per table, as Lakeflow's event log keeps one per flow update.

Batches record their row in memory (:meth:`EventLog.record`); the log appends what it holds to the Delta
table ``<warehouse>/_cdc/events`` in one commit for all the tables of the process (:meth:`EventLog.flush`,
every few seconds while jobs run, and when they end), so a job keeping a hundred tables writes one commit
per flush, not one per table. A process killed between flushes loses those rows, never a table's data:
the log is what the jobs tell, for ``cdc status`` and the metrics (:func:`prometheus_text`).

Example::

    log = EventLog.of("/data/warehouse")
    log.record(BatchEvent(table="orders", batch=7, ...))
    log.flush(spark)
    spark.read.format("delta").load(event_log_location("/data/warehouse")).show()
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc.core.tables import is_delta_table

SCHEMA = (
    "table string, batch long, started_at timestamp, ended_at timestamp, changes_read long, quarantined long, "
    "spark_jobs int, seconds double, newest_source_commit timestamp, lag_seconds double"
)
# A continuous job appends the rows it holds this often.
FLUSH_INTERVAL_S = 5.0


def event_log_location(warehouse: str) -> str:
    return f"{warehouse}/_cdc/events"


@dataclass(frozen=True)
class BatchEvent:
    """One refine batch of one table."""

    table: str
    batch: int
    started_at: datetime
    ended_at: datetime
    changes_read: int
    quarantined: int
    spark_jobs: int
    seconds: float  # the batch's duration, reruns after write conflicts included
    newest_source_commit: datetime | None  # the source commit time of the batch's newest change
    lag_seconds: float | None  # from that commit until the batch ended: how fresh the table is after it


class EventLog:
    """The batches of one warehouse's tables waiting to be appended to its event log; one per warehouse and
    process (:meth:`of`), shared by all its jobs' threads."""

    _logs: ClassVar[dict[str, EventLog]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, warehouse: str) -> None:
        self.warehouse = warehouse
        self.pending: list[BatchEvent] = []
        self.flushing = threading.Lock()  # one append at a time
        self._held = threading.Lock()  # the rows held
        self.metrics_file: Path | None = None  # where each flush writes the metrics (`CDC_METRICS_FILE`)
        self.last_error: Exception | None = None  # of the last append that failed
        self.totals: dict[tuple[str, str], float] = {}  # the metrics' counters by (metric, table), this process's
        self.gauges: dict[tuple[str, str], float] = {}
        self._users = 0  # the jobs running with it (kept_flushed)
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, warehouse: str) -> EventLog:
        with cls._lock:
            return cls._logs.setdefault(warehouse, EventLog(warehouse))

    def record(self, event: BatchEvent) -> None:
        with self._held:
            self.pending.append(event)

    def flush(self, spark: SparkSession) -> int:
        """Append the rows held to the event log in one commit; returns how many. With a ``metrics_file``,
        also write the metrics (:func:`prometheus_text`) there. A failed append (storage away, the JVM
        stopping) keeps the rows for the next flush and is kept in ``last_error``: the log never stops a job."""
        with self.flushing:
            with self._held:  # no row recorded between the swap and the append is lost
                events, self.pending = self.pending, []
            if not events:
                return 0
            rows = [astuple(event) for event in events]
            try:
                spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(
                    event_log_location(self.warehouse)
                )
            except Exception as error:  # noqa: BLE001 - the log's trouble is no job's failure
                with self._held:
                    self.pending[:0] = events
                self.last_error = error
                return 0
            if self.metrics_file is not None:
                write_metrics(self.metrics_file, events, self.totals, self.gauges)
            return len(events)

    @contextmanager
    def kept_flushed(self, spark: SparkSession, continuous: bool) -> Iterator[EventLog]:
        """The log, flushed every ``FLUSH_INTERVAL_S`` by one thread while any job of the process runs
        continuously inside such a block, and once more when the last block ends."""
        with self._lock:
            self._users += 1
            if continuous and self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._flush_until, args=(spark, self._stop), name="event log", daemon=True
                )
                self._thread.start()
        try:
            yield self
        finally:
            with self._lock:
                self._users -= 1
                last = self._users == 0
                ending = (self._thread, self._stop) if last else None
                if last:
                    self._thread = self._stop = None
            if ending is not None:
                thread, stop = ending
                if thread is not None and stop is not None:
                    stop.set()
                    thread.join()
                self.flush(spark)

    def _flush_until(self, spark: SparkSession, stop: threading.Event) -> None:
        while not stop.wait(FLUSH_INTERVAL_S):
            self.flush(spark)


_METRICS: dict[str, str] = {
    "changes_read": "cdc_refine_changes_read_total",
    "quarantined": "cdc_refine_quarantined_total",
    "spark_jobs": "cdc_refine_spark_jobs_total",
    "seconds": "cdc_refine_batch_seconds_total",
}


def write_metrics(path: Path, events: list[BatchEvent], totals: dict, gauges: dict) -> None:
    """Add ``events`` to the ``totals`` (counters) and ``gauges`` by (metric, table) and write them to ``path``
    (:func:`prometheus_text`), replacing it whole (a reader never sees half a file)."""
    for event in events:
        for name, metric in _METRICS.items():
            totals[(metric, event.table)] = totals.get((metric, event.table), 0.0) + float(getattr(event, name))
        totals[("cdc_refine_batches_total", event.table)] = totals.get(("cdc_refine_batches_total", event.table), 0) + 1
        gauges[("cdc_refine_last_batch_timestamp_seconds", event.table)] = event.ended_at.timestamp()
        if event.lag_seconds is not None:
            gauges[("cdc_refine_lag_seconds", event.table)] = event.lag_seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(prometheus_text(totals, gauges))
    partial.replace(path)


def prometheus_text(totals: dict[tuple[str, str], float], gauges: dict[tuple[str, str], float]) -> str:
    """Metrics by (name, table) in Prometheus's text exposition format: counters (``*_total``) and gauges."""
    lines: list[str] = []
    for values, kind in ((totals, "counter"), (gauges, "gauge")):
        for metric in sorted({name for name, _ in values}):
            lines.append(f"# TYPE {metric} {kind}")
            for (name, table), value in sorted(values.items()):
                if name == metric:
                    label = table.replace("\\", "\\\\").replace('"', '\\"')
                    lines.append(f'{metric}{{table="{label}"}} {float(value)!r}')  # every digit: epoch seconds
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TableFreshness:
    """What the event log says of one table (``cdc status``)."""

    table: str
    batches: int
    last_batch_at: datetime
    batch_p50_s: float
    batch_p95_s: float
    lag_p50_s: float | None
    lag_p95_s: float | None


def table_freshness(spark: SparkSession, warehouse: str, since: datetime | None = None) -> dict[str, TableFreshness]:
    """Per table, its batches in the event log (since ``since``, default all): the last, and the p50/p95 of
    their durations and lags."""
    location = event_log_location(warehouse)
    if not is_delta_table(spark, location):
        return {}
    events = spark.read.format("delta").load(location)
    if since is not None:
        events = events.where(F.col("ended_at") >= F.lit(since.astimezone(UTC).replace(tzinfo=None)))
    rows = (
        events.groupBy("table")
        .agg(
            F.count("*").alias("batches"),
            F.max("ended_at").alias("last_batch_at"),
            F.percentile_approx("seconds", [0.5, 0.95]).alias("seconds"),
            F.percentile_approx("lag_seconds", [0.5, 0.95]).alias("lag"),
        )
        .collect()
    )
    return {
        row.table: TableFreshness(
            row.table,
            row.batches,
            row.last_batch_at,
            row.seconds[0],
            row.seconds[1],
            row.lag[0] if row.lag else None,
            row.lag[1] if row.lag else None,
        )
        for row in rows
    }
