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
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, NullType, StructField, StructType

from refine.mongo.extended_json import decode, member

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
            data_type = (
                data_type[segment].dataType
                if isinstance(data_type, StructType) and segment in data_type.names
                else NullType()
            )
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
        inner = (
            data_type[head].dataType if isinstance(data_type, StructType) and head in data_type.names else NullType()
        )
        return StructType([StructField(head, build(inner, tail))])

    resolve(column_types, path)  # raises when it cannot apply
    top, *rest = segments(path)
    current = column_types[top].dataType if top in column_types.names else NullType()
    return build(current, rest)


def empty(data_type: StructType) -> Column:
    """A document of ``data_type`` with every field null."""
    return F.struct(*[F.lit(None).cast(f.dataType).alias(f.name) for f in data_type.fields])


def _bind(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` evaluated once: a lambda variable, not a copy of its expression
    per use (a document's fields each read it)."""
    return F.transform(F.array(value), body)[0]


@dataclass
class _Node:
    """The batch's paths as a tree: what a patch may do at one step of them."""

    path: str = ""
    updated: bool = False
    removed: bool = False
    truncated: bool = False
    children: dict[Step, _Node] = field(default_factory=dict)


def _tree(column_types: StructType, updated: list[str], removed: list[str], truncated: list[str]) -> _Node:
    root = _Node()
    for kind, paths in (("updated", updated), ("removed", removed), ("truncated", truncated)):
        for path in paths:
            node = root
            for step in resolve(column_types, path):
                node = node.children.setdefault(step, _Node())
            node.path = path
            setattr(node, kind, True)
    return root


def apply_patch(
    state: Column,
    column_types: StructType,
    patch: Column,
    updated: list[str],
    removed: list[str],
    truncated: list[str],
    decoders: dict[str, Callable[[Column], Column]] | None = None,
) -> Column:
    """``state`` (a document of ``column_types``) after ``patch`` (``updated`` variant, ``removed``
    paths, ``truncated`` arrays); the lists name the batch's paths, each resolvable in ``column_types``
    to a column (paths no column holds change nothing and are left out by the caller). ``decoders``
    turn the variant set at a path into its column's value where :func:`decode` does not.

    The document is rebuilt once along the tree of the batch's paths (the paths of one update never
    overlap, as MongoDB requires): the expression nests as deep as the paths do, not once per path,
    so a batch of many paths stays a plan Spark's analyzer resolves."""

    def new_value(node: _Node) -> Column:
        return member(patch["updated"], node.path)

    def is_removed(node: _Node) -> Column:
        return F.coalesce(F.array_contains(patch["removed"], node.path), F.lit(False))

    def truncated_size(node: _Node) -> Column:  # null when the patch does not truncate this array
        return F.try_element_at(F.filter(patch["truncated"], lambda t: t["field"] == node.path), F.lit(1))["size"]

    def any_of(conditions: list[Column]) -> Column:
        return reduce(Column.__or__, conditions, F.lit(False))

    def sets_below(node: _Node) -> Column:  # the patch sets a path at or below node: missing documents are created
        return any_of([new_value(node).isNotNull()] * node.updated + [sets_below(c) for c in node.children.values()])

    def touches(node: _Node) -> Column:
        own = [new_value(node).isNotNull()] * node.updated + [is_removed(node)] * node.removed
        own += [truncated_size(node).isNotNull()] * node.truncated
        return any_of(own + [touches(c) for c in node.children.values()])

    def rebuild(value: Column, data_type: DataType, node: _Node) -> Column:
        result = value
        if node.truncated:  # MongoDB truncates before it sets elements
            size = truncated_size(node)
            result = F.when(size.isNotNull(), F.slice(result, 1, size)).otherwise(result)
        if node.children:
            below = any_of([touches(c) for c in node.children.values()])
            result = F.when(below, _bind(result, lambda current: rebuild_children(current, data_type, node))).otherwise(
                result
            )
        if node.updated:
            decoded = (decoders or {}).get(node.path, lambda v: decode(v, data_type))(new_value(node))
            result = F.when(new_value(node).isNotNull(), decoded).otherwise(result)
        if node.removed:
            result = F.when(is_removed(node), F.lit(None).cast(data_type)).otherwise(result)
        return result

    def rebuild_children(current: Column, data_type: DataType, node: _Node) -> Column:
        created = any_of([sets_below(c) for c in node.children.values()])
        if isinstance(data_type, ArrayType):
            element = data_type.elementType
            items = F.coalesce(current, F.array().cast(data_type))
            # Setting an index past the end pads with nulls, as MongoDB does.
            length = F.greatest(
                F.size(items), *[F.when(sets_below(c), F.lit(int(i) + 1)) for i, c in node.children.items()]
            )

            def item(_: Column, i: Column) -> Column:
                at = F.try_element_at(items, i + 1)
                chosen = F.when(F.lit(False), at)
                for index, child in node.children.items():
                    chosen = chosen.when(i == index, rebuild(at, element, child))
                return chosen.otherwise(at)

            rebuilt = F.transform(F.array_repeat(F.lit(0), length), item)
        else:
            assert isinstance(data_type, StructType)
            document = F.coalesce(current, empty(data_type))
            rebuilt = F.struct(
                *[
                    (
                        rebuild(document[f.name], f.dataType, node.children[f.name])
                        if f.name in node.children
                        else document[f.name]
                    ).alias(f.name)
                    for f in data_type.fields
                ]
            )
        return F.when(current.isNull() & ~created, current).otherwise(rebuilt)  # nothing to create in a missing value

    return rebuild(state, column_types, _tree(column_types, updated, removed, truncated))


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
