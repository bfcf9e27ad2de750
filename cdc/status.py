"""`cdc status`: what each raw table holds and how far it is behind its topic; expectation totals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc.core.config import KafkaConnection
from cdc.core.errors import SourceError
from cdc.core.source import KafkaTopics
from cdc.core.storage import Storage
from cdc.core.tables import (
    checkpoint_location,
    gaps_table_location,
    is_delta_table,
    raw_table_location,
    raw_table_topic,
    table_version,
)
from cdc.raw.checkpoint import committed_offsets
from refine.progress import RefinedTableStatus, refined_table_statuses
from refine.quality.expectations import expectations_location
from refine.quality.quarantine import quarantine_location


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    consumed: int  # the next offset the raw job will read
    end: int | None  # the next offset Kafka will write (None: Kafka unreachable)

    @property
    def lag(self) -> int | None:
        return None if self.end is None else max(0, self.end - self.consumed)


@dataclass(frozen=True)
class RawTableStatus:
    topic: str
    table: str
    version: int
    rows: int
    recorded_gaps: int
    quarantined: int  # records of this raw table that refinement could not decode
    partitions: list[PartitionLag] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        document = asdict(self)
        document["partitions"] = [{**asdict(p), "lag": p.lag} for p in self.partitions]
        return document


def raw_table_statuses(
    spark: SparkSession, warehouse: str, kafka: KafkaConnection
) -> tuple[list[RawTableStatus], str | None]:
    """Each raw table's status, and why Kafka's end offsets are unknown (None: Kafka answered)."""
    storage = Storage(spark)
    topics = {}
    for name in storage.list_names(f"{warehouse}/raw"):
        location = raw_table_location(warehouse, name)
        if (topic := raw_table_topic(spark, location)) is not None:
            topics[topic] = location
    kafka_error = None
    try:
        held = KafkaTopics(kafka).offsets(sorted(topics)) if topics else {}
    except SourceError as error:
        held, kafka_error = {}, str(error)  # still report the tables; their lag is unknown
    gaps = _counts_by(spark, gaps_table_location(warehouse), "table")
    quarantined = _counts_by(spark, quarantine_location(warehouse), "source_table")
    statuses = []
    for topic, location in topics.items():
        consumed = committed_offsets(storage, checkpoint_location(warehouse, topic))
        partitions = sorted({p for t, p in consumed if t == topic} | {p for t, p in held if t == topic})
        statuses.append(
            RawTableStatus(
                topic=topic,
                table=location,
                version=table_version(spark, location),
                rows=spark.read.format("delta").load(location).count(),
                recorded_gaps=gaps.get(location, 0),
                quarantined=quarantined.get(location, 0),
                partitions=[
                    PartitionLag(p, consumed.get((topic, p), 0), held[(topic, p)].end if (topic, p) in held else None)
                    for p in partitions
                ],
            )
        )
    return statuses, kafka_error


@dataclass(frozen=True)
class ExpectationTotal:
    table: str
    expectation: str
    action: str
    batches: int
    passed: int
    failed: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def expectation_totals(spark: SparkSession, warehouse: str) -> list[ExpectationTotal]:
    """Rows passed and failed per table and expectation, over every recorded batch."""
    location = expectations_location(warehouse)
    if not is_delta_table(spark, location):
        return []
    totals = (
        spark.read.format("delta")
        .load(location)
        .groupBy("table", "expectation", "action")
        .agg(F.count("*").alias("batches"), F.sum("passed").alias("passed"), F.sum("failed").alias("failed"))
        .orderBy("table", "expectation")
    )
    return [ExpectationTotal(**row.asDict()) for row in totals.collect()]  # one row per expectation


def _counts_by(spark: SparkSession, table: str, column: str) -> dict[str, int]:
    """Rows of a bookkeeping table (gaps, quarantine) per raw table."""
    if not is_delta_table(spark, table):
        return {}
    counts = spark.read.format("delta").load(table).groupBy(column).agg(F.count("*").alias("rows"))
    return {row[column]: row["rows"] for row in counts.collect()}  # one row per raw table


@dataclass(frozen=True)
class WarehouseStatus:
    """What :func:`warehouse_status` found: each raw table with its lag behind Kafka, each refined table
    with its lag behind its raw table and its last error, and the expectation totals.

    Example::

        status = Lakehouse("/data/warehouse").status()
        behind = {table.topic: sum(p.lag or 0 for p in table.partitions) for table in status.raw_tables}
    """

    raw_tables: list[RawTableStatus]
    expectations: list[ExpectationTotal]
    kafka_error: str | None = None  # why the lag is unknown: Kafka's end offsets could not be read
    refined_tables: list[RefinedTableStatus] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "raw_tables": [table.as_dict() for table in self.raw_tables],
            "expectations": [total.as_dict() for total in self.expectations],
            "kafka_error": self.kafka_error,
            "refined_tables": [table.as_dict() for table in self.refined_tables],
        }


def warehouse_status(spark: SparkSession, warehouse: str, kafka: KafkaConnection) -> WarehouseStatus:
    """The status of every raw table of ``warehouse`` (Kafka gives the end offsets) and the expectation totals."""
    tables, kafka_error = raw_table_statuses(spark, warehouse, kafka)
    return WarehouseStatus(
        tables, expectation_totals(spark, warehouse), kafka_error, refined_table_statuses(spark, warehouse)
    )
