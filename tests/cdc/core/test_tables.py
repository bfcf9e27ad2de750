"""Delta table helpers of cdc/core/tables.py."""

from delta.tables import DeltaTable

from cdc.core.streaming import counting_spark_jobs
from cdc.core.tables import delta_properties, table_snapshot, table_version


def test_a_tables_snapshot_is_its_last_commit_and_the_size_delta_reports(spark, tmp_path):
    location = str(tmp_path / "table")
    spark.range(1000).write.format("delta").save(location)
    for round_ in range(3):
        # Each commit changes both: the snapshot is read again, never the one of an earlier call.
        spark.range(100 * (round_ + 1)).write.format("delta").mode("append").save(location)
        table = DeltaTable.forPath(spark, location)
        detail = table.detail().head()
        assert table_snapshot(spark, location) == (table.history(1).head().version, detail.sizeInBytes, detail.id)
    assert table_version(spark, location) == 3


def test_a_tables_snapshot_runs_no_spark_job(spark, tmp_path):
    """Its size comes from the version's checksum: Delta's own ``sizeInBytes`` rebuilt the version's state in
    three Spark jobs (~0.7 s) on every call, and the refine loop asks for every table's version each round."""
    location = str(tmp_path / "table")
    spark.range(10).write.format("delta").save(location)
    jobs: dict[int, int] = {}
    for round_ in range(3):
        spark.range(5).write.format("delta").mode("append").save(location)
        spark.sparkContext.setJobGroup("cdc-snapshot-test", "a table's snapshot")
        try:
            with counting_spark_jobs(spark, jobs, round_):
                table_snapshot(spark, location)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert jobs == {0: 0, 1: 0, 2: 0}


def test_a_commit_of_another_session_is_seen(spark, tmp_path):
    location = str(tmp_path / "table")
    spark.range(10).write.format("delta").save(location)
    assert table_version(spark, location) == 0
    spark.newSession().range(10).write.format("delta").mode("append").save(location)
    assert table_version(spark, location) == 1


def test_properties_whose_values_spark_redacts_are_read_as_they_are(spark, tmp_path):
    """Spark's SHOW TBLPROPERTIES redacts values holding "url", "token", "password" or "secret": a raw table
    of topic ``app.tokens`` must still tell its topic (its job refused its second run)."""
    location = str(tmp_path / "table")
    values = {"cdc.topic": "app.tokens", "cdc.schema": '{"password_hash": "string"}', "cdc.other": "url_safe"}
    settings = ", ".join(f"'{key}' = '{value}'" for key, value in values.items())
    spark.sql(f"CREATE TABLE delta.`{location}` (id int) USING delta TBLPROPERTIES ({settings}, 'cdc.plain' = 'x')")
    properties = delta_properties(spark, location)
    assert {key: properties[key] for key in [*values, "cdc.plain"]} == {**values, "cdc.plain": "x"}
