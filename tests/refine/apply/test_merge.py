"""The MERGE of a batch into a refined table, with and without the Bloom filter of the batch's keys."""

from __future__ import annotations

from contextlib import contextmanager

from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

import refine.apply.merge
from cdc.core.tables import CHECKPOINT_PROPERTIES, TableFeatures, delta_properties
from refine.apply.merge import (
    AUTO_COMPACT_PROPERTY,
    COMMITTED_AT,
    LSN,
    OFFSET,
    OP,
    REFINED_AT,
    TableSettings,
    ensure_refined_table,
    key_filter,
    merge_changes,
)

KEYS = ["id", "region"]  # a composite key: the filter hashes the key's columns together
ROW_TYPES = f"id int, region string, name string, {LSN} long, {OFFSET} long, {COMMITTED_AT} timestamp, {OP} string"


def changes(spark, rows: list[tuple]):
    """Refined rows (id, region, name, lsn, op) as the job hands them to the MERGE."""
    frame = spark.createDataFrame(
        [(id_, region, name, lsn, lsn, None, op) for id_, region, name, lsn, op in rows], ROW_TYPES
    )
    return frame.withColumn(REFINED_AT, F.current_timestamp())


def table_rows(spark, count: int):
    return spark.range(count).selectExpr(
        "CAST(id AS int) AS id",
        "IF(id % 2 = 0, 'eu', 'us') AS region",
        "concat('name ', id) AS name",
        f"100L AS {LSN}",
        f"id AS {OFFSET}",
        f"CAST(NULL AS timestamp) AS {COMMITTED_AT}",
        f"'r' AS {OP}",
        f"current_timestamp() AS {REFINED_AT}",
    )


def recorded_key_filters(monkeypatch) -> list:
    """The conditions merge_changes gets from key_filter (None where it builds none), as it gets them."""
    built, build = [], refine.apply.merge.key_filter

    @contextmanager
    def recording(*args):
        with build(*args) as condition:
            built.append(condition)
            yield condition

    monkeypatch.setattr(refine.apply.merge, "key_filter", recording)
    return built


def batch_key_functions(spark) -> list[str]:
    return [function.name for function in spark.catalog.listFunctions() if function.name.startswith("cdc_batch_keys_")]


def test_the_key_filter_keeps_every_key_of_the_batch_and_few_others(spark, tmp_path, monkeypatch):
    location = str(tmp_path / "refined")
    table_rows(spark, 20_000).write.format("delta").save(location)
    batch = [(id_, "eu" if id_ % 2 == 0 else "us") for id_ in range(0, 20_000, 100)]  # 200 held keys
    keys = spark.createDataFrame(batch + [(id_, "mars") for id_ in range(50)], "id int, region string")
    with key_filter(spark, location, keys, KEYS) as condition:
        assert condition is None, "a table this small should not be filtered"

    monkeypatch.setattr(refine.apply.merge, "KEY_FILTER_MIN_BYTES", 0)
    with key_filter(spark, location, keys, KEYS) as condition:
        assert condition is not None, "the session should have the helpers jar"
        kept = spark.read.format("delta").load(location).alias("t").where(condition)
        assert kept.join(keys, KEYS, "left_semi").count() == 200  # no false negative
        others = kept.join(keys, KEYS, "left_anti").count()
    assert others < 0.03 * 19_800, f"{others} of 19,800 rows whose key the batch lacks passed a 1% filter"
    assert batch_key_functions(spark) == [], "the filter's function outlived its block"


def test_a_merge_with_the_key_filter_equals_one_without(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(refine.apply.merge, "KEY_FILTER_MIN_BYTES", 0)
    built = recorded_key_filters(monkeypatch)
    filtered, plain = str(tmp_path / "filtered"), str(tmp_path / "plain")
    for location in (filtered, plain):
        table_rows(spark, 5_000).write.format("delta").save(location)
    batch = changes(
        spark,
        [
            (10, "eu", "updated", 200, "u"),
            (11, "us", None, 200, "d"),
            (12, "eu", "stale", 50, "u"),  # older than the row: ignored
            (13, "eu", "wrong region", 200, "u"),  # (13, eu) is no row: inserted
            (9_000, "eu", "new", 200, "c"),
            (9_001, "us", None, 200, "d"),  # a delete of a row never seen: nothing
        ],
    )
    for _ in range(2):  # a rerun of the batch changes nothing
        merge_changes(spark, filtered, TableSettings(), batch, KEYS, None, keys=batch.select(*KEYS))
        merge_changes(spark, plain, TableSettings(), batch, KEYS, None)
        read = [spark.read.format("delta").load(location).drop(REFINED_AT) for location in (filtered, plain)]
        assertDataFrameEqual(read[0], read[1])
    assert len(built) == 2
    assert all(condition is not None for condition in built)
    rows = {(row.id, row.region): row.name for row in read[0].where("id IN (10, 11, 12, 13, 9000, 9001)").collect()}
    assert rows == {
        (10, "eu"): "updated",
        (12, "eu"): "name 12",
        (13, "us"): "name 13",
        (13, "eu"): "wrong region",
        (9_000, "eu"): "new",
    }
    # Delta writes the condition into each commit: the filter is in it by name, not as its bytes.
    predicate = spark.sql(f"DESCRIBE HISTORY delta.`{filtered}` LIMIT 1").head().operationParameters["predicate"]
    assert "cdc_batch_keys_" in predicate, predicate[:300]
    assert len(predicate) < 1_000, predicate[:300]
    assert batch_key_functions(spark) == []


def test_no_key_filter_with_a_truncate(spark, tmp_path, monkeypatch):
    """A truncate's clause deletes the rows the batch does not match: none may be dropped from its join."""
    monkeypatch.setattr(refine.apply.merge, "KEY_FILTER_MIN_BYTES", 0)
    built = recorded_key_filters(monkeypatch)
    location = str(tmp_path / "refined")
    table_rows(spark, 100).write.format("delta").save(location)
    batch = changes(spark, [(1_000, "eu", "after the truncate", 200, "c")])
    merge_changes(spark, location, TableSettings(), batch, KEYS, (150, 0), keys=batch.select(*KEYS))
    assert built == []
    assert [row.id for row in spark.read.format("delta").load(location).collect()] == [1_000]


def test_refined_tables_compact_their_small_files(spark, tmp_path):
    location = str(tmp_path / "refined")
    settings = TableSettings(TableFeatures(change_data_feed=True))  # its feed is read below
    # Delta compacts once 50 small files are there; 4 keep the test short.
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "4")
    try:
        for lsn in range(200, 206):
            rows = changes(spark, [(lsn, "eu", f"name {lsn}", lsn, "c")])
            merge_changes(spark, location, settings, rows, KEYS, None)
    finally:
        spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
    table = DeltaTable.forPath(spark, location)
    assert table.detail().head().properties[AUTO_COMPACT_PROPERTY] == "true"
    assert table.detail().head().properties["delta.checkpointInterval"] == "100"  # see cdc/raw/table.py
    compactions = table.history().where("operation = 'OPTIMIZE'").collect()
    assert compactions
    assert all(row.operationParameters["auto"] == "true" for row in compactions)
    assert len(spark.read.format("delta").load(location).inputFiles()) < 6
    assert sorted(row.id for row in spark.read.format("delta").load(location).collect()) == list(range(200, 206))
    # Compactions change no data: the Change Data Feed holds the six inserts alone.
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(location)
    assert sorted((row.id, row._change_type) for row in feed.collect()) == [(lsn, "insert") for lsn in range(200, 206)]


def test_a_refined_table_of_an_earlier_version_gets_compaction_and_checkpoint_settings_unless_it_has_its_own(
    spark, tmp_path
):
    rows = changes(spark, [(1, "eu", "one", 100, "c")])
    defaults = {AUTO_COMPACT_PROPERTY: "true", **CHECKPOINT_PROPERTIES}
    for own in [{}, {AUTO_COMPACT_PROPERTY: "false", "delta.checkpointInterval": "10"}]:
        location = str(tmp_path / f"refined-{len(own)}")
        rows.write.format("delta").save(location)  # as an earlier version created it: no setting
        if own:
            settings = ", ".join(f"'{key}' = '{value}'" for key, value in own.items())
            spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ({settings})")
        merge_changes(spark, location, TableSettings(), changes(spark, [(2, "us", "two", 100, "c")]), KEYS, None)
        properties = DeltaTable.forPath(spark, location).detail().head().properties
        assert {key: properties.get(key) for key in defaults} == (defaults | own)


def test_a_refined_table_whose_creation_was_cut_short_is_created(spark, tmp_path):
    table = tmp_path / "refined"
    (table / "_delta_log" / "_staged_commits").mkdir(parents=True)  # a kill -9 while Delta created it
    ensure_refined_table(spark, str(table), TableSettings(), spark.range(0).schema)
    assert spark.read.format("delta").load(str(table)).columns == ["id"]


def _feature_state(spark, location: str) -> tuple[bool, bool]:
    """(deletion vectors in the table's protocol, Change Data Feed on)."""
    properties = delta_properties(spark, location)
    return "delta.feature.deletionVectors" in properties, properties.get("delta.enableChangeDataFeed") == "true"


def _deletion_vectors_added(spark, location: str) -> int:
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{location}`").where("operation = 'MERGE'").collect()
    return sum(int(row.operationMetrics.get("numTargetDeletionVectorsAdded", 0)) for row in metrics)


def _changes_leaving_deletion_vectors(spark, location: str, settings: TableSettings) -> None:
    """Inserts in one file, then an update and a delete of two of its rows: with deletion vectors on,
    the MERGE marks them in a deletion vector instead of rewriting the file."""
    inserts = changes(spark, [(i, "eu", f"name {i}", 100, "c") for i in range(20)])
    merge_changes(spark, location, settings, inserts, KEYS, None)
    later = changes(spark, [(3, "eu", "three", 200, "u"), (4, "eu", None, 200, "d")])
    merge_changes(spark, location, settings, later, KEYS, None)


def test_refined_tables_get_the_declared_features_and_by_default_delta_rs_reads_them(
    spark, tmp_path, read_with_delta_rs
):
    for features, expected in [
        (TableFeatures(), (False, False)),
        (TableFeatures(deletion_vectors=True, change_data_feed=True), (True, True)),
    ]:
        location = str(tmp_path / f"refined-{expected[0]}")
        settings = TableSettings(features)
        _changes_leaving_deletion_vectors(spark, location, settings)
        history = f"{location}__history"  # a table beside it: the same settings
        ensure_refined_table(spark, history, settings, spark.range(0).schema)
        assert _feature_state(spark, location) == _feature_state(spark, history) == expected
        assert (_deletion_vectors_added(spark, location) > 0) == expected[0]
        stored = spark.read.format("delta").load(location)
        assert sorted(row.id for row in stored.collect()) == [i for i in range(20) if i != 4]
        if not features.deletion_vectors:
            assertDataFrameEqual(read_with_delta_rs(location), stored)


def test_features_set_on_an_existing_table_are_applied_and_unset_ones_leave_it_as_it_is(
    spark, tmp_path, read_with_delta_rs
):
    location = str(tmp_path / "refined")
    _changes_leaving_deletion_vectors(
        spark, location, TableSettings(TableFeatures(deletion_vectors=True, change_data_feed=True))
    )
    assert _deletion_vectors_added(spark, location) > 0
    # Each TableSettings is a new job's: applied at its table's first batch.
    merge_changes(spark, location, TableSettings(), changes(spark, [(30, "us", "thirty", 300, "c")]), KEYS, None)
    assert _feature_state(spark, location) == (True, True)
    # Both off: the deletion vectors are purged and the feature leaves the protocol.
    off = TableSettings(TableFeatures(deletion_vectors=False, change_data_feed=False))
    merge_changes(spark, location, off, changes(spark, [(31, "us", "thirty-one", 300, "c")]), KEYS, None)
    assert _feature_state(spark, location) == (False, False)
    stored = spark.read.format("delta").load(location)
    assert sorted(row.id for row in stored.collect()) == [*[i for i in range(20) if i != 4], 30, 31]
    assertDataFrameEqual(read_with_delta_rs(location), stored)
    # On again: a Change Data Feed from the next version on, deletion vectors for the next MERGE.
    on = TableSettings(TableFeatures(deletion_vectors=True, change_data_feed=True))
    merge_changes(spark, location, on, changes(spark, [(5, "eu", "five", 400, "u")]), KEYS, None)
    assert _feature_state(spark, location) == (True, True)
