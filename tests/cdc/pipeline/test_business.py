"""Business tables: incremental refresh equals a full recomputation; other queries refresh fully."""

import threading
import time
from datetime import datetime

from delta.tables import DeltaTable
from pyspark.sql.types import IntegerType, StringType, StructField, StructType
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import AvailableNow, Continuous
from cdc.pipeline.business import (
    BusinessTableConfig,
    RefreshMode,
    changed_groups,
    refresh_business_table,
    run_business_tables,
)
from refine.apply.merge import TableSettings, ensure_refined_table

SESSIONS = "player string, session_id long, started_at timestamp"
PER_PLAYER = (
    "SELECT player, count(*) AS sessions, min(started_at) AS first_session, max(started_at) AS last_session "
    "FROM sessions WHERE session_id > 0 GROUP BY player"
)


def at(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 3, day, hour)


def refined_sessions(spark, location: str) -> None:
    rows = [
        ("ann", 1, at(1)),
        ("ann", 2, at(2)),
        ("bob", 3, at(1)),
        ("cyd", 4, at(3)),
        (None, 5, at(4)),
        ("dan", 6, at(5)),
        ("dan", -1, at(9)),
    ]
    (
        spark.createDataFrame(rows, SESSIONS)
        .write.format("delta")
        .option("delta.enableChangeDataFeed", "true")
        .save(location)
    )


def version(spark, location: str) -> int:
    return DeltaTable.forPath(spark, location).history(1).head().version


def table(spark, location: str):
    return spark.read.format("delta").load(location)


def test_incremental_refresh_equals_a_full_recomputation(spark, tmp_path):
    source = str(tmp_path / "refined" / "sessions")
    refined_sessions(spark, source)
    config = BusinessTableConfig(
        name="per_player", query=PER_PLAYER, location=str(tmp_path / "business"), views={"sessions": source}
    )

    assert refresh_business_table(spark, config).mode is RefreshMode.FULL
    assertDataFrameEqual(table(spark, config.location), spark.sql(PER_PLAYER))
    written = version(spark, config.location)
    assert refresh_business_table(spark, config).mode is RefreshMode.UNCHANGED
    assert version(spark, config.location) == written  # no change, no new version

    updates = spark.createDataFrame(
        [("ann", 2, at(1, 6)), ("bob", 7, at(8)), ("eve", 8, at(2)), (None, 9, at(7))], SESSIONS
    )
    (
        DeltaTable.forPath(spark, source)
        .alias("t")
        .merge(updates.alias("s"), "t.session_id = s.session_id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    DeltaTable.forPath(spark, source).delete("player = 'cyd'")  # cyd's group disappears
    DeltaTable.forPath(spark, source).update("session_id = 6", {"player": "'ann'"})  # moves from dan to ann

    outcome = refresh_business_table(spark, config)
    assert outcome.mode is RefreshMode.INCREMENTAL, outcome.reason
    assertDataFrameEqual(table(spark, config.location), spark.sql(PER_PLAYER))
    # Only the changed groups were written: ann, bob, NULL updated; eve inserted; cyd, dan deleted.
    metrics = DeltaTable.forPath(spark, config.location).history().where("operation = 'MERGE'").head().operationMetrics
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["numTargetRowsDeleted"]) == (
        "3",
        "1",
        "2",
    )
    written = version(spark, config.location)
    assert refresh_business_table(spark, config).mode is RefreshMode.UNCHANGED
    assert version(spark, config.location) == written


def test_a_join_with_a_window_is_refreshed_fully(spark, tmp_path):
    source = str(tmp_path / "refined" / "sessions")
    refined_sessions(spark, source)
    query = (
        f"SELECT s.player, s.session_id, rank() OVER (PARTITION BY s.player ORDER BY s.started_at) AS nth, p.total "
        f"FROM delta.`{source}` s JOIN (SELECT player, count(*) AS total FROM delta.`{source}` GROUP BY player) p "
        f"ON s.player = p.player"
    )
    config = BusinessTableConfig(name="ranked", query=query, location=str(tmp_path / "business"))
    assert refresh_business_table(spark, config).mode is RefreshMode.FULL
    DeltaTable.forPath(spark, source).delete("session_id = 1")
    outcome = refresh_business_table(spark, config)
    assert outcome.mode is RefreshMode.FULL
    assert "not a single GROUP BY aggregate" in outcome.reason
    assertDataFrameEqual(table(spark, config.location), spark.sql(query))
    assert DeltaTable.forPath(spark, config.location).history(2).select("operation").collect()[1][0] == "WRITE"
    assert refresh_business_table(spark, config).mode is RefreshMode.UNCHANGED


def test_an_aggregate_of_the_whole_table_is_refreshed_fully(spark, tmp_path):
    source = str(tmp_path / "refined" / "sessions")
    refined_sessions(spark, source)
    query = f"SELECT count(DISTINCT player) AS players, count(*) AS sessions FROM delta.`{source}`"
    config = BusinessTableConfig(name="totals", query=query, location=str(tmp_path / "business"))
    assert refresh_business_table(spark, config).mode is RefreshMode.FULL
    DeltaTable.forPath(spark, source).delete("player = 'cyd'")
    outcome = refresh_business_table(spark, config)  # it stopped with a syntax error in its recomputation
    assert outcome.mode is RefreshMode.FULL
    assert "no GROUP BY" in outcome.reason
    assertDataFrameEqual(table(spark, config.location), spark.sql(query))


def test_the_loop_refreshes_on_its_interval_until_stopped(spark, tmp_path):
    source = str(tmp_path / "refined" / "sessions")
    refined_sessions(spark, source)
    config = BusinessTableConfig(
        name="per_player", query=PER_PLAYER, location=str(tmp_path / "business"), views={"sessions": source}
    )
    assert run_business_tables(spark, [config], AvailableNow(), say=lambda line: None) == 1

    stop = threading.Event()
    lines: list[str] = []
    loop = threading.Thread(
        target=run_business_tables, args=(spark, [config], Continuous(interval_s=0.2), stop, lines.append)
    )
    loop.start()
    try:
        DeltaTable.forPath(spark, source).delete("player = 'bob'")
        deadline = time.monotonic() + 120
        while not lines:
            assert time.monotonic() < deadline, "the loop did not refresh the business table"
            time.sleep(0.2)
    finally:
        stop.set()
        loop.join(timeout=120)
    assert not loop.is_alive()
    assert lines[0].startswith("business per_player: incremental refresh")
    assertDataFrameEqual(table(spark, config.location), spark.sql(PER_PLAYER))


def test_only_the_changed_groups_are_aggregated(spark, tmp_path):
    source = str(tmp_path / "sessions")
    refined_sessions(spark, source)
    spark.read.format("delta").load(source).createOrReplaceTempView("sessions")
    changed = spark.createDataFrame([("ann",), (None,)], "player string")
    groups = changed_groups(spark, spark.sql(PER_PLAYER), changed, ["player"])
    assertDataFrameEqual(groups, spark.sql(PER_PLAYER).where("player = 'ann' OR player IS NULL"))
    plan = groups._jdf.queryExecution().optimizedPlan().toString()
    assert plan.index("Aggregate") < plan.index("LeftSemi"), plan  # the semi-join runs below the aggregate


def test_a_query_naming_a_column_its_source_no_longer_has_is_told_so(spark, tmp_path):
    """A refined table keeps a column its source dropped (``lenient``): a business table reading it gets NULL
    for rows written since, and its refresh names the column; a column that comes back is no longer named."""
    location = str(tmp_path / "items")
    stored = StructType([StructField("id", IntegerType()), StructField("gone", StringType())])
    spark.createDataFrame([(1, "g1")], stored).write.format("delta").save(location)
    ensure_refined_table(spark, location, TableSettings(), StructType([stored["id"]]), source_columns=True)  # dropped
    ensure_refined_table(spark, location, TableSettings(), StructType([stored["id"]]), source_columns=True)  # again
    business = BusinessTableConfig(
        name="gone_by_id",
        query="SELECT id, gone, 'gone' AS label FROM items",
        location=str(tmp_path / "business"),
        views={"items": location},
    )
    told = (
        "business gone_by_id: its query reads column 'gone' of items, which the source no longer has (dropped or "
        "renamed there): rows written since hold NULL in it"
    )
    assert refresh_business_table(spark, business).warnings == (told,)
    ensure_refined_table(spark, location, TableSettings(), stored, source_columns=True)  # added again at the source
    spark.createDataFrame([(2, "g2")], stored).write.format("delta").mode("append").save(location)
    assert refresh_business_table(spark, business).warnings == ()
    versions = DeltaTable.forPath(spark, location).history().select("operation").collect()
    assert [row.operation for row in versions].count("CHANGE COLUMN") == 2  # marked once, then cleared
