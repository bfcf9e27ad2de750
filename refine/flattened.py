"""Rows flattened by Debezium's ExtractNewRecordState (Postgres) / ExtractNewDocumentState (MongoDB)
transforms, as typed change rows (pure DataFrame -> DataFrame).

The value is the row itself (JsonConverter ``{schema, payload}``), with the fields the transform's
``add.fields`` adds (``__op``, ``__lsn``, ``__source_ts_ms``) and, with
``delete.handling.mode=rewrite``, ``__deleted``; see :class:`refine.envelope.FlattenedMetadata`.
Deletes arrive as tombstones (or rows with ``__deleted: "true"``); truncates are dropped by the
transform. The output has the columns of :func:`refine.parse.parse_changes`, so the rest of the
job (last change per key, MERGE with position guards) is the same as for envelopes:

- a row upserts (``_cdc_op`` is its ``__op``, ``u`` without one); ``__deleted: "true"``, ``__op:
  "d"`` or a tombstone deletes;
- the position is ``__lsn`` when the transform adds it, then the Kafka offset; without ``__lsn``
  only the offset orders changes (so replays cannot be told from new changes: add ``lsn`` to
  ``add.fields``). A tombstone carries no position: it takes the LSN of the key's change before it in
  the batch, and deletes whatever the refined table holds when it has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cdc.core.tables import delta_properties, is_delta_table
from refine.decode import decode
from refine.envelope import FLATTENED_METADATA_FIELDS, ConnectSchema, Op
from refine.parse import (
    change_columns,
    decoding_problems,
    of_known_schemas,
    record_columns,
    with_other_schemas,
    wrapped_payload,
)

ENVELOPE_FIELDS = ("op", "source")
SCHEMA_PROPERTY = "cdc.flattened.schema"  # the refined table's last row schema (Connect JSON)
_REMEMBERED: dict[str, ConnectSchema] = {}  # the schema each refined table holds, as this process set it
_MAX_LSN = 2**63 - 1
_METADATA = StructType(
    [
        StructField("__op", StringType()),
        StructField("__lsn", LongType()),
        StructField("__source_ts_ms", LongType()),
        StructField("__deleted", StringType()),
    ]
)


def is_flattened(value_schema: ConnectSchema) -> bool:
    """A row, not a Debezium envelope (which has ``op`` and ``source``)."""
    names = {field.field for field in value_schema.fields or ()}
    return value_schema.type.value == "struct" and not set(ENVELOPE_FIELDS) <= names


def has_lsn(row_schema: ConnectSchema) -> bool:
    return any(field.field == "__lsn" for field in row_schema.fields or ())


def as_envelope(row_schema: ConnectSchema) -> ConnectSchema:
    """An envelope-shaped schema whose ``before``/``after`` are the row's own columns (without the
    transform's ``__`` fields), for the code that reads envelopes' schemas."""
    columns = [
        f.model_dump(exclude_none=True) for f in row_schema.fields or () if f.field not in FLATTENED_METADATA_FIELDS
    ]
    row = {**row_schema.model_dump(exclude_none=True), "optional": True, "fields": columns}
    return ConnectSchema.model_validate(
        {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    )


def with_key_columns(value_schema: ConnectSchema, key_schema: ConnectSchema) -> ConnectSchema:
    """``value_schema`` (from :func:`as_envelope`) with the key's fields the row lacks as columns:
    ExtractNewDocumentState's rows have ``_id`` while MongoDB keys are ``{"id": ...}``."""
    row = value_schema.field_named("after")
    names = {f.field for f in row.fields or ()}
    extra = [
        {**k.model_dump(exclude_none=True), "optional": True} for k in key_schema.fields or () if k.field not in names
    ]
    if not extra:
        return value_schema
    grown = {
        **row.model_dump(exclude_none=True),
        "fields": [f.model_dump(exclude_none=True) for f in row.fields or ()] + extra,
    }
    return ConnectSchema.model_validate(
        {"type": "struct", "fields": [{**grown, "field": "before"}, {**grown, "field": "after"}]}
    )


def parse_flattened(
    raw: DataFrame,
    key_schema: ConnectSchema,
    value_schema: ConnectSchema,
    with_lsn: bool,
    schema_texts: Mapping[str, Sequence[str]] | None = None,
    only_schemas: bool = False,
) -> DataFrame:
    """Typed changes from raw rows of a flattened topic; ``value_schema`` from :func:`as_envelope`,
    ``with_lsn``: the transform adds ``__lsn``; ``schema_texts`` and ``only_schemas`` as for
    :func:`refine.parse.parse_changes`."""
    row_schema = value_schema.field_named("after")
    texts = schema_texts or {}
    # The row and the transform's fields, parsed together (and split below).
    value_type = ConnectSchema.model_validate(
        {
            **row_schema.model_dump(exclude_none=True),
            "fields": [f.model_dump(exclude_none=True) for f in row_schema.fields or ()]
            + [
                {"type": "string" if f.dataType == StringType() else "int64", "optional": True, "field": f.name}
                for f in _METADATA.fields
            ],
        }
    )
    parsed = raw.select(
        *record_columns(),
        wrapped_payload(F.col("value"), value_type, texts.get("value", ())).alias("row"),
        decode(wrapped_payload(F.col("key"), key_schema, texts.get("key", ())), key_schema).alias("key"),
        (of_known_schemas(texts) if only_schemas else F.lit(True)).alias("schema_known"),
    ).withColumn("metadata", F.struct(*[F.col(f"row.`{f.name}`").cast(f.dataType).alias(f.name) for f in _METADATA]))
    deleted = (F.col("metadata.__deleted") == "true") | (F.col("metadata.__op") == Op.DELETE.value)
    op = F.when(F.col("value").isNull() | F.coalesce(deleted, F.lit(False)), F.lit(Op.DELETE.value)).otherwise(
        F.coalesce(F.col("metadata.__op"), F.lit(Op.UPDATE.value))
    )
    after = decode(F.col("row"), row_schema)
    key_names = {k.field for k in key_schema.fields or ()}
    lsn = F.coalesce(F.col("metadata.__lsn"), F.lit(0)) if with_lsn else F.lit(0).cast("long")
    by_key = Window.partitionBy(*[F.col(f"key.`{k}`") for k in key_names]).orderBy("kafka_offset")
    before_it = F.max(F.when(F.col("value").isNotNull(), lsn)).over(by_key.rowsBetween(Window.unboundedPreceding, -1))
    tombstone_lsn = F.coalesce(before_it, F.lit(_MAX_LSN if with_lsn else 0).cast("long"))
    decoded = parsed.select("*", op.alias("op"), after.alias("decoded"))
    decoded_type = decoded.schema["decoded"].dataType
    assert isinstance(decoded_type, StructType)
    # A tombstone's image is its key (the MERGE finds the row to delete by it); a key field the row
    # lacks (see with_key_columns) comes from the key too.
    image = F.when(F.col("value").isNull(), F.lit(None)).otherwise(F.col("decoded"))
    image = F.struct(
        *[
            (F.coalesce(image[f.field], F.col(f"key.`{f.field}`")) if f.field in key_names else image[f.field])
            .cast(decoded_type[f.field_name].dataType)
            .alias(f.field_name)
            for f in row_schema.fields or ()
        ]
    )
    problem = with_other_schemas(F.col("schema_known")).when(
        F.col("value").isNotNull() & F.col("row").isNull(), F.lit("value is not a JSON row")
    )
    problem = decoding_problems(problem, "row", "decoded", row_schema)
    return decoded.select(
        *change_columns(
            F.when(F.col("op") == Op.DELETE.value, image),
            F.when(F.col("op") != Op.DELETE.value, image),
            F.when(F.col("value").isNull(), tombstone_lsn).otherwise(lsn),
            F.lit(None).cast("long"),  # only keyless refinement reads it, and it needs the envelope's before
            F.timestamp_millis(F.col("metadata.__source_ts_ms")),
            problem,
        )
    )


def remembered_schema(spark: SparkSession, refined: str) -> ConnectSchema | None:
    """The row schema a flattened topic's refined table was last refined with: a batch of tombstones
    only (deletes, in this form) carries none."""
    if not is_delta_table(spark, refined):
        return None
    properties = delta_properties(spark, refined)
    text = properties.get(SCHEMA_PROPERTY)
    return ConnectSchema.model_validate_json(text) if text else None


def remember_schema(spark: SparkSession, refined: str, row_schema: ConnectSchema) -> None:
    # Known in this process: most batches have their table's last schema, and reading the table's
    # properties to see so is a Delta command per batch.
    if _REMEMBERED.get(refined) == row_schema:
        return
    if (known := remembered_schema(spark, refined)) is None or known != row_schema:
        escaped = row_schema.model_dump_json(exclude_none=True).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"ALTER TABLE delta.`{refined}` SET TBLPROPERTIES ('{SCHEMA_PROPERTY}' = '{escaped}')")
    _REMEMBERED[refined] = row_schema
