"""Shared fixtures: one Spark session and one real CDC stack per test process (`./dev test` runs the whole
suite in two pytest-xdist workers, each with its own; the worker's number shifts its stack's ports by 20).

The stack runs on ports of its own (25432, 29092-3, 28083, 29000; its Spark cluster, started only for the
tests that ask for it, 27077 and 27080-4; shifted by CDC_TEST_PORT_OFFSET when set, so that two checkouts
can test side by side) so that tests never touch a demo stack on the default ports. They lie below Linux's
ephemeral range (32768-60999), from which the kernel picks the port of every socket bound to port 0
(Spark's driver, block managers and executors) and of every outgoing connection: a port in it can be
taken by any of them just before the stack's server binds it.
With CDC_TEST_STACK=docker it is started from docker/compose.yml through testcontainers instead (where
a Docker engine exists). A component that is missing makes the tests that need it fail with the reason;
nothing is skipped.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.core.config import (
    ConnectConfig,
    KafkaConfig,
    ObjectStoreConfig,
    PostgresConfig,
    SparkClusterConfig,
    SparkConfig,
    StackConfig,
)
from cdc.stack.base import Stack

# Under pytest-xdist each worker (gw0, gw1, ...) runs its own stack and Spark session: the tests compare
# refined tables with Postgres tables they change, which two workers must not share.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_PORT_OFFSET = int(os.environ.get("CDC_TEST_PORT_OFFSET", "0")) + 20 * _WORKER
TEST_STACK_PORTS = {
    name: port + _PORT_OFFSET
    for name, port in {
        "postgres": 25432,
        "kafka": 29092,
        "controller": 29093,
        "connect": 28083,
        "spark_master": 27077,
        "spark_master_ui": 27080,
        "spark_workers_from": 27081,
        "object_store": 29000,
    }.items()
}


# The modules that take longest (minutes each), longest first. They are collected first, so that
# pytest-xdist (one module per worker at a time; `./dev test` keeps this order: --no-loadscope-reorder) starts them
# at once and the suite ends on short ones, not with one worker running a long module while the other waits.
LONGEST_MODULES = [
    "refine/mongo/test_mongo_connector.py",
    "refine/test_refine_job.py",
    "refine/test_rebuild.py",
    "refine/test_schema_changes.py",
    "refine/apply/test_rekey.py",
    "cdc/stack/test_spark_cluster.py",
    "cdc/pipeline/test_run.py",
    "refine/test_random_workload.py",
    "refine/test_kill_points.py",
    "cdc/core/test_upgrade.py",
    "cdc/core/test_object_store.py",
    "refine/test_type_matrix.py",
    "refine/test_bad_records.py",
    "refine/mongo/test_mongo.py",
    "cdc/demo/test_shop.py",
    "cdc/core/test_catalog.py",
    "cdc/test_api.py",
    "examples/test_notebook.py",
    "cdc/demo/test_games.py",
]


# The fixtures that start real components (Postgres, Kafka, Kafka Connect, S3, a Spark cluster): a test using
# one, directly or through another fixture, is an integration test. The marker is derived, never written by
# hand, so `-m "not integration"` starts nothing and leaves out no test that needs nothing.
STACK_FIXTURES = frozenset({"stack", "spark_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        if STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)

    def rank(item: pytest.Item) -> int:
        module = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return LONGEST_MODULES.index(module) if module in LONGEST_MODULES else len(LONGEST_MODULES)

    items.sort(key=rank)  # stable: the other modules keep their order


@pytest.fixture(scope="session")
def spark():
    from cdc.core.session import build_spark_session, job_spark_config

    # As a `cdc` job that runs and ends (the parallel collector: less CPU than G1 on two cores).
    config = SparkConfig(app_name="cdc-tests", shuffle_partitions=2, driver_memory="4g")
    session = build_spark_session(job_spark_config(config, refines_continuously=False))
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def spark_state_released_after_each_test() -> Iterator[None]:
    """After each test, what the session keeps of its tables is let go: every test writes tables of its
    own, which no later test reads, while a job's driver keeps refining the same ones. Delta caches each
    table's log and its state until an hour after the table's last use (Delta's own test sessions bound
    that cache to 3 tables). DataFrames and streaming queries only Python still references (a stopped
    query keeps its last batch's plan, broadcast tables included) wait for Python's collector to free
    them in the JVM, which a long worker's heap cannot wait for."""
    yield
    from pyspark.sql import SparkSession

    session = SparkSession._instantiatedSession
    if session is None:
        return
    session.catalog.clearCache()
    session.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    gc.collect()


@pytest.fixture(scope="session")
def stack_config(tmp_path_factory: pytest.TempPathFactory) -> StackConfig:
    if os.environ.get("CDC_TEST_STACK", "local") == "docker":
        return StackConfig(state_dir=tmp_path_factory.mktemp("stack"))
    return StackConfig(
        state_dir=tmp_path_factory.mktemp("stack"),
        postgres=PostgresConfig(port=TEST_STACK_PORTS["postgres"]),
        kafka=KafkaConfig(port=TEST_STACK_PORTS["kafka"], controller_port=TEST_STACK_PORTS["controller"]),
        connect=ConnectConfig(port=TEST_STACK_PORTS["connect"]),
        spark_cluster=SparkClusterConfig(
            master_port=TEST_STACK_PORTS["spark_master"],
            master_ui_port=TEST_STACK_PORTS["spark_master_ui"],
            worker_ports_from=TEST_STACK_PORTS["spark_workers_from"],
        ),
        object_store=ObjectStoreConfig(port=TEST_STACK_PORTS["object_store"]),
    )


def _refused_in_the_stack_free_tier(request: pytest.FixtureRequest, what: str) -> None:
    if "not integration" in (request.config.getoption("markexpr") or ""):
        pytest.fail(f"{what} was asked for in the stack-free tier (-m 'not integration'): see STACK_FIXTURES")


@pytest.fixture(scope="session")
def stack(stack_config: StackConfig, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The running stack; stopped at the end, and then checked to have left no process behind."""
    _refused_in_the_stack_free_tier(request, "the stack")
    if os.environ.get("CDC_TEST_STACK", "local") == "docker":
        from cdc.stack.docker import DockerComposeStack

        running: Stack = DockerComposeStack(stack_config)
    else:
        from cdc.stack.local import LocalStack

        running = LocalStack(stack_config)
    try:
        running.up()
        yield running
    finally:
        running.down()
    left = [status for status in running.status() if status.up or status.pid]
    assert not left, f"`down` left components running: {left}"


@pytest.fixture(scope="session")
def spark_cluster(stack_config: StackConfig, request: pytest.FixtureRequest):
    """The stack's standalone Spark cluster (a master and two workers, one core each), started once for the
    tests that ask for it; its ``master_url`` is what their jobs' sessions connect to. Stopped at the end,
    executors included."""
    _refused_in_the_stack_free_tier(request, "the Spark cluster")
    from cdc.stack.spark_cluster import SparkCluster

    cluster = SparkCluster(stack_config)
    try:
        for component in cluster.components:
            component.start()
        yield cluster
    finally:
        for component in reversed(cluster.components):
            component.stop()
    assert not [worker.name for worker in cluster.workers if worker.executor_pids()], "executors outlived their worker"


@pytest.fixture
def unique_name() -> str:
    """A name no other test uses (topics, tables, connectors, replication slots)."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def postgres_connector(stack, stack_config: StackConfig, unique_name: str):
    """Register a Debezium Postgres connector of this test's own (name, topics, slot, publication).

    Yields its definition once it runs; then removes it with its replication slot and publication.
    """
    from connectors import definitions
    from connectors.client import ConnectClient

    # Of the tables each test makes, only those it adds (add_to_publication): the shipped `all_tables` would
    # have every test's connector write topics for every other test's tables.
    connector = definitions.postgres_named(unique_name, publication_autocreate_mode="filtered")
    client = ConnectClient(stack_config.connect.url)
    client.register(connector)
    client.wait_running(connector.name)
    yield connector
    remove_postgres_connector(stack_config, connector)


@pytest.fixture
def shipped_postgres_connector(stack, stack_config: StackConfig):
    """The shipped connector (connectors/postgres.json: topics demo.shop.*), for a test that registers it
    itself (the demo); removed afterwards with its replication slot and publication."""
    from connectors import definitions

    connector = definitions.load("postgres")
    yield connector
    remove_postgres_connector(stack_config, connector)


@pytest.fixture
def recreate_postgres_connector(stack, stack_config: StackConfig, postgres_connector):
    """``recreate(while_away)``: remove this test's connector with its replication slot and publication,
    call ``while_away()``, then register the connector again under a new name, as a user re-creating it
    does: Kafka Connect holds no offsets for that name, so it snapshots the tables again into the same
    topics. Returns the new definition once it runs; removed afterwards."""
    from connectors.client import ConnectClient
    from connectors.definitions import ConnectorDefinition

    created = []

    def recreate(while_away):
        remove_postgres_connector(stack_config, postgres_connector)
        while_away()
        again = ConnectorDefinition(f"{postgres_connector.name}-again", postgres_connector.config)
        client = ConnectClient(stack_config.connect.url)
        client.register(again)
        created.append(again)
        client.wait_running(again.name)
        return again

    yield recreate
    for again in created:
        remove_postgres_connector(stack_config, again)


def remove_postgres_connector(stack_config: StackConfig, connector) -> None:
    """Delete a Postgres connector, then drop its replication slot and publication."""
    from cdc.stack.postgres import remove_connector

    remove_connector(stack_config, connector)


# Each demo table as a query and the Spark schema its refined table has.
SOURCE_TABLES = {
    "orders": (
        "SELECT customer_id, order_no, status::text, amount, ordered_at FROM shop.orders",
        "customer_id long, order_no int, status string, amount decimal(10,2), ordered_at timestamp_ntz",
    ),
    "customers": (
        (
            "SELECT id, email, full_name, balance, credit_limit, signed_up_at, birth_date, profile::text, tags, "
            "external_id::text, is_active, notes, avatar FROM shop.customers"
        ),
        (
            "id long, email string, full_name string, balance decimal(12,2), credit_limit decimal(38,18), "
            "signed_up_at timestamp, birth_date date, profile string, tags array<string>, external_id string, "
            "is_active boolean, notes string, avatar binary"
        ),
    ),
    "page_views": (
        "SELECT customer_id, url, viewed_at FROM shop.page_views",
        "customer_id long, url string, viewed_at timestamp",
    ),
}


@pytest.fixture
def postgres_table(spark, stack, stack_config: StackConfig):
    """``postgres_table(name)``: the demo table ``shop.<name>`` in Postgres as a Spark DataFrame."""

    import psycopg

    def read(name: str):
        query, schema = SOURCE_TABLES[name]
        with psycopg.connect(stack_config.postgres.dsn()) as conn:
            return spark.createDataFrame(conn.execute(query).fetchall(), schema)

    return read


class KafkaTestClient:
    """Create topics, produce and read back records on the test stack's broker (kafka-python)."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers

    def create_topic(self, topic: str, partitions: int = 1) -> str:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()
        return topic

    def produce(self, topic: str, records: list[tuple], partition: int | None = None) -> None:
        """Send (key, value[, headers]) byte records, in order, and wait until all are written."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, linger_ms=5, acks="all")
        try:
            for key, value, *headers in records:
                producer.send(topic, key=key, value=value, headers=headers[0] if headers else None, partition=partition)
            producer.flush()
        finally:
            producer.close()

    def produce_again(self, topic: str, records: list[tuple]) -> None:
        """Produce copies of ``records`` (as :meth:`records` gives them), as an at-least-once delivery
        would. Records with neither key nor value (a keyless table's tombstones) cannot be produced."""
        self.produce(
            topic,
            [(key, value, headers) for _, _, _, key, value, headers in records if key is not None or value is not None],
        )

    def records(self, topic: str) -> list[tuple]:
        """Every record of ``topic``: (topic, partition, offset, key, value, headers), by partition and offset."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False)
        try:
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            if not partitions:
                return []  # the topic does not exist (yet)
            end = consumer.end_offsets(partitions)
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            found: list[tuple] = []
            while any(consumer.position(p) < end[p] for p in partitions):
                for records in consumer.poll(timeout_ms=1000).values():
                    found.extend(
                        (r.topic, r.partition, r.offset, r.key, r.value, [(k, v) for k, v in r.headers or []])
                        for r in records
                    )
            return sorted(found, key=lambda record: (record[1], record[2]))
        finally:
            consumer.close()

    def wait_for_last_value(self, topic: str, matches, timeout_s: float = 60):
        """Poll until the value of the topic's last record satisfies ``matches``; return all records."""
        import time

        deadline = time.monotonic() + timeout_s
        while not ((records := self.records(topic)) and matches(records[-1][4])):
            assert time.monotonic() < deadline, f"the awaited record did not reach {topic}"
            time.sleep(0.5)
        return records

    def delete_records_before(self, topic: str, partition: int, offset: int) -> None:
        """Make Kafka drop a partition's records below ``offset``, as retention would."""
        from kafka import KafkaAdminClient, TopicPartition

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
        try:
            admin.delete_records({TopicPartition(topic, partition): offset})
        finally:
            admin.close()


@pytest.fixture(scope="session")
def kafka(stack, stack_config: StackConfig) -> KafkaTestClient:
    return KafkaTestClient(stack_config.kafka.bootstrap_servers)


class PipelineRun:
    """A pipeline file under a test's folder, landed and refined on the test stack (`cdc raw` and
    `cdc refine`, both `--pipeline ... --available-now`), and its tables read back."""

    def __init__(self, spark, folder) -> None:
        self.spark = spark
        self.file = folder / "pipeline.yaml"
        self.warehouse = str(folder / "warehouse")

    def __call__(self, pipeline: dict, *refine_options: str) -> int:
        """Land and refine; return the exit code of `cdc refine` (`cdc raw` must succeed)."""
        import yaml

        from cdc.cli import main

        self.file.write_text(yaml.safe_dump(pipeline, sort_keys=False))
        options = ["--pipeline", str(self.file), "--warehouse", self.warehouse, "--available-now"]
        assert main(["raw", *options]) == 0
        return main(["refine", *options, *refine_options])

    def table(self, name: str, folder: str = "refined"):
        """A table of the warehouse: ``<warehouse>/<folder>/<name>``."""
        return self.spark.read.format("delta").load(f"{self.warehouse}/{folder}/{name}")


@pytest.fixture
def pipeline_run(spark, kafka: KafkaTestClient, tmp_path, monkeypatch) -> PipelineRun:
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    return PipelineRun(spark, tmp_path)


@pytest.fixture
def read_with_delta_rs(spark):
    """The rows delta-rs (`deltalake`, the reader behind pandas' and Polars' read_delta) reads from the
    Delta table at a location, as a Spark DataFrame to compare with Spark's own read."""
    from deltalake import DeltaTable as RustDeltaTable

    def read(location: str):
        # Arrow timestamps without a zone are Spark's timestamp_ntz (Postgres `timestamp`), with one Spark's timestamp.
        spark.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
        try:
            return spark.createDataFrame(RustDeltaTable(location).to_pyarrow_table())
        finally:
            spark.conf.unset("spark.sql.timestampType")

    return read


@pytest.fixture
def s3_warehouse(stack, stack_config, unique_name) -> tuple[str, dict[str, str], Path]:
    """A warehouse of this test's own in the stack's bucket, the environment that reaches it (keys as
    AWS_* variables), and the folder where the S3 server keeps that warehouse's objects."""
    server = stack_config.object_store
    env = {
        "CDC_WAREHOUSE": f"s3a://{server.bucket}/{unique_name}",
        "CDC_S3__ENDPOINT": server.endpoint,
        "CDC_S3__PATH_STYLE_ACCESS": "true",
        "CDC_S3__REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
    }
    return env["CDC_WAREHOUSE"], env, stack_config.state_dir / "s3" / "data" / server.bucket / unique_name


@pytest.fixture
def read_s3_table(spark, stack_config: StackConfig):
    """``read(location)``: a Delta table on the stack's S3 server as delta-rs reads it over HTTP (a reader the
    project did not write), as a Spark DataFrame."""
    from deltalake import DeltaTable as RustDeltaTable

    server = stack_config.object_store
    options = {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
    }

    def read(location: str):
        arrow = RustDeltaTable(location.replace("s3a://", "s3://", 1), storage_options=options).to_pyarrow_table()
        spark.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
        try:
            return spark.createDataFrame(arrow)
        finally:
            spark.conf.unset("spark.sql.timestampType")

    return read


class OrdersPipeline:
    """A pipeline of a Debezium ``shop.orders`` topic: its refined table ``orders`` and the business table
    ``order_totals`` (orders and amount per customer), with the check of both against Postgres."""

    def __init__(self, dsn: str, read_table, postgres_table) -> None:
        self.dsn, self.read_table, self.postgres_table = dsn, read_table, postgres_table

    @staticmethod
    def write(path: Path, name: str, topic: str) -> Path:
        path.write_text(
            f"""
name: {name}
sources:
  orders: {{kind: debezium_postgres, topic: {topic}}}
refined:
  orders: {{source: orders}}
business:
  order_totals:
    sql: SELECT customer_id, count(*) AS orders, sum(amount) AS amount FROM orders GROUP BY customer_id
"""
        )
        return path

    def assert_equal_to_postgres(self, warehouse: str) -> None:
        import psycopg
        from pyspark.testing import assertDataFrameEqual

        from refine.apply.merge import METADATA_COLUMNS

        refined = self.read_table(f"{warehouse}/refined/orders")
        own = [column for column in refined.columns if column.startswith("_cdc_")]
        assertDataFrameEqual(refined.drop(*own, *METADATA_COLUMNS), self.postgres_table("orders"))
        with psycopg.connect(self.dsn) as conn:
            totals = conn.execute("SELECT customer_id, count(*), sum(amount) FROM shop.orders GROUP BY customer_id")
            expected_totals = {tuple(row) for row in totals.fetchall()}
        business = self.read_table(f"{warehouse}/business/order_totals").collect()
        assert {(row.customer_id, row.orders, row.amount) for row in business} == expected_totals


@pytest.fixture
def orders_pipeline(stack_config: StackConfig, read_s3_table, postgres_table) -> OrdersPipeline:
    return OrdersPipeline(stack_config.postgres.dsn(), read_s3_table, postgres_table)


@pytest.fixture
def refined_table(spark):
    """``refined_table(warehouse, topic)``: the refined table without its metadata columns."""
    from refine.apply.merge import METADATA_COLUMNS
    from refine.config import refined_table_location

    def read(warehouse: str, topic: str):
        table = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        return table.drop(*[column for column in table.columns if column.startswith("_cdc_")], *METADATA_COLUMNS)

    return read


class CdcProcess:
    """A `cdc` job in a process group of its own (Python and its Spark JVM). Its output is read as it
    comes, so a test can wait for a line (a Delta commit is visible before the job reports its batch)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "cdc.cli", *args],
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.printed: list[str] = []
        self._reader = threading.Thread(target=lambda: self.printed.extend(self.popen.stdout), daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def output(self) -> str:
        """What the job has printed so far (all of it once ``wait`` has returned)."""
        return "".join(list(self.printed))

    def wait(self, timeout: float | None = None) -> str:
        """Wait for the job to end and return all it printed."""
        self.popen.wait(timeout)
        self._reader.join(timeout=30)
        return self.output()

    def signal_group(self, signal_number: int) -> None:
        os.killpg(self.pid, signal_number)


@pytest.fixture
def cdc_process(kafka: KafkaTestClient):
    """``cdc_process(args)``: a running `cdc` job (a ``CdcProcess``) talking to the test stack's Kafka."""
    env = {
        **os.environ,
        "CDC_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "CDC_SPARK__DRIVER_MEMORY": "2g",
        "CDC_SPARK__SHUFFLE_PARTITIONS": "2",
        # These jobs live a minute at most: with the C1 compiler alone, a JVM reaches its first Delta
        # commit ~3 s sooner (C2 compiles for long runs, on the cores the job needs now).
        "CDC_SPARK__CONF": '{"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}',
    }

    def start(args: list[str], log_dir: Path | None = None, conf: dict[str, str] | None = None) -> CdcProcess:
        """``conf``: Spark settings beside the JVM option above."""
        spark_conf = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", **(conf or {})}
        extra = {"CDC_SPARK__CONF": json.dumps(spark_conf), **({"CDC_SPARK__LOG_DIR": str(log_dir)} if log_dir else {})}
        return CdcProcess(args, {**env, **extra})

    return start


@pytest.fixture
def stop_like_a_service_manager():
    """``stop(process)``: SIGTERM to a `cdc_process` job's whole process group (so to its JVM too), as
    systemd stops a job; checks that it stopped cleanly (exit 0, its stopping line, no traceback nor
    Spark's shutdown noise) and returns its output."""

    def stop(process: CdcProcess) -> str:
        process.signal_group(signal.SIGTERM)
        output = process.wait(timeout=180)
        assert process.returncode == 0, output
        assert "stopping: a micro-batch cut short is replayed by the next run" in output
        noise = ("Traceback", "SparkContext was shut down", "TASK_WRITE_FAILED", "RejectedExecutionException", " WARN ")
        assert not [word for word in noise if word in output], output
        return output

    return stop


@pytest.fixture
def wait_for():
    """``wait_for(condition, timeout_s, what, interval_s=0.02)``: poll until ``condition()`` holds."""
    import time

    def wait(condition, timeout_s: float, what: str, interval_s: float = 0.02) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(interval_s)

    return wait
