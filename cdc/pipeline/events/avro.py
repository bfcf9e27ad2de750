"""Avro event topics: each Kafka value one Avro record, decoded in Spark by its own ``from_avro``.

The values alone cannot tell plain Avro from Confluent's wire format (a plain record may well start
with a 0 byte and four more), so where the schema is says how values are framed:

- a schema **file** (``.avsc``): plain Avro; a value is one record's binary encoding and nothing else;
- a schema **registry**: Confluent's wire format; a value is the magic byte 0, the id of the schema it
  was written with (4 bytes, big-endian), then the record. Each record is read with that writer
  schema (fetched by id from the registry, once per id and job) and resolved to the subject's latest
  schema (fetched when the job starts) by Avro's schema resolution: fields the writer lacked take the
  latest schema's defaults, fields it had that the latest schema dropped are left out.

A value is good only when it decodes to exactly one record of its schema: it is decoded followed by
an 8-byte end marker, read as one more (fixed) field of the record, so a truncated value, garbage or
trailing bytes do not show the marker where it belongs. (In PERMISSIVE mode ``from_avro`` turns a
value it cannot read into a record of nulls, which a record whose fields are all null also is.)
Bad records get a ``problem`` naming the reason and go to the quarantine; there ``raw_value`` holds the
value's bytes in hex (the raw table keeps the bytes themselves).

The events' Spark schema is that of the (latest) Avro schema, as ``from_avro`` converts it; its
top level must be a record. Schemas that import others (registry references) are not supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import StructType

from cdc.core.errors import ConfigError
from cdc.core.functions import original_bytes
from cdc.pipeline.config import SchemaFile, SchemaRegistry, WireSchema
from cdc.pipeline.events.registry import SchemaRegistryClient

END_MARKER = b"cdc-end."
END_FIELD = "_cdc_end_marker"
MAGIC_BYTE = b"\x00"
HEADER_BYTES = 5  # Confluent's wire format: the magic byte and a 4-byte schema id


@dataclass(frozen=True)
class AvroDecoding:
    """How a batch's values are decoded: plain data, built on the driver, used in Spark expressions."""

    reader: str  # the Avro schema (JSON) the events are read as
    framed: bool  # Confluent's wire format (schema id in each value) or plain Avro values
    reader_id: int | None = None  # framed: the registry's id of ``reader``
    writers: dict[int, str | None] = field(default_factory=dict)  # framed: the schema of each id; None: unknown


def with_end_marker(schema: str) -> str:
    """The record schema ``schema`` with the end marker as its last field (a ConfigError if not a record)."""
    try:
        document = json.loads(schema)
    except ValueError as error:
        raise ConfigError(f"the Avro schema is not JSON: {error}") from None
    is_record = isinstance(document, dict) and document.get("type") == "record"
    if not is_record or not isinstance(document.get("fields"), list):
        raise ConfigError('the Avro schema of events must be a record (a JSON object with "type": "record")')
    marker = {
        "name": END_FIELD,
        "type": {"type": "fixed", "name": "end_marker", "namespace": "cdc_lakehouse", "size": len(END_MARKER)},
    }
    return json.dumps({**document, "fields": [*document["fields"], marker]})


def _decode(payload: Column, writer: str, reader: str) -> Column:
    """``payload`` (followed by the end marker) as a record of ``writer``, resolved to ``reader``."""
    options = {"mode": "PERMISSIVE"}
    if writer != reader:
        options["avroSchema"] = with_end_marker(reader)  # Spark's name for the schema to resolve to
    return from_avro(F.concat(payload, F.lit(END_MARKER)), with_end_marker(writer), options)


def avro_event_schema(spark: SparkSession, reader: str) -> StructType:
    """The events' Spark schema: what ``from_avro`` makes of ``reader`` (no data read)."""
    try:
        decoded = spark.range(0).select(_decode(F.lit(None).cast("binary"), reader, reader).alias("event"))
        schema = decoded.schema["event"].dataType
        assert isinstance(schema, StructType)  # the reader schema is a record (checked above)
    except PySparkException as error:
        raise ConfigError(f"Spark cannot read events with this Avro schema: {str(error).splitlines()[0]}") from None
    except Py4JJavaError as error:  # Avro's own parser errors reach Python uncaptured
        raise ConfigError(f"Spark cannot read events with this Avro schema: {error.java_exception}") from None
    return StructType([column for column in schema.fields if column.name != END_FIELD])


def _value_problem(value: Column, decoded: Column, decoding: AvroDecoding, schema_id: Column) -> Column:
    """Why a value is not an event (null when it is one)."""
    problem = F.when(value.isNull(), F.lit("no value (a null record)"))
    unread = ~decoded.getField(END_FIELD).eqNullSafe(F.lit(END_MARKER))
    if not decoding.framed:
        hint = F.when(
            (F.substring(value, 1, 1) == F.lit(MAGIC_BYTE)) & (F.octet_length(value) >= HEADER_BYTES),
            F.lit(" (it starts like Confluent's wire format, which a registry schema reads)"),
        )
        return problem.when(unread, F.concat(F.lit("the value is not Avro of the schema"), F.coalesce(hint, F.lit(""))))
    known = [known_id for known_id, writer in decoding.writers.items() if writer is not None]
    unknown = ~schema_id.isin(known) if known else F.lit(True)
    not_read_as = F.when(schema_id == F.lit(decoding.reader_id), F.lit("")).otherwise(
        F.lit(f", or it does not resolve to the latest schema (id {decoding.reader_id})")
    )
    return (
        problem.when(
            F.octet_length(value) < HEADER_BYTES,
            F.concat(
                F.lit("the value is "),
                F.octet_length(value).cast("string"),
                F.lit(" bytes: shorter than the header of Confluent's wire format (magic byte 0, 4-byte schema id)"),
            ),
        )
        .when(
            F.substring(value, 1, 1) != F.lit(MAGIC_BYTE),
            F.concat(
                F.lit("the value starts with byte 0x"),
                F.hex(F.substring(value, 1, 1)),
                F.lit(", not the magic byte 0x00 of Confluent's wire format"),
            ),
        )
        .when(
            unknown,
            F.concat(
                F.lit("schema id "), schema_id.cast("string"), F.lit(" is not an Avro schema of the schema registry")
            ),
        )
        .when(
            unread,
            F.concat(
                F.lit("the value is not Avro of its schema (id "), schema_id.cast("string"), F.lit(")"), not_read_as
            ),
        )
    )


def schema_id_of(value: Column) -> Column:
    """The schema id of a value in Confluent's wire format (bytes 2-5, big-endian)."""
    return F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")


def decode_avro(records: DataFrame, decoding: AvroDecoding) -> DataFrame:
    """Raw rows as ``event`` (a struct of the reader schema), Kafka coordinates, ``raw_value`` (hex)
    and a ``problem`` (null for a good event) saying why the value is not an event."""
    value = original_bytes("value", "value_bytes")
    if not decoding.framed:
        schema_id = F.lit(None).cast("long")
        decoded = _decode(value, decoding.reader, decoding.reader)
    else:
        schema_id = schema_id_of(value)
        payload = F.substring(value, HEADER_BYTES + 1, 2**31 - 1)
        decoded = _decode(F.lit(None).cast("binary"), decoding.reader, decoding.reader)  # no known id: no event
        cases = [(known_id, writer) for known_id, writer in sorted(decoding.writers.items()) if writer is not None]
        if cases:
            decoded = F.when(schema_id == F.lit(cases[0][0]), _decode(payload, cases[0][1], decoding.reader))
            for known_id, writer in cases[1:]:
                decoded = decoded.when(schema_id == F.lit(known_id), _decode(payload, writer, decoding.reader))
    parsed = records.select(
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        value.alias("value"),
        schema_id.alias("schema_id"),
        decoded.alias("event"),
    )
    return parsed.select(
        F.col("event").dropFields(END_FIELD).alias("event"),
        "kafka_partition",
        "kafka_offset",
        _value_problem(F.col("value"), F.col("event"), decoding, F.col("schema_id")).alias("problem"),
        F.hex("value").alias("raw_value"),
    )


def batch_schema_ids(records: DataFrame) -> list[int]:
    """The distinct schema ids of a batch's framed values: a handful of numbers, not data."""
    value = original_bytes("value", "value_bytes")
    framed = (F.octet_length(value) >= HEADER_BYTES) & (F.substring(value, 1, 1) == F.lit(MAGIC_BYTE))
    return sorted(row[0] for row in records.where(framed).select(schema_id_of(value)).distinct().collect())


class AvroDecoder:
    """An Avro topic's schema, read when the job starts, and the decoding of each batch.

    With a registry, the writer schemas of the ids a batch holds are fetched when first seen and kept
    for the job's life (a registered schema never changes); an id the registry lacks is asked for again
    in a later batch (it may have been registered since).
    """

    def __init__(self, spark: SparkSession, schema: WireSchema, topic: str) -> None:
        self.registry: SchemaRegistryClient | None = None
        self.writers: dict[int, str] = {}
        match schema:
            case SchemaFile(path=path):
                self.reader, self.reader_id = _read_schema_file(path), None
            case SchemaRegistry(url=url, subject=subject):
                subject = subject or f"{topic}-value"
                self.registry = SchemaRegistryClient(url)
                latest = self.registry.latest_of_type(subject, "AVRO", topic)
                self.reader, self.reader_id = latest.text, latest.id
                self.writers[latest.id] = latest.text
        self.event_schema = avro_event_schema(spark, self.reader)

    def decode(self, records: DataFrame) -> DataFrame:
        """The batch's records decoded (see :func:`decode_avro`)."""
        if self.registry is None:
            return decode_avro(records, AvroDecoding(reader=self.reader, framed=False))
        writers: dict[int, str | None] = {}
        for schema_id in batch_schema_ids(records):
            if schema_id not in self.writers and (writer := self._writer(schema_id)) is not None:
                self.writers[schema_id] = writer
            writers[schema_id] = self.writers.get(schema_id)
        assert self.reader_id is not None  # read from the registry
        writers[self.reader_id] = self.reader
        return decode_avro(
            records, AvroDecoding(reader=self.reader, framed=True, reader_id=self.reader_id, writers=writers)
        )

    def _writer(self, schema_id: int) -> str | None:
        """The Avro schema of ``schema_id``; None (its records are quarantined) when the registry lacks it
        or it is not Avro."""
        assert self.registry is not None  # only values framed by a registry have schema ids
        found = self.registry.by_id(schema_id)
        return found.text if found is not None and found.schema_type == "AVRO" else None


def _read_schema_file(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the Avro schema file {path}: {error.strerror}") from None
