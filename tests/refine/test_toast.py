"""TOAST placeholders: found in a batch, and filled from the key's earlier changes (Spark, no stack)."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from refine.job import batch_facts
from refine.latest import latest_per_key
from refine.toast import TOAST_PLACEHOLDER, has_placeholder

CHANGES = (
    "op string, key struct<id:bigint>, after struct<id:bigint, note:string, blob:binary, tags:array<string>, n:int>, "
    "source_lsn bigint, kafka_offset bigint, kafka_headers array<struct<key:string, value:binary>>, problem string"
)


def change(lsn: int, note=None, blob=None, tags=None, op: str = "u", key: int = 1) -> tuple:
    return (op, (key,), None if op == "d" else (key, note, blob, tags, 7), lsn, lsn, None, None)


def test_placeholders_are_found_in_every_shape_debezium_sends_them(spark):
    rows = [
        change(1, note="plain"),
        change(2, note=TOAST_PLACEHOLDER),
        change(3, blob=TOAST_PLACEHOLDER.encode()),
        change(4, tags=[TOAST_PLACEHOLDER]),
        change(5, tags=["a", TOAST_PLACEHOLDER]),  # an array holding the text is no placeholder
        change(6, op="d"),
    ]
    changes = spark.createDataFrame(rows, CHANGES)
    found = changes.select("source_lsn", has_placeholder(F.col("after"), changes.schema["after"].dataType).alias("found"))
    assertDataFrameEqual(found, [(1, False), (2, True), (3, True), (4, True), (5, False), (6, False)])
    assert batch_facts(changes).placeholders
    assert not batch_facts(changes.where("source_lsn IN (1, 5, 6)")).placeholders


def test_the_last_change_per_key_takes_placeholders_from_earlier_changes_only_when_told_they_may_be_there(spark):
    changes = spark.createDataFrame([
        change(1, note="first", key=1), change(2, note=TOAST_PLACEHOLDER, key=1), change(3, note="other", key=2),
    ], CHANGES)  # fmt: skip

    def notes(placeholders: bool):
        return latest_per_key(changes, ["id"], None, placeholders).select("key.id", "after.note")

    assertDataFrameEqual(notes(True), [(1, "first"), (2, "other")])
    # A batch without placeholders (batch_facts) skips the window: nothing there to fill.
    assertDataFrameEqual(notes(False), [(1, TOAST_PLACEHOLDER), (2, "other")])
