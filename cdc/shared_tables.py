"""Delta tables that several streams of one job write at once: the raw gaps table (`cdc raw` of
several topics), the quarantine and the expectation counts (`cdc refine` of a pipeline's tables)."""

from __future__ import annotations

from collections.abc import Callable

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

CONFLICT_RETRIES = 5


def merge_into_shared_table(
    spark: SparkSession, location: str, schema: StructType, merge: Callable[[DeltaTable], DeltaMergeBuilder]
) -> None:
    """Run an idempotent MERGE (built by ``merge`` on the table's latest version) into a shared
    table, creating the table if needed.

    A concurrent commit (or creation) by another stream makes Delta refuse the MERGE: it is run
    again on the new version, which is safe because it is idempotent.
    """
    for attempt in range(CONFLICT_RETRIES):
        try:
            DeltaTable.createIfNotExists(spark).location(location).addColumns(schema).execute()
            merge(DeltaTable.forPath(spark, location)).execute()
            return
        except Exception as error:  # py4j wraps Delta's ConcurrentAppendException and its kin
            if "concurrent" not in str(error).lower() or attempt == CONFLICT_RETRIES - 1:
                raise
