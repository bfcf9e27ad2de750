"""Rows flattened by Debezium's ExtractNewRecordState transform, as typed change rows (pure DataFrame ->
DataFrame). (ExtractNewDocumentState's MongoDB documents are refined as documents:
:mod:`refine.mongo.unwrapped_documents`.)

The value is the row itself (JsonConverter ``{schema, payload}``), with the fields the transform's
``add.fields`` adds (``__op``, ``__lsn``, ``__source_ts_ms``) and, with
``delete.tombstone.handling.mode=rewrite`` (``rewrite-with-tombstone``; ``delete.handling.mode=rewrite``
before Debezium 2.5), ``__deleted``; see :class:`refine.records.envelope.FlattenedMetadata`.
Deletes arrive as tombstones (or rows with ``__deleted: "true"``); truncates are dropped by the
transform. The output has the columns of :func:`refine.records.parse.parse_changes`, so the rest of the
job (last change per key, MERGE with position guards) is the same as for envelopes:

- a row upserts (``_cdc_op`` is its ``__op``, ``u`` without one); ``__deleted: "true"``, ``__op:
  "d"`` or a tombstone deletes;
- the position is ``__lsn`` when the transform adds it, then the Kafka offset; without ``__lsn``
  only the offset orders changes (so replays cannot be told from new changes: add ``lsn`` to
  ``add.fields``). A tombstone carries no position: it takes the LSN of the key's change before it in
  the batch, and deletes whatever the refined table holds when it has none.

A record that is no such row (or whose key is not its row's) gets a ``problem`` for the quarantine,
by the checks envelopes get (:mod:`refine.records.parse`), in the same pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cdc.core.tables import delta_properties, is_delta_table
from refine.records.decode import decode, json_type
from refine.records.envelope import FLATTENED_METADATA_FIELDS, ConnectSchema, Op
from refine.records.parse import (
    UNPARSED,
    change_columns,
    decoding_problems,
    key_image_problems,
    key_problems,
    mismatched_field,
    of_known_schemas,
    record_columns,
    record_problems,
    required_field_problems,
    text_columns,
    with_byte_columns,
    wrapped_payload,
)

ENVELOPE_FIELDS = ("op", "source")
SCHEMA_PROPERTY = "cdc.flattened.schema"  # the refined table's last row schema (Connect JSON)
# A tombstone alone (no earlier record of its key in the batch) has no LSN of its own: it takes the largest,
# so that it deletes the stored row; its deleted-keys entry takes the row's (refine/apply/deleted.py).
LONE_TOMBSTONE_LSN = 2**63 - 1
# The ops ExtractNewRecordState writes in ``__op`` (a truncate it drops).
_TRANSFORM_OPS = (Op.READ.value, Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value)
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


def parse_flattened(
    raw: DataFrame,
    key_schema: ConnectSchema | None,
    value_schema: ConnectSchema,
    with_lsn: bool,
    schema_texts: Mapping[str, Sequence[str]] | None = None,
    only_schemas: bool = False,
    refused_schemas: Mapping[str, Mapping[str, str]] | None = None,
) -> DataFrame:
    """Typed changes from raw rows of a flattened topic; ``value_schema`` from :func:`as_envelope`,
    ``with_lsn``: the transform adds ``__lsn``; ``schema_texts``, ``only_schemas`` and
    ``refused_schemas`` as for :func:`refine.records.parse.parse_changes`. ``key_schema`` None: no key schema of
    the batch can be read, and every record gets a problem.

    A record gets a problem (for the quarantine) as an envelope does (:class:`refine.records.parse.ChangeParser`):
    a value or key that is not UTF-8, not JSON or not of its schema (naming the field), a schema refused,
    a required column null, an ``__op`` or ``__deleted`` the transform does not write, a key that is not
    its row's."""
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
    parsed = with_byte_columns(raw).select(
        *record_columns(),
        *text_columns(),
        wrapped_payload(F.col("value"), value_type, texts.get("value", ()), unparsed=True).alias("row"),
        (
            wrapped_payload(F.col("key"), key_schema, texts.get("key", ()), unparsed=True)
            if key_schema is not None
            else F.lit(None)
        ).alias("raw_key"),
        (of_known_schemas(texts) if only_schemas else F.lit(True)).alias("schema_known"),
    )
    parsed = parsed.select(
        "*",
        (decode(F.col("raw_key"), key_schema) if key_schema is not None else F.lit(None)).alias("key"),
        F.struct(*[F.col(f"row.`{f.name}`").cast(f.dataType).alias(f.name) for f in _METADATA]).alias("metadata"),
    )
    tombstone = F.col("value").isNull() & ~F.col("value_not_utf8")
    deleted = (F.col("metadata.__deleted") == "true") | (F.col("metadata.__op") == Op.DELETE.value)
    op = F.when(tombstone | F.coalesce(deleted, F.lit(False)), F.lit(Op.DELETE.value)).otherwise(
        F.coalesce(F.col("metadata.__op"), F.lit(Op.UPDATE.value))
    )
    after = decode(F.col("row"), row_schema)
    key_names = [k.field for k in key_schema.fields or ()] if key_schema is not None else []
    lsn = F.coalesce(F.col("metadata.__lsn"), F.lit(0)) if with_lsn else F.lit(0).cast("long")
    by_key = Window.partitionBy(*[F.col(f"key.`{k}`") for k in key_names]).orderBy("kafka_offset")
    before_it = F.max(F.when(F.col("value").isNotNull(), lsn)).over(by_key.rowsBetween(Window.unboundedPreceding, -1))
    tombstone_lsn = F.coalesce(before_it, F.lit(LONE_TOMBSTONE_LSN if with_lsn else 0).cast("long"))
    decoded = parsed.select("*", op.alias("op"), after.alias("decoded"))
    decoded_type = decoded.schema["decoded"].dataType
    assert isinstance(decoded_type, StructType)
    # A tombstone's image is its key (the MERGE finds the row to delete by it).
    image = F.when(tombstone, F.lit(None)).otherwise(F.col("decoded"))
    image = F.struct(
        *[
            (F.coalesce(image[f.field], F.col(f"key.`{f.field}`")) if f.field in key_names else image[f.field])
            .cast(decoded_type[f.field_name].dataType)
            .alias(f.field_name)
            for f in row_schema.fields or ()
        ]
    )
    problem = _row_problems(value_type, row_schema, key_schema, refused_schemas)
    return decoded.select(
        *change_columns(
            F.when(F.col("op") == Op.DELETE.value, image),
            F.when(F.col("op") != Op.DELETE.value, image),
            F.when(tombstone, tombstone_lsn).otherwise(lsn),
            F.lit(None).cast("long"),  # only keyless refinement reads it, and it needs the envelope's before
            F.timestamp_millis(F.col("metadata.__source_ts_ms")),
            problem,
        )
    )


def _row_problems(
    value_type: ConnectSchema,
    row_schema: ConnectSchema,
    key_schema: ConnectSchema | None,
    refused_schemas: Mapping[str, Mapping[str, str]] | None,
) -> Column:
    """The ``problem`` of a flattened record: the checks of :class:`refine.records.parse.ChangeParser`, on a row
    (``row`` read as ``value_type``, the ``row_schema`` and the transform's fields; ``decoded``)."""
    problem = record_problems(refused_schemas or {})
    unparsed = F.col(f"row.{UNPARSED}")
    not_a_row = F.lit("value is not a JSON row of the topic's schema")
    problem = problem.when(F.col("value").isNotNull() & F.col("row").isNull(), not_a_row).when(
        unparsed.isNotNull(),
        F.coalesce(mismatched_field(F.col("value"), "row", value_type, ["payload"], ""), not_a_row),
    )
    if key_schema is None:
        return problem.otherwise(F.lit("key: none of the batch's key schemas can be read"))
    if isinstance(json_type(key_schema), StructType):
        problem = key_problems(problem, key_schema, ["payload"])
    problem = problem.when(F.col("key").isNull(), F.lit("key: missing, and the topic's rows are keyed"))
    problem = problem.when(
        F.col("metadata.__op").isNotNull() & ~F.col("metadata.__op").isin(*_TRANSFORM_OPS),
        F.concat(F.lit("field __op: unknown op "), F.col("metadata.__op")),
    ).when(
        F.col("metadata.__deleted").isNotNull() & ~F.col("metadata.__deleted").isin("true", "false"),
        F.concat(F.lit("field __deleted: "), F.col("metadata.__deleted"), F.lit(" is neither true nor false")),
    )
    # A delete's row (delete.tombstone.handling.mode=rewrite) is its before image: with the default
    # replica identity only the key's columns are set.
    problem = required_field_problems(problem, "row", row_schema, when=F.col("op") != Op.DELETE.value)
    if key_schema.fields:
        problem = key_image_problems(problem, key_schema, [(F.col("value").isNotNull(), "decoded", "")])
    return decoding_problems(problem, "row", "decoded", row_schema)


def remembered_schema(spark: SparkSession, refined: str) -> ConnectSchema | None:
    """The row schema a flattened topic's refined table was last refined with: a batch of tombstones
    only (deletes, in this form) carries none."""
    if not is_delta_table(spark, refined):
        return None
    properties = delta_properties(spark, refined)
    text = properties.get(SCHEMA_PROPERTY)
    return ConnectSchema.model_validate_json(text) if text else None


def remember_schema(spark: SparkSession, refined: str, row_schema: ConnectSchema) -> None:
    """Keep ``row_schema`` as the one the ``refined`` table was last refined with (a table property), unless
    it is that already. The job that refines the table calls this only when the schema differs from the last
    it kept: reading the table's properties to see so is a Delta command per batch."""
    if (known := remembered_schema(spark, refined)) is None or known != row_schema:
        escaped = row_schema.model_dump_json(exclude_none=True).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"ALTER TABLE delta.`{refined}` SET TBLPROPERTIES ('{SCHEMA_PROPERTY}' = '{escaped}')")
