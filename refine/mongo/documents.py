"""Debezium MongoDB connector topics, refined: documents as typed columns, one row per ``_id``.

Topics written with and without schemas (JsonConverter ``schemas.enable``) are both read: a value
without the ``{schema, payload}`` wrapper is told by ``source.connector == "mongodb"``.

The refined table holds ``_id`` (the document id's Extended JSON text as the connector writes it in
the Kafka key: ``{"$oid": "..."}``, ``"abc"`` with its quotes, ``42``, ``{"a": 1}``; so an ObjectId
and a string never collide), a column per top-level field of the documents (types as in
:mod:`refine.mongo.extended_json`), and ``_cdc_ts_ms``, ``_cdc_ord``, ``_cdc_offset`` (the source position),
``_cdc_committed_at``, ``_cdc_op``, ``_cdc_refined_at``.

Per batch (:func:`refine_mongo_batch`):

1. records are parsed (:func:`parse_mongo_changes`); the shapes of their fields, and the paths their
   ``updateDescription`` touch, are collected (a handful of type strings, not data) and merged with
   the refined table's schema into the column types (:func:`column_types`): a new field is a new
   column, a new field of a nested document a new nested column;
2. the first type a field is seen with fixes its column (in one batch, integers and fractions
   together make a double); a top-level field whose values then have a type the column cannot hold
   (a string where it is bigint, a document where it is an array) drifts: its column becomes JSON
   text (a string holding each value's JSON, the column's comment says so), the refined and history
   tables' rows converted in one overwrite each (:func:`ensure_json_columns`). A record whose update
   path cannot apply (below a string, or inside a JSON-text column) is quarantined with the reason.
   A field that has held only ``[]`` is an untyped array: an array of strings, named in its column's
   comment, until its first elements retype it, in one overwrite of each table
   (:func:`settle_untyped_arrays`);
3. per ``_id``, changes are ordered by (``source.ts_ms``, ``source.ord``, Kafka offset): the last
   full document (create, snapshot read, update or replace with ``after``) or delete, then the
   updates after it that carry only ``updateDescription`` (``capture.mode=change_streams``) applied
   in order (:mod:`refine.mongo.patch`). When the batch holds no full document for the id, the patches
   apply to the refined table's row, from its position on; when there is none, the patch records
   are quarantined;
4. the documents are checked against the table's expectations (pipelines; :mod:`refine.apply.rules`),
   then MERGEd with position guards (:func:`refine.apply.merge.merge_changes`); exploded arrays refresh
   their child tables (an array whose field drifted to JSON text: each element's JSON text,
   :func:`refresh_json_children`), and with SCD type 2 the state after each change is a version of the
   document's history (:mod:`refine.apply.history`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    IntegerType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from cdc.core.ddl import quoted, sql_type
from cdc.core.tables import is_delta_table
from refine.apply.flatten import ELEMENT, array_element, child_rows
from refine.apply.flatten import POSITION as POS
from refine.apply.history import HISTORY_KIND, apply_history, debezium_history_spec, debezium_versions
from refine.apply.merge import (
    COMMITTED_AT,
    LSN,
    METADATA_COLUMNS,
    OFFSET,
    OP,
    PARTITION,
    REFINED_AT,
    TableSettings,
    ensure_refined_table,
    merge_changes,
    refresh_children,
    replace_children,
)
from refine.apply.rules import TableRules
from refine.mongo.extended_json import (
    ELEMENT_STEP,
    JSON_TEXT_METADATA,
    NUMBER_DECIMAL_TYPE,
    Path,
    commented_untyped,
    decode,
    document_type,
    fits,
    inexact_decimals,
    is_json_text,
    is_null,
    json_text,
    member,
    merge_types,
    read_untyped,
    storable,
    stored_untyped,
    to_variant,
    untyped_comment,
    untyped_paths,
    variant_json_text,
    variant_type,
)
from refine.mongo.patch import apply_patch, leaf_type, path_type, resolve
from refine.quality.quarantine import quarantine
from refine.records.envelope import TOMBSTONE, ConnectSchema, Op

MONGO_SOURCE = "io.debezium.connector.mongo.Source"
FOUND_PROBLEM = "found_problem"  # a raw record's problem found before its parse, for the quarantine
ID = "_id"
TS_MS, ORD = "_cdc_ts_ms", "_cdc_ord"
POSITION = (TS_MS, ORD, OFFSET)
MONGO_METADATA_COLUMNS = (TS_MS, ORD, *[c for c in METADATA_COLUMNS if c != LSN])

# What the job reads of the envelope's payload (the connector's schema has more).
_ENVELOPE = StructType(
    [
        StructField("after", StringType()),
        StructField(
            "updateDescription",
            StructType(
                [
                    StructField("removedFields", ArrayType(StringType())),
                    StructField("updatedFields", StringType()),
                    StructField(
                        "truncatedArrays",
                        ArrayType(StructType([StructField("field", StringType()), StructField("size", IntegerType())])),
                    ),
                ]
            ),
        ),
        StructField(
            "source",
            StructType(
                [
                    StructField("ts_ms", LongType()),
                    StructField("ord", IntegerType()),
                    # Not the connector's: the commit time of a change without a source position
                    # (refine/mongo/unwrapped_documents.py), whose ts_ms is 0.
                    StructField("committed_ts_ms", LongType()),
                ]
            ),
        ),
        StructField("op", StringType()),
    ]
)


class Kind:
    """What a change does to its document."""

    IMAGE = "image"  # the whole document: snapshot read, create, update or replace with `after`
    DELETE = "delete"
    PATCH = "patch"  # an update carrying only updateDescription
    TOMBSTONE = TOMBSTONE


def has_bare_mongo_envelopes(records: DataFrame) -> bool:
    """Values that are MongoDB connector envelopes written without schemas (``schemas.enable=false``):
    told by ``source.connector``, as the envelope has no ``{schema, payload}`` wrapper."""
    return not records.where(F.get_json_object("value", "$.source.connector") == "mongodb").isEmpty()


def is_mongo(value_schema: ConnectSchema) -> bool:
    """A MongoDB connector's envelope (told by its ``source`` block's schema name)."""
    try:
        return value_schema.field_named("source").name == MONGO_SOURCE
    except KeyError:
        return False


def parse_mongo_changes(raw: DataFrame) -> DataFrame:
    """Changes from raw rows of a MongoDB connector topic (pure DataFrame -> DataFrame).

    Columns: ``_id``, ``op``, ``kind`` (:class:`Kind`), ``document`` (``after`` as a variant),
    ``patch`` (updated variant, removed paths, truncated arrays), ``position`` (ts_ms, ord,
    offset), ``source_committed_at``, ``kafka_partition``, ``kafka_offset``, ``problem``,
    ``raw_value``.
    """
    # With schemas.enable=false the envelope and the key are not wrapped in {schema, payload}.
    bare = F.when(F.get_json_object("value", "$.source").isNotNull(), F.from_json("value", _ENVELOPE))
    envelope = F.coalesce(F.from_json("value", StructType([StructField("payload", _ENVELOPE)]))["payload"], bare)
    # A problem found before (refine/mongo/unwrapped_documents.py) stands.
    found = F.col(FOUND_PROBLEM) if FOUND_PROBLEM in raw.columns else F.lit(None).cast("string")
    parsed = raw.select(
        F.coalesce(F.get_json_object("key", "$.payload.id"), F.get_json_object("key", "$.id")).alias(ID),
        F.col("value").alias("raw_value"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.when(found.isNull(), envelope).alias("envelope"),
        found.alias(FOUND_PROBLEM),
    )
    update = F.col("envelope.updateDescription")
    op = F.when(F.col("raw_value").isNull(), F.lit(TOMBSTONE)).otherwise(F.col("envelope.op"))
    changes = parsed.select(
        ID,
        op.alias("op"),
        to_variant(F.col("envelope.after")).alias("document"),
        F.when(
            update.isNotNull(),
            F.struct(
                to_variant(update["updatedFields"]).alias("updated"),
                update["removedFields"].alias("removed"),
                update["truncatedArrays"].alias("truncated"),
            ),
        ).alias("patch"),
        F.struct(
            F.col("envelope.source.ts_ms").alias("ts_ms"),
            F.col("envelope.source.ord").alias("ord"),
            F.col("kafka_offset").alias("offset"),
        ).alias("position"),
        F.timestamp_millis(F.coalesce(F.col("envelope.source.committed_ts_ms"), F.col("envelope.source.ts_ms"))).alias(
            "source_committed_at"
        ),
        "kafka_partition",
        "kafka_offset",
        "raw_value",
        "envelope",
        FOUND_PROBLEM,
    )
    has_document = F.col("envelope.after").isNotNull()
    kind = (
        F.when(F.col("op") == TOMBSTONE, F.lit(Kind.TOMBSTONE))
        .when(F.col("op") == Op.DELETE.value, F.lit(Kind.DELETE))
        .when(
            F.col("op").isin(Op.READ.value, Op.CREATE.value) | ((F.col("op") == Op.UPDATE.value) & has_document),
            F.lit(Kind.IMAGE),
        )
        .when((F.col("op") == Op.UPDATE.value) & F.col("patch").isNotNull(), F.lit(Kind.PATCH))
    )
    problem = (
        F.when(F.col(FOUND_PROBLEM).isNotNull(), F.col(FOUND_PROBLEM))
        .when(
            F.col("raw_value").isNotNull() & F.col("envelope").isNull(), F.lit("value is not a Debezium JSON envelope")
        )
        .when(F.col(ID).isNull(), F.lit("the key holds no document id (payload.id)"))
        .when(
            F.col("op").isNull()
            | ~F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value, TOMBSTONE),
            F.concat(F.lit("unknown op "), F.coalesce("op", F.lit("null"))),
        )
        .when(has_document & F.col("document").isNull(), F.lit("after: not Extended JSON"))
        .when(
            F.col("patch.updated").isNull() & update["updatedFields"].isNotNull(),
            F.lit("updateDescription.updatedFields: not Extended JSON"),
        )
        .when(kind.isNull(), F.lit("an update with neither after nor updateDescription"))
        .when(
            (kind == Kind.IMAGE) & F.try_variant_get("document", "$", "map<string,variant>").isNull(),
            F.lit("after: not a document"),
        )
    )
    return changes.select("*", kind.alias("kind"), problem.alias("problem")).drop("envelope", FOUND_PROBLEM)


@dataclass(frozen=True)
class Shape:
    """One shape (``schema_of_variant`` string) a field or an update path had in a batch."""

    kind: str  # "field": a top-level field of a document; "set", "unset", "truncate": update paths
    name: str
    shape: str | None
    count: int


def batch_shapes(changes: DataFrame) -> list[Shape]:
    """The distinct field shapes and update paths of a batch (metadata: a handful of rows)."""
    fine = changes.where("problem IS NULL")
    fields = fine.where(F.col("kind") == Kind.IMAGE).select(
        F.lit("field").alias("kind"), F.explode(F.try_variant_get("document", "$", "map<string,variant>"))
    )
    # An update carrying `after` too (capture.mode=change_streams_update_full) is applied as a whole document.
    patches = fine.where(F.col("kind") == Kind.PATCH)
    updated = patches.select(
        F.lit("set").alias("kind"), F.explode(F.try_variant_get("patch.updated", "$", "map<string,variant>"))
    )
    removed = patches.select(
        F.lit("unset").alias("kind"),
        F.explode("patch.removed").alias("key"),
        F.lit(None).cast("variant").alias("value"),
    )
    truncated = patches.select(
        F.lit("truncate").alias("kind"),
        F.explode("patch.truncated.field").alias("key"),
        F.lit(None).cast("variant").alias("value"),
    )
    rows = (
        fields.unionByName(updated)
        .unionByName(removed, allowMissingColumns=True)
        .unionByName(truncated, allowMissingColumns=True)
        .where(F.col("key") != ID)
        .groupBy("kind", "key", F.schema_of_variant("value").alias("shape"))
        .count()
        .collect()
    )
    return [Shape(row.kind, row.key, row.shape, row["count"]) for row in rows]


@dataclass
class Columns:
    """The column types of a batch, and what in it does not fit them."""

    types: StructType
    misfits: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (kind, name) -> shape -> reason
    unsupported: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, path) -> reason
    json: dict[str, list[str]] = field(default_factory=dict)  # JSON-text column -> the batch's shapes of its values
    untyped: dict[str, list[Path]] = field(default_factory=dict)  # column -> where its untyped arrays are
    decimals: dict[str, DataType] = field(default_factory=dict)  # update path -> its type, which holds decimals

    def paths(self, kind: str, shapes: list[Shape]) -> list[str]:
        """The batch's update paths of ``kind`` that change a column."""
        names = sorted({s.name for s in shapes if s.kind == kind and (kind, s.name) not in self.unsupported})
        return [n for n in names if leaf_type(self.types, resolve(self.types, n)) is not None]


def _implied(types: StructType, shape: Shape) -> tuple[str, DataType]:
    """The top-level column a shape is about, and the column type it implies (ValueError: cannot apply)."""
    value = document_type(variant_type(shape.shape)) if shape.shape else NullType()
    if shape.kind == "field":
        return shape.name, value
    return shape.name.split(".")[0], path_type(types, shape.name, value)


def _grow(table: DataType, merged: DataType) -> DataType:
    """``table``'s type with the nested fields ``merged`` adds (a column's other types never change,
    except an untyped array's: its elements take their first type)."""
    if isinstance(table, NullType):  # an untyped array's elements
        return storable(merged) or table
    if isinstance(table, StructType) and isinstance(merged, StructType):
        fields = [
            StructField(f.name, _grow(f.dataType, merged[f.name].dataType) if f.name in merged.names else f.dataType)
            for f in table.fields
        ]
        added = [
            StructField(f.name, t) for f in merged.fields if f.name not in table.names and (t := storable(f.dataType))
        ]
        return StructType(fields + added)
    if isinstance(table, ArrayType) and isinstance(merged, ArrayType):
        return ArrayType(_grow(table.elementType, merged.elementType))
    return table


def _top(shape: Shape) -> str:
    return shape.name.split(".")[0] if shape.kind != "field" else shape.name


def _merged(table: StructType, shapes: list[Shape], json: set[str]) -> tuple[dict[str, DataType], set[str]]:
    """The columns' types merged with the batch's ``shapes`` (``json``: the JSON-text columns, left
    as strings), and the columns whose types conflict (they drift)."""
    merged: dict[str, DataType] = {f.name: StringType() if f.name in json else f.dataType for f in table.fields}
    merged.update({name: StringType() for name in json})
    conflicts = set()
    # Whole values before paths into them: `items.0.n` set in an array's element is read as such once
    # `items` is known to be an array (a path into a field known to no value makes documents, as MongoDB does).
    for shape in sorted(
        (s for s in shapes if s.kind in ("field", "set")),
        key=lambda s: (s.name.count("."), -s.count, s.name, s.shape or ""),
    ):
        if _top(shape) in json:
            continue
        try:
            name, implied = _implied(StructType([StructField(n, t) for n, t in merged.items()]), shape)
        except ValueError:
            continue  # reported below
        combined = merge_types(merged.get(name, NullType()), implied)
        if combined is None:
            conflicts.add(name)
        else:
            merged[name] = combined
    # A table's column keeps its types (a bigint column does not become double): values it cannot hold drift.
    conflicts |= {
        f.name
        for f in table.fields
        if f.name not in json
        and f.name not in conflicts
        and not fits(merged[f.name], _grow(f.dataType, merged[f.name]))
    }
    return merged, conflicts


def column_types(table: StructType, shapes: list[Shape]) -> Columns:
    """The refined table's data columns (``table``: its current ones) grown by the batch's ``shapes``.

    A field whose values have types no one column type holds (a number, then a string; a document,
    then an array) becomes a JSON-text column (:data:`refine.mongo.extended_json.JSON_TEXT_COMMENT`): a
    string holding each value's JSON, the type every value fits."""
    json = {f.name for f in table.fields if is_json_text(f)}
    while True:
        merged, conflicts = _merged(table, shapes, json)
        if not conflicts:
            break
        json |= conflicts

    def typed(name: str, data_type: DataType) -> StructField:
        return (
            StructField(name, StringType(), True, JSON_TEXT_METADATA) if name in json else StructField(name, data_type)
        )

    types = [
        typed(f.name, _grow(f.dataType, merged[f.name]) if f.name not in json else StringType()) for f in table.fields
    ]
    types += [typed(n, t) for n, m in merged.items() if n not in table.names and (t := storable(m)) is not None]
    untyped = {f.name: paths for f in types if (paths := untyped_paths(f.dataType))}
    unstored = StructType(types)  # untyped arrays as arrays of nulls: what a value must fit
    columns = Columns(
        StructType(
            [
                StructField(f.name, stored_untyped(f.dataType), True, untyped_comment(untyped[f.name]))
                if f.name in untyped
                else f
                for f in types
            ]
        ),
        untyped=untyped,
    )
    columns.json = {
        name: sorted({s.shape for s in shapes if s.kind in ("field", "set") and s.name == name and s.shape})
        for name in sorted(json)
    }
    for shape in shapes:
        top = _top(shape)
        if top in json and (shape.name != top or shape.kind == "truncate"):
            columns.unsupported[(shape.kind, shape.name)] = (
                f"cannot apply update path {shape.name}: {top} has held values of several types and is stored as "
                "JSON text, which an update cannot reach into"
            )
            continue
        if top in json:
            continue  # every value fits JSON text
        try:
            if shape.kind in ("set", "field"):
                name, implied = _implied(columns.types, shape)
                column = unstored[name].dataType if name in unstored.names else NullType()
                if not fits(implied, column):
                    columns.misfits.setdefault((shape.kind, shape.name), {})[shape.shape or ""] = (
                        f"{'field' if shape.kind == 'field' else 'update path'} {shape.name}: a value of shape "
                        f"{shape.shape} does not fit the column {name} {column.simpleString()}"
                    )
                elif shape.kind == "set":
                    leaf = leaf_type(columns.types, resolve(columns.types, shape.name))
                    if leaf is not None and inexact_decimals(leaf, shape.name):
                        columns.decimals[shape.name] = leaf
            else:
                resolve(columns.types, shape.name)
        except ValueError as error:
            columns.unsupported[(shape.kind, shape.name)] = f"cannot apply update path {shape.name}: {error}"
    return columns


def _misfit(changes_value: Column, name: str, reasons: dict[str, str], problem: Column) -> Column:
    shape = F.schema_of_variant(member(changes_value, name))
    for text, reason in reasons.items():
        problem = problem.when(shape == text, F.lit(reason))
    return problem


def decode_document(document: Column, columns: Columns) -> Column:
    """A document (a variant) as a struct of the ``columns``."""
    return F.when(
        ~is_null(document),
        F.struct(
            *[
                (
                    variant_json_text(member(document, f.name), columns.json[f.name])
                    if f.name in columns.json
                    else decode(member(document, f.name), f.dataType)
                ).alias(f.name)
                for f in columns.types.fields
            ]
        ),
    )


def flag_misfits(changes: DataFrame, columns: Columns) -> DataFrame:
    """``changes`` with ``state`` (the document decoded to the columns) and problems for the values
    that do not fit them, the update paths that cannot apply and the values that do not decode."""
    state = F.when(F.col("kind") == Kind.IMAGE, decode_document(F.col("document"), columns))
    changes = changes.withColumn("state", state)
    problem = F.when(F.col("problem").isNotNull(), F.col("problem"))
    for (kind, name), reasons in sorted(columns.misfits.items()):
        value = F.col("document") if kind == "field" else F.col("patch.updated")
        problem = _misfit(
            F.when(F.col("kind") == (Kind.IMAGE if kind == "field" else Kind.PATCH), value), name, reasons, problem
        )
    # Only updates carrying just updateDescription apply paths: one that carries `after` applies that.
    patch = F.col("kind") == Kind.PATCH
    for (kind, path), reason in sorted(columns.unsupported.items()):
        touched = {
            "set": member(F.col("patch.updated"), path).isNotNull(),
            "unset": F.array_contains(F.col("patch.removed"), path),
            "truncate": F.array_contains(F.col("patch.truncated.field"), path),
        }[kind]
        problem = problem.when(patch & F.coalesce(touched, F.lit(False)), F.lit(reason))
    # A Decimal128 the decimal column would round or overflow: the record waits in the quarantine.
    inexact = [
        (kind, path, test(member(F.col(value), name)))
        for kind, value, named in [
            (Kind.IMAGE, "document", {f.name: f.dataType for f in columns.types.fields if f.name not in columns.json}),
            (Kind.PATCH, "patch.updated", columns.decimals),
        ]
        for name, data_type in named.items()
        for path, test in inexact_decimals(data_type, name)
    ]
    for kind, path, found in inexact:
        problem = problem.when(
            (F.col("kind") == kind) & found,
            F.lit(
                f"{'field' if kind == Kind.IMAGE else 'update path'} {path}: a Decimal128 value that "
                f"{NUMBER_DECIMAL_TYPE.simpleString()} cannot hold exactly"
            ),
        )
    for column in columns.types.fields:
        raw = member(F.col("document"), column.name)
        problem = problem.when(
            (F.col("kind") == Kind.IMAGE) & ~is_null(raw) & F.col(f"state.`{column.name}`").isNull(),
            F.lit(f"field {column.name}: cannot decode the value as {column.dataType.simpleString()}"),
        )
    return changes.withColumn("problem", problem)


def latest_documents(
    changes: DataFrame, columns: Columns, shapes: list[Shape], table: DataFrame | None, every: bool = False
) -> DataFrame:
    """Per ``_id``: its latest state (the last full document or delete, then the updates after it;
    without one in the batch, the refined ``table``'s row and the updates after its position),
    with ``orphan`` set where updates have no document to apply to. With ``every``, the state after
    each change of the batch (its versions, for a history)."""
    order = Window.partitionBy(ID).orderBy("position")
    history = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    image = F.last(
        F.when(F.col("kind").isin(Kind.IMAGE, Kind.DELETE), F.struct("position", "op", "state")), ignorenulls=True
    ).over(history)
    patches = F.collect_list(F.when(F.col("kind") == Kind.PATCH, F.struct("position", "patch"))).over(history)
    rows = (
        changes.where(F.col("problem").isNull() & (F.col("kind") != Kind.TOMBSTONE))
        .select(
            ID,
            "position",
            "source_committed_at",
            "kafka_partition",
            image.alias("image"),
            patches.alias("patches"),
            F.row_number().over(Window.partitionBy(ID).orderBy(F.col("position").desc())).alias("rank"),
        )
        .where(F.lit(every) | (F.col("rank") == 1))
    )
    if table is not None:
        current = table.select(
            F.col(ID).alias("current_id"),
            F.struct(
                *[
                    (F.col(f"`{f.name}`") if f.name in table.columns else F.lit(None).cast(f.dataType)).alias(f.name)
                    for f in columns.types.fields
                ]
            ).alias("current_state"),  # a new column is null so far
            F.struct(F.col(TS_MS).alias("ts_ms"), F.col(ORD).alias("ord"), F.col(OFFSET).alias("offset")).alias(
                "current_position"
            ),
        )
        rows = rows.join(current, rows[ID] == current["current_id"], "left")
    else:
        rows = rows.select("*", F.lit(None).alias("current_state"), F.lit(None).alias("current_position"))
    base_state = F.when(F.col("image").isNotNull(), F.col("image.state")).otherwise(F.col("current_state"))
    base_position = F.when(F.col("image").isNotNull(), F.col("image.position")).otherwise(F.col("current_position"))
    pending = F.filter("patches", lambda p: base_position.isNull() | (p["position"] > base_position))
    updated, removed, truncated = (columns.paths(kind, shapes) for kind in ("set", "unset", "truncate"))
    decoders = {name: lambda v, shapes=shapes_: variant_json_text(v, shapes) for name, shapes_ in columns.json.items()}
    state = F.aggregate(
        pending,
        base_state.cast(columns.types),
        # (the decoders' lambdas bind their shapes by a default argument, which mypy types as a second one)
        lambda s, p: apply_patch(s, columns.types, p["patch"], updated, removed, truncated, decoders),  # type: ignore[arg-type]
    )
    patched = F.size(pending) > 0
    return rows.select(
        ID,
        "position",
        "source_committed_at",
        "kafka_partition",
        F.when(patched, F.lit(Op.UPDATE.value)).otherwise(F.col("image.op")).alias("op"),
        state.cast(columns.types).alias("state"),
        (patched & (base_state.isNull() | F.coalesce(F.col("image.op") == Op.DELETE.value, F.lit(False)))).alias(
            "orphan"
        ),
    )


def refined_documents(latest: DataFrame, columns: Columns) -> DataFrame:
    """Rows as the refined table stores them, with ``_cdc_partition`` (the Kafka partition of the
    document's last change: where expectations quarantine it from; not stored)."""
    return latest.where("NOT orphan AND op IS NOT NULL").select(
        ID,
        *[F.col(f"state.`{c}`").alias(c) for c in columns.types.names],
        F.col("position.ts_ms").alias(TS_MS),
        F.col("position.ord").alias(ORD),
        F.col("position.offset").alias(OFFSET),
        F.col("kafka_partition").alias(PARTITION),
        F.col("source_committed_at").alias(COMMITTED_AT),
        F.col("op").alias(OP),
        F.current_timestamp().alias(REFINED_AT),
    )


def add_nested_columns(spark: SparkSession, location: str, table: StructType, types: StructType) -> None:
    """Add the nested fields ``types`` has and the refined table does not (top-level columns are
    added by :func:`refine.apply.merge.ensure_refined_table`)."""

    def added(current: DataType, wanted: DataType, path: str) -> list[str]:
        if isinstance(current, StructType) and isinstance(wanted, StructType):
            found = []
            for f in wanted.fields:
                inner = f"{path}.{quoted(f.name)}"
                if f.name in current.names:
                    found += added(current[f.name].dataType, f.dataType, inner)
                else:
                    found.append(f"{inner} {sql_type(f.dataType)}")
            return found
        if isinstance(current, ArrayType) and isinstance(wanted, ArrayType):
            return added(current.elementType, wanted.elementType, f"{path}.element")
        return []

    nested = [
        a
        for f in table.fields
        if f.name in types.names
        for a in added(f.dataType, types[f.name].dataType, quoted(f.name))
    ]
    if nested:
        spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({', '.join(nested)})")


def ensure_json_columns(
    spark: SparkSession, location: str, settings: TableSettings, names: list[str], kind: str
) -> None:
    """Make ``names`` JSON-text columns of the table at ``location`` (created when missing, of
    ``kind``): a typed column is converted, its rows' values to their JSON text, in one overwrite
    (the old version stays for time travel); a missing one is added."""
    if not is_delta_table(spark, location):
        ensure_refined_table(
            spark,
            location,
            settings,
            StructType(
                [
                    StructField(ID, StringType()),
                    *[StructField(name, StringType(), True, JSON_TEXT_METADATA) for name in names],
                ]
            ),
            kind=kind,
        )
        return
    table = spark.read.format("delta").load(location)
    converted = [name for name in names if name in table.columns and not is_json_text(table.schema[name])]
    if converted:
        (
            table.select(
                *[
                    json_text(F.col(f"`{f.name}`")).alias(f.name, metadata=JSON_TEXT_METADATA)
                    if f.name in converted
                    else F.col(f"`{f.name}`")
                    for f in table.schema.fields
                ]
            )
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .save(location)
        )
    added = [name for name in names if name not in table.columns]
    if added:
        columns = ", ".join(f"{quoted(name)} STRING COMMENT '{JSON_TEXT_METADATA['comment']}'" for name in added)
        spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({columns})")


def _retyped(value: Column, stored: DataType, wanted: DataType, paths: list[Path], path: Path = ()) -> Column:
    """A stored value with its untyped arrays at ``paths`` (whose elements are only nulls and ``[]``)
    as the ``wanted`` type's arrays: through their JSON, the one conversion from strings to any type."""
    if path in paths:
        return F.from_json(F.to_json(value), wanted)  # type: ignore[arg-type]  # (any DataType is taken)
    if isinstance(stored, StructType) and isinstance(wanted, StructType):
        fields = [
            _retyped(value[f.name], f.dataType, wanted[f.name].dataType, paths, (*path, f.name)).alias(f.name)
            for f in stored.fields
        ]
        return F.when(value.isNotNull(), F.struct(*fields))
    if isinstance(stored, ArrayType) and isinstance(wanted, ArrayType):
        return F.transform(
            value, lambda item: _retyped(item, stored.elementType, wanted.elementType, paths, (*path, ELEMENT_STEP))
        )
    return value


def _type_at(data_type: DataType, path: Path) -> DataType | None:
    """The type at ``path`` inside ``data_type`` (None where it has none)."""
    for step in path:
        if step == ELEMENT_STEP and isinstance(data_type, ArrayType):
            data_type = data_type.elementType
        elif isinstance(data_type, StructType) and step in data_type.names:
            data_type = data_type[step].dataType
        else:
            return None
    return data_type


def settle_untyped_arrays(
    spark: SparkSession, location: str, settings: TableSettings, columns: Columns, kind: str
) -> None:
    """Make the table at ``location`` (created when missing, of ``kind``) hold the batch's untyped arrays
    as ``columns`` has them, before the MERGE: a column whose untyped arrays have taken a type (or
    deepened: ``[]``, then ``[[]]``) is converted in one overwrite with its new comment (the old version
    stays for time travel); a new untyped array is named in its column's comment first, then added. Each
    step can be run again: a table already converted or commented is left as it is."""
    if not is_delta_table(spark, location):
        if columns.untyped:
            ensure_refined_table(
                spark,
                location,
                settings,
                StructType([StructField(ID, StringType()), *[columns.types[n] for n in columns.untyped]]),
                kind=kind,
            )
        return
    table = spark.read.format("delta").load(location)
    stored = {f.name: paths for f in table.schema.fields if (paths := commented_untyped(f))}
    retyped = {
        name: [
            p
            for p in paths
            if p not in columns.untyped.get(name, [])
            or _type_at(table.schema[name].dataType, p) != _type_at(columns.types[name].dataType, p)
        ]
        for name, paths in stored.items()
        if name not in columns.json
    }
    retyped = {name: paths for name, paths in retyped.items() if paths}
    if retyped:
        (
            table.select(
                *[
                    _retyped(F.col(quoted(f.name)), f.dataType, columns.types[f.name].dataType, retyped[f.name]).alias(
                        f.name, metadata=untyped_comment(columns.untyped.get(f.name, []))
                    )
                    if f.name in retyped
                    else F.col(quoted(f.name))
                    for f in table.schema.fields
                ]
            )
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .save(location)
        )
    for name, paths in columns.untyped.items():
        comment = untyped_comment(paths)["comment"].replace("\\", "\\\\").replace("'", "\\'")
        if name not in table.columns:
            data_type = sql_type(columns.types[name].dataType)
            spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({quoted(name)} {data_type} COMMENT '{comment}')")
        elif name not in retyped and stored.get(name) != paths:
            spark.sql(f"ALTER TABLE delta.`{location}` ALTER COLUMN {quoted(name)} COMMENT '{comment}'")


def has_path(schema: StructType, path: str) -> bool:
    """Whether the refined table has the array at ``path`` yet; a ConfigError when it has something else there."""
    first, *rest = path.split(".")
    if first not in schema.names:
        return False
    current = schema[first].dataType
    for part in rest:
        if not isinstance(current, StructType) or part not in current.names:
            return False
        current = current[part].dataType
    array_element(schema, path)  # names the type that is not an array
    return True


def refine_mongo_batch(
    spark: SparkSession,
    records: DataFrame,
    *,
    refined: str,
    settings: TableSettings,
    quarantine_at: str,
    raw: str,
    topic: str,
    rules: TableRules,
    batch_id: int,
    children: dict[str, str],
    history_at: str | None,
) -> None:
    """Refine one batch of raw MongoDB connector records into the ``refined`` table (and the tables beside
    it, of the ``settings`` its job declares); documents are
    checked against the ``rules``' expectations first (deletes pass unchecked). ``children`` maps
    array paths to exploded child tables' locations; a path no document has had yet gives no children.
    With ``history_at``, every document state of the batch is a version in that history table."""
    exists = is_delta_table(spark, refined)
    table = DeltaTable.forPath(spark, refined).toDF() if exists else None
    data_columns = (  # untyped arrays as arrays of nulls, which any element type merges with
        StructType(
            [read_untyped(f) for f in table.schema.fields if f.name != ID and f.name not in MONGO_METADATA_COLUMNS]
        )
        if table is not None
        else StructType()
    )
    changes = parse_mongo_changes(records).persist()
    try:
        shapes = batch_shapes(changes)
        columns = column_types(data_columns, shapes)
        flagged = flag_misfits(changes, columns).persist()
        try:
            if columns.json:  # before the MERGE, which refuses a column whose type changed
                ensure_json_columns(spark, refined, settings, list(columns.json), "refined")
                if history_at is not None:
                    ensure_json_columns(spark, history_at, settings, list(columns.json), HISTORY_KIND)
            settle_untyped_arrays(spark, refined, settings, columns, "refined")
            if history_at is not None:
                settle_untyped_arrays(spark, history_at, settings, columns, HISTORY_KIND)
            # Read again: columns may have been added or converted (a table created above holds no document yet).
            if exists:
                add_nested_columns(spark, refined, data_columns, columns.types)
                table = DeltaTable.forPath(spark, refined).toDF()
            latest = latest_documents(flagged, columns, shapes, table).persist()
            try:
                quarantine(spark, quarantine_at, raw, topic, _mongo_problems(flagged, latest))
                if history_at is not None:  # before the MERGE: the states build on the table's rows as they were
                    _record_mongo_history(spark, history_at, settings, flagged, columns, shapes, table, rules)
                _merge_documents(spark, refined, settings, latest, columns, children, rules, batch_id)
            finally:
                latest.unpersist()
        finally:
            flagged.unpersist()
    finally:
        changes.unpersist()


def _mongo_problems(flagged: DataFrame, latest: DataFrame) -> DataFrame:
    """The batch's records that did not decode, and its updates carrying only updateDescription for a
    document the refined table does not hold, each with its problem."""
    orphans = (
        flagged.join(latest.where("orphan").select(ID), ID, "left_semi")
        .where(F.col("kind") == Kind.PATCH)
        .withColumn(
            "problem",
            F.lit("an update carrying only updateDescription, for a document the refined table does not hold"),
        )
    )
    problems = [
        df.select("kafka_partition", "kafka_offset", "raw_value", "problem")
        for df in (flagged.where("problem IS NOT NULL"), orphans)
    ]
    return problems[0].unionByName(problems[1])


def _record_mongo_history(
    spark: SparkSession,
    history_at: str,
    settings: TableSettings,
    flagged: DataFrame,
    columns: Columns,
    shapes: list[Shape],
    table: DataFrame | None,
    rules: TableRules,
) -> None:
    """Every document state of the batch as a version in the history table at ``history_at``."""
    if is_delta_table(spark, history_at):
        add_nested_columns(spark, history_at, DeltaTable.forPath(spark, history_at).toDF().schema, columns.types)
    states = latest_documents(flagged, columns, shapes, table, every=True)
    versions = debezium_versions(refined_documents(states, columns).drop(PARTITION))
    apply_history(
        spark,
        history_at,
        settings,
        rules.passing_versions(versions, F.col(OP) == Op.DELETE.value),
        debezium_history_spec([ID], list(POSITION)),
    )


def _merge_documents(
    spark: SparkSession,
    refined: str,
    settings: TableSettings,
    latest: DataFrame,
    columns: Columns,
    children: dict[str, str],
    rules: TableRules,
    batch_id: int,
) -> None:
    """MERGE the last document per ``_id`` that passes the ``rules`` into the ``refined`` table, and
    refresh the exploded arrays' child tables (a path no document has had yet gives no children). A
    child table is written from every document, in one overwrite, when it is new (documents refined
    before may hold elements) or when its columns' types changed (an untyped array, its elements only
    nulls so far, or one inside its elements, took a type)."""
    rows = refined_documents(latest, columns)
    with rules.enforced(spark, rows, [ID], batch_id, deleted=F.col(OP) == Op.DELETE.value) as passing:
        merge_changes(spark, refined, settings, passing.drop(PARTITION), [ID], None, POSITION, keys=latest.select(ID))
    stored = spark.read.format("delta").load(refined)  # as the MERGE left it
    for path, location in children.items():
        if path.split(".")[0] in columns.json:
            refresh_json_children(spark, refined, location, settings, latest.select(ID), path)
            continue
        if not has_path(stored.schema, path):
            continue
        every = child_rows(stored, [ID], path).withColumn(REFINED_AT, F.current_timestamp())
        exists = is_delta_table(spark, location)
        if exists and _same_types(spark.read.format("delta").load(location).schema, every.schema):
            refresh_children(spark, refined, location, settings, latest.select(ID), [ID], path)
            continue
        if not exists:
            ensure_refined_table(spark, location, settings, every.schema)
        every.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(location)


def _same_types(table: StructType, rows: StructType) -> bool:
    """Whether the columns ``table`` and ``rows`` both have are of the same types."""
    types = {f.name: f.dataType for f in table.fields}
    return all(types[f.name] == f.dataType for f in rows.fields if f.name in types)


def json_child_rows(parents: DataFrame, array_path: str) -> DataFrame:
    """One row per element of the array at ``array_path`` inside the parents' JSON-text column
    (pure DataFrame -> DataFrame): ``_id``, ``pos`` and ``value``, the element's JSON text (null for
    null). A document whose value there is not an array has none."""
    top, *rest = array_path.split(".")
    value = F.try_parse_json(F.col(f"`{top}`"))
    for part in rest:
        value = member(value, part)
    exploded = parents.select(ID, F.posexplode(F.try_variant_get(value, "$", "array<variant>")).alias(POS, "element"))
    return exploded.select(
        ID,
        POS,
        F.when(~is_null(F.col("element")), F.to_json("element")).alias(ELEMENT, metadata=JSON_TEXT_METADATA),
        F.current_timestamp().alias(REFINED_AT),
    )


def is_json_children(schema: StructType) -> bool:
    """Whether a child table holds its elements as JSON text (``value`` alone, a JSON-text column)."""
    elements = [f for f in schema.fields if f.name not in (ID, POS, REFINED_AT)]
    return len(elements) == 1 and elements[0].name == ELEMENT and is_json_text(elements[0])


def refresh_json_children(
    spark: SparkSession, refined: str, location: str, settings: TableSettings, keys: DataFrame, array_path: str
) -> None:
    """Make the child rows of ``keys`` (a batch's ids) the elements of the array at ``array_path``
    of their documents, whose top-level field is a JSON-text column (it drifted): each element's
    JSON text in ``value``. A child table whose elements were typed columns is rewritten first, from
    every document of the refined table, in one overwrite (the old version stays for time travel)."""
    stored = spark.read.format("delta").load(refined)
    if is_delta_table(spark, location) and is_json_children(spark.read.format("delta").load(location).schema):
        children = json_child_rows(stored.join(keys, ID, "left_semi"), array_path)
        replace_children(spark, location, settings, children, keys, [ID])
        return
    rows = json_child_rows(stored, array_path)
    if not is_delta_table(spark, location):
        ensure_refined_table(spark, location, settings, rows.schema)
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(location)
