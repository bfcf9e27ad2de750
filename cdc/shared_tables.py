"""Delta tables that several streams of one job write at once: the raw gaps table (`cdc raw` of
several topics), the quarantine and the expectation counts (`cdc refine` of a pipeline's tables)."""

from __future__ import annotations

import time
from collections.abc import Callable

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

CONFLICT_RETRIES = 5


def is_conflict(error: BaseException) -> bool:
    """Whether Delta refused because another stream committed, or was creating the table, at the same
    time: running again on the table's new version resolves it."""
    message = str(error).lower()  # py4j wraps Delta's ConcurrentAppendException and its kin
    # A creation that has made the table's log folder but not yet its first commit: the location is
    # then "not empty and also not a Delta table" for a moment.
    return "concurrent" in message or "delta_create_table_with_non_empty_location" in message


def merge_into_shared_table(
    spark: SparkSession, location: str, schema: StructType, merge: Callable[[DeltaTable], DeltaMergeBuilder]
) -> None:
    """Run an idempotent MERGE (built by ``merge`` on the table's latest version) into a shared
    table, creating the table if needed.

    A concurrent commit (or creation) by another stream makes Delta refuse the MERGE: it is run
    again on the new version, a moment later, which is safe because it is idempotent.
    """
    for attempt in range(CONFLICT_RETRIES):
        try:
            DeltaTable.createIfNotExists(spark).location(location).addColumns(schema).execute()
            merge(DeltaTable.forPath(spark, location)).execute()
            return
        except Exception as error:
            if not is_conflict(error) or attempt == CONFLICT_RETRIES - 1:
                raise
            time.sleep(0.1 * (attempt + 1))  # the other stream's commit or creation is landing
