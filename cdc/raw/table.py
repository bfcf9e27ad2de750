"""Raw tables: where they live, what they hold, and the protection that keeps them intact.

Naming rule: the raw table of topic ``T`` is the Delta table at ``<warehouse>/raw/T`` (Kafka topic
names are already safe folder names: letters, digits, ``.``, ``_``, ``-``). Everything the tool
keeps for itself lives under ``<warehouse>/_cdc/``: one streaming checkpoint per raw table at
``_cdc/checkpoints/raw/T`` and the table of recorded offset gaps at ``_cdc/raw_gaps``.

A raw table is the only durable copy of its topic once Kafka's retention has deleted the records,
so it is created with:

- ``delta.appendOnly=true``: Delta itself refuses DELETE, UPDATE, MERGE deletes and overwrites,
  whoever runs them;
- ``delta.enableChangeDataFeed=true``: refinement reads the table's changes incrementally;
- ``cdc.kind=raw``, ``cdc.topic=T`` and ``cdc.reset.allowed=false``: this tool refuses to reset or
  recreate it without ``--force-destroy-raw-data``.
- Parquet settings for its payload columns (:data:`PARQUET_PROPERTIES`);
- a checkpoint every 100 commits (:data:`CHECKPOINT_PROPERTIES`).
"""

from __future__ import annotations

import re
import time

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cdc.errors import TableError
from cdc.storage import Storage

KIND_PROPERTY = "cdc.kind"
TOPIC_PROPERTY = "cdc.topic"
RESET_ALLOWED_PROPERTY = "cdc.reset.allowed"
RAW_KIND = "raw"
PARTITION_COLUMN = "ingest_date"


def _field(name: str, data_type: DataType, comment: str, nullable: bool = True) -> StructField:
    return StructField(name, data_type, nullable, metadata={"comment": comment})


RAW_SCHEMA = StructType(
    [
        _field("key", StringType(), "the Kafka key when it is valid UTF-8"),
        _field("key_bytes", BinaryType(), "the Kafka key's bytes when it is not valid UTF-8"),
        _field("value", StringType(), "the Kafka value when it is valid UTF-8 (null: tombstone)"),
        _field("value_bytes", BinaryType(), "the Kafka value's bytes when it is not valid UTF-8"),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        _field("timestamp", TimestampType(), "the Kafka record's timestamp"),
        _field("timestamp_type", StringType(), "CreateTime or LogAppendTime"),
        _field(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            "the record's headers, in order",
        ),
        _field("ingested_at", TimestampType(), "when the micro-batch ran", nullable=False),
        _field("batch_id", LongType(), "the streaming micro-batch that landed it", nullable=False),
        _field(PARTITION_COLUMN, DateType(), "UTC date of ingested_at", nullable=False),
    ]
)


def raw_table_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/raw/{topic}"


def checkpoint_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/_cdc/checkpoints/raw/{topic}"


def gaps_table_location(warehouse: str) -> str:
    return f"{warehouse}/_cdc/raw_gaps"


# Payload columns: mostly unique values of up to many KB, for which Parquet's dictionary attempts
# and min/max statistics are wasted work: they skip nothing, and Delta keeps no statistics on them.
PAYLOAD_COLUMNS = ("key", "key_bytes", "value", "value_bytes")

# Parquet writer settings for the payload columns, kept as table properties: Delta passes a table's
# properties to Parquet in every write of it (appends, OPTIMIZE), whereas Parquet options given to a
# Delta write are ignored. Landing 1M records of ~1 KB took ~0.9 CPU s (~14%) less with them.
PARQUET_PROPERTIES = {
    f"parquet.{setting}#{column}": "false"
    for column in PAYLOAD_COLUMNS
    for setting in ("enable.dictionary", "column.statistics.enabled")
}


# A continuous job commits to its tables every second or so, and Delta writes a checkpoint (a Spark
# job: the whole log state as Parquet) inside the commit that completes each interval, synchronously:
# at Delta's default of 10 commits, one batch in ten of each table paid ~0.5 s more (warm; seconds in
# a fresh JVM), which a commit's latency meets at p95. Every 100 commits it is one in a hundred; a
# reader that starts replays at most 100 small commit files. A table's explicit setting is kept.
CHECKPOINT_PROPERTIES = {"delta.checkpointInterval": "100"}


def table_properties(topic: str) -> dict[str, str]:
    return {
        **PARQUET_PROPERTIES,
        **CHECKPOINT_PROPERTIES,
        "delta.appendOnly": "true",
        "delta.enableChangeDataFeed": "true",
        "delta.dataSkippingStatsColumns": ",".join(
            field.name
            for field in RAW_SCHEMA.fields
            if field.name not in (*PAYLOAD_COLUMNS, "headers", PARTITION_COLUMN)
        ),
        KIND_PROPERTY: RAW_KIND,
        TOPIC_PROPERTY: topic,
        RESET_ALLOWED_PROPERTY: "false",
    }


def is_delta_table(spark: SparkSession, location: str) -> bool:
    """True when a Delta log is there: its first commit, or, once log cleanup has removed that, the
    pointer to its last checkpoint (cleanup runs after a checkpoint only). Two probes, not a listing:
    a log holds a file per commit, and a refinement asks for every batch. (DeltaTable.isDeltaTable
    caches a "no" per path for the life of the JVM, so it misses a table another process created since.)"""
    storage, log = Storage(spark), f"{location}/_delta_log"
    return storage.exists(f"{log}/{0:020d}.json") or storage.exists(f"{log}/_last_checkpoint")


def delta_properties(spark: SparkSession, location: str) -> dict[str, str]:
    """The Delta table's properties, from its metadata alone. (``DeltaTable.detail()`` also counts
    the table's files: it rebuilds the state of every new version, ~0.5 s on a warm JVM for a small
    table and more with every file, where this takes ~25 ms.)"""
    return {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{location}`").collect()}


def add_missing_properties(
    spark: SparkSession, location: str, wanted: dict[str, str], present: dict[str, str] | None = None
) -> None:
    """Give the Delta table at ``location`` those of the ``wanted`` properties it lacks (a metadata-only
    commit; none when it has them all): a table created by an earlier version. A property it has, even
    with another value, is kept. ``present``: its properties, when already read."""
    present = delta_properties(spark, location) if present is None else present
    if missing := {key: value for key, value in wanted.items() if key not in present}:
        settings = ", ".join(f"'{key}' = '{value}'" for key, value in missing.items())
        spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ({settings})")


def raw_table_topic(spark: SparkSession, location: str) -> str | None:
    """The topic of the raw table at ``location``; None when no Delta table is there.

    Fails when a Delta table is there that this tool did not create as a raw table.
    """
    properties = _raw_table_properties(spark, location)
    return None if properties is None else properties[TOPIC_PROPERTY]


def _raw_table_properties(spark: SparkSession, location: str) -> dict[str, str] | None:
    if not is_delta_table(spark, location):
        return None
    properties = delta_properties(spark, location)
    if properties.get(KIND_PROPERTY) != RAW_KIND:
        raise TableError("a Delta table exists there but it is not a raw table (no cdc.kind=raw)", table=location)
    return properties


def create_raw_table(spark: SparkSession, location: str, topic: str) -> None:
    """Create the raw table of ``topic`` at ``location`` unless it exists (for that topic); give
    one created by an earlier version the Parquet and checkpoint settings it lacks (a metadata-only commit)."""
    properties = _raw_table_properties(spark, location)
    if properties is not None:
        if properties[TOPIC_PROPERTY] != topic:
            raise TableError(
                f"the raw table there holds topic {properties[TOPIC_PROPERTY]!r}", table=location, topic=topic
            )
        add_missing_properties(spark, location, PARQUET_PROPERTIES | CHECKPOINT_PROPERTIES, properties)
        return
    storage = Storage(spark)
    clear_interrupted_creation(storage, location)
    if storage.list_names(location):
        raise TableError("the location holds files but no Delta table", table=location)
    builder = DeltaTable.createIfNotExists(spark).location(location).addColumns(RAW_SCHEMA)
    builder = builder.partitionedBy(PARTITION_COLUMN)
    for key, value in table_properties(topic).items():
        builder = builder.property(key, value)
    builder.execute()


# A Delta log's versioned files (commits, checkpoints, checksums, staged commits) start with the
# version's 20 digits; the temporary file of a commit being written does not.
_VERSIONED_LOG_FILE = re.compile(r"^\d{20}\.")


def clear_interrupted_creation(storage: Storage, location: str, *, abandoned_after: float = 0.0) -> None:
    """Remove what a job killed while Delta created a table at ``location`` left there, when that
    is all there is: a log folder without a single version (Delta makes the log's folders before its
    first commit). Delta takes such a folder for a table's, and neither reads one nor creates one
    over it ("doesn't exist"); no table was ever there. Called before a table is created.

    A table that other streams or jobs may be creating at this very moment (a shared table) passes
    ``abandoned_after``: its versionless log is removed only once nothing in it has changed for that
    many seconds, and this returns as soon as a version appears there (the other writer's table)."""
    log = f"{location}/_delta_log"
    while storage.list_names(location) == ["_delta_log"] and not any(
        _VERSIONED_LOG_FILE.match(name) for name in storage.file_names(log)
    ):
        unchanged_for = time.time() - storage.last_modified(log) if abandoned_after > 0 else 0.0
        if unchanged_for >= abandoned_after:
            storage.delete(log)
            return
        time.sleep(min(0.2, abandoned_after - unchanged_for))  # a creation under way commits within seconds


def has_landed_data(spark: SparkSession, location: str) -> bool:
    """True when the table has any commit after its creation."""
    return DeltaTable.forPath(spark, location).history(1).select("version").collect()[0][0] > 0
