"""Malformed records on a real Debezium Postgres topic: each goes to the quarantine with a reason naming
the field, every good record is applied, the job exits 0 and a rerun changes nothing; a batch that
fails for another reason stops the job with one line naming the cause, the table and the batch.

The good records are the real connector's, byte for byte: captured from a table of this test's own,
then produced again, in order, to a topic of their own with the malformed ones (copies of real records,
mutated) between them.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import time

import psycopg
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from refine.job import refined_table_location
from refine.merge import METADATA_COLUMNS
from refine.quarantine import quarantine_location

pytestmark = pytest.mark.integration

COLUMNS = ("id int PRIMARY KEY, name text NOT NULL, born date, seen_at timestamp(6), updated_at timestamptz, "
           "price numeric(10,2), qty bigint, flag boolean")  # fmt: skip
SPARK_SCHEMA = ("id int, name string, born date, seen_at timestamp_ntz, updated_at timestamp, price decimal(10,2), "
                "qty long, flag boolean")  # fmt: skip


@pytest.fixture
def captured_table(stack, stack_config, unique_name):
    """``capture(statements)``: the table ``<unique_name>.items`` (:data:`COLUMNS`), changed by the SQL
    ``statements`` while a Debezium connector of this test's own captures it; returns its topic's records
    once the last statement's change is there. Removes the connector with its slot and publication."""
    from connectors import definitions
    from connectors.client import ConnectClient
    from connectors.definitions import ConnectorDefinition

    dsn, client = stack_config.postgres.dsn(), ConnectClient(stack_config.connect.url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {unique_name}")
        conn.execute(f"CREATE TABLE {unique_name}.items ({COLUMNS})")
    connector = ConnectorDefinition(unique_name, {
        **definitions.load("postgres").config, "topic.prefix": unique_name, "slot.name": unique_name,
        "publication.name": unique_name, "schema.include.list": unique_name})  # fmt: skip
    topic = f"{unique_name}.{unique_name}.items"

    def capture(statements: list[str], kafka, last_value) -> list[tuple]:
        client.register(connector)
        client.wait_running(connector.name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.format(table=f"{unique_name}.items"))
        return kafka.wait_for_last_value(topic, last_value)

    capture.topic, capture.dsn, capture.table = topic, dsn, f"{unique_name}.items"
    capture.read = lambda spark: spark.createDataFrame(  # the table in Postgres, as the refined table types it
        psycopg.connect(dsn).execute(f"SELECT * FROM {unique_name}.items").fetchall(), SPARK_SCHEMA)
    yield capture
    if connector.name in client.connectors():
        client.delete(connector.name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (unique_name,)).fetchone() == (True,):
            assert time.monotonic() < deadline, f"replication slot {unique_name} still active"
            time.sleep(0.2)
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (unique_name,))
        conn.execute(f'DROP PUBLICATION IF EXISTS "{unique_name}"')


def test_a_batch_that_fails_stops_the_job_with_one_line_naming_the_cause_table_and_batch(
    spark, kafka, captured_table, tmp_path, monkeypatch, cdc_process
):
    """The refined table's location is taken by a file (a user's mistake, a broken copy): the batch's
    first write fails inside Spark, with no error of the tool's own. `cdc refine` runs as a process of
    its own: what the user sees is all it prints."""
    from cdc.cli import main

    topic = captured_table.topic
    warehouse = str(tmp_path)
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    captured_table(["INSERT INTO {table} (id, name, qty) VALUES (1, 'one', 1)"], kafka, lambda value: value is not None)
    assert main(["raw", "--topic", topic, "--warehouse", warehouse, "--available-now"]) == 0
    (tmp_path / "refined").mkdir()
    (tmp_path / "refined" / topic).write_text("not a table")
    for debug in (False, True):
        job = cdc_process([*(["--debug"] if debug else []), "refine", "--table", topic, "--warehouse", warehouse,
                           "--available-now"])  # fmt: skip
        output = job.wait(timeout=300)
        assert job.returncode == 9, output
        errors = [line for line in output.splitlines() if line.startswith("cdc: error:")]
        assert len(errors) == 1, output
        assert re.fullmatch(rf"cdc: error: a refine batch failed: [\w.]+: \S.* \(table={re.escape(topic)}, batch=0\)",
                            errors[0]), output  # fmt: skip
        assert "Python Proxy" not in output
        assert ("Traceback" in output) == debug, output
