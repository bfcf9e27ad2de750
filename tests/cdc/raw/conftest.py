"""Fixtures of the raw landing tests."""

from __future__ import annotations

import pytest

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string, value:binary>>"
)


@pytest.fixture
def kafka_records(spark):
    """``kafka_records(rows)``: a DataFrame of records as Spark's Kafka source reads them (with headers)."""
    return lambda rows: spark.createDataFrame(rows, KAFKA_SCHEMA)
