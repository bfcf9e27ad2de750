"""The pure transform from Spark's Kafka records to raw table rows (no I/O)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc.core.functions import is_utf8
from cdc.raw.table import PARTITION_COLUMN, RAW_SCHEMA


def _text_and_bytes(column: str) -> tuple[Column, Column]:
    """(the bytes as a string when they are valid UTF-8, the bytes when they are not)."""
    valid = is_utf8(F.col(column))
    # The cast reinterprets the bytes and validates nothing.
    return F.when(valid, F.col(column).cast("string")), F.when(~valid, F.col(column))


def raw_rows(kafka_records: DataFrame, batch_id: int) -> DataFrame:
    """Kafka records (Spark's kafka source, with headers) as rows of a raw table.

    Every byte is kept: the original key is ``key_bytes`` if set, else ``key`` encoded as UTF-8
    (null when both are null); the same holds for the value.
    """
    key, key_bytes = _text_and_bytes("key")
    value, value_bytes = _text_and_bytes("value")
    # Spark's Kafka source gives Kafka's code for the timestamp type.
    timestamp_type = F.when(F.col("timestampType") == 0, "CreateTime").when(
        F.col("timestampType") == 1, "LogAppendTime"
    )
    ingested_at = F.current_timestamp()  # one value for the whole micro-batch
    columns = {
        "key": key,
        "key_bytes": key_bytes,
        "value": value,
        "value_bytes": value_bytes,
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "offset": F.col("offset"),
        "timestamp": F.col("timestamp"),
        "timestamp_type": timestamp_type,
        "headers": F.col("headers"),
        "ingested_at": ingested_at,
        "batch_id": F.lit(batch_id).cast("long"),
        PARTITION_COLUMN: F.to_date(ingested_at),
    }
    return kafka_records.select(*[columns[field.name].alias(field.name) for field in RAW_SCHEMA.fields])
