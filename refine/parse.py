"""Raw rows of a Debezium Postgres topic as typed change rows (pure DataFrame -> DataFrame).

Each output row is one Kafka record: its operation, the decoded key, the decoded ``before`` and
``after`` row images, its source position and its Kafka coordinates. A record that cannot be
parsed, or one of whose values cannot be decoded, keeps its raw value and gets a ``problem``
naming the field and the reason, for the quarantine, instead of being dropped.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from refine.decode import decode, decoded_type, json_type, undecodable
from refine.envelope import TOMBSTONE, ConnectSchema, Op

def _payload(text: Column, schema: ConnectSchema) -> Column:
    """The ``payload`` of JsonConverter's ``{schema, payload}`` wrapper, read as ``schema``."""
    wrapper = StructType([StructField("payload", json_type(schema))])
    return F.from_json(text, wrapper)["payload"]


def parse_changes(raw: DataFrame, key_schema: ConnectSchema | None, value_schema: ConnectSchema) -> DataFrame:
    """Typed changes from raw rows (columns of :data:`cdc.raw.table.RAW_SCHEMA`).

    ``value_schema`` is the envelope's Connect schema (``before``, ``after``, ``source``, ``op``...),
    ``key_schema`` the key's (None for a table without a primary key, whose keys are null).
    """
    envelope = _payload(F.col("value"), value_schema)
    row_schema = value_schema.field_named("after")
    parsed = raw.select(
        F.col("value"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("headers").alias("kafka_headers"),
        envelope.alias("envelope"),
        (_payload(F.col("key"), key_schema) if key_schema else F.lit(None)).alias("raw_key"),
    )
    op = F.when(F.col("value").isNull(), F.lit(TOMBSTONE)).otherwise(F.col("envelope.op"))
    known_ops = [member.value for member in Op] + [TOMBSTONE]
    decoded = parsed.select(
        "*",
        op.alias("op"),
        (decode(F.col("raw_key"), key_schema) if key_schema else F.lit(None)).alias("key"),
        decode(F.col("envelope.before"), row_schema).alias("before"),
        decode(F.col("envelope.after"), row_schema).alias("after"),
    )
    problem = F.when(
        F.col("value").isNotNull() & F.col("envelope").isNull(), F.lit("value is not a Debezium JSON envelope")
    ).when(~F.col("op").isin(*known_ops) | F.col("op").isNull(), F.concat(F.lit("unknown op "), F.coalesce("op", F.lit("null"))))
    for image in ("before", "after"):
        for field in row_schema.fields or ():
            problem = problem.when(
                undecodable(F.col(f"envelope.{image}.`{field.field}`"), F.col(f"{image}.`{field.field}`")),
                F.lit(f"field {image}.{field.field}: cannot decode the value as {decoded_type(field).simpleString()}"),
            )
    return decoded.select(
        "op",
        "key",
        "before",
        "after",
        F.col("envelope.source.lsn").alias("source_lsn"),
        F.col("envelope.source.txId").alias("source_tx_id"),
        F.timestamp_millis(F.col("envelope.source.ts_ms")).alias("source_committed_at"),
        "kafka_partition",
        "kafka_offset",
        "kafka_headers",
        problem.alias("problem"),
        F.col("value").alias("raw_value"),
    )
