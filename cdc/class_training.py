"""The training run of the JVM class archive (:mod:`cdc.core.class_archive`): a small raw landing and
two refines in a JVM of their own, on tables in a temporary folder (no Kafka needed).

:func:`cdc.core.class_archive.build` starts it as ``python -m cdc.class_training``: it runs the jobs, so it
sits above raw and refine, while the archive's lookup stays in the core every session uses.
"""

from __future__ import annotations

import json
import tempfile

from pyspark.sql import SparkSession


def _training_run() -> None:
    """Load what jobs load: a raw landing through the job's own batch writer, refines of Debezium
    envelopes (decimals, timestamps, a TOAST placeholder, an undecodable record), MERGEs, reads of
    Change Data Feeds. Then stop the JVM and wait for it to write the archive."""
    from pyspark import SparkContext

    from cdc.core.config import load_settings
    from cdc.core.session import build_spark_session

    spark = build_spark_session(load_settings().spark)
    with tempfile.TemporaryDirectory(prefix="cdc-class-archive-") as warehouse:
        _land_and_refine(spark, warehouse)
    gateway = SparkContext._gateway
    assert gateway is not None  # the session above started it
    spark.stop()
    # The JVM exits when its standard input closes, and writes the archive as it exits.
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=300)


TRAINING_TOPIC = "train.public.items"


def _land_and_refine(spark: SparkSession, warehouse: str) -> None:
    from pyspark.sql import functions as F

    from cdc.core.tables import TableFeatures, raw_table_location
    from cdc.raw.config import RawJobConfig
    from cdc.raw.job import LandBatch
    from cdc.raw.table import create_raw_table
    from refine.job import RefineJobConfig, run_refine_job

    raw = raw_table_location(warehouse, TRAINING_TOPIC)
    create_raw_table(spark, raw, TRAINING_TOPIC)
    config = RawJobConfig.model_validate(
        {
            "topics": {"kind": "topics", "topics": [TRAINING_TOPIC]},
            "warehouse": warehouse,
            "trigger": {"kind": "available_now"},
        }
    )
    feed = f"{warehouse}/_training_feed"
    # With a Change Data Feed: the read of it below loads what a business table's refresh loads.
    refine = RefineJobConfig(
        table=TRAINING_TOPIC,
        warehouse=warehouse,
        trigger={"kind": "available_now"},
        features=TableFeatures(change_data_feed=True),
    )
    for first, envelopes in enumerate(
        [_envelopes(range(1, 6), "c"), [*_envelopes(range(2, 5), "u"), ("{}", "{not json")]]
    ):
        records = spark.createDataFrame(
            [
                (key.encode(), value.encode(), TRAINING_TOPIC, 0, first * 10 + offset, 0)
                for offset, (key, value) in enumerate(envelopes)
            ],
            "key binary, value binary, topic string, partition int, offset long, timestampType int",
        ).select(
            "*",
            F.current_timestamp().alias("timestamp"),
            F.lit(None).cast("array<struct<key:string,value:binary>>").alias("headers"),
        )
        records.write.format("delta").mode("append").save(feed)
        # A stream of Kafka-shaped records through the raw job's own batch writer, as `cdc raw` runs it.
        (
            spark.readStream.format("delta")
            .load(feed)
            .writeStream.foreachBatch(
                LandBatch(config, TRAINING_TOPIC, raw, f"{warehouse}/_training_checkpoint", new_table=first == 0)
            )
            .option("checkpointLocation", f"{warehouse}/_training_checkpoint")
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
        run_refine_job(spark, refine, say=lambda line: None)
    spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(
        f"{warehouse}/refined/{TRAINING_TOPIC}"
    ).collect()


_ID_FIELD = {"type": "int64", "optional": False, "field": "id"}
_ROW = {
    "type": "struct",
    "optional": True,
    "name": "train.public.items.Value",
    "fields": [
        _ID_FIELD,
        {"type": "string", "optional": True, "field": "name"},
        {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": "2", "connect.decimal.precision": "12"},
            "field": "price",
        },
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "at"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "seen"},
    ],
}


_KEY_SCHEMA = {"type": "struct", "optional": False, "name": "train.public.items.Key", "fields": [_ID_FIELD]}


def _value_schema() -> dict:
    from refine.records.envelope import COMMON_SOURCE_FIELDS

    source = [
        *COMMON_SOURCE_FIELDS,
        *({"type": "string", "optional": False, "field": name} for name in ("schema", "table")),
        *({"type": "int64", "optional": True, "field": name} for name in ("txId", "lsn", "xmin")),
    ]
    return {
        "type": "struct",
        "optional": False,
        "name": "train.public.items.Envelope",
        "fields": [
            {**_ROW, "field": "before"},
            {**_ROW, "field": "after"},
            {
                "type": "struct",
                "optional": False,
                "name": "io.debezium.connector.postgresql.Source",
                "fields": source,
                "field": "source",
            },
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }


def _envelopes(ids: range, op: str) -> list[tuple[str, str]]:
    """Keys and values of Debezium Postgres records (JsonConverter with schemas) of rows ``ids``; an
    update leaves the name TOASTed."""
    schema = _value_schema()
    records = []
    for row_id in ids:
        name = "__debezium_unavailable_value" if op == "u" else f"item {row_id}"
        after = {
            "id": row_id,
            "name": name,
            "price": "AQI=",
            "at": "2026-01-02T03:04:05.123456Z",
            "seen": 1_700_000_000_000_000,
        }
        source = {
            "version": "3.6.3.Final",
            "connector": "postgresql",
            "name": "train",
            "ts_ms": 1_700_000_000_000,
            "snapshot": "false",
            "db": "train",
            "schema": "public",
            "table": "items",
            "lsn": 1000 * row_id + len(op),
        }
        payload = {"before": None, "after": after, "source": source, "op": op, "ts_ms": 1_700_000_000_000}
        key = {"schema": _KEY_SCHEMA, "payload": {"id": row_id}}
        records.append(
            (
                json.dumps(key, separators=(",", ":")),
                json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")),
            )
        )
    return records


if __name__ == "__main__":
    _training_run()
