"""The warehouse on the stack's S3 server (S3Proxy over HTTP, through s3a://): `cdc raw`, `cdc refine` and
`cdc optimize` as the user runs them, each a process of its own; the refined tables read back with
delta-rs (a reader the project did not write) straight from the S3 server and compared with Postgres."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import S3Connection, SparkConfig
from cdc.core.errors import ConfigError, TableError
from cdc.core.object_store import load_s3_connection, object_store_spark_config, on_object_store
from cdc.stack.workload import run_workload
from refine.apply.merge import METADATA_COLUMNS

JOB_TIMEOUT_S = 600


def test_s3a_jars_and_settings_only_for_an_s3a_warehouse():
    s3 = S3Connection(
        endpoint="http://127.0.0.1:9000", path_style_access=True, access_key_id="k", secret_access_key="s"
    )
    local = object_store_spark_config(SparkConfig(), s3, ["/data/warehouse"])
    assert local == SparkConfig()
    remote = object_store_spark_config(SparkConfig(conf={"spark.hadoop.fs.s3a.endpoint": "mine"}), s3, ["s3a://b/w"])
    assert remote.object_store_jars
    assert remote.conf["spark.hadoop.fs.s3a.endpoint"] == "mine"  # the user's own settings win
    assert remote.conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert remote.conf["spark.delta.logStore.s3a.impl"] == "io.delta.storage.S3SingleDriverLogStore"
    assert not on_object_store(["warehouse", "file:/tmp/w"])


def test_secrets_file_is_read_over_the_environment_and_never_quoted(tmp_path):
    secrets = tmp_path / "s3.yaml"
    secrets.write_text("access_key_id: from-file\nsecret_access_key: hunter2-secret\n")
    connection = load_s3_connection(S3Connection(endpoint="http://127.0.0.1:1", region="eu-west-1"), secrets)
    assert (connection.endpoint, connection.region, connection.access_key_id) == (
        "http://127.0.0.1:1",
        "eu-west-1",
        "from-file",
    )
    assert "hunter2-secret" not in repr(connection)
    secrets.write_text("secret_access_key: [hunter2-secret]\n")
    with pytest.raises(ConfigError) as refused:
        load_s3_connection(S3Connection(), secrets)
    assert "secret_access_key" in str(refused.value)
    assert "hunter2-secret" not in str(refused.value)


def start_cdc(args: list[str], env: dict[str, str], kafka, log_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cdc.cli", *args],
        env={
            **{key: value for key, value in os.environ.items() if not key.startswith(("CDC_", "AWS_"))},
            "CDC_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "CDC_SPARK__DRIVER_MEMORY": "1g",
            "CDC_SPARK__SHUFFLE_PARTITIONS": "2",
            "CDC_SPARK__LOG_DIR": str(log_dir),
            "CDC_SPARK__CONF": '{"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}',
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_cdc(args: list[str], env: dict[str, str], kafka, log_dir: Path) -> str:
    process = start_cdc(args, env, kafka, log_dir)
    output, _ = process.communicate(timeout=JOB_TIMEOUT_S)
    assert process.returncode == 0, f"cdc {' '.join(args)}:\n{output}"
    return output


def refined_rows(read_s3_table, warehouse: str, topic: str):
    table = read_s3_table(f"{warehouse}/refined/{topic}")
    return table.drop(*[column for column in table.columns if column.startswith("_cdc_")], *METADATA_COLUMNS)


def test_a_pipeline_synced_twice_on_the_s3_warehouse_equals_postgres(
    kafka, stack_config, postgres_connector, orders_pipeline, s3_warehouse, tmp_path
):
    warehouse, env, stored = s3_warehouse
    # The keys from a secrets file this time, not from AWS_* variables.
    secrets = tmp_path / "s3-secrets.yaml"
    secrets.write_text(
        f"access_key_id: {env.pop('AWS_ACCESS_KEY_ID')}\nsecret_access_key: {env.pop('AWS_SECRET_ACCESS_KEY')}\n"
    )
    env["CDC_S3_SECRETS_FILE"] = str(secrets)
    run_workload(stack_config.postgres.dsn(), customers=3, seed=71)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    pipeline = orders_pipeline.write(tmp_path / "pipeline.yaml", "s3shop", topic)
    logs = tmp_path / "logs"

    # `cdc sync` lands, refines and builds the business table in one driver, twice (the rerun finds
    # nothing new); `cdc raw` and `cdc refine` run apart on S3 in the cluster test and the test below.
    outputs = [run_cdc(["sync", "--pipeline", str(pipeline), "--available-now"], env, kafka, logs) for _ in range(2)]
    orders_pipeline.assert_equal_to_postgres(warehouse)

    # Everything is on the S3 server, the tool's own `_cdc/` folder (checkpoints) included.
    assert (stored / "raw" / topic / "_delta_log").is_dir()
    assert (stored / "refined" / "orders" / "_delta_log").is_dir()
    assert (stored / "business" / "order_totals" / "_delta_log").is_dir()
    assert (stored / "_cdc" / "checkpoints").is_dir()
    secret = stack_config.object_store.secret_access_key
    printed = "".join(outputs) + "".join(log.read_text() for log in logs.glob("*.log"))
    assert secret not in printed


def test_two_refines_and_an_optimize_at_once_on_the_s3_warehouse(
    spark, kafka, stack_config, postgres_connector, postgres_table, s3_warehouse, read_s3_table, tmp_path
):
    """What the README promises on S3 (one writer per table): two refines of different tables and
    `cdc optimize` of a third table (raw orders, which the orders refine reads), each its own driver, all at
    once, and every table right after."""
    warehouse, env, _ = s3_warehouse
    prefix = f"{postgres_connector.topic_prefix}.shop"
    orders, customers = f"{prefix}.orders", f"{prefix}.customers"
    land = ["raw", "--pattern", rf"{prefix.replace('.', '[.]')}[.](orders|customers)", "--available-now"]
    logs = tmp_path / "logs"
    # Two landings of two workloads: raw orders has several files for `cdc optimize` to compact.
    landed = 0
    for seed in (72, 73):
        run_workload(stack_config.postgres.dsn(), customers=3, seed=seed)
        deadline = time.monotonic() + 60
        while not ((records := kafka.records(orders)) and len(records) > landed and records[-1][4] is None):
            assert time.monotonic() < deadline, "the workload's changes did not reach Kafka"
            time.sleep(0.5)
        landed = len(records)
        run_cdc(land, env, kafka, logs)
    raw_orders = read_s3_table(f"{warehouse}/raw/{orders}")

    jobs = [
        start_cdc(["refine", "--table", orders, "--available-now"], env, kafka, logs),
        start_cdc(["refine", "--table", customers, "--available-now"], env, kafka, logs),
        start_cdc(["optimize", "--table", f"raw/{orders}"], env, kafka, logs),
    ]
    outputs = [job.communicate(timeout=JOB_TIMEOUT_S)[0] for job in jobs]
    for job, output in zip(jobs, outputs, strict=True):
        assert job.returncode == 0, output
    assert "compacted into" in outputs[2], outputs[2]

    assertDataFrameEqual(refined_rows(read_s3_table, warehouse, orders), postgres_table("orders"))
    expected_customers = postgres_table("customers")
    refined_customers = refined_rows(read_s3_table, warehouse, customers)
    assertDataFrameEqual(
        refined_customers.select(
            *[refined_customers[field.name].cast(field.dataType) for field in expected_customers.schema]
        ),
        expected_customers,
    )
    assertDataFrameEqual(read_s3_table(f"{warehouse}/raw/{orders}"), raw_orders)


def test_keys_the_store_refuses_are_one_error_line_without_the_secret(stack, kafka, s3_warehouse, tmp_path):
    _, env, _ = s3_warehouse
    env |= {"AWS_SECRET_ACCESS_KEY": "not-the-key-7f3a9c"}
    process = start_cdc(["optimize", "--table", "raw/any"], env, kafka, tmp_path / "logs")
    output, _ = process.communicate(timeout=JOB_TIMEOUT_S)
    assert process.returncode == TableError.exit_code, output
    errors = [line for line in output.splitlines() if line.startswith("cdc: error: ")]
    assert len(errors) == 1, output
    assert "the warehouse's storage failed: AccessDeniedException: " in errors[0]
    assert "Traceback" not in output
    printed = output + "".join(log.read_text() for log in (tmp_path / "logs").glob("*.log"))
    assert "not-the-key-7f3a9c" not in printed
