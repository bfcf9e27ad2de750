"""Spark DDL type strings read without a JVM, so that `cdc validate` checks column paths at once.

Reads what a pipeline file's ``schema`` holds (``time timestamp, device struct<os: string>,
items array<struct<id: string, qty: int>>``), and the type strings Spark's
``schema_of_variant_agg`` prints when a schema is inferred (``OBJECT<a: BIGINT, b: VARIANT>``),
into :mod:`pyspark.sql.types` objects (plain Python classes). The jobs parse a given schema with
Spark's own parser; this one only has to agree with it on what users write.

Inferred types become what ``from_json`` reads best: ``OBJECT`` a struct, ``VARIANT`` (a field
seen with several types) and ``VOID`` (only nulls seen) a string holding the JSON text, a decimal
with a fraction a double (as Spark's own JSON inference does).
"""

from __future__ import annotations

import re

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

ATOMIC_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "varchar": StringType(),
    "char": StringType(),
    "text": StringType(),
    "boolean": BooleanType(),
    "bool": BooleanType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "float": FloatType(),
    "real": FloatType(),
    "double": DoubleType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
    "binary": BinaryType(),
    # Inferred from variants: a field seen with several types, or only as null, is kept as JSON text.
    "variant": StringType(),
    "void": StringType(),
}
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|'(?:[^'\\]|\\.)*'|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class DdlError(ValueError):
    """A type string that cannot be read; the message says where."""


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, int]] = []
        position = 0
        while position < len(text.rstrip()):
            match = _TOKEN.match(text, position)
            if not match:
                raise DdlError(f"unexpected character {text[position:].strip()[:1]!r} at position {position}")
            self.items.append((match.group(1), match.start(1)))
            position = match.end()
        self.index = 0

    def peek(self) -> str | None:
        return self.items[self.index][0] if self.index < len(self.items) else None

    def next(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            raise DdlError(f"the type ends early{f' (expected {expected!r})' if expected else ''}")
        if expected is not None and token.lower() != expected:
            raise DdlError(f"expected {expected!r} at position {self.items[self.index][1]}, found {token!r}")
        self.index += 1
        return token

    def accept(self, token: str) -> bool:
        if (self.peek() or "").lower() == token:
            self.index += 1
            return True
        return False


def _name(token: str) -> str:
    return token[1:-1].replace("``", "`") if token.startswith("`") else token


def _type(tokens: _Tokens) -> DataType:
    name = tokens.next().lower()
    if name == "array":
        tokens.next("<")
        element = _type(tokens)
        tokens.next(">")
        return ArrayType(element)
    if name == "map":
        tokens.next("<")
        key = _type(tokens)
        tokens.next(",")
        value = _type(tokens)
        tokens.next(">")
        return MapType(key, value)
    if name in ("struct", "object"):
        tokens.next("<")
        fields = [] if tokens.peek() == ">" else _fields(tokens)
        tokens.next(">")
        return StructType(fields)
    if name in ("decimal", "dec", "numeric"):
        precision, scale = 10, 0
        if tokens.accept("("):
            precision = int(tokens.next())
            scale = int(tokens.next()) if tokens.accept(",") else 0
            tokens.next(")")
        return DecimalType(precision, scale)
    if name in ("varchar", "char") and tokens.accept("("):
        tokens.next()
        tokens.next(")")
    if name not in ATOMIC_TYPES:
        raise DdlError(f"unknown type {name!r}")
    return ATOMIC_TYPES[name]


def _fields(tokens: _Tokens) -> list[StructField]:
    fields: list[StructField] = []
    while True:
        name = _name(tokens.next())
        tokens.accept(":")  # `name type` or `name: type`
        data_type = _type(tokens)
        nullable = True
        if tokens.accept("not"):
            tokens.next("null")
            nullable = False
        if tokens.accept("comment"):
            tokens.next()
        if name in {field.name for field in fields}:
            raise DdlError(f"field {name!r} appears twice")
        fields.append(StructField(name, data_type, nullable))
        if not tokens.accept(","):
            return fields


def parse_schema(ddl: str) -> StructType:
    """A struct from a DDL string (``a int, b struct<c: string>``) or a struct type string."""
    tokens = _Tokens(ddl)
    if not tokens.items:
        raise DdlError("the schema is empty")
    first = (tokens.peek() or "").lower()
    if first in ("struct", "object") and len(tokens.items) > 1 and tokens.items[1][0] == "<":
        schema = _type(tokens)
    else:
        schema = StructType(_fields(tokens))
    if tokens.peek() is not None:
        raise DdlError(f"unexpected {tokens.peek()!r} at position {tokens.items[tokens.index][1]}")
    return schema  # type: ignore[return-value]


def inferred_schema(variant_schema: str) -> StructType:
    """The struct read from ``schema_of_variant_agg``'s output, decimals with a scale as doubles."""
    return _doubles(parse_schema(variant_schema))  # type: ignore[return-value]


def _doubles(data_type: DataType) -> DataType:
    match data_type:
        case StructType():
            return StructType([StructField(f.name, _doubles(f.dataType), f.nullable) for f in data_type.fields])
        case ArrayType():
            return ArrayType(_doubles(data_type.elementType))
        case MapType():
            return MapType(data_type.keyType, _doubles(data_type.valueType))
        case DecimalType() if data_type.scale > 0:
            return DoubleType()
    return data_type


def quoted(name: str) -> str:
    """A column or field name as SQL writes it: in backticks, a backtick in it doubled."""
    return "`" + name.replace("`", "``") + "`"


def sql_type(data_type: DataType) -> str:
    """``data_type`` as SQL DDL (``ALTER TABLE ... ADD COLUMNS``), field names quoted: a nested name
    such as ``content-type`` is no identifier, and ``simpleString()`` leaves it bare."""
    if isinstance(data_type, StructType):
        return "STRUCT<" + ", ".join(f"{quoted(f.name)}: {sql_type(f.dataType)}" for f in data_type.fields) + ">"
    if isinstance(data_type, ArrayType):
        return f"ARRAY<{sql_type(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"MAP<{sql_type(data_type.keyType)}, {sql_type(data_type.valueType)}>"
    return data_type.simpleString()
