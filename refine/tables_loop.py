"""Many Debezium tables refined by one loop: a whole database (`cdc sync --pattern`, a pipeline's `pattern` sources).

A streaming query per table gives each table its own trigger, polling, planning and thread: 50 tables at
2 commits/s in all reached their refined tables after p95 179 s (docs/operations/scaling.md). Here one loop
serves them all. For each table whose raw table has new versions it reads the Change Data Feed of those versions
as one batch, and refines it with the table's :class:`refine.batch.RefineBatch` (the function a table's streaming
query runs per micro-batch), ``workers`` tables at a time: run continuously, a table's batch starts as soon as a
worker is free; run once, in rounds until each table has refined what its raw table held at the start. A table
without new versions costs nothing when the landing in the same process says which topics it wrote
(:meth:`RefineLoop.landed`); else each look is at each table's log (~10-30 ms).

Where each table is, is kept in a marker beside its refine checkpoint (:class:`refine.progress.RefinedUpTo`):
a batch is marked begun (its versions) before it runs and done after, so a batch cut short by a crash runs
again over the same versions with the same id (its expectation counts are kept once), and replays are harmless
as for a streaming query (position guards, the keyless stream mark). A table refined so far by a streaming
query continues from its checkpoint, and a streaming query started later continues from the marker
(:func:`refine.progress.take_over`).

Example::

    loop = RefineLoop(spark, Continuous(interval_s=1), stop=stop_event)
    loop.add(RefineJobConfig(table="shop.public.orders", warehouse="/data"))
    loop.run()  # until stop_event is set; raises the first table's failure
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import suppress

from pyspark.sql import SparkSession

from cdc.core.config import Continuous, Trigger
from cdc.core.errors import TableError
from cdc.core.storage import Storage
from cdc.core.streaming import ProgressLine, batch_error
from cdc.core.tables import delta_properties, is_delta_table, raw_table_location, raw_table_topic, table_version
from refine.batch import RefineBatch
from refine.config import RefineJobConfig
from refine.event_log import EventLog
from refine.progress import RefinedUpTo, record_failure, record_tables, take_over, write_marker
from refine.rebuild import REBUILT_FROM_PROPERTY

# A backlog is refined in batches of at most this many raw commits (a raw commit is one landing micro-batch).
MAX_VERSIONS_PER_BATCH = 100
# Tables refined at once: a small batch's time goes mostly to the driver (planning, the commit), one core each.
WORKERS = 2
# With the landing's word on what moved (``landed``), every table's log is still looked at this often: a raw
# table written by another process (`cdc raw` beside `cdc refine`) is then refined too.
FULL_LOOK_S = 30.0


class LoopTable:
    """One table of the loop: its batch function and where it is."""

    def __init__(self, spark: SparkSession, job: RefineJobConfig, events: EventLog | None) -> None:
        self.job = job
        self.name = job.target
        self.raw = raw_table_location(job.warehouse, job.table)
        if raw_table_topic(spark, self.raw) is None:
            raise TableError("no raw table for this topic: run `cdc raw` first", table=self.raw)
        self.batch = RefineBatch(job, events=events)
        self.batch.check_shape(spark)
        self.storage = Storage(spark)
        record_tables(self.storage, job.warehouse, self.name, self.raw, self.batch.refined)
        refined = self.batch.refined
        rebuilt = (
            delta_properties(spark, refined).get(REBUILT_FROM_PROPERTY) if is_delta_table(spark, refined) else None
        )
        self.position = take_over(self.storage, job.warehouse, self.name, None if rebuilt is None else int(rebuilt))
        self.changes = 0  # read in this run
        self.more = False  # the last batch stopped short of the raw table's latest version (a backlog)
        self.session = own_session(spark)

    def refine_new(self, up_to: int | None = None, stop: threading.Event | None = None) -> int | None:
        """Refine the raw versions after the marker (up to ``up_to``, else the latest, at most
        ``MAX_VERSIONS_PER_BATCH``) as one batch, in the table's own session; return the changes read (None:
        nothing new). A batch that fails once ``stop`` is set was cut short by the stop, not failed: it is not
        recorded as the table's failure (the next run refines those versions again)."""
        spark = self.session
        position = self.position
        if position.begun_to is None:
            latest = table_version(spark, self.raw) if up_to is None else up_to
            if latest <= max(position.raw_version, 0):  # version 0 is the table's creation: no rows
                self.more = False
                return None
            end = min(latest, position.raw_version + MAX_VERSIONS_PER_BATCH)
            position = RefinedUpTo(position.batch, position.raw_version, end)
            self.more = latest > end
            self._mark(position)
        assert position.begun_to is not None
        batch_id = position.batch + 1
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", position.raw_version + 1)
            .option("endingVersion", position.begun_to)
            .load(self.raw)
        )
        # The job group counts the batch's Spark jobs (counting_spark_jobs), as a streaming query's run id does.
        spark.sparkContext.setJobGroup(f"cdc refine {self.name}", f"refine {self.name} batch {batch_id}")
        try:
            self.batch(changes, batch_id)
        except Exception as error:  # noqa: BLE001 - raised as the table's error, naming its batch
            failure = self.batch.error or batch_error(error, self.name, batch_id)
            self.batch.error = None
            if stop is None or not stop.is_set():
                record_failure(self.storage, self.job.warehouse, self.name, failure)
            raise failure from None
        facts = self.batch.facts
        read = self.batch.records_read.pop(batch_id, facts.records if facts is not None else 0)
        self.batch.conflicts.pop(batch_id, None)
        self._mark(RefinedUpTo(batch_id, position.begun_to))
        self.changes += read
        return read

    def _mark(self, position: RefinedUpTo) -> None:
        write_marker(self.storage, self.job.warehouse, self.name, position)
        self.position = position

    def caught_up(self, spark: SparkSession, up_to: int | None = None) -> bool:
        latest = up_to if up_to is not None else table_version(spark, self.raw)
        return self.position.begun_to is None and latest <= max(self.position.raw_version, 0)


def own_session(spark: SparkSession) -> SparkSession:
    """A session of one table's batches: a clone of ``spark`` (its settings, functions and views), as a streaming
    query runs its batches in. A batch may set session settings for a write (the keyless MERGE's idempotent
    ``txnAppId``/``txnVersion``): another table's batch, running beside it, must not see them. Delta's refusal to
    read versions older than ``delta.deletedFileRetentionDuration`` is lifted there: a raw table is only appended
    to, and a streaming read of its feed is not refused either (a loop a week behind would stop for good)."""
    session = SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())
    session.conf.set("spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration", "false")
    return session


class RefineLoop:
    """Debezium tables refined by one loop until ``stop`` (continuous) or until each has refined what its raw
    table held when the loop first looked (available now). Tables are added before :meth:`run` or by
    ``discover``, called at the start and every ``discover_every_s`` (a whole database's new tables)."""

    def __init__(
        self,
        spark: SparkSession,
        trigger: Trigger,
        say: Callable[[str], None] = print,
        stop: threading.Event | None = None,
        *,
        events: EventLog | None = None,
        told_what_landed: bool = False,
        discover: Callable[[], Iterable[RefineJobConfig]] | None = None,
        discover_every_s: float = 5.0,
        workers: int = WORKERS,
    ) -> None:
        self.spark = spark
        self.trigger = trigger
        self.say = say
        self.stop = stop or threading.Event()
        self.events = events
        self.told_what_landed = told_what_landed  # :meth:`landed` is called by the landing of this process
        self.discover = discover
        self.discover_every_s = discover_every_s
        self.workers = workers
        self.tables: dict[str, LoopTable] = {}
        self._moved: set[str] = set()  # topics the landing wrote since the last round
        self._woken = threading.Event()
        self._lock = threading.Lock()
        self._failed = False  # a table's batch failed (and set ``stop``)

    def add(self, job: RefineJobConfig) -> None:
        """Refine ``job``'s table in this loop (its raw table must exist)."""
        if job.target not in self.tables:
            self.tables[job.target] = LoopTable(self.spark, job, self.events)
            with self._lock:
                self._moved.add(job.table)  # looked at in the next round

    def landed(self, topics: Iterable[str]) -> None:
        """The landing wrote these topics' raw tables: refine them in the next round, which starts now."""
        with self._lock:
            self._moved.update(topics)
        self._woken.set()

    def changes(self) -> dict[str, int]:
        """The changes each table read in this run."""
        return {name: table.changes for name, table in self.tables.items()}

    def run(self) -> dict[str, int]:
        """Refine until done (see the class); return the changes each table read. The first table whose batch
        fails stops the loop: its error (naming the table and the batch) is raised once the batches running
        beside it end. Once ``stop`` is set from outside, what fails is the stop, not an error: a service manager
        stopping the job signals its whole process group, and the JVM exits under the batches still running
        (each runs again in the next run)."""
        try:
            return self._run()
        except Exception:
            if not self.stop.is_set() or self._failed:
                raise
            return self.changes()

    def _run(self) -> dict[str, int]:
        self._discover()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="refine") as pool:
            if isinstance(self.trigger, Continuous):
                self._run_continuously(pool, self.trigger.interval_s)
            else:
                self._run_once(pool)
        return self.changes()

    def _run_once(self, pool: ThreadPoolExecutor) -> None:
        """Rounds until each table has refined what its raw table held at the start."""
        limits = {name: table_version(self.spark, t.raw) for name, t in self.tables.items()}
        while not self.stop.is_set():
            due = [t for name, t in self.tables.items() if not t.caught_up(self.spark, limits[name])]
            if not due:
                return
            running = {pool.submit(self._refine_one, table, limits[table.name]): table for table in due}
            self._collect(running, only_done=False)

    def _run_continuously(self, pool: ThreadPoolExecutor, interval: float) -> None:
        """Until ``stop``: a table's batch starts as soon as a worker is free, so no table waits for another's
        slowest batch (a table's first batch, with its history and child tables, took minutes while the others
        waited)."""
        last_discovery = last_full_look = time.monotonic()
        running: dict[Future[None], LoopTable] = {}
        again: set[str] = set()  # tables that moved while their batch was running: looked at once it has ended
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                if self.discover is not None and began - last_discovery >= self.discover_every_s:
                    self._discover()
                    last_discovery = began
                full_look = not self.told_what_landed or began - last_full_look >= FULL_LOOK_S
                if full_look:
                    last_full_look = began
                with self._lock:
                    moved, self._moved = self._moved, set()
                    self._woken.clear()
                busy = {table.name for table in running.values()}
                looked_at = [t for t in self.tables.values() if full_look or t.job.table in moved or t.name in again]
                again = {t.name for t in looked_at if t.name in busy}
                due = [t for t in self.tables.values() if t in looked_at or t.more or t.position.begun_to is not None]
                for table in due:
                    if table.name not in busy:
                        running[pool.submit(self._refine_one, table, None)] = table
                # Again once a batch ends, at the trigger's interval, or as soon as the landing says what it wrote.
                self._wait(running, began + interval)
                self._collect(running, only_done=True)
        finally:
            self._collect(running, only_done=False)

    def _wait(self, running: dict[Future[None], LoopTable], until: float) -> None:
        woken = self._woken if self.told_what_landed else self.stop
        while not (self.stop.is_set() or woken.is_set()) and (left := until - time.monotonic()) > 0:
            if not running:
                woken.wait(min(0.1, left))
            elif wait(running, timeout=min(0.1, left), return_when=FIRST_COMPLETED).done:
                return

    def _collect(self, running: dict[Future[None], LoopTable], only_done: bool) -> None:
        """Forget the batches that have ended (all of them, waiting, unless ``only_done``); the first failure
        sets ``stop`` and is raised once the batches running beside it have ended."""
        failures: list[Exception] = []
        for future in list(running):
            if only_done and not future.done():
                continue
            del running[future]
            try:
                future.result()
            except Exception as error:  # noqa: BLE001 - raised below, once the other batches have ended
                if self.stop.is_set() and not self._failed:
                    continue  # cut short by the stop (see run)
                failures.append(error)
                self._failed = True
                self.stop.set()
        if failures:
            for future in list(running):  # the batches beside it end (cut short by the stop) before it is raised
                del running[future]
                with suppress(Exception):
                    future.result()
            raise failures[0]

    def _discover(self) -> None:
        for job in self.discover() if self.discover is not None else ():
            if not self.stop.is_set():
                self.add(job)

    def _refine_one(self, table: LoopTable, up_to: int | None) -> None:
        if self.stop.is_set():
            return
        read = table.refine_new(up_to, self.stop)
        if read:
            self.say(ProgressLine(f"refine {table.name} batch {table.position.batch}: {read:,} changes"))
