"""`cdc sync`: landing and refinement in one Spark application, once or continuously; a failure of
either ends both and is the job's error."""

import json
import re
import threading

import psycopg
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.cli import main
from cdc.core.config import Continuous, KafkaConnection, validate
from cdc.core.errors import ConfigError, SourceError, TableError
from cdc.core.tables import is_delta_table, raw_table_location
from cdc.pipeline.config import Pipeline
from cdc.pipeline.run import PipelineRefineConfig, raw_job_config
from cdc.raw.config import RawJobConfig
from cdc.stack.workload import run_workload
from cdc.sync import SyncJobConfig, run_sync_job
from refine.config import RefineJobConfig, refined_table_location

CONTINUOUS = {"kind": "continuous", "interval_s": 0.5}


def sync_config(
    warehouse: str,
    topics: list[str],
    bootstrap_servers: str,
    trigger: dict = CONTINUOUS,
    refined: list[str] | None = None,
    **refine_settings,
) -> SyncJobConfig:
    raw = {
        "topics": {"kind": "topics", "topics": topics},
        "warehouse": warehouse,
        "trigger": trigger,
        "kafka": {"bootstrap_servers": bootstrap_servers},
    }
    jobs = [
        {"table": topic, "warehouse": warehouse, "trigger": trigger, **refine_settings} for topic in refined or topics
    ]
    return validate(SyncJobConfig, {"raw": raw, "refine": {"kind": "topics", "jobs": jobs}}, "sync job settings")


def pipeline_sync_config(pipeline: Pipeline, warehouse: str, bootstrap_servers: str) -> SyncJobConfig:
    """A continuous `cdc sync --pipeline`: the landing as `raw_job_config` makes it (by pattern for a
    pipeline with a `pattern` source), the pipeline's refinement."""
    trigger = Continuous(**{k: v for k, v in CONTINUOUS.items() if k != "kind"})
    raw = raw_job_config(
        pipeline, warehouse=warehouse, trigger=trigger, kafka=KafkaConnection(bootstrap_servers=bootstrap_servers)
    )
    run = PipelineRefineConfig(warehouse=warehouse, trigger=trigger)
    return SyncJobConfig(raw=raw, refine={"kind": "pipeline", "pipeline": pipeline, "run": run})


def test_the_refinement_must_read_what_the_landing_lands_in_the_same_run(tmp_path):
    with pytest.raises(ConfigError, match=r"refine: topics b are not landed by raw.topics"):
        sync_config(str(tmp_path), ["a"], "127.0.0.1:1", refined=["a", "b"])
    raw = RawJobConfig(topics={"kind": "topics", "topics": ["a"]}, warehouse=str(tmp_path))
    elsewhere = RefineJobConfig(table="a", warehouse=str(tmp_path / "other"))
    with pytest.raises(ConfigError, match=r"refine: warehouse .*/other is not the landing's"):
        validate(SyncJobConfig, {"raw": raw, "refine": {"kind": "topics", "jobs": [elsewhere]}}, "sync job settings")
    once = RefineJobConfig(table="a", warehouse=str(tmp_path), trigger={"kind": "available_now"})
    with pytest.raises(ConfigError, match="refine: the trigger differs from the landing's"):
        validate(SyncJobConfig, {"raw": raw, "refine": {"kind": "topics", "jobs": [once]}}, "sync job settings")


def test_sync_once_lands_and_refines_postgres_tables_alternating_with_raw_and_refine(
    spark, kafka, stack_config, postgres_connector, tmp_path, monkeypatch, postgres_table, refined_table
):
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topics = {table: f"{postgres_connector.topic_prefix}.shop.{table}" for table in ("customers", "orders")}
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    options = ["--warehouse", warehouse, "--available-now"]
    sync = ["sync", *[f"--topic={topic}" for topic in topics.values()], *options]
    separately = [
        ["raw", *[f"--topic={topic}" for topic in topics.values()], *options],
        *[["refine", "--table", topic, *options] for topic in topics.values()],
    ]
    # A whole database by pattern: the same topics (the page views left out), each landed where it stopped.
    by_pattern = [
        "sync",
        rf"--pattern={re.escape(postgres_connector.topic_prefix)}\.shop\.(customers|orders)",
        *options,
    ]
    # The same tables and checkpoints: each run goes on where the last one stopped, whichever command
    # it was; the last run finds nothing new and changes nothing.
    for seed, commands in [(91, [sync]), (92, separately), (93, [sync]), (94, [by_pattern]), (None, [by_pattern])]:
        if seed is not None:
            run_workload(dsn, customers=2, seed=seed)  # inserts, updates and deletes of customers and orders
            marker = f"round {seed}".encode()  # the last change, so every change of the round is in Kafka
            with psycopg.connect(dsn) as conn:
                conn.execute(
                    "UPDATE shop.customers SET full_name = %s WHERE id = (SELECT max(id) FROM shop.customers)",
                    (marker.decode(),),
                )
            kafka.wait_for_last_value(topics["customers"], lambda value: marker in (value or b""))
        for command in commands:
            assert main(command) == 0, command
        for table, topic in topics.items():
            assertDataFrameEqual(refined_table(warehouse, topic), postgres_table(table))
            # Nothing landed twice.
            assert spark.read.format("delta").load(raw_table_location(warehouse, topic)).count() == len(
                kafka.records(topic)
            )


def test_continuous_sync_follows_postgres_and_stops_on_sigterm(
    spark,
    kafka,
    stack_config,
    postgres_connector,
    tmp_path,
    cdc_process,
    wait_for,
    postgres_table,
    refined_table,
    stop_like_a_service_manager,
):
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    run_workload(dsn, customers=2, seed=92)
    kafka.wait_for_last_value(topic, lambda value: value is None)
    process = cdc_process(["sync", "--topic", topic, "--warehouse", warehouse, "--trigger-interval", "1"])
    location = refined_table_location(warehouse, topic)
    try:
        with psycopg.connect(dsn) as conn:
            # A name of this test's own: the demo table is shared by the run's tests.
            conn.execute(
                "UPDATE shop.customers SET full_name = %s WHERE id = (SELECT max(id) FROM shop.customers)",
                (f"Synced {topic}",),
            )
        wait_for(
            lambda: (
                process.poll() is not None
                or (
                    is_delta_table(spark, location)
                    and refined_table(warehouse, topic).where(F.col("full_name") == f"Synced {topic}").count() == 1
                )
            ),
            600,
            "the change in the refined table",
            1.0,
        )
        assert process.poll() is None, process.wait()
        # The MERGE's commit is visible before the job reports its batch (its auto compaction runs in between).
        wait_for(lambda: f"refine {topic} batch" in process.output(), 60, "the refine batch's progress line", 0.1)
    finally:
        output = stop_like_a_service_manager(process)
    assert f"raw {topic} -> " in output, output
    assert f"refine {topic} batch" in output, output
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))


def in_thread(job) -> tuple[threading.Thread, list[BaseException]]:
    """``job()`` running in a thread; what it raised, once it has ended, in the list."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as error:  # noqa: BLE001 - asserted by the test
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failures


def test_continuous_pipeline_sync_lands_refines_and_refreshes_its_business_table(
    spark, kafka, tmp_path, unique_name, wait_for
):
    topic = kafka.create_topic(f"{unique_name}.scores")
    warehouse = str(tmp_path)
    # No schema: the refinement waits for the first rows to infer it from.
    document = {
        "name": "live",
        "sources": {"game": {"kind": "events", "format": "json", "topic": topic}},
        "refined": {"scores": {"source": "game"}},
        "business": {
            "totals": {
                "sql": "SELECT player, sum(score) AS total FROM scores GROUP BY player",
                "trigger_interval_s": 0.5,
            }
        },
    }
    config = pipeline_sync_config(Pipeline.model_validate(document), warehouse, kafka.bootstrap_servers)

    def total_of(player: str) -> int | None:
        if not is_delta_table(spark, f"{warehouse}/business/totals"):
            return None
        rows = (
            spark.read.format("delta").load(f"{warehouse}/business/totals").where(F.col("player") == player).collect()
        )
        return rows[0].total if rows else None

    stop, lines = threading.Event(), []
    thread, failures = in_thread(lambda: run_sync_job(spark, config, lines.append, stop))
    try:
        for round_, scores in enumerate([[("ann", 1), ("bob", 2)], [("bob", 3), ("bob", 4)]]):
            kafka.produce(
                topic,
                [
                    (player.encode(), json.dumps({"player": player, "score": score}).encode())
                    for player, score in scores
                ],
            )
            wait_for(
                lambda: failures or total_of("bob") == [2, 9][round_], 300, f"round {round_} in the business table", 0.5
            )
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()
    assert not failures, failures
    assert spark.read.format("delta").load(f"{warehouse}/refined/scores").count() == 4


def flattened_value(row_id: int, name: object, name_type: str) -> bytes:
    """A Debezium Postgres row after ExtractNewRecordState (JsonConverter, with its schema)."""
    schema = {
        "type": "struct",
        "optional": False,
        "name": "shop.items.Value",
        "fields": [
            {"type": "int64", "optional": False, "field": "id"},
            {"type": name_type, "optional": True, "field": "name"},
            {"type": "string", "optional": True, "field": "__op"},
            {"type": "int64", "optional": True, "field": "__lsn"},
            {"type": "int64", "optional": True, "field": "__source_ts_ms"},
            {"type": "string", "optional": True, "field": "__deleted"},
        ],
    }
    payload = {
        "id": row_id,
        "name": name,
        "__op": "c",
        "__lsn": row_id,
        "__source_ts_ms": 1_763_700_000_000,
        "__deleted": "false",
    }
    return json.dumps({"schema": schema, "payload": payload}).encode()


def flattened_key(row_id: int) -> bytes:
    schema = {
        "type": "struct",
        "optional": False,
        "name": "shop.items.Key",
        "fields": [{"type": "int64", "optional": False, "field": "id"}],
    }
    return json.dumps({"schema": schema, "payload": {"id": row_id}}).encode()


def test_a_failed_refinement_ends_the_landing_and_is_the_error(spark, kafka, tmp_path, unique_name, wait_for):
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    # The exception policy: a column's type change stops its table.
    config = sync_config(warehouse, [topic], kafka.bootstrap_servers, schema_changes="exception")
    kafka.produce(topic, [(flattened_key(1), flattened_value(1, "one", "string"))])
    thread, failures = in_thread(lambda: run_sync_job(spark, config, lambda line: None))
    try:
        wait_for(
            lambda: failures or is_delta_table(spark, refined_table_location(warehouse, topic)),
            300,
            "the first row refined",
            0.5,
        )
        # The topics named are refined by one loop beside the landing, not by a streaming query each.
        assert [query.name for query in spark.streams.active if query.name.startswith("refine")] == []
        kafka.produce(topic, [(flattened_key(2), flattened_value(2, 2, "int64"))])  # `name` turned a number
        # No stop is ever set here: the landing, which would otherwise run on, ends because refining failed.
        thread.join(300)
    finally:
        assert not thread.is_alive(), "the landing went on after the refinement failed"
    [failure] = failures
    assert isinstance(failure, TableError), failure
    assert "changed type" in str(failure), failure
    assert "column=name" in str(failure), failure
    assert "new_type=bigint" in str(failure), failure
    assert not spark.streams.active, "a stream of the failed sync is still running"


def test_an_unknown_topic_ends_a_continuous_sync_with_one_line(kafka, tmp_path, unique_name, monkeypatch, capsys):
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    assert main(["sync", "--topic", unique_name, "--warehouse", str(tmp_path), "--trigger-interval", "1"]) == (
        SourceError.exit_code
    )
    error = capsys.readouterr().err
    assert error.startswith("cdc: error: "), error
    assert unique_name in error, error
    assert error.count("\n") == 1, error


def _rows_of(dsn: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return sorted(conn.execute(f"SELECT id, name FROM {table}").fetchall())


def _refined_rows(spark, warehouse: str, name: str) -> list[tuple] | None:
    location = refined_table_location(warehouse, name)
    if not is_delta_table(spark, location):
        return None
    return sorted((r.id, r.name) for r in spark.read.format("delta").load(location).select("id", "name").collect())


def test_a_whole_database_is_kept_by_one_sync_and_a_table_created_meanwhile_joins_it(
    spark, kafka, stack, stack_config, tmp_path, unique_name, wait_for, monkeypatch
):
    """One pipeline source with a `pattern` over a schema's topics: each table refined into its own table named
    by the template, with its own keys; a table created while the sync runs is landed and refined without a
    restart (the shipped connector publishes new tables); compared with Postgres read back."""
    import cdc.pipeline.run
    import cdc.raw.by_pattern
    from cdc.stack.postgres import remove_connector
    from connectors import definitions
    from connectors.client import ConnectClient

    monkeypatch.setattr(cdc.raw.by_pattern, "TOPIC_RESCAN_S", 2.0)  # new topics found sooner than a service's 30 s
    monkeypatch.setattr(cdc.pipeline.run, "TABLE_RESCAN_S", 1.0)
    dsn, warehouse, schema = stack_config.postgres.dsn(), str(tmp_path), f"s_{unique_name}"
    tables = ["alpha", "beta", "gamma"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for i, table in enumerate(tables):
            conn.execute(f"CREATE TABLE {schema}.{table} (id int PRIMARY KEY, name text)")
            conn.execute(f"INSERT INTO {schema}.{table} SELECT n, '{table}' || n FROM generate_series(1, {i + 2}) n")
    connector = definitions.postgres_named(unique_name, schema_include_list=schema)
    client = ConnectClient(stack_config.connect.url)
    client.register(connector)
    try:
        client.wait_running(connector.name)
        for table in tables:  # snapshotted: a pattern matching no topic yet is an error of its own
            kafka.wait_for_last_value(f"{unique_name}.{schema}.{table}", lambda value: value is not None)
        pipeline = Pipeline.model_validate(
            {
                "name": "whole",
                "sources": {"db": {"kind": "debezium_postgres", "pattern": rf"{unique_name}\.{schema}\..*"}},
                "refined": {
                    "db": {
                        "source": "db",
                        "name_prefix": "pg_",
                        "tables": {"beta": {"deletes": "soft"}},
                    }
                },
            }
        )
        config = pipeline_sync_config(pipeline, warehouse, kafka.bootstrap_servers)
        assert config.raw.topics.kind == "pattern"  # the landing subscribes to the pattern

        def equal(table: str) -> bool:
            return _refined_rows(spark, warehouse, f"pg_{table}") == _rows_of(dsn, f"{schema}.{table}")

        stop, lines = threading.Event(), []
        thread, failures = in_thread(lambda: run_sync_job(spark, config, lines.append, stop))
        try:
            wait_for(lambda: failures or all(equal(t) for t in tables), 300, "the snapshot refined", 1)
            assert not failures, failures
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"UPDATE {schema}.alpha SET name = 'changed' WHERE id = 1")
                conn.execute(f"DELETE FROM {schema}.beta WHERE id = 1")
                conn.execute(f"CREATE TABLE {schema}.delta (id int PRIMARY KEY, name text)")
                conn.execute(f"INSERT INTO {schema}.delta VALUES (1, 'new'), (2, 'table')")
            wait_for(
                lambda: failures or all(equal(t) for t in ["alpha", "delta"]),
                300,
                "the change and the new table refined",
                1,
            )
            assert not failures, failures
            soft = spark.read.format("delta").load(refined_table_location(warehouse, "pg_beta"))
            wait_for(
                lambda: failures or soft.where("_cdc_deleted_at IS NOT NULL").count() == 1, 120, "beta's delete", 1
            )
        finally:
            stop.set()
            thread.join(120)
        assert not thread.is_alive()
        assert not failures, failures
        assert _refined_rows(spark, warehouse, "pg_beta") == [(1, "beta1"), (2, "beta2"), (3, "beta3")]
    finally:
        remove_connector(stack_config, connector)
