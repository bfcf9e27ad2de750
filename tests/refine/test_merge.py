"""The MERGE of a batch's last changes into a refined table (real Delta tables), and its append path."""

from __future__ import annotations

from datetime import datetime

from delta.tables import DeltaTable
from pyspark.testing import assertDataFrameEqual

from refine.merge import merge_changes

AT = datetime(2026, 1, 1)
ROWS = "id long, name string, _cdc_lsn long, _cdc_offset long, _cdc_committed_at timestamp, _cdc_op string, _cdc_refined_at timestamp"


def changes(spark, rows: list[tuple]):
    """Refined rows of (id, name, lsn, op)."""
    return spark.createDataFrame([(id_, name, lsn, lsn, AT, op, AT) for id_, name, lsn, op in rows], ROWS)


def table(spark, location: str):
    return spark.read.format("delta").load(location).select("id", "name", "_cdc_lsn", "_cdc_op")


def last_operation(spark, location: str) -> str:
    return DeltaTable.forPath(spark, location).history(1).first().operation


def test_creates_of_new_keys_are_appended(spark, tmp_path):
    location = str(tmp_path / "refined")
    merge_changes(spark, location, changes(spark, [(1, "a", 10, "r"), (2, "b", 11, "r")]), ["id"], None, inserts_only=True)
    merge_changes(spark, location, changes(spark, [(3, "c", 20, "c")]), ["id"], None, inserts_only=True)
    assert last_operation(spark, location) == "WRITE"
    assertDataFrameEqual(table(spark, location), [(1, "a", 10, "r"), (2, "b", 11, "r"), (3, "c", 20, "c")])


def test_creates_of_stored_keys_are_merged_with_their_position_guard(spark, tmp_path):
    location = str(tmp_path / "refined")
    merge_changes(spark, location, changes(spark, [(1, "a", 10, "c"), (2, "b", 11, "c")]), ["id"], None, inserts_only=True)
    # A new snapshot (reads of rows the table holds, one changed since), and a replayed create.
    merge_changes(spark, location, changes(spark, [(1, "a2", 30, "r"), (3, "c", 31, "r")]), ["id"], None, inserts_only=True)
    merge_changes(spark, location, changes(spark, [(2, "stale", 5, "c")]), ["id"], None, inserts_only=True)
    assert last_operation(spark, location) == "MERGE"
    assertDataFrameEqual(table(spark, location), [(1, "a2", 30, "r"), (2, "b", 11, "c"), (3, "c", 31, "r")])
    # Replaying the append changes nothing either.
    merge_changes(spark, location, changes(spark, [(3, "c", 31, "r")]), ["id"], None, inserts_only=True)
    assertDataFrameEqual(table(spark, location), [(1, "a2", 30, "r"), (2, "b", 11, "c"), (3, "c", 31, "r")])
