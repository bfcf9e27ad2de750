"""Delta table helpers of cdc/core/tables.py."""

from delta.tables import DeltaTable

from cdc.core.tables import table_snapshot, table_version


def test_a_tables_snapshot_is_its_last_commit_and_the_size_delta_reports(spark, tmp_path):
    location = str(tmp_path / "table")
    spark.range(1000).write.format("delta").save(location)
    for round_ in range(3):
        # Each commit changes both: the snapshot is read again, never the one of an earlier call.
        spark.range(100 * (round_ + 1)).write.format("delta").mode("append").save(location)
        table = DeltaTable.forPath(spark, location)
        assert table_snapshot(spark, location) == (
            table.history(1).head().version,
            table.detail().head().sizeInBytes,
        )
    assert table_version(spark, location) == 3


def test_a_commit_of_another_session_is_seen(spark, tmp_path):
    location = str(tmp_path / "table")
    spark.range(10).write.format("delta").save(location)
    assert table_version(spark, location) == 0
    spark.newSession().range(10).write.format("delta").mode("append").save(location)
    assert table_version(spark, location) == 1
