"""MongoDB Extended JSON, as Debezium writes documents, to typed Spark values (Spark expressions only).

Documents are parsed into Spark's ``variant`` (:func:`to_variant`); their shapes come from
``schema_of_variant`` (type strings such as ``OBJECT<`$oid`: STRING>``, a handful per batch), which
:func:`document_type` maps to the column types below, and :func:`decode` turns a variant into a
value of such a type. Both the strict form of ``after`` and the relaxed form of ``updatedFields``
are understood:

=================================================  ==========================================
Extended JSON                                      column type
=================================================  ==========================================
``{"$oid": "..."}``                                string (the 24 hex digits)
``{"$numberLong": "..."}``, ``{"$numberInt"}``,    bigint (int32 and int64 are not told apart:
plain integers                                     the key loses the distinction too)
plain fractions, ``{"$numberDouble": "NaN"}``,     double
bare ``NaN`` / ``Infinity`` tokens
``{"$numberDecimal": "..."}``                      decimal(38,18) (a value it cannot hold exactly
                                                   is quarantined, never rounded)
``{"$date": millis | "ISO" | {"$numberLong"}}``    timestamp
``{"$binary": ...}`` (legacy and v2 forms)         binary
documents / arrays                                 structs / arrays
arrays of mixed types, other BSON types            string holding the value's JSON text
(``$timestamp``, ``$regex``, ``$minKey``...)
=================================================  ==========================================

A field holding integers in some documents and fractions in others is a double column. A field
that has only been null so far has no type yet: its column appears with its first typed value. A
field that has only held ``[]`` (or arrays of nulls and ``[]``) is an *untyped array*: its column is
an array of strings for now, named in the column's comment (:func:`untyped_comment`), and retyped
when its first elements come (see :mod:`refine.mongo.documents`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    VariantType,
)

from refine.records.decode import VARIABLE_SCALE_DECIMAL_TYPE

NUMBER_DECIMAL_TYPE = VARIABLE_SCALE_DECIMAL_TYPE  # Decimal128 has 34 digits; 18 of them fractional fit

# BSON types in Extended JSON: an object whose keys are exactly these (``$type`` goes with legacy $binary).
_WRAPPERS: dict[frozenset[str], DataType] = {
    frozenset({"$oid"}): StringType(),
    frozenset({"$numberLong"}): LongType(),
    frozenset({"$numberInt"}): LongType(),
    frozenset({"$numberDouble"}): DoubleType(),
    frozenset({"$numberDecimal"}): NUMBER_DECIMAL_TYPE,
    frozenset({"$date"}): TimestampType(),
    frozenset({"$binary", "$type"}): BinaryType(),
    frozenset({"$binary"}): BinaryType(),
}
_INTEGERS = (LongType, IntegerType, ShortType, ByteType)
_FRACTIONS = (DoubleType, FloatType, DecimalType)

# Java's JSON writer in strict mode writes non-finite doubles as bare tokens, which are not JSON.
_STRING_OR_NON_FINITE = r'("(?:[^"\\]|\\.)*")|(-?Infinity|NaN)'
_MARK = "\u0001"  # never raw in JSON text: control characters in strings are escaped


def to_variant(text: Column) -> Column:
    """Extended JSON text as a variant; null when it is not JSON. Bare ``NaN``/``Infinity`` tokens
    (outside strings) become ``{"$numberDouble": ...}`` first."""
    # Strings are matched too so that tokens inside them are left alone: a string gets an empty
    # pair of marks (removed again), a token gets marks around it (then wrapped).
    marked = F.regexp_replace(text, _STRING_OR_NON_FINITE, f"$1{_MARK}$2{_MARK}")
    wrapped = F.regexp_replace(marked, f"{_MARK}(-?Infinity|NaN){_MARK}", r'{"\$numberDouble":"$1"}')
    return F.try_parse_json(F.regexp_replace(wrapped, _MARK * 2, ""))


def variant_type(type_string: str) -> DataType:
    """The Spark type of a ``schema_of_variant`` string (``OBJECT<a: BIGINT>`` -> ``struct<a: bigint>``)."""
    ddl, quoted, i = [], False, 0
    while i < len(type_string):
        if type_string[i] == "`":
            quoted = not quoted
        elif not quoted and type_string.startswith("OBJECT<", i):
            ddl.append("STRUCT<")
            i += len("OBJECT<")
            continue
        ddl.append(type_string[i])
        i += 1
    return DataType.fromDDL("".join(ddl))


def document_type(shape: DataType) -> DataType:
    """The column type of a value of variant type ``shape`` (NullType: no type known yet)."""
    if isinstance(shape, StructType):
        wrapper = _WRAPPERS.get(frozenset(shape.names))
        if wrapper is not None:
            return wrapper
        if any(name.startswith("$") for name in shape.names):
            return StringType()  # another BSON type: its JSON text
        return StructType([StructField(f.name, document_type(f.dataType)) for f in shape.fields])
    if isinstance(shape, ArrayType):
        element = document_type(shape.elementType)
        return StringType() if isinstance(shape.elementType, VariantType) else ArrayType(element)
    if isinstance(shape, _INTEGERS):
        return LongType()
    if isinstance(shape, _FRACTIONS):
        return DoubleType()
    if isinstance(shape, VariantType):
        return StringType()
    return shape  # string, boolean, null


def merge_types(a: DataType, b: DataType) -> DataType | None:
    """The type holding values of both; None when they conflict."""
    if isinstance(a, NullType):
        return b
    if isinstance(b, NullType) or a == b:
        return a
    if {type(a), type(b)} == {LongType, DoubleType}:
        return DoubleType()
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        element = merge_types(a.elementType, b.elementType)
        return None if element is None else ArrayType(element)
    if isinstance(a, StructType) and isinstance(b, StructType):
        fields = {f.name: f.dataType for f in a.fields}
        for field in b.fields:
            merged = merge_types(fields.get(field.name, NullType()), field.dataType)
            if merged is None:
                return None
            fields[field.name] = merged
        return StructType([StructField(name, data_type) for name, data_type in fields.items()])
    return None


def fits(value: DataType, column: DataType) -> bool:
    """A value of type ``value`` decodes into ``column`` without loss. A value whose type is not known
    yet (null, ``[]``, arrays of nulls) needs no column: no column (NullType) or field is created for it."""
    if isinstance(value, NullType) or value == column:
        return True
    if isinstance(column, NullType):
        return known(value) is None
    if isinstance(value, LongType) and isinstance(column, DoubleType):
        return True
    if isinstance(value, ArrayType) and isinstance(column, ArrayType):
        return fits(value.elementType, column.elementType)
    if isinstance(value, StructType) and isinstance(column, StructType):
        names = set(column.names)
        return all(fits(f.dataType, column[f.name].dataType if f.name in names else NullType()) for f in value.fields)
    return False


def is_untyped_array(data_type: DataType) -> bool:
    """An array whose elements have no type yet: it has held only ``[]``, nulls, or arrays of those."""
    return isinstance(data_type, ArrayType) and (
        isinstance(data_type.elementType, NullType) or is_untyped_array(data_type.elementType)
    )


def storable(data_type: DataType) -> DataType | None:
    """:func:`known`, but keeping untyped arrays: they get a column (of strings, until typed)."""
    return known(data_type, keep_untyped_arrays=True)


ELEMENT_STEP = "$[]"  # an array's elements, in the paths below (MongoDB field names do not start with $)
Path = tuple[str, ...]


def untyped_paths(data_type: DataType, path: Path = ()) -> list[Path]:
    """The paths, within a value of ``data_type``, of its untyped arrays (``()``: the value itself)."""
    if is_untyped_array(data_type):
        return [path]
    if isinstance(data_type, StructType):
        return [p for f in data_type.fields for p in untyped_paths(f.dataType, (*path, f.name))]
    if isinstance(data_type, ArrayType):
        return untyped_paths(data_type.elementType, (*path, ELEMENT_STEP))
    return []


def _with_leaves(data_type: DataType, leaf: DataType) -> DataType:
    """An array (of arrays...) of ``leaf``."""
    return ArrayType(_with_leaves(data_type.elementType, leaf)) if isinstance(data_type, ArrayType) else leaf


def _leaf(data_type: DataType) -> DataType:
    return _leaf(data_type.elementType) if isinstance(data_type, ArrayType) else data_type


def replaced_at(
    data_type: DataType, paths: list[Path], replace: Callable[[DataType], DataType], path: Path = ()
) -> DataType:
    """``data_type`` with the type at each of ``paths`` replaced (fields keep their metadata)."""
    if path in paths:
        return replace(data_type)
    if isinstance(data_type, StructType):
        return StructType(
            [
                StructField(f.name, replaced_at(f.dataType, paths, replace, (*path, f.name)), f.nullable, f.metadata)
                for f in data_type.fields
            ]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(
            replaced_at(data_type.elementType, paths, replace, (*path, ELEMENT_STEP)), data_type.containsNull
        )
    return data_type


def stored_untyped(data_type: DataType) -> DataType:
    """``data_type`` as a table stores it: its untyped arrays as arrays of strings."""
    return replaced_at(data_type, untyped_paths(data_type), lambda t: _with_leaves(t, StringType()))


# A column holding untyped arrays says where in its comment: readers see why an array of strings holds
# only [], and the next batch reads those arrays as untyped again (a string array would not take ints).
UNTYPED_COMMENT = "MongoDB arrays with no element type yet (only [] so far), stored as arrays of strings, at: "


def untyped_comment(paths: list[Path]) -> dict[str, str]:
    """The metadata of a column whose untyped arrays are at ``paths`` (none: no comment)."""
    return {"comment": UNTYPED_COMMENT + json.dumps([list(p) for p in paths])} if paths else {}


def commented_untyped(field: StructField) -> list[Path]:
    """The paths the column's comment names as untyped arrays (see :func:`untyped_comment`)."""
    comment = field.metadata.get("comment") or ""
    if not comment.startswith(UNTYPED_COMMENT):
        return []
    return [tuple(p) for p in json.loads(comment[len(UNTYPED_COMMENT) :])]


def read_untyped(field: StructField) -> StructField:
    """A stored column as the batch's types see it: the untyped arrays its comment names (those still
    arrays of strings there) as arrays of nulls, which any element type merges with."""
    paths = commented_untyped(field)

    def untyped(data_type: DataType) -> DataType:
        return _with_leaves(data_type, NullType()) if isinstance(_leaf(data_type), StringType) else data_type

    return StructField(field.name, replaced_at(field.dataType, paths, untyped), field.nullable, field.metadata)


def known(data_type: DataType, keep_untyped_arrays: bool = False) -> DataType | None:
    """``data_type`` without the parts whose type is not known yet (only null or [] so far), untyped
    arrays kept with ``keep_untyped_arrays``."""
    if keep_untyped_arrays and is_untyped_array(data_type):
        return data_type
    if isinstance(data_type, NullType):
        return None
    if isinstance(data_type, ArrayType):
        element = known(data_type.elementType, keep_untyped_arrays)
        return None if element is None else ArrayType(element)
    if isinstance(data_type, StructType):
        fields = [
            StructField(f.name, t)
            for f in data_type.fields
            if (t := known(f.dataType, keep_untyped_arrays)) is not None
        ]
        return StructType(fields) if fields else None
    return data_type


def member(value: Column, name: str) -> Column:
    """The member ``name`` of a variant object (null when absent or not an object)."""
    # A variant path quotes a name in '' or "" and knows no escapes: a name holding both quotes has
    # no path, and is looked up in the object read as a map.
    if '"' not in name:
        return F.try_variant_get(value, f'$["{name}"]', "variant")
    if "'" not in name:
        return F.try_variant_get(value, f"$['{name}']", "variant")
    return F.try_element_at(F.try_variant_get(value, "$", "map<string,variant>"), F.lit(name))


def is_null(value: Column) -> Column:
    """Absent or JSON null."""
    return value.isNull() | F.is_variant_null(value)


def _as(value: Column, data_type: str, path: str = "$") -> Column:
    return F.try_variant_get(value, path, data_type)


def decode(value: Column, column: DataType) -> Column:
    """The variant ``value`` as a value of ``column`` (a :func:`document_type`); null when it does not fit."""
    decoded: Column
    if isinstance(column, StructType):
        decoded = F.struct(*[decode(member(value, f.name), f.dataType).alias(f.name) for f in column.fields])
    elif isinstance(column, ArrayType):
        element = column.elementType
        decoded = F.transform(_as(value, "array<variant>"), lambda item: decode(item, element))
    elif isinstance(column, TimestampType):
        date = member(value, "$date")
        decoded = F.coalesce(
            F.timestamp_millis(_as(date, "bigint")),
            F.timestamp_millis(_as(date, "bigint", '$["$numberLong"]')),
            _as(date, "string").try_cast(TimestampType()),
        )
    elif isinstance(column, BinaryType):
        binary = member(value, "$binary")
        text = F.coalesce(_as(binary, "string", "$.base64"), _as(binary, "string"))
        decoded = F.try_to_binary(text, F.lit("base64"))
    elif isinstance(column, DecimalType):
        text = decimal_text(value)
        zero = ~F.concat(*_decimal_parts(text)[:2]).rlike("[1-9]")
        # Never rounded; a zero at any exponent is 0 (a cast refuses 0E+6111).
        decoded = F.when(
            decimal_text_fits(text, column), F.when(zero, F.lit(0).cast(column)).otherwise(text.try_cast(column))
        )
    elif isinstance(column, LongType):
        decoded = F.coalesce(
            *[_as(value, "bigint", f'$["{w}"]') for w in ("$numberLong", "$numberInt")], _as(value, "bigint")
        )
    elif isinstance(column, DoubleType):
        decoded = F.coalesce(
            *[_as(value, "double", f'$["{w}"]') for w in ("$numberDouble", "$numberLong", "$numberInt")],
            _as(value, "double"),
        )
    elif isinstance(column, StringType):
        # An ObjectId as its hex digits; any other string as itself, anything else as its JSON text.
        decoded = F.coalesce(_as(value, "string", '$["$oid"]'), _as(value, "string"))
    elif isinstance(column, BooleanType):
        decoded = _as(value, "boolean")
    else:
        raise ValueError(f"no Extended JSON decoding into {column.simpleString()}")
    return F.when(~is_null(value), decoded)


# Decimal128 text: sign, integer digits, fraction digits, exponent ("1.50", "-0E-6176", "1E+40", "NaN").
_DECIMAL_TEXT = r"^[+-]?([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?$"


def _decimal_parts(text: Column) -> tuple[Column, Column, Column]:
    """Decimal128 text's integer digits, fraction digits and exponent (each "" where it has none)."""
    whole, fraction, exponent = (F.regexp_extract(text, _DECIMAL_TEXT, group) for group in (1, 2, 3))
    return whole, fraction, exponent


def decimal_text_fits(text: Column, column: DecimalType = NUMBER_DECIMAL_TYPE) -> Column:
    """Whether the Decimal128 ``text`` is a number ``column`` holds exactly: at most its scale of fraction
    digits and its precision less scale of integer digits, trailing zeros aside (a cast would round the
    rest away, or overflow to null). Zero at any exponent fits; NaN and Infinity do not."""
    whole, fraction, exponent_text = _decimal_parts(text)
    exponent = F.when(exponent_text == "", F.lit(0)).otherwise(exponent_text.try_cast("int"))  # beyond int: null
    digits = F.regexp_replace(F.concat(whole, fraction), "^0+", "")  # significant, trailing zeros kept
    scale = F.length(fraction) - exponent  # digits after the point, as written
    trailing_zeros = F.length(digits) - F.length(F.regexp_replace(digits, "0+$", ""))
    return F.coalesce(
        text.rlike(_DECIMAL_TEXT)
        & (F.length(F.concat(whole, fraction)) > 0)
        & (
            (F.length(digits) == 0)
            | ((scale - trailing_zeros <= column.scale) & (F.length(digits) - scale <= column.precision - column.scale))
        ),
        F.lit(False),
    )


def decimal_text(value: Column) -> Column:
    """The text of a variant ``{"$numberDecimal": ...}`` (null for any other value)."""
    return _as(value, "string", '$["$numberDecimal"]')


def inexact_decimals(column: DataType, path: str) -> list[tuple[str, Callable[[Column], Column]]]:
    """For each decimal in a value of ``column`` (at ``path``; ``[]`` marks an array's elements): its path
    and a test of a variant value of the column that holds a Decimal128 there the decimal cannot hold
    exactly (see :func:`decimal_text_fits`)."""
    if isinstance(column, DecimalType):
        return [(path, lambda v: decimal_text(v).isNotNull() & ~decimal_text_fits(decimal_text(v), column))]

    # (Closures made by functions: Spark reads a lambda's parameters, so none may have a default.)
    def in_member(test: Callable[[Column], Column], name: str) -> Callable[[Column], Column]:
        return lambda v: test(member(v, name))

    def in_elements(test: Callable[[Column], Column]) -> Callable[[Column], Column]:
        return lambda v: F.coalesce(F.exists(_as(v, "array<variant>"), test), F.lit(False))

    if isinstance(column, StructType):
        return [
            (inner_path, in_member(test, f.name))
            for f in column.fields
            for inner_path, test in inexact_decimals(f.dataType, f"{path}.{f.name}")
        ]
    if isinstance(column, ArrayType):
        return [(inner, in_elements(test)) for inner, test in inexact_decimals(column.elementType, f"{path}[]")]
    return []


# A field whose values have had types no one column type holds (an int, then a string) is stored as
# each value's JSON text; the column's comment says so (readers of any kind see it, and the next
# batch knows not to quote its strings again).
JSON_TEXT_COMMENT = "MongoDB values of several types, as JSON text"
JSON_TEXT_METADATA = {"comment": JSON_TEXT_COMMENT}


def is_json_text(field: StructField) -> bool:
    return field.metadata.get("comment") == JSON_TEXT_COMMENT


def json_text(value: Column) -> Column:
    """A typed value as JSON text: numbers bare, strings quoted, documents and arrays as JSON,
    timestamps as ISO text in UTC, binary as base64; null stays null."""
    return F.when(value.isNotNull(), F.regexp_extract(F.to_json(F.array(value)), r"^\[(.*)\]$", 1))


def _holds_variant(shape: DataType) -> bool:
    """Whether a variant shape has a part of mixed types (``VARIANT``: an array's elements, a field of them)."""
    if isinstance(shape, VariantType):
        return True
    if isinstance(shape, ArrayType):
        return _holds_variant(shape.elementType)
    if isinstance(shape, StructType):
        return any(_holds_variant(f.dataType) for f in shape.fields)
    return False


def variant_json_text(value: Column, shapes: list[str]) -> Column:
    """A variant (Extended JSON, strict or relaxed) as :func:`json_text` of its value decoded to
    its own type (``shapes``: the ``schema_of_variant`` strings the batch has for it), so an int64
    is ``5`` whether written ``{"$numberLong": "5"}`` or ``5``; types without a column type of
    their own (``$timestamp``, mixed arrays) as their Extended JSON."""
    result = F.when(is_null(value), F.lit(None).cast(StringType()))
    for shape in sorted(set(shapes)):
        shape_type = variant_type(shape)
        column = known(document_type(shape_type))
        if (
            column is None
            or _holds_variant(shape_type)
            or (
                isinstance(column, StringType)
                and not isinstance(shape_type, StringType)
                and not (isinstance(shape_type, StructType) and shape_type.names == ["$oid"])
            )
        ):
            continue  # a value of mixed types inside (decoded, an 8 among strings would be "8")
        decoded = json_text(decode(value, column))
        # A Decimal128 a decimal cannot hold exactly keeps its Extended JSON: never rounded, never nulled.
        if inexact := [test(value) for _, test in inexact_decimals(column, "")]:
            decoded = F.when(reduce(Column.__or__, inexact), F.to_json(value)).otherwise(decoded)
        result = result.when(F.schema_of_variant(value) == shape, decoded)
    return result.otherwise(F.to_json(value))
