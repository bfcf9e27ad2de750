"""How far each refined table is: its last batch, the raw changes it has not refined yet, its last error.

A refine query records, at ``<warehouse>/_cdc/refine/<name>.json``, which raw table it reads and which
refined table it writes (when it starts) and its last failure (when a batch fails). With its streaming
checkpoint (``offsets/<batch>`` holds the raw table's Delta version the batch read up to, ``commits/<batch>``
exists once the batch committed), that is all ``cdc status`` needs: no query runs for it.

Tables refined by one loop instead (:mod:`refine.tables_loop`) keep where they are in a marker in that
checkpoint's folder (:class:`RefinedUpTo`). The two hand over there: the loop takes a checkpoint's committed
batches (newer than any marker, since the loop removes them when it takes over) into its marker, and a
streaming query started later begins after the marker's version.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc.core.errors import CdcError
from cdc.core.storage import Storage
from cdc.core.tables import is_delta_table
from refine.event_log import TableFreshness, table_freshness


def progress_location(warehouse: str, name: str) -> str:
    return f"{warehouse}/_cdc/refine/{name}.json"


def refine_checkpoint_location(warehouse: str, name: str) -> str:
    return f"{warehouse}/_cdc/checkpoints/refine/{name}"


def marker_location(warehouse: str, name: str) -> str:
    return f"{refine_checkpoint_location(warehouse, name)}/refined-up-to.json"


def _first_batch_location(warehouse: str, name: str) -> str:
    return f"{refine_checkpoint_location(warehouse, name)}/first-batch-id.json"


@dataclass(frozen=True)
class RefinedUpTo:
    """Where a table refined by the loop is: its last batch done and the raw version it refined through (-1:
    none), and a batch begun and not done (the next id, over the raw versions up to ``begun_to``): after a crash
    it runs again over the same versions with the same id, as a streaming query replays its planned batch."""

    batch: int
    raw_version: int
    begun_to: int | None = None


def _parse_marker(text: str) -> RefinedUpTo | None:
    try:
        return RefinedUpTo(**json.loads(text))
    except (ValueError, TypeError):
        return None


def read_marker(storage: Storage, warehouse: str, name: str) -> RefinedUpTo | None:
    text = storage.read_replaced_text(marker_location(warehouse, name), lambda t: _parse_marker(t) is not None)
    return None if text is None else _parse_marker(text)


def write_marker(storage: Storage, warehouse: str, name: str, marker: RefinedUpTo) -> None:
    """Replace the marker whole or not at all: a torn one would send the table back to its first version."""
    storage.replace_text(marker_location(warehouse, name), json.dumps(asdict(marker)))


def committed_batches(storage: Storage, checkpoint: str) -> list[int]:
    """The micro-batches a refine query's checkpoint holds as committed."""
    return [int(batch) for batch in storage.list_names(f"{checkpoint}/commits") if batch.isdigit()]


def take_over(storage: Storage, warehouse: str, name: str, rebuilt_from: int | None) -> RefinedUpTo:
    """Where the loop starts refining table ``name``: a streaming query's last committed batch (its offsets and
    commits are then removed, so that a query started later begins after the marker, not at its old offsets),
    else the loop's own marker, else after the raw version a rebuild made the table from (``rebuilt_from``),
    else at the start."""
    checkpoint = refine_checkpoint_location(warehouse, name)
    batches = committed_batches(storage, checkpoint)
    # A take-over cut short leaves commits without their offsets: the marker it wrote before stands.
    if batches and (up_to := _read_up_to(storage, checkpoint, max(batches))) is not None:
        marker = RefinedUpTo(max(batches) + first_batch_id(storage, warehouse, name), up_to)
        write_marker(storage, warehouse, name, marker)
    elif (kept := read_marker(storage, warehouse, name)) is not None:
        marker = kept
    else:
        marker = RefinedUpTo(-1, -1 if rebuilt_from is None else rebuilt_from)
    # A batch planned and not committed is replayed by the loop's marker; the commits go first, so that a
    # removal cut short leaves no commit without its offsets.
    for location in (f"{checkpoint}/commits", f"{checkpoint}/offsets", _first_batch_location(warehouse, name)):
        if storage.exists(location):
            storage.delete(location)
    return marker


@dataclass(frozen=True)
class StreamingStart:
    """Where a streaming query of a table starts: after the loop's marker (``raw_version``; None: it resumes from
    its checkpoint's offsets, or starts afresh), its batch 0 numbered ``first_batch``, so batch ids go on from the
    loop's (the event log and the expectation counts are kept by batch id)."""

    raw_version: int | None
    first_batch: int


def streaming_start(storage: Storage, warehouse: str, name: str) -> StreamingStart:
    """Where a streaming query of table ``name`` starts; records its numbering for :func:`first_batch_id`."""
    checkpoint = refine_checkpoint_location(warehouse, name)
    if storage.exists(f"{checkpoint}/offsets") and storage.list_names(f"{checkpoint}/offsets"):
        return StreamingStart(None, first_batch_id(storage, warehouse, name))
    marker = read_marker(storage, warehouse, name)
    first = 0 if marker is None else marker.batch + 1
    numbering = _first_batch_location(warehouse, name)
    if first:
        storage.replace_text(numbering, str(first))
    elif storage.exists(numbering):
        storage.delete(numbering)
    return StreamingStart(None if marker is None else marker.raw_version + 1, first)


def first_batch_id(storage: Storage, warehouse: str, name: str) -> int:
    """The id a streaming query's batch 0 stands for (0 unless it took its table over from the loop)."""
    text = storage.read_replaced_text(_first_batch_location(warehouse, name), str.isdigit)
    return 0 if text is None else int(text)


@dataclass(frozen=True)
class RefineFailure:
    """A refine batch's failure, as the job reported it."""

    at: str  # UTC, ISO 8601
    batch: int | None  # None: the stream stopped outside a batch
    error: str


@dataclass(frozen=True)
class RefinedTableStatus:
    """One refine query's progress (``cdc status``)."""

    name: str
    refined: str
    raw: str
    last_batch: int | None  # the last committed micro-batch; None: none yet
    raw_version: int | None  # the raw table's Delta version refined up to (inclusive)
    behind: int | None  # raw changes (Change Data Feed rows) not refined yet; None: unknown
    last_error: RefineFailure | None  # the last failure, when no batch has committed since
    freshness: TableFreshness | None = None  # what the event log says of its batches (refine/event_log.py)

    def as_dict(self) -> dict[str, object]:
        document = asdict(self)
        if self.freshness is not None:  # JSON has no datetime
            document["freshness"]["last_batch_at"] = self.freshness.last_batch_at.isoformat()
        return document


def record_tables(storage: Storage, warehouse: str, name: str, raw: str, refined: str) -> None:
    """Record which raw table the refine query ``name`` reads and which table it writes (kept: its last error)."""
    document = _read(storage, warehouse, name)
    if (document.get("raw"), document.get("refined")) != (raw, refined):
        storage.write_text(progress_location(warehouse, name), json.dumps({**document, "raw": raw, "refined": refined}))


def record_failure(storage: Storage, warehouse: str, name: str, error: CdcError) -> None:
    """Record the failure of the refine query ``name`` (its batch is in the error's context)."""
    batch = error.context.get("batch")
    failure = RefineFailure(datetime.now(UTC).isoformat(timespec="seconds"), batch, str(error))
    document = _read(storage, warehouse, name)
    storage.write_text(progress_location(warehouse, name), json.dumps({**document, "last_error": asdict(failure)}))


def refined_table_statuses(spark: SparkSession, warehouse: str) -> list[RefinedTableStatus]:
    """The progress of every refine query of ``warehouse`` that recorded its tables."""
    storage = Storage(spark)
    names = sorted(
        name.removesuffix(".json") for name in storage.list_names(f"{warehouse}/_cdc/refine") if name.endswith(".json")
    )
    freshness = table_freshness(spark, warehouse)
    return [
        _status(spark, storage, warehouse, name, _read(storage, warehouse, name), freshness.get(name)) for name in names
    ]


def refined_table_status(spark: SparkSession, warehouse: str, name: str) -> RefinedTableStatus | None:
    """The progress of the refine query ``name`` (None: it never recorded its tables)."""
    storage = Storage(spark)
    document = _read(storage, warehouse, name)
    return _status(spark, storage, warehouse, name, document) if document.get("raw") else None


def _status(
    spark: SparkSession,
    storage: Storage,
    warehouse: str,
    name: str,
    document: dict,
    freshness: TableFreshness | None = None,
) -> RefinedTableStatus:
    checkpoint = refine_checkpoint_location(warehouse, name)
    batches = committed_batches(storage, checkpoint)
    last_batch = max(batches) + first_batch_id(storage, warehouse, name) if batches else None
    raw_version = None if not batches else _read_up_to(storage, checkpoint, max(batches))
    last_commit = f"{checkpoint}/commits/{max(batches) if batches else None}"
    if last_batch is None and (marker := read_marker(storage, warehouse, name)) is not None and marker.batch >= 0:
        last_batch, raw_version, last_commit = marker.batch, marker.raw_version, marker_location(warehouse, name)
    failure = document.get("last_error")
    last_error = None
    if failure and (last_batch is None or _after(failure["at"], storage.last_modified(last_commit))):
        last_error = RefineFailure(**failure)  # no batch has committed since
    return RefinedTableStatus(
        name=name,
        refined=document["refined"],
        raw=document["raw"],
        last_batch=last_batch,
        raw_version=raw_version,
        behind=_changes_after(spark, document["raw"], raw_version),
        last_error=last_error,
        freshness=freshness,
    )


# Delta's source offset names the version a batch stopped in and the index of the last file of it read:
# this index when all of the version was read; a negative one (none of it) or a file's (part of it) else.
_WHOLE_VERSION_INDEX = 2**63 - 1


def _after(at: str, seconds: float) -> bool:
    return datetime.fromisoformat(at).timestamp() >= int(seconds)


def _read_up_to(storage: Storage, checkpoint: str, batch: int) -> int | None:
    """The raw table's last version that batch ``batch`` and those before it read completely."""
    location = f"{checkpoint}/offsets/{batch}"
    try:
        if not storage.exists(location):
            return None
        offset = json.loads(storage.read_text(location).splitlines()[-1])
        version, index = int(offset["reservoirVersion"]), int(offset.get("index", -1))
    except (CdcError, OSError, ValueError, KeyError, IndexError):
        return None
    return version if index == _WHOLE_VERSION_INDEX else version - 1


def _changes_after(spark: SparkSession, raw: str, version: int | None) -> int | None:
    """Rows the raw table's commits after ``version`` appended (all of them before any batch).

    Counted from the table's history (each append's ``numOutputRows``), not by reading its Change Data Feed:
    a raw table is append-only, so the two agree, and Delta (since 4.1) refuses a batch read of the feed
    from a version older than ``delta.deletedFileRetentionDuration``, which a refine a week behind is.
    """
    if not is_delta_table(spark, raw):
        return None
    history = spark.sql(f"DESCRIBE HISTORY delta.`{raw}`")
    start = 0 if version is None else version + 1
    appended = (
        history.where((F.col("version") >= start) & F.col("operation").isin("WRITE", "STREAMING UPDATE"))
        .select(F.sum(F.col("operationMetrics")["numOutputRows"].cast("long")).alias("rows"))
        .first()
    )
    return int(appended["rows"] or 0) if appended is not None else 0


def _read(storage: Storage, warehouse: str, name: str) -> dict:
    location = progress_location(warehouse, name)
    try:
        return json.loads(storage.read_text(location)) if storage.exists(location) else {}
    except ValueError:
        return {}  # a torn write: the next run writes it whole again
