"""SCD type 2 history tables: versions in source order whatever the order changes arrive in."""

from datetime import datetime, timedelta

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import ConfigError
from refine.apply.history import HistorySpec, apply_history, closing_versions, delivered_first, op_of_debezium
from refine.apply.merge import TableSettings

SPEC = HistorySpec(key_columns=["id"], position_columns=["seq"], valid_from_column="changed_at")
CHANGES = "id long, seq long, name string, changed_at timestamp, op string"
HISTORY = (
    "id long, seq long, name string, changed_at timestamp, _cdc_valid_from timestamp, _cdc_valid_to timestamp, "
    "_cdc_is_current boolean, _cdc_is_deleted boolean"
)


def at(seq: int | None) -> datetime | None:
    return None if seq is None else datetime(2026, 1, 1) + timedelta(minutes=seq)


def change(key: int, seq: int, name: str | None, op: str = "upsert") -> tuple:
    return (key, seq, name, at(seq), op)


def version(key: int, seq: int, name: str | None, valid_to: int | None, current=False, deleted=False) -> tuple:
    return (key, seq, name, at(seq), at(seq), at(valid_to), current, deleted)


def apply(spark, location: str, *changes: tuple) -> None:
    apply_history(spark, location, TableSettings(), spark.createDataFrame(list(changes), CHANGES), SPEC)


def history(spark, location: str):
    return spark.read.format("delta").load(location)


def expected(spark, *versions: tuple):
    return spark.createDataFrame(list(versions), HISTORY)


IN_ORDER = [change(1, 1, "a"), change(1, 2, "b"), change(1, 3, "c"), change(2, 1, "x")]
IN_ORDER_HISTORY = [
    version(1, 1, "a", valid_to=2),
    version(1, 2, "b", valid_to=3),
    version(1, 3, "c", None, current=True),
    version(2, 1, "x", None, current=True),
]


def test_in_order_changes_make_consecutive_versions(spark, tmp_path):
    location = str(tmp_path / "history")
    apply(spark, location, *IN_ORDER[:2])
    apply(spark, location, *IN_ORDER[2:])
    assertDataFrameEqual(history(spark, location), expected(spark, *IN_ORDER_HISTORY))


def test_out_of_order_changes_in_one_batch(spark, tmp_path):
    location = str(tmp_path / "history")
    apply(spark, location, *reversed(IN_ORDER))
    assertDataFrameEqual(history(spark, location), expected(spark, *IN_ORDER_HISTORY))


def test_late_change_between_two_versions_and_before_the_first(spark, tmp_path):
    location = str(tmp_path / "history")
    apply(spark, location, change(1, 1, "a"), change(1, 3, "c"), change(2, 1, "x"))
    assertDataFrameEqual(
        history(spark, location),
        expected(
            spark,
            version(1, 1, "a", valid_to=3),
            version(1, 3, "c", None, current=True),
            version(2, 1, "x", None, current=True),
        ),
    )

    apply(spark, location, change(1, 2, "b"))  # late: belongs between 1 and 3
    assertDataFrameEqual(history(spark, location), expected(spark, *IN_ORDER_HISTORY))

    apply(spark, location, change(1, 0, "first"))  # late: before the first version
    assertDataFrameEqual(
        history(spark, location), expected(spark, version(1, 0, "first", valid_to=1), *IN_ORDER_HISTORY)
    )


def test_delete_closes_the_current_version_and_a_reinsert_opens_a_new_one(spark, tmp_path):
    location = str(tmp_path / "history")
    apply(spark, location, change(1, 1, "a"), change(1, 3, "a", op="delete"))
    assertDataFrameEqual(
        history(spark, location),
        expected(
            spark,
            version(1, 1, "a", valid_to=3),
            version(1, 3, "a", valid_to=3, deleted=True),
        ),
    )
    assert history(spark, location).where("_cdc_is_current").count() == 0

    apply(spark, location, change(1, 5, "again"))
    apply(spark, location, change(1, 2, "late before the delete"), change(1, 4, "late after the delete"))
    assertDataFrameEqual(
        history(spark, location),
        expected(
            spark,
            version(1, 1, "a", valid_to=2),
            version(1, 2, "late before the delete", valid_to=3),
            version(1, 3, "a", valid_to=3, deleted=True),
            version(1, 4, "late after the delete", valid_to=5),
            version(1, 5, "again", None, current=True),
        ),
    )
    as_of = history(spark, location).where(
        f"_cdc_valid_from <= '{at(3)}' AND (_cdc_valid_to IS NULL OR '{at(3)}' < _cdc_valid_to)"
    )
    assert as_of.count() == 0  # deleted at that time


def test_replayed_changes_change_nothing(spark, tmp_path):
    location = str(tmp_path / "history")
    apply(spark, location, *IN_ORDER)
    version_before = DeltaTable.forPath(spark, location).history(1).head().version
    for _ in range(2):
        apply(spark, location, *IN_ORDER, *IN_ORDER[:1])  # a duplicate within the batch too
        assertDataFrameEqual(history(spark, location), expected(spark, *IN_ORDER_HISTORY))
    operations = DeltaTable.forPath(spark, location).history().where(f"version > {version_before}")
    assert (
        operations.where(
            "operationMetrics.numTargetRowsInserted != '0' OR operationMetrics.numTargetRowsUpdated != '0'"
        ).count()
        == 0
    )


def test_a_missing_column_is_a_config_error(spark, tmp_path):
    changes = spark.createDataFrame([change(1, 1, "a")], CHANGES).drop("seq")
    with pytest.raises(ConfigError, match="no position column 'seq'"):
        apply_history(spark, str(tmp_path / "history"), TableSettings(), changes, SPEC)


def test_debezium_ops_map_to_upserts_and_deletes(spark):
    ops = spark.createDataFrame([("c",), ("u",), ("r",), ("d",)], "op string").select(op_of_debezium(F.col("op")))
    assert [row[0] for row in ops.collect()] == ["upsert", "upsert", "upsert", "delete"]


MARK = "__debezium_unavailable_value"


def test_an_unchanged_marker_takes_the_previous_versions_value_even_a_null(spark, tmp_path):
    location = str(tmp_path / "history")
    unchanged = {"name": lambda value: value == MARK}
    apply_history(
        spark,
        location,
        TableSettings(),
        spark.createDataFrame([change(1, 1, "a"), change(1, 2, MARK), change(2, 1, None)], CHANGES),
        SPEC,
        unchanged,
    )
    # Later batches: the previous version is in the table; a late marker takes the value before it.
    later = spark.createDataFrame([change(1, 3, MARK), change(2, 2, MARK)], CHANGES)
    apply_history(spark, location, TableSettings(), later, SPEC, unchanged)
    late = spark.createDataFrame([change(1, 0, "late"), change(1, 4, "b")], CHANGES)
    apply_history(spark, location, TableSettings(), late, SPEC, unchanged)
    assertDataFrameEqual(
        history(spark, location),
        expected(
            spark,
            version(1, 0, "late", valid_to=1),
            version(1, 1, "a", valid_to=2),
            version(1, 2, "a", valid_to=3),
            version(1, 3, "a", valid_to=4),
            version(1, 4, "b", None, current=True),
            version(2, 1, None, valid_to=2),
            version(2, 2, None, None, current=True),
        ),
    )


def test_closing_versions_delete_every_key_open_before_a_truncate(spark, tmp_path):
    location = str(tmp_path / "history")
    apply(spark, location, change(1, 1, "a"), change(2, 1, "x"), change(2, 2, "x", op="delete"), change(3, 6, "after"))
    changes = spark.createDataFrame([], CHANGES)
    closing = closing_versions(history(spark, location), SPEC, changes.schema, {"seq": 5}, {"changed_at": F.lit(at(5))})
    assertDataFrameEqual(closing, spark.createDataFrame([(1, 5, None, at(5), "delete")], CHANGES))
    apply_history(spark, location, TableSettings(), closing, SPEC)
    assertDataFrameEqual(
        history(spark, location),
        expected(
            spark,
            version(1, 1, "a", valid_to=5),
            version(1, 5, None, valid_to=5, deleted=True),
            version(2, 1, "x", valid_to=2),
            version(2, 2, "x", valid_to=2, deleted=True),
            version(3, 6, "after", None, current=True),
        ),
    )


def test_streamed_changes_delivered_again_are_left_out_and_reads_stay(spark):
    """Kafka Connect re-sends a change at a later offset with its LSN and op; snapshot reads (and a reset's
    delete versions) share a snapshot's LSN, so they stay told apart by their whole position."""
    columns = "id long, _cdc_lsn long, _cdc_offset long, _cdc_op string, name string"
    held = spark.createDataFrame([(1, 2, 1, "u", "b"), (2, 3, 2, "r", "x")], columns)
    versions = spark.createDataFrame(
        [
            (1, 2, 7, "u", "b"),  # held: delivered again
            (1, 5, 9, "u", "c"),  # new, twice in the batch: the first kept
            (1, 5, 8, "u", "c"),
            (2, 3, 10, "r", "x"),  # a read at a held read's LSN: another snapshot's
            (2, 3, 11, "u", "y"),  # a change at a read's LSN
        ],
        columns,
    )
    assertDataFrameEqual(
        delivered_first(versions, held, ["id"]),
        [(1, 5, 8, "u", "c"), (2, 3, 10, "r", "x"), (2, 3, 11, "u", "y")],
    )
    # Rows flattened without `__lsn` have none (0): two updates of a key are two changes, not one delivered again.
    unplaced = spark.createDataFrame([(3, 0, 12, "u", "p"), (3, 0, 13, "u", "q")], columns)
    assertDataFrameEqual(delivered_first(unplaced, held, ["id"]), unplaced)
    # Before the history's first batch nothing is held; a change twice in the batch is still kept once.
    assertDataFrameEqual(
        delivered_first(versions, None, ["id"]),
        [(1, 2, 7, "u", "b"), (1, 5, 8, "u", "c"), (2, 3, 10, "r", "x"), (2, 3, 11, "u", "y")],
    )


# --- tracked columns: a change of untracked columns alone updates the version before it in place ----------

TRACKED_SPEC = HistorySpec(
    key_columns=["id"], position_columns=["seq"], valid_from_column="changed_at", tracked_columns=["email"]
)
TRACKED_CHANGES = "id long, seq long, email string, balance long, changed_at timestamp, op string"


def tracked_model(changes: list[tuple]) -> list[tuple]:
    """The versions a history tracking ``email`` holds after ``changes`` (each once, in source order):
    (id, first seq, email, balance, last seq, deleted)."""
    versions: dict[int, list[list]] = {}
    for key, seq, email, balance, _, op in sorted(set(changes), key=lambda c: (c[0], c[1])):
        held = versions.setdefault(key, [])
        if op == "delete":
            held.append([key, seq, None, None, seq, True])
        elif held and not held[-1][5] and held[-1][2] == email:
            held[-1][3:5] = [balance, seq]
        else:
            held.append([key, seq, email, balance, seq, False])
    return sorted(tuple(v) for held in versions.values() for v in held)


@pytest.mark.parametrize("seed", [1, 2])
def test_untracked_changes_update_the_version_in_place_whatever_the_batches_and_replays(spark, tmp_path, seed):
    """Random changes of three keys (email tracked, balance not; deletes and re-inserts) in random
    batches, each also delivering again a few changes of earlier batches, then a batch of changes
    delivered again only, against a model."""
    import itertools
    import random

    rng = random.Random(seed)
    changes = []
    for seq in range(1, 41):
        key = rng.randint(1, 3)
        op = "delete" if rng.random() < 0.1 else "upsert"
        email = None if op == "delete" else rng.choice(["a@x", "a@x", "a@x", "b@x", None])  # mostly untracked changes
        balance = None if op == "delete" else rng.randint(0, 3)
        changes.append((key, seq, email, balance, at(seq), op))
    location = str(tmp_path / "history")
    cuts = sorted(rng.sample(range(1, len(changes)), 4))
    delivered: list[tuple] = []
    for start, end in zip([0, *cuts], [*cuts, len(changes)], strict=True):
        again = rng.sample(delivered, min(len(delivered), rng.randint(2, 10)))
        batch = changes[start:end] + again
        delivered += changes[start:end]
        apply_history(spark, location, TableSettings(), spark.createDataFrame(batch, TRACKED_CHANGES), TRACKED_SPEC)
    # A batch of changes delivered again only, as after a task's restart: some at random, and those a
    # version holds that are not its last (delivered again, they must not undo the later ones).
    inside = {(key, seq) for key, first, *_, last, _ in tracked_model(changes) for seq in range(first + 1, last)}
    replayed = rng.sample(changes, 6) + [c for c in changes if (c[0], c[1]) in inside]
    apply_history(spark, location, TableSettings(), spark.createDataFrame(replayed, TRACKED_CHANGES), TRACKED_SPEC)
    rows = history(spark, location).collect()
    got = sorted((r.id, r.seq, r.email, r.balance, r.seq_last, r._cdc_is_deleted) for r in rows)
    assert got == tracked_model(changes), f"seed {seed}"
    by_key: dict[int, list] = {}
    for row in sorted(rows, key=lambda r: (r.id, r.seq)):
        by_key.setdefault(row.id, []).append(row)
    for held in by_key.values():  # one chain of validity per key, current only at its live end
        for v, w in itertools.pairwise(held):  # a delete is a zero-length version
            assert v._cdc_valid_to == (v._cdc_valid_from if v._cdc_is_deleted else w._cdc_valid_from)
        assert [v._cdc_is_current for v in held] == [False] * (len(held) - 1) + [not held[-1]._cdc_is_deleted]
