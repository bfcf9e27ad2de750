"""Delta tables that several writers write at once: the raw gaps table (`cdc raw` of several topics),
the quarantine and the expectation counts (`cdc refine` of a pipeline's tables), and refined tables
that a refinement MERGEs into while `cdc optimize` (or any other Delta writer) compacts them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from delta.tables import DeltaMergeBuilder, DeltaTable
from py4j.java_gateway import is_instance_of
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from cdc.core.errors import CdcError
from cdc.core.storage import Storage
from cdc.core.tables import clear_interrupted_creation

CONFLICT_RETRIES = 5
# A shared table's log that has stayed without a version this long was left by a killed job: a
# creation under way commits its first version within a second or two.
ABANDONED_CREATION_SECONDS = 30.0
T = TypeVar("T")

_tables_seen: set[str] = set()  # shared tables this process has found or created: no more checks


# Delta's error conditions for a commit refused because another writer committed first, or was
# creating the table: its log folder exists before its first commit, so the location is for a moment
# "not empty and also not a Delta table", or (createIfNotExists having taken the folder for the table)
# a table not found.
CONFLICT_CONDITIONS = frozenset(
    {
        "DELTA_CONCURRENT_APPEND",
        "DELTA_CONCURRENT_DELETE_DELETE",
        "DELTA_CONCURRENT_DELETE_READ",
        "DELTA_CONCURRENT_TRANSACTION",
        "DELTA_CONCURRENT_WRITE",
        "DELTA_METADATA_CHANGED",
        "DELTA_PROTOCOL_CHANGED",
        "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION",
        "DELTA_TABLE_NOT_FOUND",
    }
)


def is_conflict(error: BaseException) -> bool:
    """Whether Delta refused because another stream committed, or was creating the table, at the same
    time: running again on the table's new version resolves it.

    Decided by the error condition (of PySpark's exception, or of the Java exception py4j wraps and its
    causes), and by the message only for errors that carry neither: a message may be empty."""
    if condition_of(error) in CONFLICT_CONDITIONS:
        return True
    # The Java exception: py4j's own error wraps it, PySpark's converted ones (AnalysisException...) keep
    # it as their origin, whose message may be null and so theirs empty.
    java = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    while java is not None:
        # Delta's conflicts all extend java.util.ConcurrentModificationException.
        if _java_condition(java) in CONFLICT_CONDITIONS or is_instance_of(
            SparkContext._gateway, java, "java.util.ConcurrentModificationException"
        ):
            return True
        java = java.getCause()
    message = str(error).lower()
    return "concurrent" in message or "delta_create_table_with_non_empty_location" in message


def condition_of(error: BaseException) -> str | None:
    """The error condition of a PySpark exception (``DELTA_PROTOCOL_CHANGED``...), if it has one."""
    get_condition = getattr(error, "getCondition", None)
    return get_condition() if callable(get_condition) else None


def _java_condition(java) -> str | None:
    try:
        return java.getErrorClass()
    except Exception:  # noqa: BLE001 - not a SparkThrowable
        return None


def retrying_conflicts(
    action: Callable[[], T], on_conflict: Callable[[BaseException], None] | None = None, attempts: int | None = None
) -> T:
    """``action()``, run again a moment later (up to ``attempts`` times in all) while Delta refuses its
    commit because another writer committed first: the next run reads the table's new version.

    ``action`` must be safe to run again after a refused commit, and any commit it made before it:
    an idempotent MERGE, or a whole micro-batch (each replays harmlessly, as after a crash).
    ``on_conflict`` is told of each conflict that is retried."""
    for attempt in range(1, attempts or CONFLICT_RETRIES):
        try:
            return action()
        except Exception as error:
            if isinstance(error, CdcError) or not is_conflict(error):
                raise
            if on_conflict is not None:
                on_conflict(error)
            time.sleep(0.1 * attempt)  # the other writer's commit is landing
    return action()  # the last attempt: a conflict now is raised


def merge_into_shared_table(
    spark: SparkSession, location: str, schema: StructType, merge: Callable[[DeltaTable], DeltaMergeBuilder]
) -> None:
    """Run an idempotent MERGE (built by ``merge`` on the table's latest version) into a shared
    table, creating the table if needed.

    A concurrent commit (or creation) by another stream makes Delta refuse the MERGE: it is run
    again on the new version, a moment later, which is safe because it is idempotent.
    """

    def create_and_merge() -> None:
        if location not in _tables_seen:
            # An earlier job killed while it created the table may have left a log without a version,
            # over which Delta creates nothing; another stream may be creating the table right now.
            clear_interrupted_creation(Storage(spark), location, abandoned_after=ABANDONED_CREATION_SECONDS)
        DeltaTable.createIfNotExists(spark).location(location).addColumns(schema).execute()
        _tables_seen.add(location)
        merge(DeltaTable.forPath(spark, location)).execute()

    retrying_conflicts(create_and_merge)
