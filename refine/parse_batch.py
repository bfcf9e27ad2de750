"""A batch's Debezium Postgres records parsed into typed changes (:class:`ParsedBatch`): with the Kafka
Connect schemas the batch holds, of envelopes or flattened rows (:mod:`refine.batch_schemas`), or, for
values written without a schema, with the refine job's declared columns (:mod:`refine.records.columns`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import NamedTuple

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructField, StructType

from cdc.core.errors import TableError
from refine.apply.schema_changes import converted, needs_time_zone, widened_type
from refine.batch_schemas import merged_schema, readable_key_schemas
from refine.records.columns import declared_schemas, declared_types
from refine.records.decode import decoded_type
from refine.records.envelope import ConnectSchema
from refine.records.flattened import as_envelope, has_lsn, is_flattened, parse_flattened
from refine.records.parse import VALUE_SCHEMA, has_schema, parse_changes, schema_index


class ParsedBatch(NamedTuple):
    changes: DataFrame  # parsed, with the declared column types applied
    value_schema: ConnectSchema  # one envelope schema covering the batch's
    key_schema: ConnectSchema | None  # None: no primary key (or none readable)
    # The batch's keys have schemas that cannot be read (so their records go to the quarantine): the
    # table is keyed, and only the quarantine is written.
    no_readable_key: bool
    # The source columns of each of the batch's value schemas, in order; a keyless table's changes say which
    # schema their record carries (VALUE_SCHEMA): its columns now are those of its newest change's.
    columns_by_schema: tuple[list[str], ...] = ()


def parse_rows(
    records: DataFrame,
    schemas: list[ConnectSchema],
    texts: dict[str, list[str]],
    columns: dict[str, str],
    raw: str,
    guessed: bool = False,
    refused: dict[str, str] | None = None,
    time_zone: str | None = None,
) -> ParsedBatch | None:
    """Postgres envelopes or flattened rows of the value ``schemas`` (in order of appearance) and the
    wrapper schema ``texts``, parsed, with the declared ``columns``' types; ``guessed``: the schemas are
    the last batch's, and records of others are marked (:data:`refine.records.parse.OTHER_SCHEMA`), and None
    when a key schema of the batch cannot be read; ``refused``: value schema texts the batch cannot be
    read with, and why (their records get that problem). ``raw``: the raw table, for errors. ``time_zone``: the
    source's, in which a batch's wall-clock times become instants after a ``timestamp -> timestamptz`` ALTER."""
    flattened = is_flattened(schemas[-1])
    envelopes = [as_envelope(schema) if flattened else schema for schema in schemas]
    value_schema = merged_schema(envelopes)
    key_texts, refused_keys = readable_key_schemas(texts["key"], value_schema)
    if guessed and refused_keys:
        return None
    key_schema = ConnectSchema.model_validate_json(key_texts[-1]) if key_texts else None
    if flattened and key_schema is None and not refused_keys:
        raise TableError(
            "flattened rows (ExtractNewRecordState) of a table without a primary key cannot "
            "be refined: without `before`, a delete cannot say which row it removes",
            table=raw,
        )

    def parse(part: DataFrame, schema: ConnectSchema, value_texts: list[str]) -> DataFrame:
        schema_texts: dict[str, Sequence[str]] = {**texts, "value": value_texts, "key": key_texts}
        refused_schemas: dict[str, dict[str, str]] = {"value": refused or {}, "key": refused_keys}
        if flattened:
            with_lsn = has_lsn(schemas[-1])
            return parse_flattened(part, key_schema, schema, with_lsn, schema_texts, guessed, refused_schemas)
        return parse_changes(part, key_schema, schema, True, schema_texts, guessed, refused_schemas)

    if len(types := {_row_type(envelope) for envelope in envelopes}) > 1 and _retyped(types):
        changes = _parsed_by_schema(records, envelopes, texts["value"], value_schema, parse, raw, time_zone)
    else:
        changes = parse(records, value_schema, texts["value"])
    no_readable_key = bool(refused_keys) and key_schema is None
    columns_by_schema = tuple(
        [field.field_name for field in envelope.field_named("after").fields or ()] for envelope in envelopes
    )
    if key_schema is None:
        changes = changes.withColumn(VALUE_SCHEMA, schema_index(F.col("raw_value"), texts["value"]))
    return ParsedBatch(declared_types(changes, columns), value_schema, key_schema, no_readable_key, columns_by_schema)


def _row_type(envelope: ConnectSchema) -> StructType:
    row_type = decoded_type(envelope.field_named("after"))
    assert isinstance(row_type, StructType)  # a row of columns (checked by refine.batch_schemas)
    return row_type


def _retyped(row_types: set[StructType]) -> bool:
    """Whether a column has another type in some of the row types (not merely a column added or dropped)."""
    seen: dict[str, DataType] = {}
    for row_type in row_types:
        for field in row_type:
            if seen.setdefault(field.name, field.dataType) != field.dataType:
                return True
    return False


def _parsed_by_schema(
    records: DataFrame,
    envelopes: list[ConnectSchema],
    value_texts: list[str],
    merged: ConnectSchema,
    parse: Callable[[DataFrame, ConnectSchema, list[str]], DataFrame],
    raw: str,
    time_zone: str | None,
) -> DataFrame:
    """A batch whose records carry a column of different types (an ALTER at the source between them): each
    record decoded with the schema it carries (a decimal with its own scale, an integer of its own width),
    then all of them of one type holding each (:func:`refine.apply.schema_changes.widened_type`; a string where
    none does). Records of no compact wrapper of these schemas (and tombstones) are parsed with the merged
    ``merged`` schema, as a batch of one schema is."""
    parts = []
    for envelope, text in zip(envelopes, value_texts, strict=True):
        parts.append(parse(records.where(has_schema(F.col("value"), text)), envelope, [text]))
    of_none = reduce(Column.__and__, [~has_schema(F.col("value"), text) for text in value_texts])
    parts.append(parse(records.where(F.col("value").isNull() | of_none), merged, value_texts))
    row_type = reduce(_holding_both, [_row_type(envelope) for envelope in [*envelopes, merged]])
    return reduce(
        DataFrame.unionByName,
        [
            part.withColumns(
                {image: _as_row_type(part, image, row_type, raw, time_zone) for image in ("before", "after")}
            )
            for part in parts
        ],
    )


def _holding_both(one: StructType, other: StructType) -> StructType:
    widened = widened_type(one, other)
    if isinstance(widened, StructType):
        return widened
    fields = {field.name: field.dataType for field in one}
    for field in other:
        kept = fields.get(field.name)
        fields[field.name] = field.dataType if kept is None else (widened_type(kept, field.dataType) or StringType())
    return StructType([StructField(name, data_type) for name, data_type in fields.items()])


def _as_row_type(part: DataFrame, image: str, row_type: StructType, raw: str, time_zone: str | None) -> Column:
    """The row ``image`` of ``part`` as one of ``row_type`` (a column it lacks: null; a wall-clock time
    becoming an instant: read in ``time_zone``, refused without it)."""
    own = part.schema[image].dataType
    assert isinstance(own, StructType)  # a row
    value = F.col(image)
    values = []
    for field in row_type:
        if field.name not in own.names:
            values.append(F.lit(None).cast(field.dataType).alias(field.name))
            continue
        old = own[field.name].dataType
        if needs_time_zone(old, field.dataType) and time_zone is None:
            raise TableError(
                "a source column changed type and its values before the change are wall-clock times of the "
                "source's time zone, which is not declared",
                table=raw,
                column=field.name,
                old_type=old.simpleString(),
                new_type=field.dataType.simpleString(),
                to_go_on="set source_time_zone (e.g. Europe/Berlin) for the table, then run again",
            )
        values.append(converted(value[field.name], old, field.dataType, time_zone).alias(field.name))
    return F.when(value.isNotNull(), F.struct(*values))


def parse_schemaless(
    records: DataFrame, columns: dict[str, str] | None, key: list[str] | None, raw: str
) -> ParsedBatch:
    """Values without the ``{schema, payload}`` wrapper: Postgres envelopes parsed with the declared
    ``columns`` and ``key`` (a TableError naming the ``raw`` table when they are not declared)."""
    if not columns or not key:
        raise TableError(
            "the topic's values carry no schema (schemas.enable=false): declare the refined table's `columns` "
            "(name: Spark type) and its `key` in the refine job's configuration",
            table=raw,
        )
    value_schema, key_schema = declared_schemas(columns, key)
    changes = parse_changes(records, key_schema, value_schema, wrapped=False)
    return ParsedBatch(declared_types(changes, columns), value_schema, key_schema, no_readable_key=False)
