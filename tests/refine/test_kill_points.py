"""Jobs killed between a batch's data files and its commit, at each table a batch writes.

The kill is a fault-injection point, not a race: `cdc.testing.HaltBeforeCommit` (tests/jvm), put on the
driver's class path and turned on by Spark settings only this test gives, halts the driver JVM as SIGKILL
would right before a chosen Delta commit is written, after that transaction's data files are. Each
`cdc refine` process is killed so at the next data commit of one table (the refined table, its history,
its child table, a keyless table); the next process goes on from what the last one left. Then two
reruns: the tables equal Postgres. Before that, `cdc raw` is killed so too, and its rerun lands each
Kafka record once.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import unquote

import psycopg
import pytest
import yaml
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.stack.workload import run_workload

HALTED = "cdc: halting before commit "  # what cdc.testing.HaltBeforeCommit prints as it halts the JVM
CUSTOMER_COLUMNS = ["id", "email", "full_name", "balance", "tags", "notes"]
# In the order a batch commits them: each process is killed at the next commit of one.
KILL_POINTS = ["customers", "customers__history", "customers__tags", "page_views"]


@pytest.fixture(scope="module")
def halting_jar(tmp_path_factory) -> str:
    """tests/jvm/HaltBeforeCommit.java compiled against pyspark's and Delta's jars, as a jar, and the class
    path that holds it: with Delta's storage jar, which the JVM's own class loader must then load too (the
    jobs' jars are loaded by a child of it, whose classes the log store could not see)."""
    import pyspark

    from cdc.core import jars

    spark_jars = jars.resolve(jars.SPARK_BUNDLE)
    source = Path(__file__).parents[1] / "jvm" / "HaltBeforeCommit.java"
    jar = jars.compile_jar(
        [source],
        tmp_path_factory.mktemp("halting") / "halting.jar",
        [Path(pyspark.__file__).parent / "jars" / "*", *spark_jars],
        "the kill points' log store",
    )
    storage = [path for path in spark_jars if path.name.startswith("delta-storage-")]
    return os.pathsep.join([str(jar), *map(str, storage)])


def halt_before_commit(class_path: str, table_path_end: str, version: int) -> dict[str, str]:
    """The Spark settings that halt the driver JVM before the first commit at or after ``version`` that adds
    data files to the table whose path ends with ``table_path_end``."""
    return {
        "spark.driver.extraClassPath": class_path,
        "spark.delta.logStore.file.impl": "cdc.testing.HaltBeforeCommit",
        "spark.hadoop.cdc.halt-before-commit": f"{table_path_end}@{version}",
    }


def halted_commit(output: str, location: Path) -> int | None:
    """The version of the table's commit the job's JVM halted before, as it printed it (None: it did not)."""
    found = re.search(rf"{re.escape(f'{HALTED}file:{location}/_delta_log/')}(\d{{20}})\.json", output)
    return None if found is None else int(found[1])


def uncommitted_data_files(location: Path) -> set[str]:
    """The table's Parquet files that no commit of its log adds."""
    written = {
        path.relative_to(location).as_posix()
        for path in location.rglob("*.parquet")
        if "_delta_log" not in path.relative_to(location).parts
    }
    added = {
        unquote(action["add"]["path"])
        for log in (location / "_delta_log").glob("*.json")
        for action in map(json.loads, log.read_text().splitlines())
        if "add" in action
    }
    return written - added


@pytest.mark.timeout(2400)  # four Spark processes started and killed: slow on a loaded machine
def test_a_refine_killed_between_its_data_files_and_its_commit_refines_equal_to_postgres(
    spark,
    kafka,
    stack_config,
    postgres_connector,
    tmp_path,
    monkeypatch,
    cdc_process,
    land,
    postgres_table,
    halting_jar,
):
    from cdc.cli import main

    dsn, warehouse, prefix = stack_config.postgres.dsn(), tmp_path / "warehouse", postgres_connector.topic_prefix
    run_workload(dsn, customers=10, seed=71)
    with psycopg.connect(dsn) as conn:  # a primary-key change of a row with TOASTed values
        conn.execute("UPDATE shop.customers SET id = id + 10000 WHERE id = (SELECT min(id) FROM shop.customers)")
    topics = {table: f"{prefix}.shop.{table}" for table in ("customers", "page_views")}
    kafka.wait_for_last_value(topics["customers"], lambda value: value is not None and b'"op":"c"' in value)
    kafka.wait_for_last_value(topics["page_views"], lambda value: value is None)
    # `cdc raw` killed before its first batch's commit, then run again: each Kafka record lands once.
    raw = warehouse / "raw" / topics["customers"]
    job = cdc_process(
        ["raw", *(f"--topic={topic}" for topic in topics.values()), "--warehouse", str(warehouse), "--available-now"],
        conf=halt_before_commit(halting_jar, f"/raw/{topics['customers']}", 1),
    )
    output = job.wait(timeout=900)
    assert halted_commit(output, raw) == 1, output
    assert job.returncode != 0, output
    assert uncommitted_data_files(raw), "the killed batch had written no data file"
    land(str(warehouse), *topics.values())
    for topic in topics.values():
        landed = spark.read.format("delta").load(str(warehouse / "raw" / topic)).select("partition", "offset")
        assert sorted(map(tuple, landed.collect())) == [(r[1], r[2]) for r in kafka.records(topic)], topic
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "name": "shop",
                "sources": {table: {"kind": "debezium_postgres", "topic": topic} for table, topic in topics.items()},
                "refined": {
                    "customers": {"source": "customers", "explode": ["tags"], "scd": 2},
                    "page_views": {"source": "page_views"},
                },
            }
        )
    )
    refine = ["refine", "--pipeline", str(pipeline), "--warehouse", str(warehouse), "--available-now"]

    for table in KILL_POINTS:
        location = warehouse / "refined" / table
        # Its next commit that adds data (a table not made yet: its first batch's, after its creation).
        version = max(1, len(list((location / "_delta_log").glob("*.json"))))
        job = cdc_process(refine, conf=halt_before_commit(halting_jar, f"/refined/{table}", version))
        output = job.wait(timeout=900)
        halted = halted_commit(output, location)
        assert halted is not None, f"not killed before a commit of {table} from {version} on:\n{output}"
        assert job.returncode != 0, output
        assert not (location / "_delta_log" / f"{halted:020d}.json").exists()
        assert uncommitted_data_files(location), f"{table}: the killed batch had written no data file"

    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    customers, page_views = postgres_table("customers"), postgres_table("page_views")
    read = lambda name: spark.read.format("delta").load(str(warehouse / "refined" / name))  # noqa: E731
    for _ in range(2):  # a rerun changes nothing
        assert main(refine) == 0
        assertDataFrameEqual(read("customers").select(*CUSTOMER_COLUMNS), customers.select(*CUSTOMER_COLUMNS))
        current = read("customers__history").where("_cdc_is_current AND NOT _cdc_is_deleted")
        assertDataFrameEqual(current.select(*CUSTOMER_COLUMNS), customers.select(*CUSTOMER_COLUMNS))
        tags = customers.select("id", F.posexplode("tags").alias("pos", "value"))
        assertDataFrameEqual(read("customers__tags").select("id", "pos", "value"), tags)
        assertDataFrameEqual(read("page_views").select(*page_views.columns), page_views)
