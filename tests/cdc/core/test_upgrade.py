"""Upgrade in place: a warehouse written by the previous engine (Spark 4.0.0, Delta 4.0.0) goes on under the
current one without landing or refining anything twice, and no table's Delta protocol is raised.

The fixture (tests/fixtures/warehouse_spark_4_0, written by its generate.py under the previous engine) holds
the shop pipeline's warehouse after a first round of Debezium records from the real connector, every record of
both rounds, and the Postgres tables after the second round. The test produces the records again into new
topics of the same names (they get the same offsets), continues landing and refining, and compares with
Postgres.
"""

import base64
import json
import tarfile
from pathlib import Path

import yaml
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.cli import main

FIXTURE = Path(__file__).parents[2] / "fixtures" / "warehouse_spark_4_0"
TABLES = ("customers", "orders", "page_views")


def delta_tables(warehouse: Path) -> list[Path]:
    return sorted(log.parent for log in warehouse.rglob("_delta_log"))


def protocols(spark, tables: list[Path]) -> dict[str, tuple]:
    found = {}
    for table in tables:
        (detail,) = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()
        found[table.name] = (detail.minReaderVersion, detail.minWriterVersion, sorted(detail.tableFeatures or []))
    return found


def test_a_warehouse_of_the_previous_engine_goes_on_under_this_one(spark, kafka, tmp_path, monkeypatch):
    with tarfile.open(FIXTURE / "warehouse.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    warehouse = tmp_path / "warehouse"
    records = [json.loads(line) for line in (FIXTURE / "records.jsonl").read_text().splitlines()]

    def decoded(text):
        return None if text is None else base64.b64decode(text)

    def key(record):
        # kafka-python cannot produce a record with neither key nor value (a keyless table's tombstone after
        # a delete): it gets an empty key, which refinement ignores as it ignores the tombstone.
        return decoded(record["key"]) if record["key"] is not None or record["value"] is not None else b""

    for topic in sorted({record["topic"] for record in records}):
        kafka.create_topic(topic)
        kafka.produce(
            topic,
            [
                (key(r), decoded(r["value"]), [(k, decoded(v)) for k, v in r["headers"]])
                for r in records
                if r["topic"] == topic
            ],
            partition=0,
        )
    tables = delta_tables(warehouse)
    assert {"customers", "customers__history", "customers__tags", "orders", "page_views"} <= {t.name for t in tables}
    before = protocols(spark, tables)
    landed_before = {
        topic: spark.read.format("delta").load(str(warehouse / "raw" / topic)).count()
        for topic in {r["topic"] for r in records}
    }
    assert 0 < sum(landed_before.values()) < len(records), "the fixture holds the first round only"

    shop = (Path(__file__).parents[3] / "examples" / "pipelines" / "shop.yaml").read_text()
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(yaml.safe_load(shop.replace("topic: demo.shop.", "topic: upgrade.shop."))))
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    options = ["--pipeline", str(pipeline), "--warehouse", str(warehouse), "--available-now"]
    for _ in range(2):  # a rerun lands and refines nothing more
        assert main(["raw", *options]) == 0
        assert main(["refine", *options]) == 0

        for topic in {r["topic"] for r in records}:
            raw = spark.read.format("delta").load(str(warehouse / "raw" / topic))
            expected = sorted(r["offset"] for r in records if r["topic"] == topic)
            assert sorted(row.offset for row in raw.select("offset").collect()) == expected, f"{topic} landed twice"
        for table in TABLES:
            postgres = spark.read.parquet(str(FIXTURE / "postgres" / f"{table}.parquet"))
            refined = spark.read.format("delta").load(str(warehouse / "refined" / table))
            assertDataFrameEqual(refined.select(*postgres.columns), postgres)
        customers = spark.read.parquet(str(FIXTURE / "postgres" / "customers.parquet"))
        history = spark.read.format("delta").load(str(warehouse / "refined" / "customers__history"))
        assertDataFrameEqual(history.where("_cdc_is_current").select(*customers.columns), customers)
        assert history.where("_cdc_is_current").groupBy("id").count().where("count > 1").isEmpty()
        tags = spark.read.format("delta").load(str(warehouse / "refined" / "customers__tags"))
        assertDataFrameEqual(
            tags.select("id", "pos", "value"), customers.select("id", F.posexplode("tags").alias("pos", "value"))
        )
    # Each change the first round refined is in the history once: none was refined twice.
    assert history.groupBy("id", "_cdc_lsn", "_cdc_offset").count().where("count > 1").isEmpty()
    assert protocols(spark, tables) == before, "a table's Delta protocol was raised"
