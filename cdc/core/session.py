"""The one place that builds the SparkSession: Delta Lake and Spark's Kafka source on any master."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO

from pyspark import SparkContext
from pyspark.sql import SparkSession

from cdc.core import class_archive, jars
from cdc.core.catalog import catalog_conf, derby_log_option
from cdc.core.config import GarbageCollector, LocalJars, MavenJars, SparkConfig
from cdc.core.errors import DependencyError
from cdc.core.functions import quiet_console_logs_on_shutdown, register_helpers

# What the status store keeps when no UI shows it: a few refine batches (~40 SQL executions each with history).
_RETAINED_WITHOUT_UI = {
    "spark.sql.ui.retainedExecutions": "200",
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
}


def spark_conf(config: SparkConfig) -> dict[str, str]:
    """The Spark settings :func:`build_spark_session` applies, in order (later keys win)."""
    conf = {
        "spark.master": config.master,
        "spark.app.name": config.app_name,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # CDC timestamps are instants: keep them in UTC whatever the machine's zone.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.ui.enabled": str(config.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        # The status store keeps ended jobs, stages and SQL executions (1,000 each by default) in the
        # driver's heap even with the UI off: ~55 MB in a test driver after ~20 minutes of refining.
        **({} if config.ui_enabled else _RETAINED_WITHOUT_UI),
        # Small Delta logs checkpoint and snapshot fast with few partitions on a small machine.
        "spark.databricks.delta.snapshotPartitions": str(max(config.shuffle_partitions, 1)),
        # Where the JVM's default time zone is not UTC, Delta rebuilds and collects a small table's
        # whole file list after every commit, only to check the copy its checksum keeps (a mismatch
        # just drops that copy, which no read uses): one more state query per commit, three per refine
        # batch with history (41 SQL executions instead of 38, TZ=Europe/Berlin).
        "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        # One refine micro-batch (parse, MERGE, Delta snapshot) generates ~170 classes: with Spark's
        # default cache of 100 every batch compiled them all again (~170 Janino compiles instead of
        # ~7 per steady batch).
        "spark.sql.codegen.cache.maxEntries": "2000",
        # A raw batch has one ingest_date, so one partition per task: with a writer per partition
        # value (up to 4 per task, then Spark falls back to sorting) a partitioned append streams its
        # rows to parquet instead of first sorting ~1 GB of records by a constant column.
        "spark.sql.maxConcurrentOutputFileWriters": "4",
        # Cached batches are mostly Debezium's JSON texts, each unique: the cache's run-length and
        # dictionary encodings only try and give up (building refine's cache of 300k records:
        # ~3.9 s compressed, ~2.5 s not, in one warm JVM).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Timestamps as Parquet's int64 microseconds instead of Spark's default, the deprecated INT96:
        # each INT96 value is a 12-byte binary built and dictionary-hashed per row. A warm refine of
        # 300k changes into 1M rows took ~8.5 s instead of ~9.6 s. Files of both kinds read alike.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # PySpark 4 records the Python call site of every Column function for error messages (four
        # round trips to the JVM and a stack walk each): a refine batch builds thousands of them, and
        # the call sites would name this library's lines. Building the same parse plan: ~3x less
        # Python CPU, ~25% less wall time.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    if config.is_local:
        # A local driver serves only this machine: keep every port it opens on loopback.
        conf |= {
            "spark.driver.memory": config.driver_memory,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        }
    jar_paths = _jar_paths(config)
    if jar_paths:
        conf["spark.jars"] = ",".join(jar_paths)
    conf |= catalog_conf(config.catalog, metastore_dir(config))
    conf |= config.conf
    # The class archive and the collector are tuned for a driver that also runs the tasks.
    archive_options = _class_archive_options(config, jar_paths) if config.is_local and config.class_archive else []
    collector = [config.garbage_collector.jvm_option] if config.is_local and config.garbage_collector else []
    logging_options = _log_options(config) + derby_log_option(config.catalog, metastore_dir(config))
    if archive_options or collector or logging_options:
        # Before the user's own options: a later JVM option wins over an earlier one.
        user_options = config.conf.get("spark.driver.extraJavaOptions", "")
        options = [*logging_options, *archive_options, *collector, user_options]
        conf["spark.driver.extraJavaOptions"] = " ".join(options).strip()
    return conf


def metastore_dir(config: SparkConfig) -> Path:
    """The embedded metastore's folder: the catalog's setting, else ``.cdc/metastore`` (the API and the CLI
    set it under a local warehouse)."""
    return config.catalog.metastore_dir or Path(".cdc/metastore")


# The JVM's log lines (Spark's, Delta's, the Kafka client's) on the terminal drown the job's own: a refine
# batch alone logs plan truncations and local checkpoints as warnings. A local JVM this process starts
# shows the terminal only its errors (ConsoleLogLevel) and keeps its warnings in a file of its own.
_LOG4J2_PROPERTIES = """\
# Written by cdc-lakehouse (cdc.core.session): the terminal shows ${sys:cdc.log.console} and up,
# ${sys:cdc.log.file} keeps every line the root level lets through.
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = ${sys:cdc.log.console}
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:cdc.log.file}
appender.file.createOnDemand = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{yyyy-MM-dd HH:mm:ss.SSS} %p [%t] %c: %m%n%ex
rootLogger.level = ${sys:cdc.log.level}
rootLogger.appenderRef.console.ref = console
rootLogger.appenderRef.file.ref = file
# As Spark's own defaults: third-party chatter that is noise even in a log file.
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.hadoop_native.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop_native.level = error
"""
# The log file of this process's JVM: set by the first local session with a log_dir (a path per process).
log_file: Path | None = None
# The log file this process names in each log folder (one name per process and folder, whenever asked).
_log_files: dict[Path, Path] = {}


def _log_options(config: SparkConfig) -> list[str]:
    """The driver JVM's options that route its logs (with a ``log_dir``): on any master, as the driver
    runs in this process's JVM (client mode); the executors keep the cluster's own logging."""
    if config.log_dir is None:
        return []
    log_dir = config.log_dir.resolve()
    file = _log_files.setdefault(log_dir, log_dir / f"cdc-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    return [
        f"-Dlog4j2.configurationFile={log_dir / 'log4j2.properties'}",
        f"-Dcdc.log.file={file}",
        f"-Dcdc.log.console={config.console_log_level.value}",
        f"-Dcdc.log.level={config.console_log_level.file_level}",
    ]


def _prepare_log_file(config: SparkConfig) -> None:
    """Write the log configuration the JVM's options name, and remember this process's log file."""
    global log_file  # noqa: PLW0603 - one log file per process, known once its JVM starts
    if not _log_options(config) or log_file is not None or config.log_dir is None:
        return
    log_dir = config.log_dir.resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    properties = log_dir / "log4j2.properties"
    if not properties.exists() or properties.read_text() != _LOG4J2_PROPERTIES:
        properties.write_text(_LOG4J2_PROPERTIES)
    log_file = _log_files[log_dir]


def job_spark_config(config: SparkConfig, *, refines_continuously: bool) -> SparkConfig:
    """The session settings a `cdc` job runs with. Unless the user chose a garbage collector, the
    parallel one, which spends less CPU per record than the JVM's default, G1 (landing 1M records of
    ~1 KB in a warm JVM: ~11 CPU s instead of ~12.5, ~13% more rows/s; refining 300,000 changes into
    10M rows: ~6% more changes/s). A job that refines continuously keeps G1: the parallel collector's
    full collections stop the JVM (~0.2 s each) inside a commit's way to its refined table."""
    if config.garbage_collector is not None or refines_continuously:
        return config
    return config.model_copy(update={"garbage_collector": GarbageCollector.PARALLEL})


# A query's failure reaches the user as the job's own one-line error (cdc.core.streaming.batch_error); Spark,
# PySpark and py4j would each log it first with its whole stack (a failed micro-batch's: the Python
# traceback too). Shown under `cdc --debug`, which sets this.
show_failure_logs = False
_STREAM_ENGINES = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.StreamExecution",
)
_FAILURE_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger", "py4j.clientserver")


def _no_failure_logs(record: logging.LogRecord) -> bool:
    return record.name == "py4j.clientserver" and not record.getMessage().startswith(
        "There was an exception while executing the Python Proxy"
    )


def _show_failure_logs(spark: SparkSession, show: bool) -> None:
    from pyspark.logger import PySparkLogger

    jvm = spark._jvm
    assert jvm is not None  # a live session has its JVM gateway
    level = jvm.org.apache.logging.log4j.Level.ERROR if show else jvm.org.apache.logging.log4j.Level.OFF
    for engine in _STREAM_ENGINES:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(engine, level)
    for name in _FAILURE_LOGGERS:
        logger = logging.getLogger(name) if name.startswith("py4j") else PySparkLogger.getLogger(name)
        (logger.removeFilter if show else logger.addFilter)(_no_failure_logs)


def build_spark_session(config: SparkConfig | None = None) -> SparkSession:
    """Build (or return the running) SparkSession configured by ``config``: Delta Lake, Spark's Kafka
    source and the project's JVM helpers, on any master.

    Example::

        from cdc import SparkConfig
        from cdc import build_spark_session

        spark = build_spark_session(SparkConfig(app_name="nightly-refine"))

    Settings that only take effect when the JVM starts (jars, driver memory) apply to the first
    session of the process; a later call returns that session with the SQL settings re-applied.
    """
    config = config or SparkConfig()
    if config.is_local:
        # Spark otherwise picks the host's first non-loopback address for its own servers.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers (Protobuf decoding runs in them) use this interpreter and its packages, not
        # whatever `python3` is first on the PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    starts_jvm = SparkSession.getActiveSession() is None and SparkContext._active_spark_context is None
    if starts_jvm:
        _prepare_log_file(config)
        if derby_log_option(config.catalog, folder := metastore_dir(config)):
            # Derby writes its log there from its start: a missing folder sends its boot banner and a
            # FileNotFoundException to the terminal instead.
            folder.expanduser().mkdir(parents=True, exist_ok=True)
    settings = spark_conf(config)
    if starts_jvm and "PYSPARK_GATEWAY_PORT" not in os.environ:  # (under spark-submit the JVM runs already)
        _start_driver_jvm(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # The root level; with the project's log configuration the terminal shows less (ConsoleLogLevel).
    spark.sparkContext.setLogLevel("INFO" if config.console_log_level.file_level == "info" else "WARN")
    _show_failure_logs(spark, show_failure_logs)
    register_helpers(spark)
    if log_file is not None:  # a job's JVM stopped by a signal: Spark's shutdown noise goes to the log file only
        quiet_console_logs_on_shutdown(spark)
    quiet_accumulator_server(spark)
    return spark


def quiet_accumulator_server(spark: SparkSession) -> None:
    """PySpark's accumulator server (the JVM sends it what Python workers' accumulators add) prints a traceback
    to stderr when its connection from the JVM ends mid-read, as when a signal stops the job's JVM: that end
    is no error of the job, and the server now says nothing of it. Other errors print as before."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None or getattr(server, "_cdc_quiet", False):
        return
    printed = server.handle_error

    def handle_error(request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):  # the JVM went away
            return
        printed(request, client_address)

    server.handle_error = handle_error
    server._cdc_quiet = True


# Spark's launcher always adds `--add-modules=jdk.incubator.vector`, and the JDK then prints this line to
# the JVM's stderr at its start, before any logging is set up; no JVM option silences it.
_INCUBATOR_WARNING = b"WARNING: Using incubator modules"


def _start_driver_jvm(settings: dict[str, str]) -> None:
    """Start the driver JVM and its SparkContext, the JVM's stderr copied to this process' own stderr
    (where it went before) line by line, but for the JDK's incubator-module warning."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_copy_stderr, args=(gateway.proc.stderr,), name="jvm-stderr", daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _copy_stderr(jvm_stderr: BinaryIO) -> None:
    for line in iter(jvm_stderr.readline, b""):
        if line.startswith(_INCUBATOR_WARNING):
            continue
        with contextlib.suppress(OSError):  # a closed terminal: keep reading, or the JVM would block writing
            os.write(2, line)


def build_class_archive(config: SparkConfig) -> Path:
    """The class archive that local sessions of ``config`` start their JVM from, made on the first
    call (a training run of ~1 minute; :mod:`cdc.core.class_archive`)."""
    return class_archive.build(_cache_dir(config), jars.java_executable(), _jar_paths(config))


def _cache_dir(config: SparkConfig) -> Path:
    return (config.jars.cache_dir if isinstance(config.jars, MavenJars) else None) or jars.default_cache_dir()


def _class_archive_options(config: SparkConfig, jar_paths: list[str]) -> list[str]:
    """The driver JVM's options that map the class archive of this JDK and these jars, if it exists."""
    try:
        java = jars.java_executable()
    except DependencyError:
        return []  # Spark's own launch reports the missing JDK
    return class_archive.java_options(_cache_dir(config), java, jar_paths)


def _jar_paths(config: SparkConfig) -> list[str]:
    match config.jars:
        case MavenJars(cache_dir=cache_dir):
            object_store = jars.resolve(jars.S3A_BUNDLE, cache_dir) if config.object_store_jars else []
            bundles = [*jars.resolve(jars.SPARK_BUNDLE, cache_dir), *object_store]
            return [str(path) for path in [*bundles, jars.helpers_jar(cache_dir)]]
        case LocalJars(folder=folder):
            return sorted(str(path) for path in folder.glob("*.jar"))
        case _:
            return []
