"""examples/notebook.py runs as a user would run it, in a process of its own, against the real stack: its
refined table equals the Postgres table, and a second run changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyspark.testing import assertDataFrameEqual

from cdc.stack.workload import run_workload
from refine.apply.merge import METADATA_COLUMNS
from refine.job import refined_table_location

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.py"


def test_the_notebook_example_refines_a_topic_equal_to_postgres(
    spark, kafka, stack_config, postgres_connector, postgres_table, tmp_path
):
    run_workload(stack_config.postgres.dsn(), customers=3, seed=31)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    env = {
        **os.environ,
        "CDC_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "CDC_WAREHOUSE": str(tmp_path),
        "CDC_SPARK__DRIVER_MEMORY": "1g",
        "CDC_SPARK__SHUFFLE_PARTITIONS": "2",
        # A session of a minute or two: the C1 compiler alone (C2 compiles for long runs, on the cores it needs).
        "CDC_SPARK__CONF": '{"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}',
        "EXAMPLE_TOPIC": topic,
    }

    def run() -> str:
        done = subprocess.run(
            [sys.executable, str(NOTEBOOK)], env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    first = run()
    refined = spark.read.format("delta").load(refined_table_location(str(tmp_path), topic))
    expected = postgres_table("orders")
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), expected)
    assert f"{expected.count()} rows in the refined table of {topic}" in first
    assert f"{topic}: " in first
    assert "lag 0" in first

    second = run()
    assert "landed 0 records" in second
    assert "refined 0 changes" in second
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), expected)
