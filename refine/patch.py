"""MongoDB updates sent as a change (``updateDescription``) rather than a document, applied to a
document state in Spark expressions.

A path is dotted: ``address.city`` sets a field of a nested document, ``orders.1.qty`` a field of
the second element of an array, ``tags`` a whole field. A segment is an array index when the value
it reaches into is an array (column types say so), else a field name, as MongoDB resolves it.
Setting a field of a missing (null) document creates it; setting an index past an array's end
pads the array with nulls (both as MongoDB does). ``removedFields`` set their path to null (the
column stays: the refined table has one schema for every document); ``truncatedArrays`` shorten.

Paths that cannot be applied are reported by :func:`path_problem` (the records go to the
quarantine): a segment below a value that is neither a document nor an array, or a field name
under an array.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, NullType, StructField, StructType

from refine.extended_json import decode, member

Step = str | int  # a field name or an array index


def segments(path: str) -> list[str]:
    return path.split(".")


def resolve(column_types: StructType, path: str) -> list[Step]:
    """The steps of ``path`` in documents of ``column_types``; ValueError naming why it cannot apply."""
    steps: list[Step] = []
    data_type: DataType = column_types
    for segment in segments(path):
        if isinstance(data_type, (StructType, NullType)):  # a missing document is created
            steps.append(segment)
            data_type = data_type[segment].dataType if isinstance(data_type, StructType) and segment in data_type.names else NullType()
        elif isinstance(data_type, ArrayType) and segment.isdigit():
            steps.append(int(segment))
            data_type = data_type.elementType
        elif isinstance(data_type, ArrayType):
            raise ValueError(f"{'.'.join(map(str, steps))} is an array: {segment!r} is not an index")
        else:
            raise ValueError(f"{'.'.join(map(str, steps))} is a {data_type.simpleString()}, not a document or an array")
    return steps


def path_type(column_types: StructType, path: str, leaf: DataType) -> DataType:
    """The type of the top-level column that setting ``path`` to a ``leaf`` value implies (ValueError
    when the path cannot apply); missing documents on the way are created."""

    def build(data_type: DataType, rest: list[str]) -> DataType:
        if not rest:
            return leaf
        head, tail = rest[0], rest[1:]
        if isinstance(data_type, ArrayType):
            return ArrayType(build(data_type.elementType, tail))
        inner = data_type[head].dataType if isinstance(data_type, StructType) and head in data_type.names else NullType()
        return StructType([StructField(head, build(inner, tail))])

    resolve(column_types, path)  # raises when it cannot apply
    top, *rest = segments(path)
    current = column_types[top].dataType if top in column_types.names else NullType()
    return build(current, rest)


def empty(data_type: StructType) -> Column:
    """A document of ``data_type`` with every field null."""
    return F.struct(*[F.lit(None).cast(f.dataType).alias(f.name) for f in data_type.fields])


def set_path(value: Column, data_type: DataType, steps: list[Step], new: Callable[[Column], Column],
             applies: Column) -> Column:  # fmt: skip
    """``value`` with the value at ``steps`` replaced by ``new(old)`` where ``applies``."""
    if not steps:
        return F.when(applies, new(value)).otherwise(value)
    step, rest = steps[0], steps[1:]
    if isinstance(step, int):
        assert isinstance(data_type, ArrayType)
        element = data_type.elementType
        items = F.coalesce(value, F.array().cast(data_type))
        length = F.greatest(F.size(items), F.lit(step + 1))
        rebuilt = F.transform(
            F.sequence(F.lit(0), length - 1),
            lambda i: F.when(i == step, set_path(F.try_element_at(items, i + 1), element, rest, new, applies))
            .otherwise(F.try_element_at(items, i + 1)),
        )
        return F.when(applies, rebuilt).otherwise(value)
    assert isinstance(data_type, StructType)
    rebuilt = _bind(F.coalesce(value, empty(data_type)), lambda document: F.struct(*[
        (set_path(document[f.name], f.dataType, rest, new, applies) if f.name == step else document[f.name]).alias(f.name)
        for f in data_type.fields
    ]))  # fmt: skip
    return F.when(applies, rebuilt).otherwise(value)


def _bind(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` evaluated once: a lambda variable, not a copy of its expression
    per use (a patch of many paths would otherwise grow exponentially)."""
    return F.transform(F.array(value), body)[0]


def apply_patch(state: Column, column_types: StructType, patch: Column, updated: list[str], removed: list[str],
                truncated: list[str]) -> Column:  # fmt: skip
    """``state`` (a document of ``column_types``) after ``patch`` (``updated`` variant, ``removed``
    paths, ``truncated`` arrays); the lists name the batch's paths, each resolvable in ``column_types``
    to a column (paths no column holds change nothing and are left out by the caller)."""
    def change(path: str, new: Callable[[Column], Column], applies: Column) -> Callable[[Column], Column]:
        steps = resolve(column_types, path)
        return lambda s: set_path(s, column_types, steps, new, applies)

    def truncation(path: str) -> Callable[[Column], Column]:
        size = F.filter(patch["truncated"], lambda t: t["field"] == path)[0]["size"]
        return change(path, lambda old: F.slice(old, 1, size), size.isNotNull())

    def update(path: str) -> Callable[[Column], Column]:
        value = member(patch["updated"], path)
        leaf = leaf_type(column_types, resolve(column_types, path))
        return change(path, lambda old: decode(value, leaf), value.isNotNull())

    def removal(path: str) -> Callable[[Column], Column]:
        leaf = leaf_type(column_types, resolve(column_types, path))
        applies = F.coalesce(F.array_contains(patch["removed"], path), F.lit(False))
        return change(path, lambda old: F.lit(None).cast(leaf), applies)

    # MongoDB truncates arrays before it sets fields; set and removed paths never overlap.
    for body in [truncation(p) for p in truncated] + [update(p) for p in updated] + [removal(p) for p in removed]:
        state = _bind(state, body)
    return state


def leaf_type(column_types: StructType, steps: list[Step]) -> DataType | None:
    """The type at ``steps``; None where no column holds it (its values have all been null so far)."""
    data_type: DataType = column_types
    for step in steps:
        if isinstance(step, int) and isinstance(data_type, ArrayType):
            data_type = data_type.elementType
        elif isinstance(step, str) and isinstance(data_type, StructType) and step in data_type.names:
            data_type = data_type[step].dataType
        else:
            return None
    return data_type
