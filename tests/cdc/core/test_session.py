import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import ConsoleLogLevel, GarbageCollector, LocalJars, ProvidedJars, SparkConfig
from cdc.core.session import job_spark_config, spark_conf


def test_conf_wires_delta_and_utc():
    conf = spark_conf(SparkConfig(jars=ProvidedJars()))
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.python.sql.dataFrameDebugging.enabled"] == "false"  # a Python stack walk per Column
    assert "spark.jars" not in conf


def test_local_master_keeps_the_driver_on_loopback_and_a_cluster_master_does_not():
    local = spark_conf(SparkConfig(jars=ProvidedJars()))
    assert local["spark.driver.bindAddress"] == "127.0.0.1"
    cluster = spark_conf(SparkConfig(master="spark://cluster:7077", jars=ProvidedJars()))
    assert "spark.driver.bindAddress" not in cluster
    assert "spark.driver.memory" not in cluster


def test_a_chosen_garbage_collector_comes_before_the_users_jvm_options_and_only_for_a_local_driver():
    user = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
    local = SparkConfig(
        jars=ProvidedJars(), class_archive=False, garbage_collector=GarbageCollector.PARALLEL, conf=user, log_dir=None
    )
    assert spark_conf(local)["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC -XX:TieredStopAtLevel=1"
    g1 = local.model_copy(update={"garbage_collector": GarbageCollector.G1, "conf": {}})
    assert spark_conf(g1)["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC"
    assert "spark.driver.extraJavaOptions" not in spark_conf(g1.model_copy(update={"garbage_collector": None}))
    cluster = local.model_copy(update={"master": "spark://cluster:7077"})
    assert spark_conf(cluster)["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"


def test_the_driver_logs_to_its_file_and_shows_the_terminal_its_errors_only(tmp_path, monkeypatch):
    # As in a process whose JVM started earlier with another log folder (the test session's own).
    monkeypatch.setattr("cdc.core.session.log_file", tmp_path / "earlier" / "cdc-1.log")
    config = SparkConfig(jars=ProvidedJars(), class_archive=False, log_dir=tmp_path / "logs")
    options = spark_conf(config)["spark.driver.extraJavaOptions"].split()
    assert options[0] == f"-Dlog4j2.configurationFile={tmp_path / 'logs' / 'log4j2.properties'}"
    assert options[1].startswith(f"-Dcdc.log.file={tmp_path / 'logs'}/cdc-")
    assert options[1].endswith(".log")
    assert options[2:4] == ["-Dcdc.log.console=error", "-Dcdc.log.level=warn"]
    verbose = config.model_copy(update={"console_log_level": ConsoleLogLevel.INFO})
    assert spark_conf(verbose)["spark.driver.extraJavaOptions"].split()[2:4] == [
        "-Dcdc.log.console=info",
        "-Dcdc.log.level=info",
    ]
    # The driver runs in this process's JVM on a cluster's master too (client mode): its logs are routed
    # alike (the executors keep the cluster's own logging).
    cluster = config.model_copy(update={"master": "spark://cluster:7077"})
    assert spark_conf(cluster)["spark.driver.extraJavaOptions"].split()[:4] == options[:4]


def test_jobs_run_on_the_parallel_collector_unless_they_refine_continuously_or_one_is_chosen():
    assert job_spark_config(SparkConfig(), refines_continuously=False).garbage_collector is GarbageCollector.PARALLEL
    assert job_spark_config(SparkConfig(), refines_continuously=True).garbage_collector is None  # the JVM's G1
    chosen = SparkConfig(garbage_collector=GarbageCollector.G1)
    assert job_spark_config(chosen, refines_continuously=False) is chosen


def test_user_conf_is_applied_last():
    conf = spark_conf(SparkConfig(jars=ProvidedJars(), conf={"spark.sql.shuffle.partitions": "64"}))
    assert conf["spark.sql.shuffle.partitions"] == "64"


def test_local_jars_folder_goes_on_the_classpath(tmp_path):
    for name in ("b.jar", "a.jar"):
        (tmp_path / name).write_bytes(b"")
    conf = spark_conf(SparkConfig(jars=LocalJars(folder=tmp_path)))
    assert conf["spark.jars"] == f"{tmp_path}/a.jar,{tmp_path}/b.jar"


def test_maven_jars_put_delta_the_kafka_source_and_the_helpers_on_the_classpath():
    jars = spark_conf(SparkConfig())["spark.jars"].split(",")
    names = {path.rsplit("/", 1)[1] for path in jars}
    assert "delta-spark_4.2_2.13-4.4.0.jar" in names
    assert "cdc-helpers.jar" in names
    assert "spark-sql-kafka-0-10_2.13-4.2.0.jar" in names
    assert not any(name.startswith("scala-library") for name in names), "pyspark ships Scala already"


def test_session_writes_delta_with_change_data_feed(spark, tmp_path):
    path = str(tmp_path / "table")
    spark.range(3).write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(path)
        .select("id", "_change_type", "_commit_version")
    )
    expected = spark.createDataFrame(
        [(0, "insert", 0), (1, "insert", 0), (2, "insert", 0), (1, "delete", 1)],
        "id long, _change_type string, _commit_version long",
    )
    assertDataFrameEqual(changes, expected)


def test_session_has_the_kafka_source(spark):
    # Resolved the way `format("kafka")` resolves it, through Spark's own class loader.
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource
    provider = lookup("kafka", spark._jsparkSession.sessionState().conf())
    assert provider.getName() == "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def test_timestamps_are_written_as_int64_micros_and_read_alike_beside_int96_files(spark, tmp_path):
    path = str(tmp_path / "table")
    rows = "SELECT {id} AS id, timestamp'0001-01-01 00:00:00' AS t, timestamp_ntz'2026-11-25 10:00:00.123456' AS n"
    spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")  # as files written before
    try:
        spark.sql(rows.format(id=1)).write.format("delta").save(path)
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.sql(rows.format(id=2)).write.format("delta").mode("append").save(path)
    physical = {str(pq.ParquetFile(file).schema.column(1).physical_type) for file in Path(path).glob("*.parquet")}
    assert physical == {"INT96", "INT64"}
    table = spark.read.format("delta").load(path).selectExpr("id", "CAST(t AS STRING) AS t", "CAST(n AS STRING) AS n")
    assertDataFrameEqual(
        table,
        [
            Row(id=1, t="0001-01-01 00:00:00", n="2026-11-25 10:00:00.123456"),
            Row(id=2, t="0001-01-01 00:00:00", n="2026-11-25 10:00:00.123456"),
        ],
    )


def test_a_stopping_jobs_jvm_sends_what_it_prints_to_stderr_to_the_log_file_only(tmp_path):
    # A Scala Future rejected by a thread pool shutting down prints its stack trace on the JVM's stderr,
    # without a logger: after a SIGTERM, that too must reach the log file and not the terminal.
    script = f"""
from pathlib import Path
from cdc import SparkConfig, build_spark_session
from cdc.core import session
from cdc.core.functions import quiet_console_logs
spark = build_spark_session(SparkConfig(log_dir=Path({str(tmp_path)!r})))
spark._jvm.java.lang.System.err.println("before-the-stop")
quiet_console_logs()
spark._jvm.java.lang.System.err.println("java.util.concurrent.RejectedExecutionException: after-the-stop")
spark._jvm.java.lang.System.err.flush()
print(session.log_file, flush=True)
spark.stop()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "before-the-stop" in result.stderr
    assert "after-the-stop" not in result.stderr
    assert "RejectedExecutionException: after-the-stop" in Path(result.stdout.strip()).read_text()


def _jobs_of_an_append(spark, location: str, group: str) -> int:
    spark.sparkContext.setJobGroup(group, group)
    try:
        spark.range(1).write.format("delta").mode("append").save(location)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_commit_costs_the_same_jobs_in_a_jvm_outside_utc(spark, tmp_path):
    """Delta re-reads a table's file list after each commit where the JVM's zone is not UTC, unless
    the session turns that check off."""
    location = str(tmp_path / "table")
    spark.range(1).write.format("delta").save(location)
    _jobs_of_an_append(spark, location, f"warm-{tmp_path.name}")
    in_utc = _jobs_of_an_append(spark, location, f"utc-{tmp_path.name}")
    zones = spark.sparkContext._jvm.java.util.TimeZone
    default = zones.getDefault()
    zones.setDefault(zones.getTimeZone("Europe/Berlin"))
    try:
        in_berlin = _jobs_of_an_append(spark, location, f"berlin-{tmp_path.name}")
    finally:
        zones.setDefault(default)
    assert in_berlin == in_utc


def test_the_accumulator_server_says_nothing_when_the_jvm_goes_away(spark, capsys):
    """A signal stops the JVM while PySpark's accumulator server reads from it: socketserver printed the
    EOFError's traceback to stderr at every such stop."""
    server = spark.sparkContext._accumulatorServer
    try:
        raise EOFError
    except EOFError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert capsys.readouterr().err == ""
    try:
        raise ValueError("a real error")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert "a real error" in capsys.readouterr().err
