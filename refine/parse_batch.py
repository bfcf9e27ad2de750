"""A batch's Debezium Postgres records parsed into typed changes (:class:`ParsedBatch`): with the Kafka
Connect schemas the batch holds, of envelopes or flattened rows (:mod:`refine.batch_schemas`), or, for
values written without a schema, with the refine job's declared columns (:mod:`refine.columns`)."""

from __future__ import annotations

from typing import NamedTuple

from pyspark.sql import DataFrame

from cdc.core.errors import TableError
from refine.batch_schemas import merged_schema, readable_key_schemas
from refine.columns import declared_schemas, declared_types
from refine.envelope import ConnectSchema
from refine.flattened import as_envelope, has_lsn, is_flattened, parse_flattened
from refine.parse import parse_changes


class ParsedBatch(NamedTuple):
    changes: DataFrame  # parsed, with the declared column types applied
    value_schema: ConnectSchema  # one envelope schema covering the batch's
    key_schema: ConnectSchema | None  # None: no primary key (or none readable)
    # The batch's keys have schemas that cannot be read (so their records go to the quarantine): the
    # table is keyed, and only the quarantine is written.
    no_readable_key: bool


def parse_rows(
    records: DataFrame,
    schemas: list[ConnectSchema],
    texts: dict[str, list[str]],
    columns: dict[str, str],
    raw: str,
    guessed: bool = False,
    refused: dict[str, str] | None = None,
) -> ParsedBatch | None:
    """Postgres envelopes or flattened rows of the value ``schemas`` (in order of appearance) and the
    wrapper schema ``texts``, parsed, with the declared ``columns``' types; ``guessed``: the schemas are
    the last batch's, and records of others are marked (:data:`refine.parse.OTHER_SCHEMA`), and None
    when a key schema of the batch cannot be read; ``refused``: value schema texts the batch cannot be
    read with, and why (their records get that problem). ``raw``: the raw table, for errors."""
    flattened = is_flattened(schemas[-1])
    value_schema = merged_schema([as_envelope(schema) if flattened else schema for schema in schemas])
    key_texts, refused_keys = readable_key_schemas(texts["key"], value_schema)
    if guessed and refused_keys:
        return None
    key_schema = ConnectSchema.model_validate_json(key_texts[-1]) if key_texts else None
    if flattened:
        if key_schema is None and not refused_keys:
            raise TableError(
                "flattened rows (ExtractNewRecordState) of a table without a primary key cannot "
                "be refined: without `before`, a delete cannot say which row it removes",
                table=raw,
            )
        changes = parse_flattened(
            records,
            key_schema,
            value_schema,
            has_lsn(schemas[-1]),
            {**texts, "key": key_texts},
            only_schemas=guessed,
            refused_schemas={"value": refused or {}, "key": refused_keys},
        )
    else:
        changes = parse_changes(
            records,
            key_schema,
            value_schema,
            schema_texts={**texts, "key": key_texts},
            only_schemas=guessed,
            refused_schemas={"value": refused or {}, "key": refused_keys},
        )
    no_readable_key = bool(refused_keys) and key_schema is None
    return ParsedBatch(declared_types(changes, columns), value_schema, key_schema, no_readable_key)


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
