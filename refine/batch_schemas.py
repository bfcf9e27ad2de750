"""The Kafka Connect schemas of a batch's records, read and checked: the value schemas a batch of
Debezium envelopes (or flattened rows) can be parsed with, the key schemas its changes can be applied
by, and one envelope schema covering them all; the others, with why, for the quarantine."""

from __future__ import annotations

import json

from pydantic import ValidationError

from refine.apply.schema_changes import widened_type
from refine.mongo.documents import is_mongo
from refine.records.decode import decoded_type
from refine.records.envelope import ConnectSchema, ConnectType
from refine.records.flattened import is_flattened


def merged_schema(schemas: list[ConnectSchema]) -> ConnectSchema:
    """One envelope schema covering a batch's schemas: a column added mid-batch is in it (optional, as
    the records before it hold none); a column that changed type is of its latest schema (records of
    each schema are decoded with their own: :mod:`refine.parse_batch`)."""
    latest = schemas[-1]
    rows = [schema.field_named("after") for schema in schemas]
    fields: dict[str, dict] = {}
    for row in rows:
        for field in row.fields or ():
            fields[field.field_name] = field.model_dump(exclude_none=True)  # in order of first appearance
    for name, document in fields.items():  # a column added or dropped within the batch: null in some records
        if not all(any(f.field == name for f in row.fields or ()) for row in rows):
            document["optional"] = True
    after = {**rows[-1].model_dump(exclude_none=True), "fields": list(fields.values())}
    envelope = latest.model_dump(exclude_none=True)
    envelope["fields"] = [
        {**after, "field": field["field"]} if field.get("field") in ("before", "after") else field
        for field in envelope["fields"]
    ]
    return ConnectSchema.model_validate(envelope)


def read_schema(text: str) -> tuple[ConnectSchema | None, str | None]:
    """A wrapper schema (JSON text) as a :class:`ConnectSchema`, or None and why it is none, naming the field."""
    try:
        return ConnectSchema.model_validate_json(text), None
    except ValidationError as error:
        first = error.errors()[0]
        names, node = [], None
        try:
            node = json.loads(text)
        except ValueError:
            pass
        for part in first["loc"]:  # the Connect field names along the error's path
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
                if isinstance(node, dict) and "field" in node:
                    names.append(str(node["field"]))
            else:
                break
        found = f" (found {first['input']!r})" if isinstance(first.get("input"), (str, int, float)) else ""
        where = f"field {'.'.join(names)}: " if names else ""
        return None, f"{where}the schema is no Kafka Connect schema: {first['msg']}{found}"


def _envelope_problem(schema: ConnectSchema) -> str | None:
    """Why a Debezium envelope's schema cannot be read (its row images are no structs)."""
    names = {field.field for field in schema.fields or ()}
    for image in ("before", "after"):
        if image not in names:
            return f"field {image}: missing"
        field = schema.field_named(image)
        if field.type != ConnectType.STRUCT:
            return f"field {image}: the schema's type is {field.type.value}, not struct"
    return None


def readable_value_schemas(
    texts: list[str], holds_rows: bool = False
) -> tuple[list[ConnectSchema], list[str], dict[str, str]]:
    """The value schemas of a batch that can be read, their texts, and the others' texts with why.
    One topic holds one kind: Debezium envelopes, or rows (flattened by ExtractNewRecordState), told by
    ``holds_rows`` (the refined table was refined from rows) or else by the batch's first schema of
    either kind; schemas of the other kind are refused, and so are schemas that are no struct."""
    read = {text: read_schema(text) for text in texts}
    refused = {text: f"value {why}" for text, (_, why) in read.items() if why is not None}
    valid = {text: schema for text, (schema, _) in read.items() if schema is not None}
    for text, schema in valid.items():
        if schema.type != ConnectType.STRUCT:
            refused[text] = (
                f"value schema is a {schema.type.value}, not a struct (a Debezium envelope or a flattened row)"
            )
    structs = {text: schema for text, schema in valid.items() if text not in refused}
    envelopes = {text for text, schema in structs.items() if not is_flattened(schema) and not is_mongo(schema)}
    rows = {text for text, schema in structs.items() if is_flattened(schema)}
    kinds = ["rows" if text in rows else "envelopes" for text in texts if text in rows or text in envelopes]
    topic_kind = "rows" if holds_rows else next(iter(kinds), None)
    if topic_kind == "envelopes":
        for text, schema in structs.items():
            if text not in envelopes:
                refused[text] = (
                    "value schema is no Debezium envelope (before, after, source, op), as the topic's others are"
                )
            elif (why := _envelope_problem(schema)) is not None:
                refused[text] = f"value schema: {why}"
    elif topic_kind == "rows":
        for text in envelopes:
            refused[text] = "value schema is a Debezium envelope, not a flattened row as the topic's others are"
    kept = [text for text in texts if text in valid and text not in refused]
    return [valid[text] for text in kept], kept, refused


def readable_key_schemas(texts: list[str], value_schema: ConnectSchema) -> tuple[list[str], dict[str, str]]:
    """The key schemas of a batch whose fields are all columns of the value's rows, of their type (or of one
    it holds: a key of a record before its column was widened); the others' texts with why (a change is
    applied by its key's columns)."""
    columns = {field.field: field for field in value_schema.field_named("after").fields or ()}
    refused = {}
    for text in texts:
        schema, why = read_schema(text)
        if schema is not None:
            for field in schema.fields or () if schema.type == ConnectType.STRUCT else ():
                if field.field not in columns:
                    why = f"field {field.field} of the key's schema is no column of the value's rows"
                elif (
                    widened_type(decoded_type(field), column_type := decoded_type(columns[field.field])) != column_type
                ):
                    why = (
                        f"field {field.field} is {decoded_type(field).simpleString()} in the key's schema and "
                        f"{decoded_type(columns[field.field]).simpleString()} in the value's"
                    )
                if why:
                    break
        if why is not None:
            refused[text] = f"key {why}"
    return [text for text in texts if text not in refused], refused
