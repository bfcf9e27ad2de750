"""What a refined table does when its source's schema changes (an ALTER at the source).

Debezium sends each record with the schema of its table at the time: a column that changed type shows
as a field of another type (``int16`` then ``int32``, a decimal of another scale), a dropped column as a
field no longer there, a renamed one as a dropped column and a new one (nothing links them). Every
record is decoded with the schema it carries (:mod:`refine.parse_batch`); this module decides what the
tables that hold the column become, by the table's :class:`SchemaChangePolicy`:

- a **widening** (``smallint -> integer -> bigint``, ``real -> double precision``, a numeric of more
  digits or a larger scale, ``date -> timestamp``, ``timestamp -> timestamptz`` with the source's time
  zone) gives the column the wider type, its stored values converted as Postgres converts them in the
  ALTER (``4.25`` of ``numeric(8,2)`` is ``4.250`` of ``numeric(14,3)``);
- an **incompatible** change (``text -> integer``) makes the column a string holding both (``lenient``,
  ``evolve``);
- a **narrowing** (``bigint -> integer``) keeps the wider column, which holds every value;
- a **dropped** column stays, NULL in rows written after the drop, or goes (``drop_columns``, ``evolve``);
- a **rename** declared in ``renames`` carries the old column's values over to the new one.

A column's type changes by a rewrite of the table (one overwrite; the previous version stays for time
travel), not by Delta's type-widening table feature: that feature raises the table's protocol, and
readers without it (delta-rs, so pandas' and Polars' ``read_delta``) could no longer open the table.
"""

from __future__ import annotations

import zoneinfo
from datetime import datetime
from enum import Enum
from typing import Annotated, NamedTuple

from delta.tables import DeltaTable
from pydantic import AfterValidator, Field
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
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

from cdc.core.config import _Strict
from cdc.core.errors import TableError

CURRENT_VERSION = "_cdc_is_current"  # a history table's column (refine.apply.history.IS_CURRENT)
METADATA_PREFIX = "_cdc_"  # the tool's own columns: never a source column, never dropped or retyped here


class SchemaChangePolicy(str, Enum):
    """What a refined table does when a source column changes type, is dropped or renamed.

    Example::

        from cdc import RefineJobConfig, SchemaChangePolicy

        RefineJobConfig(table="demo.shop.items", warehouse="/lake", schema_changes=SchemaChangePolicy.EVOLVE)
    """

    EVOLVE = "evolve"  # every change applied: widenings, drops (the column goes), renames (the old column goes)
    LENIENT = "lenient"  # nothing dropped or narrowed: widenings applied, an incompatible change widens to string
    EXCEPTION = "exception"  # any change of a column's type stops the table, naming it and the way on
    IGNORE = "ignore"  # the refined schema stays: values that no longer fit go to the quarantine


def _known_time_zone(zone: str) -> str:
    if zone not in zoneinfo.available_timezones() and zone != "UTC":
        raise ValueError(f"unknown time zone {zone!r} (an IANA name, e.g. Europe/Berlin)")
    return zone


TimeZoneName = Annotated[str, AfterValidator(_known_time_zone)]  # an IANA time zone name, checked


class SchemaChangeRules(_Strict):
    """How one refined table (with its history, child and side tables) follows its source's schema."""

    policy: SchemaChangePolicy = Field(default=SchemaChangePolicy.LENIENT, description="See SchemaChangePolicy.")
    renames: dict[str, str] = Field(
        default_factory=dict,
        description="Source column renames, old name to new: the new column takes the old one's values, so rows not "
        "written since the rename read their value under the new name.",
    )
    drop_columns: bool = Field(
        default=False,
        description="Remove a column the source dropped (default: keep it, NULL in rows written after the drop). "
        "Implied by the policy `evolve`.",
    )
    source_time_zone: TimeZoneName | None = Field(
        default=None,
        description="The source database's time zone (e.g. Europe/Berlin): what a `timestamp -> timestamptz` ALTER "
        "reads the stored wall-clock times in. Without it that change is refused.",
    )

    @property
    def drops(self) -> bool:
        return self.drop_columns or self.policy is SchemaChangePolicy.EVOLVE


_INTEGRAL_DIGITS: dict[type[DataType], int] = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 19}
_INTEGRAL_ORDER = (ByteType, ShortType, IntegerType, LongType)
_MAX_DIGITS = 38
_ZONED = "zoned"  # a widening that needs the source's time zone


def _integral(data_type: DataType) -> bool:
    return type(data_type) in _INTEGRAL_DIGITS


def _as_decimal(data_type: DataType) -> DecimalType | None:
    if isinstance(data_type, DecimalType):
        return data_type
    if _integral(data_type):
        return DecimalType(_INTEGRAL_DIGITS[type(data_type)], 0)
    return None


def _exact_in_double(data_type: DataType) -> bool:
    """Whether a double holds every value of the exact type ``data_type`` (15 significant digits)."""
    if isinstance(data_type, DecimalType):
        return data_type.precision <= 15
    return isinstance(data_type, (ByteType, ShortType, IntegerType))


def widened_type(old: DataType, new: DataType) -> DataType | None:
    """The narrowest type holding every value of ``old`` and of ``new`` as Postgres converts them in an
    ALTER (a narrowing keeps the wider type), or None when neither holds the other's values (a double and,
    later, integers or decimals of more than 15 digits: a string holds both).
    A change between a timestamp without and with a time zone is :class:`TimestampType` only with the
    source's time zone: see :func:`needs_time_zone`."""
    if old == new:
        return old
    if _integral(old) and _integral(new):
        return max(old, new, key=lambda t: _INTEGRAL_ORDER.index(type(t)))
    if (old_decimal := _as_decimal(old)) and (new_decimal := _as_decimal(new)):
        scale = max(old_decimal.scale, new_decimal.scale)
        whole = max(old_decimal.precision - old_decimal.scale, new_decimal.precision - new_decimal.scale)
        return DecimalType(whole + scale, scale) if whole + scale <= _MAX_DIGITS else None
    numeric = (FloatType, DoubleType, DecimalType, *_INTEGRAL_ORDER)
    if isinstance(old, numeric) and isinstance(new, numeric):
        # float4 -> float8, a numeric or bigint -> float8: Postgres' values are doubles now. The other way
        # (float8 -> bigint or numeric) a double holds the new values only when they have 15 digits at most.
        return DoubleType() if isinstance(new, (FloatType, DoubleType)) or _exact_in_double(new) else None
    if {type(old), type(new)} == {DateType, TimestampNTZType}:
        return TimestampNTZType()
    if {type(old), type(new)} <= {DateType, TimestampNTZType, TimestampType}:
        return TimestampType()
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        element = widened_type(old.elementType, new.elementType)
        return None if element is None else ArrayType(element)
    if isinstance(old, StructType) and isinstance(new, StructType):
        fields = []
        for name in dict.fromkeys([*old.names, *new.names]):
            if name in old.names and name in new.names:
                inner = widened_type(old[name].dataType, new[name].dataType)
                if inner is None:
                    return None
            else:
                inner = (old if name in old.names else new)[name].dataType
            fields.append(StructField(name, inner))
        return StructType(fields)
    return None


def needs_time_zone(old: DataType, new: DataType) -> bool:
    """Whether values of ``old`` become ``new`` only in the source's time zone (a wall-clock time, or a
    date, becoming an instant)."""
    return isinstance(new, TimestampType) and isinstance(old, (DateType, TimestampNTZType))


class ColumnChange(NamedTuple):
    """One column of a table whose type follows a source's change."""

    column: str
    stored: DataType  # the table's type now
    arriving: DataType  # the type the batch's records carry
    becomes: DataType  # the table's type after the change


class SchemaPlan(NamedTuple):
    """What a table becomes for a batch: retyped columns, added, dropped and renamed ones."""

    retyped: list[ColumnChange]
    added: list[StructField]
    dropped: list[str]
    renamed: dict[str, str]  # old column -> new column, the new one filled from the old
    absent: list[str]  # stored source columns the source no longer has (dropped there, or renamed)
    returned: list[StructField]  # kept absent columns the source has again: NULL (current rows), of its type

    @property
    def rewrites(self) -> bool:
        return bool(self.retyped or self.dropped or self.renamed or self.returned)


def plan_schema_change(
    table: str, stored: StructType, arriving: StructType, rules: SchemaChangeRules, source_columns: bool = True
) -> SchemaPlan:
    """What the table at ``table`` (schema ``stored``) becomes to take rows of schema ``arriving`` under
    ``rules``. ``source_columns``: ``arriving`` holds every column of the source (a Debezium row), so a stored
    source column it lacks was dropped (or renamed). Raises :class:`TableError` for a change the rules refuse."""
    current = {field.name: field.dataType for field in stored}
    # A column the source dropped (kept, marked) and added again: its stored values are not the source's.
    marked = set(absent_columns(stored)) if rules.policy is not SchemaChangePolicy.IGNORE else set()
    retyped, added, returned = [], [], []
    for field in arriving:
        if field.name not in current:
            added.append(field)
            continue
        if field.name in marked:  # of a type holding the earlier values too (a history keeps them)
            held = widened_type(current[field.name], field.dataType) or StringType()
            returned.append(StructField(field.name, held))
            continue
        old, new = current[field.name], field.dataType
        if old == new:
            continue
        becomes = widened_type(old, new)
        # Under every policy: wall-clock times become instants (the stored ones, or later ones the stored
        # column of instants takes) only in the source's time zone.
        if (needs_time_zone(old, new) or needs_time_zone(new, old)) and rules.source_time_zone is None:
            raise _refused(
                table,
                field.name,
                old,
                new,
                "wall-clock times (stored, or arriving) become instants only in the source's time zone, which is "
                "not declared",
                "set source_time_zone (e.g. Europe/Berlin) for the table, then run again",
            )
        if becomes == old:
            continue  # a narrowing, or a nested field added: the stored column holds the values as they are
        if rules.policy is SchemaChangePolicy.EXCEPTION:
            raise _refused(table, field.name, old, new, "the table's schema_changes policy is exception")
        if rules.policy is SchemaChangePolicy.IGNORE:
            continue  # values that do not fit the stored type are quarantined (misfit)
        if (target := becomes if becomes is not None else StringType()) != old:  # a string column holds both
            retyped.append(ColumnChange(field.name, old, new, target))
    if rules.policy is SchemaChangePolicy.IGNORE:
        return SchemaPlan(retyped, [], [], {}, [], [])
    arriving_names = set(arriving.names)
    renamed = {
        before: after
        for before, after in rules.renames.items()
        if before in current and after in arriving_names and after not in current
    }
    renamed_from = {after: before for before, after in renamed.items()}
    for field in arriving:
        before_rename = current.get(renamed_from.get(field.name, ""))
        if before_rename is not None and needs_time_zone(before_rename, field.dataType) and not rules.source_time_zone:
            raise _refused(
                table,
                field.name,
                before_rename,
                field.dataType,
                f"its values renamed from {renamed_from[field.name]} are wall-clock times of the source's time "
                "zone, which is not declared",
                "set source_time_zone (e.g. Europe/Berlin) for the table, then run again",
            )
    # The new column holds the old one's values too: of a type holding both.
    added = [
        StructField(field.name, widened_type(current[renamed_from[field.name]], field.dataType) or StringType())
        if field.name in renamed_from
        else field
        for field in added
    ]
    absent = [
        name
        for name in current
        if source_columns and name not in arriving_names and not name.startswith(METADATA_PREFIX)
    ]
    dropped = absent if rules.drops else []
    return SchemaPlan(retyped, added, dropped, renamed, absent, returned)


# A column its source no longer has says so in its comment: readers (and the business tables' check) see why
# rows written since hold NULL in it.
ABSENT_COMMENT = "the source no longer has this column (dropped or renamed there): NULL in rows written since"


def absent_columns(schema: StructType) -> list[str]:
    """The table's columns its source no longer has, as :func:`mark_absent_columns` marked them."""
    return [field.name for field in schema if field.metadata.get("comment") == ABSENT_COMMENT]


def mark_absent_columns(spark: SparkSession, location: str, stored: StructType, plan: SchemaPlan) -> None:
    """Comment the table's columns kept after their source dropped (or renamed) them with :data:`ABSENT_COMMENT`,
    and clear it from one the source has again: a metadata commit per column, at the batch that changes it."""
    kept = set(plan.absent) - set(plan.dropped)
    marked = set(absent_columns(stored))
    for column, comment in [*[(c, ABSENT_COMMENT) for c in kept - marked], *[(c, "") for c in marked - kept]]:
        spark.sql(f"ALTER TABLE delta.`{location}` ALTER COLUMN `{column.replace('`', '``')}` COMMENT '{comment}'")


def _refused(table: str, column: str, old: DataType, new: DataType, why: str, way_on: str | None = None) -> TableError:
    return TableError(
        f"a source column changed type and {why}",
        table=table,
        column=column,
        old_type=old.simpleString(),
        new_type=new.simpleString(),
        to_go_on=way_on or "run the table once with --schema-changes lenient (or evolve), or set schema_changes",
    )


def converted(value: Column, old: DataType, becomes: DataType, time_zone: str | None) -> Column:
    """A stored value of type ``old`` as the column of type ``becomes`` holds it (as the source's ALTER
    converted it: a wall-clock time read in ``time_zone`` becomes an instant)."""
    if needs_time_zone(old, becomes):
        assert time_zone is not None  # refused by plan_schema_change without one
        wall_clock = value.cast(TimestampNTZType())
        utc = F.convert_timezone(F.lit(time_zone), F.lit("UTC"), wall_clock)
        micros = F.timestamp_diff("MICROSECOND", F.lit(datetime(1970, 1, 1)).cast(TimestampNTZType()), utc)
        return F.timestamp_micros(micros)
    return value.cast(becomes)


def conformed(
    rows: DataFrame, table: StructType, absent_as_null: bool = False, time_zone: str | None = None
) -> DataFrame:
    """``rows`` with the table's types (a batch of a narrower type, or of an older schema, is cast up; a
    wall-clock time a column of instants takes is read in ``time_zone``, the source's); columns the table
    lacks are left out, and, with ``absent_as_null``, columns the rows lack are NULL."""
    present = {field.name: field.dataType for field in rows.schema}
    columns = [
        (
            converted(F.col(f"`{field.name}`"), present[field.name], field.dataType, time_zone)
            if field.name in present
            else F.lit(None).cast(field.dataType)
        ).alias(field.name)
        for field in table
        if field.name in present or absent_as_null
    ]
    return rows.select(*columns)


def rewrite_table(spark: SparkSession, location: str, plan: SchemaPlan, time_zone: str | None) -> None:
    """Overwrite the table at ``location`` as ``plan`` retypes, renames and drops its columns (and adds the
    others) in one commit."""
    enable_types(
        spark,
        location,
        [change.becomes for change in plan.retyped] + [f.dataType for f in [*plan.added, *plan.returned]],
    )
    rows = spark.read.format("delta").load(location)
    changes = {change.column: change for change in plan.retyped}
    returned = {field.name: field.dataType for field in plan.returned}
    # A history table keeps its earlier versions' values: only its current versions lose them.
    current = F.col(f"`{CURRENT_VERSION}`") if CURRENT_VERSION in rows.columns else F.lit(True)
    columns = [
        converted(F.col(f"`{name}`"), changes[name].stored, changes[name].becomes, time_zone).alias(name)
        if name in changes
        else F.when(~current, F.col(f"`{name}`").cast(returned[name])).cast(returned[name]).alias(name)
        if name in returned
        else F.col(f"`{name}`")
        for name in rows.columns
        if name not in plan.dropped
    ]
    renamed_to = {new: old for old, new in plan.renamed.items()}
    stored = {field.name: field.dataType for field in rows.schema}
    for field in plan.added:  # in the same commit: a renamed column's values come with it
        old = renamed_to.get(field.name)
        value = F.lit(None) if old is None else converted(F.col(f"`{old}`"), stored[old], field.dataType, time_zone)
        columns.append(value.cast(field.dataType).alias(field.name))
    overwrite_table(spark, location, rows.select(*columns))


def enable_types(spark: SparkSession, location: str, types: list[DataType]) -> None:
    """Give the table at ``location`` the Delta table feature a column of ``types`` needs, before a write that
    adds such a column: Delta enables ``timestampNtz`` by itself only when a table is created (a table created
    with such a column has it, so its readers are those of every refined table with a ``timestamp`` column)."""
    if any(_holds(data_type, TimestampNTZType) for data_type in types):
        spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ('delta.feature.timestampNtz' = 'supported')")


def _holds(data_type: DataType, kind: type[DataType]) -> bool:
    if isinstance(data_type, kind):
        return True
    if isinstance(data_type, StructType):
        return any(_holds(field.dataType, kind) for field in data_type)
    if isinstance(data_type, ArrayType):
        return _holds(data_type.elementType, kind)
    return isinstance(data_type, MapType) and (_holds(data_type.keyType, kind) or _holds(data_type.valueType, kind))


def overwrite_table(spark: SparkSession, location: str, rows: DataFrame) -> None:
    """Replace the table at ``location`` by ``rows`` (read from it), schema included, in one commit that keeps
    its partitioning and properties (the previous version stays for time travel)."""
    detail = DeltaTable.forPath(spark, location).detail().select("partitionColumns").first()
    partitions = detail[0] if detail is not None else []
    (
        rows.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy(*partitions)
        .save(location)
    )


def with_renamed_columns(changes: DataFrame, renames: dict[str, str]) -> DataFrame:
    """Parsed ``changes`` of a batch holding records from before a rename (the old column) and after it (the
    new one), all with the value under the new name and the old column NULL, as records after the rename
    have them: each row refines under the new name, and equal rows have equal images (a keyless table's
    hash). A record has one of the two columns, never both."""
    row_type = changes.schema["after"].dataType
    assert isinstance(row_type, StructType)  # a row of columns
    pairs = {old: new for old, new in renames.items() if old in row_type.names and new in row_type.names}
    if not pairs:
        return changes
    old_of = {new: old for old, new in pairs.items()}

    def renamed(image: str) -> Column:
        value = F.col(image)
        fields = []
        for field in row_type:
            if field.name in old_of:
                fields.append(F.coalesce(value[field.name], value[old_of[field.name]].cast(field.dataType)))
            elif field.name in pairs:
                fields.append(F.lit(None).cast(field.dataType))
            else:
                fields.append(value[field.name])
        return F.when(value.isNotNull(), F.struct(*[v.alias(f.name) for v, f in zip(fields, row_type, strict=True)]))

    return changes.withColumns({image: renamed(image) for image in ("before", "after")})


def misfit(image: Column, label: str, row_type: StructType, stored: StructType) -> Column | None:
    """For a table whose schema stays as it is (policy ``ignore``): why the first value of the row ``image``
    that its stored column's type cannot hold exactly (a value of a column the source widened) is refused,
    naming the field, both types and the policy; null for a row that fits. None: every value fits."""
    types = {field.name: field.dataType for field in stored}
    reason: Column | None = None
    for field in row_type:
        kept = types.get(field.name)
        if kept is None or kept == field.dataType or widened_type(kept, field.dataType) == kept:
            continue
        value = image[field.name]
        fits = value.try_cast(kept).try_cast(field.dataType).eqNullSafe(value)
        why = F.concat(
            F.lit(f"field {label}{field.name}: "),
            value.cast(StringType()),
            F.lit(
                f" does not fit the refined column's type {kept.simpleString()} (the source's is now "
                f"{field.dataType.simpleString()}; the table's schema_changes policy is ignore)"
            ),
        )
        misfits = value.isNotNull() & ~fits
        reason = F.when(misfits, why) if reason is None else reason.when(misfits, why)
    return reason
