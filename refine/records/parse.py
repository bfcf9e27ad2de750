"""Raw rows of a Debezium Postgres topic as typed change rows (pure DataFrame -> DataFrame).

Each output row is one Kafka record: its operation, the decoded key, the decoded ``before`` and
``after`` row images, its source position and its Kafka coordinates. A record that cannot be
parsed, or one of whose values cannot be decoded, keeps its raw value and gets a ``problem``
naming the field and the reason, for the quarantine, instead of being dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from refine.records.decode import decode, decoded_type, json_type, undecodable
from refine.records.envelope import TOMBSTONE, ConnectSchema, ConnectType, Op

# JsonConverter writes its wrapper as {"schema":<schema>,"payload":<payload>}, in this order and
# without spaces. The schema is most of a record's bytes and the same in record after record: once a
# batch's schema texts are known (:func:`wrapper_schemas`), a value that starts with one of them is
# cut there, and only its payload is parsed as JSON. Finding the payload by searching the text for
# its mark would cost more than the parse (Spark's string search is byte by byte); comparing a known
# prefix is a memory compare. A value written any other way (spaces, another key order) is parsed
# whole. (A schema cannot contain the payload mark: quotes inside its strings are escaped.)
_WRAPPER_START, _PAYLOAD_MARK = '{"schema":', ',"payload":'
# The problem of a record whose wrapper schema is not among those a parser was built for, when it
# parses only those (``only_schemas``).
OTHER_SCHEMA = "the record's schema is not among the batch's"
# from_json's column for a record that does not match the type it is read as: null for every good
# record, so the check costs nothing on them; the field that did not match is then looked for in the
# record's JSON (:func:`mismatched_field`) for the bad ones only.
UNPARSED = "__cdc_unparsed"
_UNPARSED_OPTIONS = {"columnNameOfCorruptRecord": UNPARSED}
# Passes that each find one new schema, before the rest are grouped in one (slower) pass.
_DISCOVERY_PASSES = 4

# A record's problem, for the quarantine.
# Debezium sends logical decoding messages (pg_logical_emit_message) to a topic of their own, never a table's:
# one on a table's topic carries no row, and applied it would empty the row of its key.
MESSAGE_ON_A_TABLE_TOPIC = (
    "op m: a logical decoding message, which Debezium sends to its own topic (<topic.prefix>.message), not a table's"
)
VALUE_NOT_UTF8 = "value is not UTF-8 text (its bytes are in the raw table's value_bytes)"


def _wrapper_prefix(schema_text: str) -> str:
    return f"{_WRAPPER_START}{schema_text}{_PAYLOAD_MARK}"


def compact_wrapper_schema(text: Column) -> Column:
    """The ``schema`` of JsonConverter's compact ``{schema, payload}`` wrapper, as JSON text; null for
    any other text."""
    head = F.substring_index(text, _PAYLOAD_MARK, 1)
    compact = text.startswith(_WRAPPER_START) & (F.length(head) < F.length(text)) & text.endswith("}")
    return F.when(compact, head.substr(F.lit(len(_WRAPPER_START) + 1), F.length(head)))


def wrapped_schema(text: Column) -> Column:
    """The ``schema`` of JsonConverter's ``{schema, payload}`` wrapper, as JSON text (found by
    searching: for the few records whose schema is not known yet)."""
    return F.coalesce(compact_wrapper_schema(text), F.get_json_object(text, "$.schema"))


def first_wrapper_schemas(records: DataFrame) -> dict[str, list[str]] | None:
    """The wrapper schemas (JSON texts) of the first record that has a value: ``{"value": [text],
    "key": [text] or []}`` (no key schema for a null key, or one written without a wrapper); None when
    that value is not a compact wrapper. A guess for a whole batch, as most hold one schema: see
    :class:`ChangeParser`'s ``only_schemas``."""
    first = (
        records.where(F.col("value").isNotNull())
        .select(
            compact_wrapper_schema(F.col("value")).alias("value"),
            compact_wrapper_schema(F.col("key")).alias("key"),
        )
        .first()
    )
    if first is None or first.value is None:
        return None
    return {"value": [first.value], "key": [first.key] if first.key is not None else []}


def wrapper_schemas(records: DataFrame, known: dict[str, Sequence[str]]) -> dict[str, list[str]]:
    """The distinct wrapper schemas (JSON texts) of each column of ``known`` (``key``, ``value``) in
    ``records``, ordered by where each first appears (Kafka partition, offset). ``known``: the
    schemas seen before (earlier batches).

    A pass over the records tells which known schemas they hold and where the first value of
    none of them is; that one value's schema is read, and the pass repeated. Values that are no
    compact wrapper (spaces, another key order, not JSON) are grouped by their schema in a last pass.
    """
    position = F.struct("partition", "offset")
    candidates = {column: list(dict.fromkeys(schemas)) for column, schemas in known.items()}
    found: dict[str, list[str]] = {}
    for _ in range(_DISCOVERY_PASSES):
        unmatched, firsts = {}, []
        for column, schemas in candidates.items():
            text = F.col(column)
            matches = [text.startswith(_wrapper_prefix(schema)) for schema in schemas]
            unmatched[column] = text.isNotNull() & ~reduce(Column.__or__, matches, F.lit(False))
            firsts.append(
                F.struct(
                    F.min(F.when(unmatched[column], position)).alias("unmatched"),
                    F.array(*[F.min(F.when(match, position)) for match in matches]).alias("known"),
                ).alias(column)
            )
        row = records.agg(*firsts).collect()[0]
        searching = {}
        for column, schemas in candidates.items():
            at = {schema: first for schema, first in zip(schemas, row[column].known, strict=True) if first is not None}
            if (first := row[column].unmatched) is None:
                found[column] = sorted(at, key=at.__getitem__)
            else:
                searching[column] = (first, at)
        if not searching:
            return found
        stuck = False
        for column, (first, _) in searching.items():
            at_first = (F.col("partition") == first.partition) & (F.col("offset") == first.offset)
            schema = records.where(at_first).select(wrapped_schema(F.col(column))).head(1)[0][0]  # the record is there
            if schema is None or schema in candidates[column]:
                stuck = True  # not a compact wrapper
            else:
                candidates[column].append(schema)
        if stuck:
            break
    for column, (_, at) in searching.items():  # the values left, grouped by their schema
        grouped = records.where(unmatched[column]).groupBy(wrapped_schema(F.col(column)).alias("schema"))
        for group in grouped.agg(F.min(position).alias("at")).where("schema IS NOT NULL").collect():
            at[group.schema] = min(group.at, at.get(group.schema, group.at))
        found[column] = sorted(at, key=at.__getitem__)
    return found


def with_unparsed(data_type: StructType) -> StructType:
    """``data_type`` with :data:`UNPARSED`, where ``from_json`` (with :data:`_UNPARSED_OPTIONS`) keeps
    the text of a record that does not match it."""
    return StructType([*data_type.fields, StructField(UNPARSED, StringType())])


def read_json(text: Column, schema: ConnectSchema) -> Column:
    """``text`` (JSON without the wrapper) read as ``schema``, with :data:`UNPARSED` when it is a struct."""
    data_type = json_type(schema)
    if not isinstance(data_type, StructType):
        # (from_json takes any DataType: pyspark's annotation is too narrow)
        return F.from_json(text, data_type)  # type: ignore[arg-type]
    return F.from_json(text, with_unparsed(data_type), _UNPARSED_OPTIONS)


def wrapped_payload(
    text: Column, schema: ConnectSchema, schema_texts: Sequence[str] = (), unparsed: bool = False
) -> Column:
    """The ``payload`` of JsonConverter's ``{schema, payload}`` wrapper, read as ``schema``;
    ``schema_texts``: the batch's wrapper schemas (:func:`wrapper_schemas`), whose values are cut
    after them instead of being parsed whole. ``unparsed``: with :data:`UNPARSED` (a struct
    ``schema``), the text of a record that does not match it."""
    payload_type = json_type(schema)
    if unparsed and isinstance(payload_type, StructType):
        return _wrapped_payload_and_unparsed(text, payload_type, schema_texts)
    payload_text = _cut_payload(text, schema_texts)
    wrapper = StructType([StructField("payload", payload_type)])
    # from_json stops at the end of the payload's object: the wrapper's closing brace is not read.
    # (from_json takes any DataType: pyspark's annotation is too narrow)
    return F.when(payload_text.isNotNull() & text.endswith("}"), F.from_json(payload_text, payload_type)).otherwise(  # type: ignore[arg-type]
        F.from_json(text, wrapper)["payload"]
    )


def _wrapped_payload_and_unparsed(text: Column, payload_type: StructType, schema_texts: Sequence[str]) -> Column:
    payload_text = _cut_payload(text, schema_texts)
    whole = F.from_json(
        text, StructType([StructField("payload", payload_type), StructField(UNPARSED, StringType())]), _UNPARSED_OPTIONS
    )
    # Never null for a value: a wrapper without a payload, or no JSON at all, is told by UNPARSED.
    whole = F.when(
        whole.isNotNull(),
        F.struct(*[whole["payload"][name].alias(name) for name in payload_type.names], whole[UNPARSED].alias(UNPARSED)),
    )
    return F.when(
        payload_text.isNotNull() & text.endswith("}"),
        F.from_json(payload_text, with_unparsed(payload_type), _UNPARSED_OPTIONS),
    ).otherwise(whole)


def _cut_payload(text: Column, schema_texts: Sequence[str]) -> Column:
    """The text after the compact wrapper prefix of one of ``schema_texts``; null for any other."""
    payload_text = F.lit(None).cast("string")
    for schema_text in schema_texts:
        prefix = _wrapper_prefix(schema_text)
        # Cut as bytes: a string's substring counts characters from its start, a cost per record.
        payload = text.cast("binary").substr(len(prefix.encode()) + 1, 2**31 - 1).cast("string")
        payload_text = F.when(text.startswith(prefix), payload).otherwise(payload_text)
    return payload_text


def _json_at(value: Column, path: Sequence[str]) -> Column:
    return F.try_variant_get(value, "$" + "".join("['" + name.replace("'", "\\'") + "']" for name in path), "variant")


def _connect_type(schema: ConnectSchema) -> str:
    return f"{schema.name} ({schema.type.value})" if schema.name else schema.type.value


def mismatched_field(text: Column, parsed: str, schema: ConnectSchema, at: Sequence[str], label: str) -> Column:
    """Where the JSON ``text`` (a record ``from_json`` found :data:`UNPARSED`) holds a value that did not
    read as ``schema`` (a struct) says: ``field <label><name>: cannot read <JSON> as <Connect type>``
    for the first such field (top level first, then one level into structs); null when none is found.
    ``at``: the path of the struct in ``text`` (``payload`` in a wrapper). The JSON is parsed here, so
    only for the records that did not match."""
    json = F.try_parse_json(text)
    reason = None
    levels = [[(field, [field.field_name], F.col(parsed)[field.field]) for field in schema.fields or ()]]
    levels.append(
        [
            (child, [field.field_name, child.field_name], F.col(parsed)[field.field][child.field])
            for field in schema.fields or ()
            if field.type == ConnectType.STRUCT
            for child in field.fields or ()
        ]
    )
    for level in levels:
        for field, path, value in level:
            found = _json_at(json, [*at, *path])
            mismatch = value.isNull() & found.isNotNull() & ~F.is_variant_null(found)
            message = F.concat(
                F.lit(f"field {label}{'.'.join(path)}: cannot read "),
                F.to_json(found),
                F.lit(f" as {_connect_type(field)}"),
            )
            reason = F.when(mismatch, message) if reason is None else reason.when(mismatch, message)
    return reason if reason is not None else F.lit(None).cast("string")


def refused_schema(text: Column, refused: dict[str, str]) -> Column | None:
    """The reason ``refused`` gives (by wrapper schema text) for the schema of ``text``; None when none are refused."""
    reason = None
    for schema_text, why in refused.items():
        match = text.startswith(_wrapper_prefix(schema_text)) | (wrapped_schema(text) == F.lit(schema_text))
        reason = F.when(match, F.lit(why)) if reason is None else reason.when(match, F.lit(why))
    return reason


def has_schema(text: Column, schema_text: str) -> Column:
    """``text`` is the compact wrapper of the schema ``schema_text``."""
    return text.startswith(_wrapper_prefix(schema_text))


# Of a keyless table's parsed changes: the index of the value schema its record carries among the batch's
# (null for a value that is no compact wrapper of one of them).
VALUE_SCHEMA = "_value_schema"


def schema_index(text: Column, schema_texts: Sequence[str]) -> Column:
    """The index in ``schema_texts`` of the schema whose compact wrapper ``text`` is (null: none's)."""
    if not schema_texts:
        return F.lit(None).cast("int")
    first, *others = schema_texts
    index = F.when(has_schema(text, first), F.lit(0))
    for number, schema_text in enumerate(others, start=1):
        index = index.when(has_schema(text, schema_text), F.lit(number))
    return index


def _has_one_of(text: Column, schema_texts: Sequence[str]) -> Column:
    """``text`` is the compact wrapper of one of ``schema_texts``; without any, it is no wrapper at all
    (the schemas of a batch hold none for keys written without one: a keyless table's)."""
    if not schema_texts:
        return ~text.startswith(_WRAPPER_START)
    return reduce(Column.__or__, [text.startswith(_wrapper_prefix(schema_text)) for schema_text in schema_texts])


def of_known_schemas(schema_texts: Mapping[str, Sequence[str]]) -> Column:
    """Whether a record's ``value`` and ``key`` are each null or the compact wrapper of one of its
    column's ``schema_texts`` (a key without any: no wrapper at all)."""
    return reduce(
        Column.__and__,
        [
            F.col(column).isNull() | _has_one_of(F.col(column), schema_texts.get(column, ()))
            for column in ("value", "key")
        ],
    )


def with_other_schemas(known: Column) -> Column:
    """The start of a ``problem`` column: :data:`OTHER_SCHEMA` where not ``known``
    (:func:`of_known_schemas`), so that the batch is parsed again rather than decoded wrongly."""
    return F.when(~known, F.lit(OTHER_SCHEMA))


def record_columns() -> list[Column]:
    """A raw record's value and Kafka coordinates, as every parsed change keeps them."""
    return [
        F.col("value"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("headers").alias("kafka_headers"),
    ]


def with_byte_columns(raw: DataFrame) -> DataFrame:
    """``raw`` with ``key_bytes`` and ``value_bytes`` (null where the raw table predates them)."""
    missing = [column for column in ("key_bytes", "value_bytes") if column not in raw.columns]
    return raw.withColumns({column: F.lit(None).cast("binary") for column in missing}) if missing else raw


def text_columns() -> list[Column]:
    """Whether a raw record's value and key were not UTF-8 (the raw table keeps their bytes apart, and
    its ``value``/``key`` null), and its key's text: what :func:`record_problems` and
    :func:`key_problems` read."""
    return [
        F.col("value_bytes").isNotNull().alias("value_not_utf8"),
        F.col("key_bytes").isNotNull().alias("key_not_utf8"),
        F.col("key").alias("key_text"),
    ]


def record_problems(refused: Mapping[str, Mapping[str, str]]) -> Column:
    """The start of a ``problem`` column for a record's own faults, before its content is read: a schema
    not among those parsed with (:func:`with_other_schemas`), a value or key that is not UTF-8, and a
    wrapper schema ``refused`` (by column, ``value``/``key``: schema text -> why). Reads
    ``schema_known`` and :func:`text_columns`."""
    problem = (
        with_other_schemas(F.col("schema_known"))
        .when(F.col("value_not_utf8"), F.lit(VALUE_NOT_UTF8))
        .when(F.col("key_not_utf8"), F.lit("key is not UTF-8 text (its bytes are in the raw table's key_bytes)"))
    )
    for column, text in (("value", "value"), ("key", "key_text")):
        if (reason := refused_schema(F.col(text), dict(refused.get(column, {})))) is not None:
            problem = problem.when(reason.isNotNull(), reason)
    return problem


def required_field_problems(
    problem: Column, row: str, row_schema: ConnectSchema, label: str = "", when: Column | None = None
) -> Column:
    """``problem`` extended with a field of struct column ``row`` that is null where ``row_schema`` says it
    is not optional (only ``when``, if given)."""
    checked = F.col(row).isNotNull() if when is None else F.col(row).isNotNull() & when
    for field in row_schema.fields or ():
        if not field.optional:
            problem = problem.when(
                checked & F.col(f"{row}.`{field.field}`").isNull(),
                F.lit(f"field {label}{field.field}: null, and the schema says it is not optional"),
            )
    return problem


def decoding_problems(problem: Column, raw: str, decoded: str, row_schema: ConnectSchema, label: str = "") -> Column:
    """``problem`` extended with the first field of struct column ``raw`` that did not decode into ``decoded``."""
    for field in row_schema.fields or ():
        problem = problem.when(
            undecodable(F.col(f"{raw}.`{field.field}`"), F.col(f"{decoded}.`{field.field}`")),
            F.lit(f"field {label}{field.field}: cannot decode the value as {decoded_type(field).simpleString()}"),
        )
    return problem


def change_columns(
    before: Column,
    after: Column,
    source_lsn: Column,
    last_commit_lsn: Column,
    committed_at: Column,
    problem: Column,
    snapshot_marker: Column | None = None,
) -> list[Column | str]:
    """The columns of a parsed change, in order, from a frame that has ``op``, ``key``, ``value``
    and :func:`record_columns`: what every parser of Postgres changes returns.

    ``last_commit_lsn`` is the LSN of the last commit Debezium streamed before the change's transaction
    (the first LSN of ``source.sequence``; null before the connector's first commit, and where the
    form carries none). Debezium streams transactions in commit order, so it orders changes of different
    transactions as they were streamed, where their own LSNs interleave (see :mod:`refine.apply.keyless`).

    ``snapshot_marker`` is a read's ``source.snapshot`` (:func:`snapshot_marker`). ``source_snapshot_start`` is
    true for the first read of a snapshot of the table: the table is read whole again from there, so it resets
    the table as a truncate does. ``source_snapshot_end`` is true for its last read, which may be its only one
    (see :func:`refine.apply.latest.lone_snapshot_reads`)."""
    return [
        "op",
        "key",
        before.alias("before"),
        after.alias("after"),
        source_lsn.alias("source_lsn"),
        last_commit_lsn.alias("source_last_commit_lsn"),
        _marked(snapshot_marker, SNAPSHOT_START_MARKERS).alias("source_snapshot_start"),
        _marked(snapshot_marker, SNAPSHOT_END_MARKERS).alias("source_snapshot_end"),
        committed_at.alias("source_committed_at"),
        "kafka_partition",
        "kafka_offset",
        "kafka_headers",
        problem.alias("problem"),
        F.col("value").alias("raw_value"),
    ]


def last_commit_lsn(envelope_schema: ConnectSchema) -> Column:
    """The first LSN of Debezium's ``source.sequence``, the JSON text ``["<last commit LSN>","<LSN>"]``
    (null where the envelope's schema has no ``sequence``, as before Debezium 1.4)."""
    source = envelope_schema.field_named("source")
    if not any(field.field == "sequence" for field in source.fields or ()):
        return F.lit(None).cast("long")
    return F.get_json_object(F.col("envelope.source.sequence"), "$[0]").try_cast("long")  # JSON null: text null


# source.snapshot of the first read of a table's snapshot: the snapshot's very first record, or the first
# of a later table in it; of the last read: the snapshot's very last record, or the last of a table in it.
# A table of one row has one read, marked as a last (or "first", as the snapshot's first table); an empty
# one no record.
SNAPSHOT_START_MARKERS = ("first", "first_in_data_collection")
SNAPSHOT_END_MARKERS = ("last", "last_in_data_collection")


def snapshot_marker(envelope_schema: ConnectSchema) -> Column | None:
    """A snapshot read's ``source.snapshot`` marker (null for other changes; None where the schema has no string
    ``snapshot``, as before Debezium 1.x)."""
    source = envelope_schema.field_named("source")
    marker = next((field for field in source.fields or () if field.field == "snapshot"), None)
    if marker is None or marker.type != ConnectType.STRING:
        return None
    return F.when(F.col("envelope.op") == Op.READ.value, F.col("envelope.source.snapshot"))


def _marked(marker: Column | None, markers: tuple[str, ...]) -> Column:
    return F.lit(False) if marker is None else F.coalesce(marker.isin(*markers), F.lit(False))


class ChangeParser:
    """:func:`parse_changes` for one key schema, value schema and set of wrapper schema texts.

    Its expressions are built once and applied to each batch that has those schemas: building
    them (a few hundred JVM calls for a table with decimals) cost ~1 s per refine micro-batch.
    """

    def __init__(
        self,
        key_schema: ConnectSchema | None,
        value_schema: ConnectSchema,
        wrapped: bool = True,
        schema_texts: dict[str, Sequence[str]] | None = None,
        only_schemas: bool = False,
        refused_schemas: dict[str, dict[str, str]] | None = None,
    ) -> None:
        texts, refused = schema_texts or {}, refused_schemas or {}

        def read(column: str, schema: ConnectSchema) -> Column:
            if not wrapped:
                return read_json(F.col(column), schema)
            return wrapped_payload(F.col(column), schema, texts.get(column, ()), unparsed=True)

        row_schema = value_schema.field_named("after")
        self._envelopes: list[str | Column] = [
            *record_columns(),
            *text_columns(),
            read("value", value_schema).alias("envelope"),
            (read("key", key_schema) if key_schema else F.lit(None)).alias("raw_key"),
        ]
        self._envelopes.append((of_known_schemas(texts) if only_schemas else F.lit(True)).alias("schema_known"))
        op = F.when(F.col("value").isNull() & ~F.col("value_not_utf8"), F.lit(TOMBSTONE)).otherwise(
            F.col("envelope.op")
        )
        self._decoded: list[str | Column] = [
            "*",
            op.alias("op"),
            (decode(F.col("raw_key"), key_schema) if key_schema else F.lit(None)).alias("key"),
            decode(F.col("envelope.before"), row_schema).alias("before"),
            decode(F.col("envelope.after"), row_schema).alias("after"),
        ]
        known_ops = [member.value for member in Op] + [TOMBSTONE]
        at = ["payload"] if wrapped else []
        problem = record_problems(refused)
        unparsed = F.col(f"envelope.{UNPARSED}")
        problem = (
            problem.when(
                F.col("value").isNotNull() & F.col("envelope").isNull(), F.lit("value is not a Debezium JSON envelope")
            )
            .when(
                unparsed.isNotNull(),
                F.coalesce(
                    mismatched_field(F.col("value"), "envelope", value_schema, at, ""),
                    F.lit("value is not a Debezium JSON envelope"),
                ),
            )
            .when(
                ~F.col("op").isin(*known_ops) | F.col("op").isNull(),
                F.concat(F.lit("unknown op "), F.coalesce("op", F.lit("null"))),
            )
            .when(F.col("op") == Op.MESSAGE.value, F.lit(MESSAGE_ON_A_TABLE_TOPIC))
        )
        if key_schema is not None and isinstance(json_type(key_schema), StructType):
            problem = key_problems(problem, key_schema, at)
        problem = problem.when(
            F.col("op").isin(*_ROW_OPS) & F.col("envelope.after").isNull(),
            F.concat(F.lit("field after: missing in a change of op "), F.col("op")),
        )
        problem = required_field_problems(problem, "envelope.after", row_schema, "after.")
        if key_schema is not None:
            problem = key_image_problems(
                problem,
                key_schema,
                [
                    (F.col("op").isin(*_ROW_OPS), "after", "after."),
                    (F.col("op") == Op.DELETE.value, "before", "before."),
                ],
            )
        for image in ("before", "after"):
            problem = decoding_problems(problem, f"envelope.{image}", image, row_schema, f"{image}.")
        self._changes = change_columns(
            F.col("before"),
            F.col("after"),
            F.col("envelope.source.lsn"),
            last_commit_lsn(value_schema),
            F.timestamp_millis(F.col("envelope.source.ts_ms")),
            problem,
            snapshot_marker(value_schema),
        )

    def __call__(self, raw: DataFrame) -> DataFrame:
        """Typed changes from raw rows (columns of :data:`cdc.raw.table.RAW_SCHEMA`)."""
        return with_byte_columns(raw).select(*self._envelopes).select(*self._decoded).select(*self._changes)


# Changes whose row is ``after``.
_ROW_OPS = (Op.READ.value, Op.CREATE.value, Op.UPDATE.value)


def key_problems(problem: Column, key_schema: ConnectSchema, at: list[str]) -> Column:
    """``problem`` extended with a key (``raw_key``, read from ``key_text`` by :func:`wrapped_payload` with
    ``unparsed``) that is no JSON of ``key_schema``, or misses a required field."""
    unparsed = F.col(f"raw_key.{UNPARSED}")
    problem = problem.when(
        F.col("key_text").isNotNull() & F.col("raw_key").isNull(),
        F.lit("key is not a Debezium JSON key of the table's key schema"),
    ).when(
        unparsed.isNotNull(),
        F.coalesce(
            mismatched_field(F.col("key_text"), "raw_key", key_schema, at, "key."),
            F.lit("key is not a Debezium JSON key of the table's key schema"),
        ),
    )
    for field in key_schema.fields or ():
        if not field.optional:
            problem = problem.when(
                F.col("raw_key").isNotNull() & F.col(f"raw_key.`{field.field}`").isNull(),
                F.lit(f"field key.{field.field}: null, and the schema says it is not optional"),
            )
    return problem


def key_image_problems(problem: Column, key_schema: ConnectSchema, images: Sequence[tuple[Column, str, str]]) -> Column:
    """``problem`` extended with a key (the decoded ``key``) that is not that of the change's row: for each
    of ``images``, (when, the decoded row's column, its label in the reason), the row's key columns
    (changes are applied by key)."""
    for field in key_schema.fields or ():
        name = field.field
        key = F.col(f"key.`{name}`")
        for when, image, label in images:
            row = F.col(f"{image}.`{name}`")
            differs = when & F.col(image).isNotNull() & ~key.eqNullSafe(row)
            problem = problem.when(
                differs,
                F.concat(
                    F.lit(f"field key.{name}: "),
                    F.coalesce(key.cast("string"), F.lit("null")),
                    F.lit(f" is not the row's {label}{name}, "),
                    F.coalesce(row.cast("string"), F.lit("null")),
                ),
            )
    return problem


def parse_changes(
    raw: DataFrame,
    key_schema: ConnectSchema | None,
    value_schema: ConnectSchema,
    wrapped: bool = True,
    schema_texts: dict[str, Sequence[str]] | None = None,
    only_schemas: bool = False,
    refused_schemas: dict[str, dict[str, str]] | None = None,
) -> DataFrame:
    """Typed changes from raw rows (columns of :data:`cdc.raw.table.RAW_SCHEMA`).

    ``value_schema`` is the envelope's Connect schema (``before``, ``after``, ``source``, ``op``...),
    ``key_schema`` the key's (None for a table without a primary key, whose keys are null);
    ``wrapped``: key and value are JsonConverter's ``{schema, payload}`` (else the payload alone);
    ``schema_texts``: the batch's wrapper schemas by column (``key``, ``value``), see :func:`wrapped_payload`;
    ``only_schemas``: a record (key or value) that is no compact wrapper of one of them gets the problem
    :data:`OTHER_SCHEMA` (``schema_texts`` was a guess, and the batch is to be parsed again);
    ``refused_schemas``: by column, wrapper schema texts the batch cannot be read with, and why: their
    records get that problem.

    A record that does not match the schemas (a value where the schema says another type, a required
    field null, a key that is not its row's) gets a problem naming the field.
    """
    return change_parser(key_schema, value_schema, wrapped, schema_texts, only_schemas, refused_schemas)(raw)


# Parsers by schemas, least recently used first, for the life of the process: a refine run's next
# micro-batch, a later `--available-now` run, a pipeline's next refresh or a rerun in the same
# process reuses them (building one took ~1.4 s of a ~5 s refine run of 10 changes).
_PARSERS: dict[tuple, ChangeParser] = {}
_PARSERS_KEPT = 64
_PARSERS_LOCK = threading.Lock()  # a pipeline runs several refine queries at once


def change_parser(
    key_schema: ConnectSchema | None,
    value_schema: ConnectSchema,
    wrapped: bool = True,
    schema_texts: dict[str, Sequence[str]] | None = None,
    only_schemas: bool = False,
    refused_schemas: dict[str, dict[str, str]] | None = None,
) -> ChangeParser:
    """The :class:`ChangeParser` of these schemas, built on first use and kept."""
    schemas = (
        key_schema and key_schema.model_dump_json(),
        value_schema.model_dump_json(),
        wrapped,
        tuple((column, tuple(seen)) for column, seen in sorted((schema_texts or {}).items())),
        only_schemas,
        tuple((column, tuple(sorted(why.items()))) for column, why in sorted((refused_schemas or {}).items())),
    )
    with _PARSERS_LOCK:
        parser = _PARSERS.pop(schemas, None) or ChangeParser(
            key_schema, value_schema, wrapped, schema_texts, only_schemas, refused_schemas
        )
        _PARSERS[schemas] = parser  # now the most recently used
        while len(_PARSERS) > _PARSERS_KEPT:
            _PARSERS.pop(next(iter(_PARSERS)))
        return parser
