"""`cdc refine`: a raw table's Change Data Feed, decoded and MERGEd into its refined table.

The stream: a query per refined table over its raw table's Change Data Feed, with a checkpoint of the
tool's (:func:`start_refine_query`), its micro-batches reported as they go (:func:`watch_refine_queries`);
each micro-batch is refined by :class:`refine.batch.RefineBatch`.

Supported so far: Debezium Postgres topics (snapshot reads, creates, updates with TOAST placeholders,
deletes, tombstones, truncates, added columns), with a primary key (primary-key changes:
:mod:`refine.apply.rekey`; deleted keys stay deleted: :mod:`refine.apply.deleted`) or without one (multisets:
:mod:`refine.apply.keyless`), with or without the ``{schema, payload}`` wrapper (:mod:`refine.records.columns`);
MongoDB topics (:mod:`refine.mongo.documents`); rows flattened by ExtractNewRecordState /
ExtractNewDocumentState (:mod:`refine.records.flattened`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc.core.config import Continuous, Trigger
from cdc.core.errors import CdcError, QuarantineError, StreamError, TableError
from cdc.core.storage import Storage
from cdc.core.streaming import ProgressLine, ProgressReports, ending_on_request, failure, stop_queries, with_trigger
from cdc.core.tables import delta_properties, is_delta_table, raw_table_location, raw_table_topic, table_version
from refine.batch import RefineBatch
from refine.config import RefineJobConfig, RefineRun, refined_table_location
from refine.event_log import EventLog
from refine.progress import (
    first_batch_id,
    record_failure,
    record_tables,
    refine_checkpoint_location,
    refined_table_status,
    streaming_start,
)
from refine.quality.expectations import expectation_failures_since
from refine.quality.quarantine import quarantine_location, quarantined_since
from refine.rebuild import REBUILT_FROM_PROPERTY


def starting_raw_version(spark: SparkSession, refined: str, raw: str) -> int:
    """The raw table's first version a new checkpoint of the refined table's stream reads: after the one
    a rebuild made it from (:mod:`refine.rebuild`), else 0. (An existing checkpoint knows its own.)
    Delta refuses to start after its last version: until the raw table has a newer one, the stream starts
    at the rebuild's, whose changes the refined table holds already (a replay its guards leave out)."""
    if not is_delta_table(spark, refined):
        return 0
    rebuilt_from = delta_properties(spark, refined).get(REBUILT_FROM_PROPERTY)
    if rebuilt_from is None:
        return 0
    latest = DeltaTable.forPath(spark, raw).history(1).select("version").collect()[0][0]
    return min(int(rebuilt_from) + 1, latest)


def _numbered(batch: Callable[[DataFrame, int], None], first: int) -> Callable[[DataFrame, int], None]:
    return lambda rows, batch_id: batch(rows, batch_id + first)


def start_refine_query(
    spark: SparkSession,
    warehouse: str,
    topic: str,
    name: str,
    batch: Callable[[DataFrame, int], None],
    trigger: Trigger,
) -> StreamingQuery:
    """Stream the raw table of ``topic``'s Change Data Feed through ``batch`` (a foreachBatch
    function), with a tool-managed checkpoint at ``<warehouse>/_cdc/checkpoints/refine/<name>``."""
    raw = raw_table_location(warehouse, topic)
    if raw_table_topic(spark, raw) is None:
        raise TableError("no raw table for this topic: run `cdc raw` first", table=raw)
    checkpoint = refine_checkpoint_location(warehouse, name)
    storage = Storage(spark)
    record_tables(storage, warehouse, name, raw, refined_table_location(warehouse, name))
    start = streaming_start(storage, warehouse, name)
    if start.raw_version is not None:  # refined by the loop so far
        starting = min(start.raw_version, table_version(spark, raw))  # Delta refuses a start after the last version
    elif storage.exists(checkpoint):
        starting = 0  # resumed from the checkpoint's offsets
    else:
        starting = starting_raw_version(spark, refined_table_location(warehouse, name), raw)
    writer = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", starting)
        .load(raw)
        .writeStream.queryName(f"refine {name}")
        .foreachBatch(batch if not start.first_batch else _numbered(batch, start.first_batch))
        .option("checkpointLocation", checkpoint)
    )
    return with_trigger(writer, trigger).start()


def watch_refine_queries(
    queries: dict[str, StreamingQuery],
    say: Callable[[str], None],
    stop: threading.Event,
    batches: dict[str, object] | None = None,
    warehouse: str | None = None,
) -> dict[str, int]:
    """Report each query's micro-batches until all have stopped (or ``stop`` is set); return the
    changes each read. A query that failed stops the others and raises, naming its table (and records
    the failure for ``cdc status``, given the ``warehouse``)."""
    changes = dict.fromkeys(queries, 0)
    reports = {name: ProgressReports(query) for name, query in queries.items()}
    # Batch ids go on from the refine loop's where a query took its table over from it.
    first = dict.fromkeys(queries, 0)
    if warehouse is not None:
        storage = Storage(SparkSession.builder.getOrCreate())
        first = {name: first_batch_id(storage, warehouse, name) for name in queries}
    try:
        with ending_on_request(stop):
            while any(query.isActive for query in queries.values()) and not stop.is_set():
                for name, query in queries.items():
                    try:
                        query.awaitTermination(0.5)  # type: ignore[arg-type]  # seconds, a float works
                    except StreamingQueryException:
                        pass  # reported just below, by _raise_failure
                    read = getattr((batches or {}).get(name), "records_read", {})
                    conflicts = getattr((batches or {}).get(name), "conflicts", {})
                    for report in reports[name].new():
                        batch = report["batchId"] + first[name]
                        rows = read.pop(batch, report["numInputRows"])
                        if rows:  # not one of Spark's idle reports between batches
                            changes[name] += rows
                            rerun = conflicts.pop(batch, 0)
                            say(
                                ProgressLine(
                                    f"refine {name} batch {batch}: {rows:,} changes"
                                    + (
                                        f" (run again after {rerun} conflicting commit(s) by another writer)"
                                        if rerun
                                        else ""
                                    )
                                )
                            )
                    _raise_failure(name, query, batches)
            for name, query in queries.items():  # one may have failed while another was awaited
                _raise_failure(name, query, batches)
    except CdcError as error:
        failed = error.context.get("table")
        if warehouse is not None and failed in queries:
            record_failure(Storage(SparkSession.active()), warehouse, failed, error)
        raise
    finally:
        stop_queries(queries.values(), stop, say)
    return changes


def _raise_failure(name: str, query: StreamingQuery, batches: dict[str, object] | None) -> None:
    if (message := failure(query)) is not None:
        # A micro-batch's own failure (batch_error) reaches the user as itself: Spark's message would bury it.
        batch = (batches or {}).get(name)
        if (error := getattr(batch, "error", None)) is not None:
            # Raised, not kept: py4j keeps the batch function as long as the JVM keeps its query, and the
            # error's traceback (whose frames hold the queries) would keep the stopped query in turn.
            setattr(batch, "error", None)  # noqa: B010 - RefineBatch or the event job's
            raise error
        raise StreamError(f"the refine stream stopped: {message.splitlines()[0]}", table=name)


def run_refine_job(
    spark: SparkSession,
    config: RefineJobConfig,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> int:
    """Refine the raw table into ``<warehouse>/refined/<name>``; return the number of changes read.

    A continuous run goes on until ``stop`` is set; a failed batch raises a :class:`~cdc.core.errors.CdcError`
    naming the table and the batch (recorded for ``cdc status``).

    Example (:class:`cdc.Lakehouse`'s ``refine`` builds the config and calls this)::

        changes = run_refine_job(spark, RefineJobConfig(table="demo.shop.orders", warehouse="/data/warehouse"))
    """
    since = datetime.now(UTC)
    stop = stop or threading.Event()
    with EventLog.of(config.warehouse).kept_flushed(spark, isinstance(config.trigger, Continuous)) as events:
        batch = RefineBatch(config, events=events)
        batch.check_shape(spark)
        query = start_refine_query(spark, config.warehouse, config.table, config.target, batch, config.trigger)
        changes = watch_refine_queries({config.target: query}, say, stop, {config.target: batch}, config.warehouse)
    fail_if_quarantined(config, summarize_run(spark, config.warehouse, changes, since, say, stop))
    return changes[config.target]


def summarize_run(
    spark: SparkSession,
    warehouse: str,
    changes: dict[str, int],
    since: datetime,
    say: Callable[[str], None],
    stop: threading.Event,
) -> dict[str, int]:
    """Say what the run did to each table: the changes it read, the records it sent to the quarantine
    (with where to look), the rows that failed expectations, and the raw changes still to refine; return
    the quarantined counts. A run stopped by a signal only says the changes: its JVM may have stopped
    with it (a service manager signals the whole process group)."""
    quarantine = quarantine_location(warehouse)
    quarantined = dict.fromkeys(changes, 0)
    for name, count in changes.items():
        line = f"refine {name}: {count:,} changes -> {refined_table_location(warehouse, name)}"
        status = None if stop.is_set() else refined_table_status(spark, warehouse, name)
        if status is not None:
            # Undecodable records are filed under the raw table, rows a drop expectation failed under the table.
            by_source = quarantined_since(spark, quarantine, [status.raw, name], since)
            quarantined[name] = sum(by_source.values())
            if quarantined[name]:
                sources = " and ".join(sorted(by_source))
                line += f"; {quarantined[name]:,} records quarantined (in {quarantine}, source_table {sources})"
            if failed := expectation_failures_since(spark, warehouse, name, since):
                line += f"; {failed:,} rows failed expectations (`cdc status` totals them)"
            if status.behind is not None:
                line += f"; {status.behind:,} raw changes not refined yet"
        say(line)
    return quarantined


def fail_if_quarantined(config: RefineRun, quarantined: dict[str, int]) -> None:
    """:class:`QuarantineError` when the run quarantined records and ``config.fail_on_quarantine``."""
    if config.fail_on_quarantine and (total := sum(quarantined.values())):
        tables = ", ".join(name for name, count in quarantined.items() if count)
        quarantine = quarantine_location(config.warehouse)
        raise QuarantineError(f"{total:,} records went to the quarantine ({tables})", quarantine=quarantine)
