"""Nested rows as flat columns, and configured arrays as child rows (pure DataFrame -> DataFrame).

Naming rule: a field reached through nested structs is named by its path with ``_`` between the
parts (``device.os`` -> ``device_os``, ``a.b.c`` -> ``a_b_c``). Arrays and maps that are not
exploded stay one column, as they are. When two paths give the same name (``device.os`` and a
top-level ``device_os``) it is an error naming both; nothing is renamed silently.

An exploded array becomes the child table ``<table>__<array name>`` (``items`` -> ``events__items``,
``device.sensors`` -> ``events__device_sensors``): one row per element, keyed by the parent's key
columns and ``pos`` (the element's 0-based position). A struct element's fields are flattened by the
same rule; any other element is the column ``value``. A null or empty array gives no child rows.
Paths go through structs only: an array inside an array is not exploded.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, StructType

from cdc.core.errors import ConfigError

SEPARATOR = "_"
CHILD_SEPARATOR = "__"
POSITION = "pos"
ELEMENT = "value"


def flat_name(path: str) -> str:
    return path.replace(".", SEPARATOR)


def child_table_name(table: str, array_path: str) -> str:
    return f"{table}{CHILD_SEPARATOR}{flat_name(array_path)}"


def column(path: str) -> Column:
    """The column at a dotted path (each part quoted, so names with odd characters work)."""
    first, *rest = path.split(".")
    result = F.col(f"`{first}`")
    for part in rest:
        result = result.getField(part)
    return result


def field_type(schema: StructType, path: str) -> DataType:
    """The type at a dotted path through structs; a ConfigError says which part is unknown."""
    current: DataType = schema
    for depth, part in enumerate(path.split(".")):
        if not isinstance(current, StructType):
            reached = ".".join(path.split(".")[:depth])
            raise ConfigError(f"unknown column path {path!r}: {reached!r} is a {current.simpleString()}, not a struct")
        names = {field.name: field.dataType for field in current.fields}
        if part not in names:
            raise ConfigError(f"unknown column path {path!r}: no field {part!r} (fields: {', '.join(names)})")
        current = names[part]
    return current


def flat_columns(
    schema: StructType, exclude: tuple[str, ...] = (), keep: tuple[str, ...] = (), prefix: str = ""
) -> list[tuple[str, str]]:
    """(path, flat name) of every leaf column, structs walked (except those ``keep`` names),
    ``exclude``d paths left out.

    A ConfigError names both paths when two of them get the same flat name.
    """
    leaves: list[tuple[str, str]] = []
    for field in schema.fields:
        path = f"{prefix}{field.name}"
        if path in exclude:
            continue
        if isinstance(field.dataType, StructType) and path not in keep:
            leaves.extend(flat_columns(field.dataType, exclude, keep, f"{path}."))
        else:
            leaves.append((path, flat_name(path)))
    if not prefix:
        unique_names(leaves)
    return leaves


def unique_names(columns: list[tuple[str, str]]) -> None:
    """Refuse two (path, name) pairs with the same name, naming both paths."""
    seen: dict[str, str] = {}
    for path, name in columns:
        if name in seen:
            raise ConfigError(f"flattening gives two columns named {name!r}: {seen[name]!r} and {path!r}")
        seen[name] = path


def flatten(rows: DataFrame, exclude: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> DataFrame:
    """``rows`` with every nested struct field as a column of its own (see the naming rule), but
    the structs at the ``keep`` paths, and without the ``exclude``d paths."""
    return rows.select(*[column(path).alias(name) for path, name in flat_columns(rows.schema, exclude, keep)])


def array_element(schema: StructType, array_path: str) -> DataType:
    """The element type of the array at ``array_path``; a ConfigError when it is not an array."""
    data_type = field_type(schema, array_path)
    if not isinstance(data_type, ArrayType):
        raise ConfigError(f"column {array_path!r} is a {data_type.simpleString()}, not an array: it cannot be exploded")
    return data_type.elementType


def child_columns(schema: StructType, key_paths: list[str], array_path: str) -> list[tuple[str, str]]:
    """(path in the exploded row, name) of a child table's columns: keys, ``pos``, the element's fields."""
    element = array_element(schema, array_path)
    keys = [(flat_name(path), flat_name(path)) for path in key_paths]  # selected by name first
    fields = flat_columns(element, prefix="element.") if isinstance(element, StructType) else [("element", ELEMENT)]
    named = keys + [(POSITION, POSITION)] + [(path, name.removeprefix(f"element{SEPARATOR}")) for path, name in fields]
    unique_names(named)
    return named


def child_rows(rows: DataFrame, key_paths: list[str], array_path: str, carry: tuple[str, ...] = ()) -> DataFrame:
    """One row per element of the array at ``array_path``: the parent's keys, ``pos``, the element
    flattened, plus the ``carry`` columns of the parent as they are."""
    named = child_columns(rows.schema, key_paths, array_path)
    exploded = rows.select(
        *[column(path).alias(flat_name(path)) for path in key_paths],
        *[F.col(name) for name in carry],
        F.posexplode(column(array_path)).alias(POSITION, "element"),
    )
    return exploded.select(*[column(path).alias(name) for path, name in named], *carry)
