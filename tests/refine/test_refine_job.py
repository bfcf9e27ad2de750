"""Postgres -> Debezium -> Kafka -> `cdc raw` -> `cdc refine`: refined tables equal the source tables."""

import psycopg
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.config import validate
from cdc.raw.config import RawJobConfig
from cdc.raw.job import run_raw_job
from cdc.stack.workload import run_workload
from refine.job import RefineJobConfig, refined_table_location, run_refine_job
from refine.merge import METADATA_COLUMNS

pytestmark = pytest.mark.integration

def land_and_refine(spark, kafka, warehouse: str, topic: str) -> None:
    raw = {"topics": {"kind": "topics", "topics": [topic]}, "warehouse": warehouse,
           "trigger": {"kind": "available_now"}, "kafka": {"bootstrap_servers": kafka.bootstrap_servers}}  # fmt: skip
    run_raw_job(spark, validate(RawJobConfig, raw, "raw job"), say=lambda line: None)
    run_refine_job(spark, RefineJobConfig(table=topic, warehouse=warehouse, trigger={"kind": "available_now"}),
                   say=lambda line: None)  # fmt: skip


def test_refined_tables_equal_postgres(spark, kafka, stack_config, postgres_connector, postgres_tables, tmp_path):
    dsn = stack_config.postgres.dsn()
    run_workload(dsn, customers=5, seed=11)  # inserts, TOAST-preserving updates, deletes, NULLs
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE shop.orders")
        conn.execute("INSERT INTO shop.orders VALUES (1, 1, 'paid', 10.50, '2026-01-01 10:00:00.123456'), "
                     "(1, 2, 'pending', 0.01, '2026-01-02 00:00:00')")  # fmt: skip
        conn.execute("UPDATE shop.orders SET status = 'shipped' WHERE order_no = 2")
        conn.execute("UPDATE shop.customers SET full_name = 'Renamed' WHERE id = (SELECT min(id) FROM shop.customers)")
    prefix = postgres_connector.topic_prefix
    kafka.wait_for_last_value(f"{prefix}.shop.orders", lambda value: b'"status":"shipped"' in (value or b""))
    kafka.wait_for_last_value(f"{prefix}.shop.customers", lambda value: b'"full_name":"Renamed"' in (value or b""))

    warehouse = str(tmp_path)
    for table in ("orders", "customers"):
        topic = f"{prefix}.shop.{table}"
        for _ in range(2):  # a rerun changes nothing
            land_and_refine(spark, kafka, warehouse, topic)
            refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
            assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_tables[table])
    customers = spark.read.format("delta").load(refined_table_location(warehouse, f"{prefix}.shop.customers"))
    assert customers.where(F.col("notes").contains("__debezium_unavailable_value")).count() == 0
    assert customers.where(F.col("_cdc_op") == "u").count() > 0


def test_refine_from_the_command_line(
    spark, kafka, stack_config, postgres_connector, postgres_tables, tmp_path, monkeypatch, capsys
):
    from cdc.cli import main

    run_workload(stack_config.postgres.dsn(), customers=2, seed=12)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    assert main(["raw", "--topic", topic, "--warehouse", str(tmp_path), "--available-now"]) == 0
    assert main(["refine", "--table", topic, "--warehouse", str(tmp_path), "--available-now"]) == 0
    assert f"refine {topic}: " in capsys.readouterr().out
    refined = spark.read.format("delta").load(refined_table_location(str(tmp_path), topic))
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_tables["orders"])

    assert main(["refine", "--table", "no.such.table", "--warehouse", str(tmp_path), "--available-now"]) == 8
    assert "no raw table for this topic: run `cdc raw` first" in capsys.readouterr().err


def test_undecodable_records_go_to_quarantine_and_the_job_goes_on(
    spark, kafka, stack_config, postgres_connector, postgres_tables, tmp_path, monkeypatch, capsys
):
    import json

    from cdc.cli import main
    from refine.quarantine import quarantine_location

    run_workload(stack_config.postgres.dsn(), customers=2, seed=13)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)
    kafka.produce(topic, [(b'{"payload":{"customer_id":1,"order_no":1}}', b"{not json")])
    bad_offset = kafka.records(topic)[-1][2]

    land_and_refine(spark, kafka, str(tmp_path), topic)

    quarantined = spark.read.format("delta").load(quarantine_location(str(tmp_path)))
    [row] = quarantined.collect()
    assert (row.topic, row.offset, row.raw_value, row.reason) == (
        topic, bad_offset, "{not json", "value is not a Debezium JSON envelope"
    )
    refined = spark.read.format("delta").load(refined_table_location(str(tmp_path), topic))
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_tables["orders"])

    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    capsys.readouterr()
    assert main(["status", "--warehouse", str(tmp_path), "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)["raw_tables"]
    assert status["quarantined"] == 1
