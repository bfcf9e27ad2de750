"""MongoDB documents flattened by Debezium's ExtractNewDocumentState, as the connector's envelopes
(pure DataFrame -> DataFrame), so they are refined as documents (:mod:`refine.mongo.documents`).

The transform gives each row its own document's schema: a field's type is whatever that document
holds, and a nested field it lacks is absent. Refined as rows of one table, documents whose shapes
differ would stop the job or be quarantined; as documents, each field takes the type its values
share (JSON text when they drift). A row becomes the bare envelope ``{op, after, source}``: ``after``
the row's fields but the transform's ``__`` ones, as JSON; ``op`` its ``__op`` (``u`` without one),
``d`` when ``__deleted`` is true. A tombstone is a delete: with ``delete.tombstone.handling.mode=tombstone``
(the transform's default) it is the only sign of one. The Kafka offset alone orders a document's
changes (a tombstone has no source position), so a replayed change is applied again. The transform
keeps no BSON type, so the connector's envelopes and these rows key some ids otherwise (an ObjectId as
``{"$oid": ...}`` and as its hex text): a refined table takes one form, and a topic that switches is
refused. The key ``{"id": <value>}`` becomes the connector's ``{"id": "<JSON>"}``, so ids of different
types (``7``, ``"7"``) stay apart.

The rows are told from ExtractNewRecordState's (Postgres rows) by their key (:func:`unwrapped_documents`),
or by the job's ``connector`` setting.

An update the connector sent without its document (``capture.mode=change_streams``) becomes a row of
what changed, its paths dotted (``address.city``), and the removed fields and truncated arrays gone:
such a row (a field name with a dot) goes to the quarantine, as no document can be made of it. One
whose changes are all top-level fields cannot be told from a document.

What the transform loses stays lost: an ObjectId is its hex string, a decimal its text, a date its
epoch milliseconds, binary data its base64 text.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.core.errors import TableError
from cdc.core.tables import add_missing_properties, delta_properties, is_delta_table
from refine.mongo.documents import FOUND_PROBLEM, TS_MS
from refine.records.envelope import ConnectSchema
from refine.records.flattened import is_flattened
from refine.records.parse import VALUE_NOT_UTF8

DOCUMENT_ID, KEY_ID = "_id", "id"
# The refined table's mark: its topic holds ExtractNewDocumentState's rows, so a batch of tombstones
# alone (deletes, in the transform's default handling) is refined as documents too.
UNWRAPPED_PROPERTY = "cdc.mongodb.unwrapped"
# The fields the transform adds (``add.fields``: ``__op``, ``__ts_ms``, ``__source_*``...), not the document's.
_TRANSFORM_FIELDS = ("__deleted", "__op", "__ts_ms", "__collection", "__db")


def may_be_unwrapped_documents(value_schema: ConnectSchema) -> bool:
    """Whether rows of this schema may be ExtractNewDocumentState's (:func:`unwrapped_documents` tells):
    flattened, with an ``_id``, or a delete it rewrote (only the transform's fields, ``__deleted`` among
    them; ExtractNewRecordState's holds the row's columns)."""
    names = {field.field_name for field in value_schema.fields or ()}
    rewritten_delete = "__deleted" in names and all(name.startswith("__") for name in names)
    return is_flattened(value_schema) and (DOCUMENT_ID in names or rewritten_delete)


def unwrapped_documents() -> Column:
    """Whether a raw record (with or without its schema) is ExtractNewDocumentState's row: its key is the
    connector's ``{id}`` alone, and the value is a document whose ``_id`` equals it (a Postgres row keyed by
    ``id`` holds it as ``id``; one with an ``_id`` column has another key), or a delete it rewrote."""
    key, value = _payload(F.col("key")), _payload(F.col("value"))
    key_id = F.to_json(F.try_variant_get(key, f"$.{KEY_ID}", "variant"))
    connector_key = (F.size(F.map_keys(F.try_variant_get(key, "$", "map<string,variant>"))) == 1) & key_id.isNotNull()
    document_id = F.to_json(F.try_variant_get(value, f"$.{DOCUMENT_ID}", "variant"))
    row_id = F.to_json(F.try_variant_get(value, f"$.{KEY_ID}", "variant"))
    names = F.map_keys(F.try_variant_get(value, "$", "map<string,variant>"))
    rewritten_delete = F.array_contains(names, "__deleted") & F.forall(names, lambda name: name.startswith("__"))
    document = (document_id == key_id) & ~F.coalesce(row_id == key_id, F.lit(False))
    return connector_key & F.coalesce(document | rewritten_delete, F.lit(False))


def has_unwrapped_documents(records: DataFrame) -> bool:
    return not records.where(unwrapped_documents()).isEmpty()


def _payload(text: Column) -> Column:
    """The ``payload`` of a ``{schema, payload}`` wrapper, or the value itself (a variant)."""
    parsed = F.try_parse_json(text)
    return F.coalesce(F.try_variant_get(parsed, "$.payload", "variant"), parsed)


def as_mongo_envelopes(records: DataFrame) -> DataFrame:
    """``records`` (raw rows) with each ExtractNewDocumentState row's ``value`` and ``key`` as the
    MongoDB connector's bare envelope and key (see the module's doc), a tombstone as a delete; a value
    that is no JSON object is left as it is (the envelope parser quarantines it)."""
    row = _payload(F.col("value"))
    fields = F.try_variant_get(row, "$", "map<string,variant>")
    document = F.map_filter(fields, lambda name, _: ~(name.isin(*_TRANSFORM_FIELDS) | name.startswith("__source_")))
    not_utf8 = F.col("value_bytes").isNotNull() if "value_bytes" in records.columns else F.lit(False)
    tombstone = F.col("value").isNull() & ~not_utf8
    deleted = tombstone | F.coalesce(F.try_variant_get(row, "$.__deleted", "boolean"), F.lit(False))
    op = F.when(deleted, F.lit("d")).otherwise(F.coalesce(F.try_variant_get(row, "$.__op", "string"), F.lit("u")))
    # No source position: the Kafka offset orders the changes. Their commit time is __source_ts_ms
    # (add.fields=source.ts_ms), else the Kafka record's timestamp (Kafka Connect's, when it sent it).
    committed = F.try_variant_get(row, "$.__source_ts_ms", "bigint")
    if "timestamp" in records.columns:
        committed = F.coalesce(committed, F.unix_millis("timestamp"))
    source = F.struct(
        F.lit(0).alias("ts_ms"),
        F.lit(0).alias("ord"),
        committed.alias("committed_ts_ms"),
        F.lit("mongodb").alias("connector"),
    )
    envelope = F.to_json(
        F.struct(
            op.alias("op"),
            F.when(~deleted, F.to_json(document)).alias("after"),
            source.alias("source"),
        )
    )
    key_id = F.try_variant_get(_payload(F.col("key")), f"$.{KEY_ID}", "variant")
    key = F.to_json(F.struct(F.to_json(key_id).alias(KEY_ID)))
    dotted = F.exists(F.map_keys(document), lambda name: name.contains("."))
    problem = F.when(not_utf8, F.lit(VALUE_NOT_UTF8)).when(
        dotted & (op == "u"),
        F.lit(
            "an ExtractNewDocumentState row of an update without its document (capture.mode=change_streams): "
            "its removed fields and truncated arrays are lost; capture with change_streams_update_full"
        ),
    )
    return records.withColumns(
        {
            "value": F.when(problem.isNull() & (fields.isNotNull() | tombstone), envelope).otherwise(F.col("value")),
            "key": F.when(key_id.isNotNull(), key).otherwise(F.col("key")),
            FOUND_PROBLEM: problem,
        }
    )


class UnwrappedMark:
    """Whether a ``refined`` table was refined from ExtractNewDocumentState's rows: its mark, a table
    property read once by the job that refines it (one object per table, which the job owns).

    Example::

        mark = UnwrappedMark("/data/warehouse/refined/inventory")
        if not mark.is_set(spark):
            mark.set(spark)  # once the table exists
    """

    def __init__(self, refined: str) -> None:
        self.refined = refined
        self._marked: bool | None = None  # not read yet

    def is_set(self, spark: SparkSession) -> bool:
        """Whether the table is marked (False while it does not exist)."""
        if self._marked is None:
            if not is_delta_table(spark, self.refined):
                return False
            self._marked = UNWRAPPED_PROPERTY in delta_properties(spark, self.refined)
        return self._marked

    def set(self, spark: SparkSession) -> None:
        """Mark the table (once it exists)."""
        if not self.is_set(spark) and is_delta_table(spark, self.refined):
            add_missing_properties(spark, self.refined, {UNWRAPPED_PROPERTY: "true"})
            self._marked = True

    def refuse_envelopes(self, spark: SparkSession) -> None:
        """Raise :class:`TableError` when the table was refined from ExtractNewDocumentState's rows: the
        connector's envelopes now in its topic key some ids otherwise (an ObjectId as ``{"$oid": ...}``,
        not its hex text), so their documents would be rows of their own."""
        if self.is_set(spark):
            refuse_mixed_forms(
                self.refined, "was refined from ExtractNewDocumentState's rows, and now holds the connector's envelopes"
            )

    def refuse_rows(self, spark: SparkSession) -> None:
        """Raise :class:`TableError` when the table holds documents refined from the connector's envelopes
        (a source position) and is not marked: ExtractNewDocumentState's rows key some ids otherwise."""
        unmarked = is_delta_table(spark, self.refined) and not self.is_set(spark)
        if unmarked and not spark.read.format("delta").load(self.refined).where(F.col(TS_MS) > 0).isEmpty():
            refuse_mixed_forms(
                self.refined,
                "was refined from the connector's envelopes, and now holds ExtractNewDocumentState's rows",
            )


def refuse_mixed_forms(refined: str, what: str) -> None:
    raise TableError(
        f"the topic {what}: the transform keeps no BSON type, so the two key some documents otherwise "
        '(an ObjectId\'s hex text, not {"$oid": ...}) and a document would be two; refine each form from a '
        "topic of its own",
        table=refined,
    )
