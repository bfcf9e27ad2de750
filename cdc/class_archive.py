"""A class-data-sharing archive for the Spark driver's JVM: Spark's, Delta's and Scala's classes parsed
and verified once, then mapped by every later JVM instead of loaded again from the jars.

A fresh JVM that lands or refines a batch loads ~20,000 classes, each read from its jar, parsed and
verified: seconds of a scheduled run and of the first batches of a continuous one, on two cores. The
JDK's dynamic class-data sharing (``-XX:ArchiveClassesAtExit``, JDK 13 and later) writes the classes
one run loaded to a file; a JVM started with ``-XX:SharedArchiveFile`` maps them from it.

:func:`build` makes that archive with a training run (a small raw landing and two refines, in a JVM
of their own, on tables in a temporary folder: no Kafka needed) and keeps it in the jars cache, named
by a digest of what it is only valid for (the JDK, pyspark's jars, the session's jars). ``cdc jars
fetch`` builds it; a local session (:func:`cdc.spark.build_spark_session`) uses the archive of its
digest when it exists. A JVM that finds the archive does not match it ignores it and loads classes as
usual (``-Xshare:auto``, the JDK's default), so a stale or missing archive costs time, never a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cdc.errors import DependencyError
from cdc.jars import built_once

# The JDK's own messages about the archive (classes it skips while writing, an archive it will not
# use) are for JDK developers: the archive is an optimisation, and a run without it is still right.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_path(cache_dir: Path, java: str, jars: list[str]) -> Path:
    """Where the archive for this JDK (``java``, the launcher Spark starts), this pyspark's jars and
    these jars (the session's ``spark.jars``) is kept: any change to them names another file."""
    import pyspark

    jdk = Path(os.path.realpath(java)).parent.parent
    release = jdk / "release"
    pyspark_jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    parts = [str(jdk), release.read_text() if release.exists() else ""]
    # The JVM maps an archive only for the class path it was written with, jar for jar (path, size
    # and time): another virtualenv's pyspark, even of the same version, needs an archive of its own.
    parts += [
        f"{path} {Path(path).stat().st_size} {Path(path).stat().st_mtime_ns}"
        for path in [*map(str, pyspark_jars), *jars]
    ]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return cache_dir / "class-archives" / f"spark-{digest}.jsa"


def java_options(cache_dir: Path, java: str, jars: list[str]) -> list[str]:
    """The driver JVM's options that map the archive, when there is one for this JDK and these jars."""
    archive = archive_path(cache_dir, java, jars)
    return [f"-XX:SharedArchiveFile={archive}", *_QUIET] if archive.exists() else []


def build(cache_dir: Path, java: str, jars: list[str]) -> Path:
    """The archive for this JDK and these jars: made by a training run in a process of its own on the
    first call (~1 minute), then found in the cache."""
    archive = archive_path(cache_dir, java, jars)
    return built_once(cache_dir, lambda: archive if archive.exists() else None, lambda: _train(archive))


def _train(archive: Path) -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    # The child builds its session from the same settings as the caller, so with the same jars.
    conf = json.loads(os.environ.get("CDC_SPARK__CONF") or "{}")
    conf["spark.driver.extraJavaOptions"] = " ".join([f"-XX:ArchiveClassesAtExit={partial}", *_QUIET])
    env = {**os.environ, "CDC_SPARK__CONF": json.dumps(conf)}
    result = subprocess.run(
        [sys.executable, "-m", "cdc.class_archive"], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        partial.unlink(missing_ok=True)
        raise DependencyError(f"the training run of the JVM class archive failed:\n{tail}", archive=str(archive))
    partial.rename(archive)
    return archive


def _training_run() -> None:
    """Load what jobs load: a raw landing through the job's own batch writer, refines of Debezium
    envelopes (decimals, timestamps, a TOAST placeholder, an undecodable record), MERGEs, reads of
    Change Data Feeds. Then stop the JVM and wait for it to write the archive."""
    from pyspark import SparkContext

    from cdc.config import load_settings
    from cdc.spark import build_spark_session

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


def _land_and_refine(spark, warehouse: str) -> None:
    from pyspark.sql import functions as F

    from cdc.raw.config import RawJobConfig
    from cdc.raw.job import LandBatch
    from cdc.raw.table import create_raw_table, raw_table_location
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
    refine = RefineJobConfig(table=TRAINING_TOPIC, warehouse=warehouse, trigger={"kind": "available_now"})
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
    from refine.envelope import COMMON_SOURCE_FIELDS

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
