"""Protobuf event topics: each Kafka value one Protobuf message, decoded in Python inside Spark.

Spark's own decoder (spark-protobuf's ``from_protobuf``) is not on Maven Central as this project's
machines reach it, so the values are decoded by the ``protobuf`` package in Spark's Python workers,
a batch of rows at a time (``mapInArrow``):

- on the driver, the ``.proto`` is compiled by ``protoc`` (``grpcio-tools``, with the well-known types
  it bundles) into a FileDescriptorSet, and the events' Spark schema derived from the message's
  descriptor (:func:`protobuf_event_schema`); a schema that does not compile is a ConfigError;
- the serialized descriptor set travels to the workers inside the decoding function (no files),
  where a message class is built from it; each value is parsed and converted to the Spark schema.

As with Avro, where the schema is says how values are framed:

- a schema **file** (``.proto``): plain values, each one message's encoding and nothing else; ``message``
  (fully qualified) names the message, default the file's first;
- a schema **registry**: Confluent's wire format; a value is the magic byte 0, the id of the schema it
  was written with (4 bytes, big-endian), the message indexes (zigzag varints: a count, then the path of
  indexes to the message among the file's messages and their nested ones; a single 0 for the first
  message), then the message. The writer schema of each id is fetched (once per id and job) to name the
  message its indexes point at; a value of the events' message (``message`` or the first of the
  subject's latest schema) is read with the latest schema: Protobuf's encoding carries field numbers,
  so fields the writer lacked take their defaults and fields the latest schema dropped are left out.

Protobuf's encoding has no end marker or checksum: a value that parses is a message (fields the
schema does not know are skipped), so only values the parser refuses are caught (truncated values
and most garbage). Bad records get a ``problem`` naming the reason and go to the quarantine; there
``raw_value`` holds the value's bytes in hex.

Field types become Spark types as :func:`spark_type` says (enums as their value's name, Timestamp as
timestamp, wrappers as nullable scalars, Struct/Value/ListValue as JSON text). A proto3 field without
presence that is unset reads as its default (0, "", false, the first enum value); a field with
presence (``optional``, a message, a oneof member) is null when unset. Recursive messages (one that
contains itself) are refused: no Spark schema can hold them. Registry schemas that import other
subjects (references) are not supported; imports of the well-known types are.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cdc.core.errors import ConfigError
from cdc.core.functions import original_bytes
from cdc.pipeline.config import SchemaFile, SchemaRegistry, WireSchema
from cdc.pipeline.events.avro import HEADER_BYTES, batch_schema_ids
from cdc.pipeline.events.registry import SchemaRegistryClient

TIMESTAMP = "google.protobuf.Timestamp"
# The wrappers of google/protobuf/wrappers.proto: a scalar with presence (null when unset).
WRAPPERS = {
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
# JSON-like values (google/protobuf/struct.proto), recursive by nature: kept as their JSON text.
JSON_MESSAGES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
# The range of google.protobuf.Timestamp (years 1 to 9999), which Spark's timestamps hold too.
MIN_SECONDS, MAX_SECONDS = -62_135_596_800, 253_402_300_799
NO_VALUE = "no value (a null record)"
# The decoder's output: the input value is passed through (its hex, raw_value, is computed by Spark).
DECODED_FIELDS = [
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("problem", StringType()),
    ("value", BinaryType()),
]


# --- compiling the schema (on the driver) ------------------------------------------------------


@dataclass(frozen=True)
class CompiledSchema:
    """A .proto compiled by protoc: plain bytes, shipped to Spark's workers as they are."""

    descriptor_set: bytes  # a serialized FileDescriptorSet, with every file it imports
    file_name: str  # the schema's own file in the set


def compile_proto(folder: Path, file_name: str, what: str) -> CompiledSchema:
    """``folder/file_name`` compiled with its imports (those of ``folder`` and the well-known types
    grpcio-tools bundles); a ConfigError naming ``what`` and protoc's message when it does not compile."""
    with tempfile.TemporaryDirectory(prefix="cdc-protoc-") as out:
        target = Path(out) / "schema.pb"
        # protoc in a process of its own, in the schema's folder: its messages (on its stderr, read here)
        # name files as the schema names them.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                "--proto_path=.",
                "--include_imports",
                f"--descriptor_set_out={target}",
                file_name,
            ],
            cwd=folder,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not target.exists():
            message = " ".join(line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip())
            raise ConfigError(f"{what} does not compile: {message or f'protoc exited with {done.returncode}'}")
        return CompiledSchema(descriptor_set=target.read_bytes(), file_name=file_name)


def compile_schema_file(path: Path) -> CompiledSchema:
    """A .proto file, compiled with the files beside it as its import path."""
    if not path.is_file():
        raise ConfigError(f"cannot read the Protobuf schema file {path}: no such file")
    return compile_proto(path.parent, path.name, f"the Protobuf schema file {path}")


def compile_schema_text(text: str, what: str) -> CompiledSchema:
    """A .proto given as text (a registry's schema), compiled from a temporary file."""
    with tempfile.TemporaryDirectory(prefix="cdc-proto-") as folder:
        (Path(folder) / "registered.proto").write_text(text)
        return compile_proto(Path(folder), "registered.proto", what)


@functools.lru_cache(maxsize=16)
def _pool(descriptor_set: bytes) -> Any:
    """A descriptor pool of the set's files (cached: each Python worker builds it once per schema)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(file)
    return pool


def schema_file(schema: CompiledSchema) -> Any:
    """The FileDescriptor of the schema's own file."""
    return _pool(schema.descriptor_set).FindFileByName(schema.file_name)


def message_descriptor(schema: CompiledSchema, name: str | None) -> Any:
    """The Descriptor of message ``name`` (fully qualified), default the file's first message; a
    ConfigError naming the messages there are when there is no such message."""
    messages = list(indexed_messages(schema_file(schema)).values())
    if not messages:
        raise ConfigError("the Protobuf schema declares no message")
    if name is None:
        name = messages[0]
    elif name not in messages:
        raise ConfigError(
            f"message: the Protobuf schema has no message {name!r} (it has {', '.join(messages)}; "
            "give the fully qualified name)"
        )
    return _pool(schema.descriptor_set).FindMessageTypeByName(name)


def indexed_messages(file: Any) -> dict[tuple[int, ...], str]:
    """Every message of a file (nested ones too, map entries left out) by its message indexes, the path
    Confluent's wire format names it by: (2,) the file's third message, (2, 0) the first nested in it."""
    from google.protobuf import descriptor_pb2

    found: dict[tuple[int, ...], str] = {}

    def visit(messages: list, path: tuple[int, ...], scope: str) -> None:
        # The declaration order, as the file's descriptor (not the descriptors' name lookups) keeps it.
        declared = [message for message in messages if not message.options.map_entry]
        for index, message in enumerate(declared):
            found[(*path, index)] = scope + message.name
            visit(message.nested_type, (*path, index), f"{scope}{message.name}.")

    proto = descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb)
    visit(list(proto.message_type), (), f"{proto.package}." if proto.package else "")
    return found


# --- the events' Spark schema ------------------------------------------------------------------


def _scalar_types() -> dict[int, DataType]:
    from google.protobuf.descriptor import FieldDescriptor as Field

    return {
        Field.TYPE_INT32: IntegerType(),
        Field.TYPE_SINT32: IntegerType(),
        Field.TYPE_SFIXED32: IntegerType(),
        Field.TYPE_INT64: LongType(),
        Field.TYPE_SINT64: LongType(),
        Field.TYPE_SFIXED64: LongType(),
        Field.TYPE_UINT32: LongType(),
        Field.TYPE_FIXED32: LongType(),
        Field.TYPE_UINT64: DecimalType(20, 0),
        Field.TYPE_FIXED64: DecimalType(20, 0),
        Field.TYPE_FLOAT: FloatType(),
        Field.TYPE_DOUBLE: DoubleType(),
        Field.TYPE_BOOL: BooleanType(),
        Field.TYPE_STRING: StringType(),
        Field.TYPE_BYTES: BinaryType(),
        Field.TYPE_ENUM: StringType(),
    }


def protobuf_event_schema(message: Any) -> StructType:
    """The events' Spark schema: one column per field of ``message`` (a Descriptor), typed by :func:`spark_type`."""
    return _struct_type(message, "", (message.full_name,))


def _struct_type(message: Any, prefix: str, enclosing: tuple[str, ...]) -> StructType:
    return StructType(
        [StructField(field.name, spark_type(field, prefix + field.name, enclosing)) for field in message.fields]
    )


def spark_type(field: Any, path: str, enclosing: tuple[str, ...] = ()) -> DataType:
    """The Spark type of a field (a FieldDescriptor at column path ``path``, inside the messages ``enclosing``):

    int32, sint32, sfixed32 -> int; int64, sint64, sfixed64, uint32, fixed32 -> bigint; uint64, fixed64
    -> decimal(20,0); float, double, bool, string; bytes -> binary; enum -> string (the value's name);
    message -> struct; repeated -> array; map<k, v> -> map; google.protobuf.Timestamp -> timestamp;
    wrappers (google.protobuf.StringValue...) -> the wrapped scalar, null when unset; Struct, Value and
    ListValue -> string (their JSON). A message inside itself is a ConfigError naming the field.
    """
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return MapType(_element_type(key, path, enclosing), _element_type(value, path, enclosing))
    element = _element_type(field, path, enclosing)
    return ArrayType(element) if field.is_repeated else element


def _element_type(field: Any, path: str, enclosing: tuple[str, ...]) -> DataType:
    message = field.message_type
    if message is None:
        return _scalar_types()[field.type]
    if message.full_name == TIMESTAMP:
        return TimestampType()
    if message.full_name in WRAPPERS:
        return _element_type(message.fields_by_name["value"], path, enclosing)
    if message.full_name in JSON_MESSAGES:
        return StringType()
    if message.full_name in enclosing:
        raise ConfigError(
            f"field {path}: message {message.full_name} contains itself; recursive Protobuf "
            "messages are not supported (no Spark schema can hold them)"
        )
    return _struct_type(message, path + ".", (*enclosing, message.full_name))


# --- converting messages to rows -----------------------------------------------------------------


class Unfit(ValueError):
    """A parsed message holds a value its Spark column cannot (a Timestamp out of range), at ``path``."""

    def __init__(self, reason: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(reason, path)
        self.reason, self.path = reason, path

    def __str__(self) -> str:
        return f"field {'.'.join(self.path)}: {self.reason}" if self.path else self.reason


Convert = Callable[[Any], Any]


def message_converter(message: Any) -> Callable[[Any], dict]:
    """A function turning a parsed message of ``message`` (a Descriptor) into a dict of Python values
    fitting :func:`protobuf_event_schema` (built once; it walks no descriptors per message)."""
    getters = [(field.name, _field_getter(field)) for field in message.fields]

    def convert(parsed: Any) -> dict:
        try:
            return {name: get(parsed) for name, get in getters}
        except Unfit as error:  # name the field (looked for only when one does not fit)
            name = next(name for name, get in getters if _does_not_fit(get, parsed))
            raise Unfit(error.reason, (name, *error.path)) from None

    return convert


def _does_not_fit(get: Convert, parsed: Any) -> bool:
    try:
        get(parsed)
    except Unfit:
        return True
    return False


def _field_getter(field: Any) -> Convert:
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        convert_value = _value_converter(field.message_type.fields_by_name["value"])
        if convert_value is None:
            return lambda parsed: list(getattr(parsed, name).items())
        return lambda parsed: [(key, convert_value(value)) for key, value in getattr(parsed, name).items()]
    convert = _value_converter(field)
    if field.is_repeated:
        if convert is None:
            return lambda parsed: list(getattr(parsed, name))
        return lambda parsed: [convert(value) for value in getattr(parsed, name)]
    if field.has_presence:  # null when unset
        convert_set = convert or (lambda value: value)
        return lambda parsed: convert_set(getattr(parsed, name)) if parsed.HasField(name) else None
    if convert is None:
        return lambda parsed: getattr(parsed, name)  # an unset field reads as its default
    return lambda parsed: convert(getattr(parsed, name))


def _value_converter(field: Any) -> Convert | None:
    """How one value of ``field`` becomes its Spark column's Python value; None: as it is."""
    from google.protobuf.descriptor import FieldDescriptor as Field

    message = field.message_type
    if field.type == Field.TYPE_ENUM:
        names = {value.number: value.name for value in field.enum_type.values}
        return lambda number: names.get(number, str(number))  # a number this schema does not know: as text
    if field.type in (Field.TYPE_UINT64, Field.TYPE_FIXED64):
        return Decimal
    if message is None:
        return None
    if message.full_name == TIMESTAMP:
        return _timestamp_micros
    if message.full_name in WRAPPERS:
        inner = _value_converter(message.fields_by_name["value"])
        return (lambda wrapper: inner(wrapper.value)) if inner else (lambda wrapper: wrapper.value)
    if message.full_name in JSON_MESSAGES:
        from google.protobuf import json_format

        return lambda value: json_format.MessageToJson(value, indent=None)
    return message_converter(message)


def _timestamp_micros(timestamp: Any) -> int:
    """A google.protobuf.Timestamp as microseconds since the epoch (Spark's timestamp, as Arrow takes it)."""
    if not MIN_SECONDS <= timestamp.seconds <= MAX_SECONDS or not 0 <= timestamp.nanos < 1_000_000_000:
        raise Unfit(f"Timestamp {timestamp.seconds}s {timestamp.nanos}ns is outside years 1 to 9999")
    return timestamp.seconds * 1_000_000 + timestamp.nanos // 1000


# --- Confluent's wire format -------------------------------------------------------------------


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at ``position`` and the position after it; a ValueError if it is cut short."""
    result = shift = 0
    while True:
        if position >= len(data):
            raise ValueError("the value ends inside a varint")
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, position


def read_zigzag(data: bytes, position: int) -> tuple[int, int]:
    """The zigzag-encoded (signed) varint at ``position`` and the position after it."""
    value, position = read_varint(data, position)
    return (value >> 1) ^ -(value & 1), position


def message_indexes(data: bytes, position: int) -> tuple[tuple[int, ...], int]:
    """The message indexes at ``position`` (after the schema id) and where the message starts: a count,
    then that many indexes; a count of 0 alone stands for (0,), the file's first message."""
    count, position = read_zigzag(data, position)
    if count == 0:
        return (0,), position
    if count < 0 or count > len(data) - position:
        raise ValueError(f"a count of {count} message indexes")
    indexes = []
    for _ in range(count):
        index, position = read_zigzag(data, position)
        indexes.append(index)
    return tuple(indexes), position


def framing_header(indexes: tuple[int, ...], schema_id: int) -> bytes:
    """The wire format's header of a message at ``indexes`` of schema ``schema_id`` (what producers write)."""

    def zigzag(number: int) -> bytes:
        value, out = (number << 1) ^ (number >> 63), bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes([*out, value])

    body = b"\x00" if indexes == (0,) else zigzag(len(indexes)) + b"".join(zigzag(index) for index in indexes)
    return b"\x00" + schema_id.to_bytes(4, "big") + body


# --- decoding, in Spark's Python workers -------------------------------------------------------


# A writer schema id's messages by their indexes, or why its values cannot be read.
Writer = dict[tuple[int, ...], str] | str


@dataclass(frozen=True)
class ProtobufDecoding:
    """How a batch's values are decoded: plain data, built on the driver, shipped to the workers."""

    schema: CompiledSchema  # the schema the events are read with (the file, or the subject's latest)
    message: str  # the events' message, fully qualified
    event_schema: StructType  # its Spark schema (protobuf_event_schema)
    framed: bool  # Confluent's wire format (schema id and message indexes in each value) or plain messages
    writers: dict[int, Writer] = field(default_factory=dict)  # framed: the schema ids of the batch


class _Reader:
    """Parses one value into (event, problem): built once per task on a worker."""

    def __init__(self, decoding: ProtobufDecoding) -> None:
        from google.protobuf import message_factory

        descriptor = _pool(decoding.schema.descriptor_set).FindMessageTypeByName(decoding.message)
        self.parse = message_factory.GetMessageClass(descriptor).FromString
        self.convert = message_converter(descriptor)
        self.decoding = decoding

    def read(self, value: bytes | None) -> tuple[dict | None, str | None]:
        if value is None:
            return None, NO_VALUE
        if not self.decoding.framed:
            return self._message(value, "", _framing_hint(value))
        if len(value) < HEADER_BYTES:
            return None, (
                f"the value is {len(value)} bytes: shorter than the header of Confluent's wire format "
                "(magic byte 0, 4-byte schema id)"
            )
        if value[0] != 0:
            return (
                None,
                f"the value starts with byte 0x{value[0]:02X}, not the magic byte 0x00 of Confluent's wire format",
            )
        schema_id = int.from_bytes(value[1:HEADER_BYTES], "big")
        writer = self.decoding.writers.get(schema_id, "is not a Protobuf schema of the schema registry")
        if isinstance(writer, str):
            return None, f"schema id {schema_id} {writer}"
        try:
            indexes, start = message_indexes(value, HEADER_BYTES)
        except ValueError as error:
            return None, f"the message indexes after schema id {schema_id} are not readable: {error}"
        name = writer.get(indexes)
        if name is None:
            return None, f"message indexes {list(indexes)} name no message of schema id {schema_id}"
        if name != self.decoding.message:
            return None, f"the value is a {name} message (schema id {schema_id}), not {self.decoding.message}"
        return self._message(value[start:], f" (schema id {schema_id})", "")

    def _message(self, payload: bytes, written_with: str, hint: str) -> tuple[dict | None, str | None]:
        try:
            parsed = self.parse(payload)
        except Exception as error:  # noqa: BLE001 - the parser's DecodeError (any failure to parse: the value is the cause)
            return None, (
                f"the value is not a Protobuf {self.decoding.message} message{written_with}: "
                f"{_parse_error(error)}{hint}"
            )
        try:
            return self.convert(parsed), None
        except ValueError as error:  # Unfit, or text that is not UTF-8 (proto2 strings are not checked by the parser)
            return None, f"the {self.decoding.message} message{written_with} does not fit the events' schema: {error}"


def _framing_hint(value: bytes) -> str:
    """A plain value starting with a 0 byte (no field is numbered 0) is likely in Confluent's wire format."""
    framed_like = len(value) >= HEADER_BYTES and value[0] == 0
    return " (it starts like Confluent's wire format, which a registry schema reads)" if framed_like else ""


def _parse_error(error: Exception) -> str:
    """The parser's reason without its preamble ("Error parsing message with type 'x.Y': ")."""
    text = str(error) or type(error).__name__
    return text.split("': ", 1)[1] if text.startswith("Error parsing message with type '") and "': " in text else text


class DecodeBatches:
    """The ``mapInArrow`` function: Arrow batches of (value, kafka_partition, kafka_offset) in, the same
    rows out with ``event`` and ``problem``; every row in gives one row out."""

    def __init__(self, decoding: ProtobufDecoding) -> None:
        self.decoding = decoding

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        reader = _Reader(self.decoding)
        # Timestamps as instants in UTC (pyspark asks for a time zone for them, and UTC is what mapInArrow reads).
        event_type = to_arrow_type(self.decoding.event_schema, timezone="UTC")
        for batch in batches:
            read = [reader.read(value) for value in batch.column("value").to_pylist()]
            events, problems = _arrow_events(
                [event for event, _ in read], [problem for _, problem in read], event_type, self.decoding.message
            )
            yield pa.RecordBatch.from_arrays(
                [
                    events,
                    batch.column("kafka_partition"),
                    batch.column("kafka_offset"),
                    pa.array(problems, pa.string()),
                    batch.column("value"),
                ],
                names=["event", *(name for name, _ in DECODED_FIELDS)],
            )


def _arrow_events(events: list, problems: list, event_type: Any, message: str) -> tuple[Any, list]:
    """The events as an Arrow struct array; should one not convert (a value Arrow refuses), the
    events are converted one by one and those that fail become problems (nothing is lost)."""
    import pyarrow as pa

    try:
        return pa.array(events, event_type), problems
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        pass
    kept, problems = list(events), list(problems)
    for index, event in enumerate(events):
        if event is not None:
            try:
                pa.array([event], event_type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as error:
                kept[index], problems[index] = None, f"the {message} message does not fit the events' schema: {error}"
    return pa.array(kept, event_type), problems


def decode_protobuf(records: DataFrame, decoding: ProtobufDecoding) -> DataFrame:
    """Raw rows as ``event`` (a struct of the message's Spark schema), Kafka coordinates, ``raw_value``
    (hex) and a ``problem`` (null for a good event) saying why the value is not an event."""
    values = records.select(
        original_bytes("value", "value_bytes").alias("value"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
    )
    decoded_schema = StructType(
        [
            StructField("event", decoding.event_schema),
            *[StructField(name, data_type) for name, data_type in DECODED_FIELDS],
        ]
    )
    # pyspark types the function as taking an Iterable; Spark passes an iterator, as DecodeBatches declares.
    decoded = values.mapInArrow(DecodeBatches(decoding), decoded_schema)
    return decoded.select("event", "kafka_partition", "kafka_offset", "problem", F.hex("value").alias("raw_value"))


class ProtobufDecoder:
    """A Protobuf topic's schema, compiled when the job starts, and the decoding of each batch.

    With a registry, the writer schemas of the ids a batch holds are fetched and compiled when first
    seen and kept for the job's life (a registered schema never changes); an id the registry lacks (or
    whose schema is not Protobuf, or does not compile) is asked for again in a later batch.
    """

    def __init__(self, schema: WireSchema, topic: str, message: str | None = None) -> None:
        self.registry: SchemaRegistryClient | None = None
        self.writers: dict[int, dict[tuple[int, ...], str]] = {}
        match schema:
            case SchemaFile(path=path):
                self.schema = compile_schema_file(path)
            case SchemaRegistry(url=url, subject=subject):
                subject = subject or f"{topic}-value"
                self.registry = SchemaRegistryClient(url)
                latest = self.registry.latest_of_type(subject, "PROTOBUF", topic)
                what = f"the Protobuf schema of subject {subject} (id {latest.id}) at the schema registry {url}"
                self.schema = compile_schema_text(latest.text, what)
                self.writers[latest.id] = indexed_messages(schema_file(self.schema))
        try:
            descriptor = message_descriptor(self.schema, message)
            self.message = descriptor.full_name
            self.event_schema = protobuf_event_schema(descriptor)
        except ConfigError as error:
            raise ConfigError(error.message, topic=topic) from None

    def decode(self, records: DataFrame) -> DataFrame:
        """The batch's records decoded (see :func:`decode_protobuf`)."""
        writers: dict[int, Writer] = {}
        if self.registry is not None:
            for schema_id in batch_schema_ids(records):
                writers[schema_id] = self._writer(schema_id)
        decoding = ProtobufDecoding(
            schema=self.schema,
            message=self.message,
            event_schema=self.event_schema,
            framed=self.registry is not None,
            writers=writers,
        )
        return decode_protobuf(records, decoding)

    def _writer(self, schema_id: int) -> Writer:
        """The messages of schema ``schema_id`` by their indexes, or why its values cannot be read."""
        if schema_id in self.writers:
            return self.writers[schema_id]
        assert self.registry is not None  # only values framed by a registry have schema ids
        found = self.registry.by_id(schema_id)
        if found is None or found.schema_type != "PROTOBUF":
            return "is not a Protobuf schema of the schema registry"
        try:
            compiled = compile_schema_text(found.text, "its schema")
        except ConfigError as error:
            return f"is a Protobuf schema that {error.message.removeprefix('its schema ')}"
        self.writers[schema_id] = indexed_messages(schema_file(compiled))
        return self.writers[schema_id]
