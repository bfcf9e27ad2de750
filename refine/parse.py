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

# JsonConverter writes its wrapper as {"schema":<schema>,"payload":<payload>}, in this order and
# without spaces. The schema is most of a record's bytes: cutting the text at the payload mark
# spares tokenizing it as JSON, the costliest step of a refine otherwise. A value written any other
# way falls back to a JSON parse. (A schema cannot contain the mark: quotes inside its strings are
# escaped, and no schema key is named "payload".)
_WRAPPER_START, _PAYLOAD_MARK = '{"schema":', ',"payload":'


def _schema_part(text: Column) -> Column:
    return F.substring_index(text, _PAYLOAD_MARK, 1)


def _is_wrapped(text: Column) -> Column:
    return text.startswith(_WRAPPER_START) & (F.length(_schema_part(text)) < F.length(text)) & text.endswith("}")


def wrapped_schema(text: Column) -> Column:
    """The ``schema`` of JsonConverter's ``{schema, payload}`` wrapper, as JSON text."""
    head = _schema_part(text)
    return F.when(_is_wrapped(text), head.substr(F.lit(len(_WRAPPER_START) + 1), F.length(head))).otherwise(
        F.get_json_object(text, "$.schema")
    )


def wrapped_payload(text: Column, schema: ConnectSchema) -> Column:
    """The ``payload`` of JsonConverter's ``{schema, payload}`` wrapper, read as ``schema``."""
    payload_type = json_type(schema)
    start = F.length(_schema_part(text)) + len(_PAYLOAD_MARK) + 1
    payload_text = text.substr(start, F.length(text) - start)  # up to the wrapper's closing brace
    wrapper = StructType([StructField("payload", payload_type)])
    return F.when(_is_wrapped(text), F.from_json(payload_text, payload_type)).otherwise(
        F.from_json(text, wrapper)["payload"]
    )


def record_columns() -> list[Column]:
    """A raw record's value and Kafka coordinates, as every parsed change keeps them."""
    return [
        F.col("value"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("headers").alias("kafka_headers"),
    ]


def decoding_problems(problem: Column, raw: str, decoded: str, row_schema: ConnectSchema, label: str = "") -> Column:
    """``problem`` extended with the first field of struct column ``raw`` that did not decode into ``decoded``."""
    for field in row_schema.fields or ():
        problem = problem.when(
            undecodable(F.col(f"{raw}.`{field.field}`"), F.col(f"{decoded}.`{field.field}`")),
            F.lit(f"field {label}{field.field}: cannot decode the value as {decoded_type(field).simpleString()}"),
        )
    return problem


def parse_changes(
    raw: DataFrame, key_schema: ConnectSchema | None, value_schema: ConnectSchema, wrapped: bool = True
) -> DataFrame:
    """Typed changes from raw rows (columns of :data:`cdc.raw.table.RAW_SCHEMA`).

    ``value_schema`` is the envelope's Connect schema (``before``, ``after``, ``source``, ``op``...),
    ``key_schema`` the key's (None for a table without a primary key, whose keys are null);
    ``wrapped``: key and value are JsonConverter's ``{schema, payload}`` (else the payload alone).
    """
    read = wrapped_payload if wrapped else lambda text, schema: F.from_json(text, json_type(schema))
    envelope = read(F.col("value"), value_schema)
    row_schema = value_schema.field_named("after")
    parsed = raw.select(
        *record_columns(),
        envelope.alias("envelope"),
        (read(F.col("key"), key_schema) if key_schema else F.lit(None)).alias("raw_key"),
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
        problem = decoding_problems(problem, f"envelope.{image}", image, row_schema, f"{image}.")
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
