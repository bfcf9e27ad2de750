"""Pydantic models of what Debezium writes to Kafka (Postgres and MongoDB connectors, JsonConverter).

They describe the messages and validate samples; the records themselves are parsed by Spark's
``from_json`` with a schema derived from :class:`ConnectSchema` (see :mod:`refine.records.decode`), never
row by row in Python.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# What this project calls a record with a null value: the tombstone that follows every delete.
TOMBSTONE = "tombstone"


class Op(str, Enum):
    """Debezium's ``op`` codes."""

    READ = "r"  # a snapshot read
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    TRUNCATE = "t"
    MESSAGE = "m"  # a logical decoding message


class ConnectType(str, Enum):
    """Kafka Connect's schema types, as JsonConverter writes them: its schema JSON names FLOAT32 and
    FLOAT64 ``float`` and ``double`` (not Connect's Java names); the other names are Connect's."""

    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float"
    FLOAT64 = "double"
    BOOLEAN = "boolean"
    STRING = "string"
    BYTES = "bytes"
    ARRAY = "array"
    MAP = "map"
    STRUCT = "struct"


class ConnectSchema(BaseModel):
    """A Kafka Connect schema (``schemas.enable=true``): a type, optionally named as a logical type
    (``io.debezium.time.MicroTimestamp``, ``org.apache.kafka.connect.data.Decimal``...)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: ConnectType
    optional: bool = False
    name: str | None = None
    version: int | None = None
    parameters: dict[str, str] | None = None
    field: str | None = None
    fields: list[ConnectSchema] | None = None
    items: ConnectSchema | None = None
    keys: ConnectSchema | None = None
    values: ConnectSchema | None = None

    @property
    def field_name(self) -> str:
        """The name of this schema as a field of a struct (every field of a struct has one)."""
        assert self.field is not None, f"a struct's field without a name: {self!r}"
        return self.field

    def field_named(self, name: str) -> ConnectSchema:
        for child in self.fields or ():
            if child.field == name:
                return child
        raise KeyError(name)


# The Connect schema of the fields every Debezium connector's ``source`` block starts with (as
# JsonConverter writes it); the Postgres and MongoDB connectors add their own after these.
COMMON_SOURCE_FIELDS: tuple[dict, ...] = (
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
        "default": "false",
        "field": "snapshot",
    },
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "sequence"},
    {"type": "int64", "optional": True, "field": "ts_us"},
    {"type": "int64", "optional": True, "field": "ts_ns"},
)


class PostgresSource(BaseModel):
    """``source`` of the Postgres connector: where and when the change happened."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    version: str
    connector: str
    name: str
    ts_ms: int
    snapshot: str | None = None  # a STRING: "true", "first", "last", "false", "incremental"...
    db: str
    sequence: str | None = None  # JSON text of [last committed LSN, current LSN]
    schema_name: str = Field(alias="schema")
    table: str
    txId: int | None = None
    lsn: int | None = None
    xmin: int | None = None


class PostgresEnvelope(BaseModel):
    """The value of a Postgres connector record (the ``payload`` when wrapped with its schema)."""

    model_config = ConfigDict(extra="allow")

    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    source: PostgresSource
    op: Op
    ts_ms: int | None = None
    ts_us: int | None = None
    ts_ns: int | None = None


class MongoSource(BaseModel):
    """``source`` of the MongoDB connector: order events by (ts_ms, ord), then Kafka offset."""

    model_config = ConfigDict(extra="allow")

    version: str
    connector: str
    name: str
    ts_ms: int
    snapshot: str | None = None
    db: str
    collection: str
    ord: int | None = None  # the cluster-time increment, restarting each second; -1 for snapshot reads


class UpdateDescription(BaseModel):
    """What a MongoDB update changed, when the connector sends the change rather than the document."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    removedFields: list[str] | None = None
    updatedFields: str | None = None  # relaxed Extended JSON text with dotted paths as keys
    truncatedArrays: list[dict[str, Any]] | None = None


class MongoEnvelope(BaseModel):
    """The value of a MongoDB connector record: documents are Extended JSON TEXT, not objects."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    before: str | None = None
    after: str | None = None
    update_description: UpdateDescription | None = Field(default=None, alias="updateDescription")
    source: MongoSource
    op: Op
    ts_ms: int | None = None


class FlattenedMetadata(BaseModel):
    """What ExtractNewRecordState (Postgres) / ExtractNewDocumentState (MongoDB) add to the row they
    make of a change: ``add.fields=op,lsn,source.ts_ms`` gives ``__op``, ``__lsn``,
    ``__source_ts_ms``; ``delete.tombstone.handling.mode=rewrite`` (``delete.handling.mode=rewrite``
    before Debezium 2.5) gives ``__deleted`` ("true" on a delete's row). The row's own columns are
    extra fields. Deletes are otherwise tombstones only; truncates are dropped by the transforms."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    op: Op | None = Field(default=None, alias="__op")
    lsn: int | None = Field(default=None, alias="__lsn")
    source_ts_ms: int | None = Field(default=None, alias="__source_ts_ms")
    deleted: str | None = Field(default=None, alias="__deleted")  # a STRING: "true" / "false"


# The fields the transforms add, prefixed as their default ``add.fields.prefix`` says.
FLATTENED_METADATA_FIELDS = tuple(field.alias for field in FlattenedMetadata.model_fields.values())


class SchemaAndPayload(BaseModel):
    """JsonConverter's wrapper with ``schemas.enable=true``."""

    model_config = ConfigDict(populate_by_name=True)

    connect_schema: ConnectSchema = Field(alias="schema")
    payload: Any = None
