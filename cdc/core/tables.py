"""Delta table helpers and the warehouse's layout, shared by every job.

Naming rule: the raw table of topic ``T`` is the Delta table at ``<warehouse>/raw/T`` (Kafka topic
names are already safe folder names: letters, digits, ``.``, ``_``, ``-``). Everything the tool
keeps for itself lives under ``<warehouse>/_cdc/``: one streaming checkpoint per raw table at
``_cdc/checkpoints/raw/T`` and the table of recorded offset gaps at ``_cdc/raw_gaps``.

The tool marks the tables it creates with properties: ``cdc.kind`` (``raw``, ``refined``, ...),
``cdc.topic`` and ``cdc.reset.allowed`` (see :mod:`cdc.raw.table` for the raw table's protection).

A refined table's optional Delta features (:class:`TableFeatures`) decide which readers open it:
deletion vectors make a MERGE cheaper but a reader must support them (delta-rs, behind pandas' and
Polars' ``read_delta``, does not), a Change Data Feed makes every MERGE write the changed rows again
but lets a reader (a business table's incremental refresh) read what changed.
"""

from __future__ import annotations

import re
import time
from typing import NamedTuple

from delta.tables import DeltaTable
from py4j.protocol import Py4JError
from pydantic import Field
from pyspark.sql import SparkSession

from cdc.core.config import _Strict
from cdc.core.errors import TableError
from cdc.core.storage import Storage

KIND_PROPERTY = "cdc.kind"
TOPIC_PROPERTY = "cdc.topic"
RESET_ALLOWED_PROPERTY = "cdc.reset.allowed"
RAW_KIND = "raw"


def raw_table_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/raw/{topic}"


def checkpoint_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/_cdc/checkpoints/raw/{topic}"


def gaps_table_location(warehouse: str) -> str:
    return f"{warehouse}/_cdc/raw_gaps"


# A continuous job commits to its tables every second or so, and Delta writes a checkpoint (a Spark
# job: the whole log state as Parquet) inside the commit that completes each interval, synchronously:
# at Delta's default of 10 commits, one batch in ten of each table paid ~0.5 s more (warm; seconds in
# a fresh JVM), which a commit's latency meets at p95. Every 100 commits it is one in a hundred; a
# reader that starts replays at most 100 small commit files. A table's explicit setting is kept.
CHECKPOINT_PROPERTIES = {"delta.checkpointInterval": "100"}


CHANGE_DATA_FEED_PROPERTY = "delta.enableChangeDataFeed"
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"
# How SHOW TBLPROPERTIES tells that a table's protocol holds deletion vectors (readers must support them).
DELETION_VECTORS_SUPPORTED = "delta.feature.deletionVectors"


class TableFeatures(_Strict):
    """The optional Delta features of a refined table and of the child and history tables beside it.
    Unset (null): off on a new table, and an existing table keeps what it has. Set: a new table is
    created so, and an existing one is changed so at its job's first batch."""

    deletion_vectors: bool | None = Field(
        default=None,
        description="Deletion vectors: a MERGE marks the rows it replaces instead of rewriting their files (cheaper "
        "for a large table), but readers without deletion-vector support (delta-rs: pandas' and Polars' read_delta) "
        "cannot open the table. false on an existing table purges them (`REORG ... APPLY (PURGE)`, a rewrite of the "
        "files holding some) and drops the feature from the table's protocol, once.",
    )
    change_data_feed: bool | None = Field(
        default=None,
        description="Change Data Feed: every MERGE also writes the rows it changed, for readers of the table's changes "
        "(a business table's incremental refresh). In a pipeline, unset means on for a table a business table reads. "
        "Turned on or off on an existing table by a property change; a feed only covers the versions written while on.",
    )

    def over(self, default: TableFeatures) -> TableFeatures:
        """These settings where set, ``default``'s elsewhere."""
        return TableFeatures(
            deletion_vectors=default.deletion_vectors if self.deletion_vectors is None else self.deletion_vectors,
            change_data_feed=default.change_data_feed if self.change_data_feed is None else self.change_data_feed,
        )

    def creation_properties(self) -> dict[str, str]:
        """The properties a new table is created with."""
        return {
            CHANGE_DATA_FEED_PROPERTY: str(bool(self.change_data_feed)).lower(),
            DELETION_VECTORS_PROPERTY: str(bool(self.deletion_vectors)).lower(),
        }


def apply_features(spark: SparkSession, location: str, features: TableFeatures, present: dict[str, str]) -> None:
    """Change the existing Delta table at ``location`` (with the properties ``present``) to have the
    ``features`` that are set; nothing when it has them."""
    wanted = {
        key: str(value).lower()
        for key, value in (
            (CHANGE_DATA_FEED_PROPERTY, features.change_data_feed),
            (DELETION_VECTORS_PROPERTY, True if features.deletion_vectors else None),
        )
        if value is not None
    }
    if changed := {key: value for key, value in wanted.items() if present.get(key, "false") != value}:
        settings = ", ".join(f"'{key}' = '{value}'" for key, value in changed.items())
        spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ({settings})")
    if features.deletion_vectors is False and (
        DELETION_VECTORS_SUPPORTED in present or present.get(DELETION_VECTORS_PROPERTY) == "true"
    ):
        # Turns the property off, rewrites the files that have deletion vectors, and removes the
        # feature from the protocol, so readers without their support open the table again.
        spark.sql(f"ALTER TABLE delta.`{location}` DROP FEATURE deletionVectors")


def is_delta_table(spark: SparkSession, location: str) -> bool:
    """True when a Delta log is there: its first commit, or, once log cleanup has removed that, the
    pointer to its last checkpoint (cleanup runs after a checkpoint only). Two probes, not a listing:
    a log holds a file per commit, and a refinement asks for every batch. (DeltaTable.isDeltaTable
    caches a "no" per path for the life of the JVM, so it misses a table another process created since.)"""
    storage, log = Storage(spark), f"{location}/_delta_log"
    return storage.exists(f"{log}/{0:020d}.json") or storage.exists(f"{log}/_last_checkpoint")


# What SHOW TBLPROPERTIES shows for a value Spark's redaction settings match: by default any value holding
# "url", "token", "password" or "secret" (a topic `app.tokens`, a stored schema with a `password_hash` column).
REDACTED = "*********(redacted)"


def delta_properties(spark: SparkSession, location: str) -> dict[str, str]:
    """The Delta table's properties, from its metadata alone (``DeltaTable.detail()`` also counts the
    table's files: it rebuilds the state of every new version, ~0.5 s on a warm JVM for a small table
    and more with every file, where this takes ~25 ms). A value SHOW TBLPROPERTIES redacts is read
    from DESCRIBE DETAIL, which gives it as it is."""
    properties = {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{location}`").collect()}
    if REDACTED in properties.values():
        [detail] = spark.sql(f"DESCRIBE DETAIL delta.`{location}`").select("properties").collect()
        properties |= detail.properties
    return properties


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
    properties = raw_table_properties(spark, location)
    return None if properties is None else properties[TOPIC_PROPERTY]


def raw_table_properties(spark: SparkSession, location: str) -> dict[str, str] | None:
    if not is_delta_table(spark, location):
        return None
    properties = delta_properties(spark, location)
    if properties.get(KIND_PROPERTY) != RAW_KIND:
        raise TableError("a Delta table exists there but it is not a raw table (no cdc.kind=raw)", table=location)
    return properties


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


class TableSnapshot(NamedTuple):
    """A Delta table's latest version, the bytes of its data files, and its id (a table created again at the
    same place has another)."""

    version: int
    size_in_bytes: int
    table_id: str


def table_snapshot(spark: SparkSession, location: str) -> TableSnapshot:
    """The Delta table's latest version and size, from its log: Delta's own snapshot, with the size from
    the version's checksum file (~10-30 ms on a warm JVM). The snapshot's ``sizeInBytes`` rebuilds the
    version's state instead (three Spark jobs, ~0.7 s for a small table), as do the public ways:
    ``DeltaTable.history(1)`` runs a query (~0.2-0.5 s) and ``detail()`` ~0.8 s per batch of a 1M-row
    refined table. Delta's JVM classes are not a public API: where they differ (another Delta build), the
    public ways answer."""
    jvm = spark.sparkContext._jvm
    try:
        assert jvm is not None  # a live session has its JVM gateway
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location)
        snapshot = log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
        checksum = snapshot.checksumOpt()
        size = checksum.get().tableSizeBytes() if checksum.isDefined() else snapshot.sizeInBytes()
        return TableSnapshot(int(snapshot.version()), int(size), str(snapshot.metadata().id()))
    except Py4JError:
        table = DeltaTable.forPath(spark, location)
        version = table.history(1).select("version").collect()[0][0]
        detail = table.detail().collect()[0]
        return TableSnapshot(version, detail.sizeInBytes, detail.id)


def table_version(spark: SparkSession, location: str) -> int:
    """The Delta table's latest version (its last commit)."""
    return table_snapshot(spark, location).version


def has_landed_data(spark: SparkSession, location: str) -> bool:
    """True when the table has any commit after its creation."""
    return table_version(spark, location) > 0
