"""Tables without a primary key (``REPLICA IDENTITY FULL``): refined as multisets of rows.

Such a table may hold equal rows, Debezium sends them with null Kafka keys, and ``before`` holds the
whole old row. So a row is known only by its image: the refined table holds as many equal rows as
the source, told apart by ``_cdc_row_hash`` (SHA-256 of the image's JSON) and ``_cdc_copy``
(1..n among equal rows). A create or snapshot read adds one copy of ``after``; a delete removes one
copy of ``before``; an update does both. Per batch the changes are summed per image (insert, update,
delete of equal rows commute), and the MERGE adds copies n+1..n+k or removes the highest ones.

Adding and removing copies is not idempotent by itself, so each change must apply exactly once:

- the side table ``<warehouse>/_cdc/applied/<topic>`` keeps the stream position of the last change
  applied and a batch counter; changes at or before it are left out. The stream position is not the
  change's LSN: Postgres writes the changes of concurrent transactions to its log interleaved, and
  Debezium streams each transaction whole when it commits, so a transaction that wrote first and
  committed last comes later with lower LSNs. It is (the LSN of the last commit streamed before the
  change's transaction, from ``source.sequence``; the LSN itself, then the Kafka offset), which grows
  as Debezium streams. Every streamed change has an LSN of its own, so a replayed copy (same position
  but a later offset) is recognised; snapshot reads share one LSN and are told apart by offset (a copy
  of a snapshot read is not recognised, but a new snapshot's first read resets the table, as a truncate
  does: see :func:`refine.apply.latest.from_snapshot_start`). Before the connector's first commit Debezium gives no last
  commit, and the change's own LSN stands in: so a first transaction that began before the snapshot
  and is refined in a later batch than it would be taken for a replay (not seen so far, and one
  transaction in a connector's life);
- the MERGE is committed with Delta's idempotent-DML settings (``txnAppId``/``txnVersion`` = the
  next batch counter): after a crash between the MERGE and the side table's update, the replayed
  batch's MERGE is skipped by Delta and only the side table is written.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc.core.errors import ConfigError
from cdc.core.tables import delta_properties, is_delta_table
from refine.apply.latest import SnapshotStart, at_or_after, from_snapshot_start, last_snapshot_start
from refine.apply.merge import (
    COMMITTED_AT,
    DELETED_AT,
    LSN,
    OFFSET,
    OP,
    REFINED_AT,
    TableSettings,
    ensure_refined_table,
)
from refine.apply.rules import TableRules
from refine.apply.schema_changes import overwrite_table
from refine.apply.shaping import DeleteMode, TableShape, shaped_images
from refine.records.envelope import Op
from refine.records.parse import VALUE_SCHEMA
from refine.records.toast import replace_placeholders

ROW_HASH, COPY = "_cdc_row_hash", "_cdc_copy"
# The columns and types a keyless table's row hashes are computed over (Spark's JSON of a struct type), once
# they are no longer every source column it stores as it stores them (a column dropped or retyped).
IMAGE_PROPERTY = "cdc.row_hash.image"
TXN_APP_ID = "cdc-refine-keyless"
# Where a change came in Debezium's stream: the last commit LSN (or the change's own LSN before the
# connector's first commit: :func:`unapplied` adds it as STREAM_COMMIT), its LSN, its Kafka offset.
STREAM_COMMIT = "_stream_commit"
STREAM_POSITION = (STREAM_COMMIT, "source_lsn", "kafka_offset")


def applied_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/_cdc/applied/{topic}"


def read_applied(spark: SparkSession, location: str) -> tuple[int | None, int, int, int] | None:
    """(stream position: last commit LSN, LSN, Kafka offset; batch counter) of the last applied change,
    or None. A side table written before the stream position existed has no last commit LSN (None)."""
    if not is_delta_table(spark, location):
        return None
    rows = spark.read.format("delta").load(location).collect()  # one row
    if not rows:
        return None
    row = rows[0].asDict()
    return row.get("commit_lsn"), row["lsn"], row["offset"], row["version"]


def write_applied(
    spark: SparkSession, location: str, commit_lsn: int | None, lsn: int, offset: int, version: int
) -> None:
    mark = spark.createDataFrame(
        [(commit_lsn, lsn, offset, version)], "commit_lsn long, lsn long, offset long, version long"
    )
    # overwriteSchema: a side table of an earlier version lacks commit_lsn.
    mark.withColumn("updated_at", F.current_timestamp()).write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).save(location)


def unapplied(changes: DataFrame, applied: tuple[int | None, int, int, int] | None) -> DataFrame:
    """The batch's changes after ``applied`` in the stream, each once (copies share an LSN; snapshot
    reads do not count as copies of each other)."""
    commit, lsn, offset = (F.col(c) for c in STREAM_POSITION)
    rows = changes.where(
        F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value, Op.TRUNCATE.value)
    )
    rows = rows.withColumn(STREAM_COMMIT, F.coalesce("source_last_commit_lsn", "source_lsn"))
    is_read = F.col("op") == Op.READ.value
    if applied is not None:
        last_commit, last_lsn, last_offset, _ = applied
        # A mark written before the stream position existed has LSN and offset only: compared as then.
        streamed, streamed_mark = (
            ([commit, lsn], [last_commit, last_lsn]) if last_commit is not None else ([lsn], [last_lsn])
        )
        read_after = ~at_or_after([F.lit(v) for v in (*streamed_mark, last_offset)], [*streamed, offset])
        streamed_after = ~at_or_after([F.lit(v) for v in streamed_mark], streamed)
        rows = rows.where(F.when(is_read, read_after).otherwise(streamed_after))
    change = Window.partitionBy(lsn, F.when(is_read, offset)).orderBy(offset)
    return rows.withColumn("_copy", F.row_number().over(change)).where("_copy = 1").drop("_copy")


def _hashed(image: Column) -> Column:
    return F.sha2(F.to_json(image), 256)


SIGNED = "_cdc_signed"  # of a row image added (delta 1) or removed (-1): the change's place and metadata


def signed_images(rows: DataFrame, columns: list[str]) -> DataFrame:
    """Each change's row images of the source ``columns`` (``image``): the row it adds (``delta`` 1 in the
    ``SIGNED`` struct, with the change's position and metadata) and the row it removes (-1)."""
    meta = F.struct(
        F.col("source_lsn").alias(LSN),
        F.col("kafka_offset").alias(OFFSET),
        F.col("source_committed_at").alias(COMMITTED_AT),
        F.col("op").alias(OP),
        F.col(STREAM_COMMIT),
    )
    after_type = rows.schema["after"].dataType
    assert isinstance(after_type, StructType)  # a row

    def image(row: Column) -> Column:
        return F.struct(*[row[c].alias(c) for c in columns])

    # Under REPLICA IDENTITY FULL the old row is whole: it has the values an update left TOASTed.
    after = replace_placeholders(F.col("after"), F.col("before"), after_type)
    added = rows.where(F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value)).select(
        image(after).alias("image"), meta.withField("delta", F.lit(1)).alias(SIGNED)
    )
    removed = rows.where(F.col("op").isin(Op.UPDATE.value, Op.DELETE.value)).select(
        image(F.col("before")).alias("image"), meta.withField("delta", F.lit(-1)).alias(SIGNED)
    )
    return added.unionByName(removed)


def typed_images(images: DataFrame, image: StructType) -> DataFrame:
    """Signed images (:func:`signed_images`) of the table's ``image`` columns and types: a row's hash is that
    of the values the table stores."""
    value = F.col("image")
    return images.withColumn("image", F.struct(*[value[f.name].cast(f.dataType).alias(f.name) for f in image]))


def net_changes(images: DataFrame, columns: list[str], soft_deletes: bool = False) -> DataFrame:
    """Per row image, how many copies the signed ``images`` add (``net`` < 0: remove), with the image and
    the metadata of its last addition; with ``soft_deletes`` also ``peak``, the most copies it had on the
    way (above those it had before: soft-deleted copies stay counted), and the metadata of its last removal
    (``removed``)."""
    changes = images.select("image", f"{SIGNED}.*").withColumn(ROW_HASH, _hashed(F.col("image")))
    place = (STREAM_COMMIT, LSN, OFFSET)
    position = F.when(F.col("delta") > 0, F.struct(*place))
    last_added = F.max_by(F.struct("image", LSN, OFFSET, COMMITTED_AT, OP), position)
    measures = [F.sum("delta").alias("net"), last_added.alias("last")]
    if soft_deletes:
        # An update that leaves the image as it was removes it before adding it: no copy more on the way.
        so_far = Window.partitionBy(ROW_HASH).orderBy(*place, "delta").rowsBetween(Window.unboundedPreceding, 0)
        changes = changes.withColumn("_so_far", F.sum("delta").over(so_far))
        removal = F.when(F.col("delta") < 0, F.struct(*place))
        measures += [
            F.greatest(F.max("_so_far"), F.lit(0)).alias("peak"),
            F.max_by(F.struct(LSN, OFFSET, COMMITTED_AT), removal).alias("removed"),
        ]
    nets = changes.groupBy(ROW_HASH).agg(*measures)
    kept = (F.col("net") != 0) | (F.col("peak") > 0) if soft_deletes else F.col("net") != 0
    return nets.where(kept).select(
        ROW_HASH,
        "net",
        *([F.col("peak"), F.col("removed")] if soft_deletes else []),
        *[F.col(f"last.image.`{column}`").alias(column) for column in columns],
        *[F.col(f"last.{column}").alias(column) for column in (LSN, OFFSET, COMMITTED_AT, OP)],
    )


def _ranges(counted: DataFrame, soft_deletes: bool) -> Column:
    """Per image, the copy numbers to write as (low, high, action, deleted) structs: with ``_live`` copies
    (1.._live) and ``_have`` in all (soft-deleted ones after the live ones), a net change ``net`` and a
    ``peak``. Hard deletes add copies n+1..n+k or remove the highest ones; soft deletes revive or mark the
    lowest deleted and highest live ones, and keep as many copies as the image ever had at once."""
    live, have, net = F.col("_live"), F.col("_have"), F.col("net")
    live_now = F.greatest(live + net, F.lit(0))

    def span(low: Column, high: Column, action: str, deleted: bool) -> Column:
        return F.struct(
            low.alias("low"), high.alias("high"), F.lit(action).alias("action"), F.lit(deleted).alias("deleted")
        )

    if not soft_deletes:
        return F.array(span(live + 1, live_now, "insert", False), span(live_now + 1, live, "delete", True))
    have_now = F.greatest(have, live + F.col("peak"))
    return F.array(
        span(live + 1, F.least(live_now, have), "insert", False),  # revived
        span(have + 1, live_now, "insert", False),
        span(live_now + 1, live, "delete", True),  # marked deleted
        span(F.greatest(have, live_now) + 1, have_now, "insert", True),  # added and deleted on the way
    )


def copies(
    nets: DataFrame, existing: DataFrame | None, columns: list[str], soft_deletes: bool = False, reset: bool = False
) -> DataFrame:
    """One row per copy to write (``_action`` insert, or delete: under soft deletes, marking it deleted),
    from the images' net changes (:func:`net_changes`) and the ``existing`` table (None: empty, after a
    truncate under hard deletes; under soft ones a truncate's table has no live copies, and all count)."""
    if existing is None:
        counted = nets.withColumns({"_live": F.lit(0), "_have": F.lit(0)})
    else:
        # Copies 1..n: live ones first, then the soft-deleted ones.
        if reset:  # after a truncate every stored copy is deleted, and stays counted
            live = F.lit(0)
        elif DELETED_AT in existing.columns:
            live = F.count(F.when(F.col(DELETED_AT).isNull(), 1))
        else:
            live = F.max(COPY)
        have = (
            existing.join(nets.select(ROW_HASH), ROW_HASH, "left_semi")
            .groupBy(ROW_HASH)
            .agg(live.alias("_live"), F.max(COPY).alias("_have"))
        )
        counted = nets.join(have, ROW_HASH, "left").fillna(0, ["_live", "_have"])
    spans = counted.withColumn("_span", F.explode(_ranges(counted, soft_deletes))).where("_span.low <= _span.high")
    deleted = F.col("_span.deleted")
    values = [F.col(f"`{column}`") for column in columns]
    if not soft_deletes:
        meta = [F.col(c) for c in (LSN, OFFSET, COMMITTED_AT, OP)]
    else:
        meta = [
            F.when(deleted, F.col(f"removed.{LSN}")).otherwise(F.col(LSN)).alias(LSN),
            F.when(deleted, F.col(f"removed.{OFFSET}")).otherwise(F.col(OFFSET)).alias(OFFSET),
            F.when(deleted, F.col(f"removed.{COMMITTED_AT}")).otherwise(F.col(COMMITTED_AT)).alias(COMMITTED_AT),
            F.when(deleted, F.lit(Op.DELETE.value)).otherwise(F.col(OP)).alias(OP),
        ]
    return spans.select(
        *values,
        *meta,
        F.current_timestamp().alias(REFINED_AT),
        *(
            [F.when(deleted, F.coalesce(F.col(f"removed.{COMMITTED_AT}"), F.current_timestamp())).alias(DELETED_AT)]
            if soft_deletes
            else []
        ),
        ROW_HASH,
        F.explode(F.sequence("_span.low", "_span.high")).alias(COPY),
        F.col("_span.action").alias("_action"),
    )


def keyless_table(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    images: DataFrame,
    columns: list[str],
    soft_deletes: bool = False,
) -> StructType:
    """Make the keyless table at ``location`` take a batch's signed ``images`` (:func:`signed_images`, shaped, of
    the ``columns`` it stores), as :func:`refine.apply.merge.ensure_refined_table` does, with its row hashes those
    of the images the batch's are computed from (:func:`typed_images`); returns the image's columns and types.

    The columns and types the stored hashes were computed over are the table's ``IMAGE_PROPERTY``, set before
    anything changes them: a job stopped between the table's rewrite and its rehash rehashes on its next run."""
    # A plan, never run: the stored columns' types.
    probe = copies(net_changes(images, columns, soft_deletes), None, columns, soft_deletes)
    stored = StructType([StructField(f.name, f.dataType) for f in probe.schema if f.name != "_action"])
    existed = is_delta_table(spark, location)
    if existed and (hashed := delta_properties(spark, location).get(IMAGE_PROPERTY)) is None:
        # Hashed over every source column as the table stores them (before this property existed).
        before = spark.read.format("delta").load(location).schema
        hashed = _set_image(spark, location, StructType([f for f in before if not f.name.startswith("_cdc_")]))
    table = ensure_refined_table(spark, location, settings, stored, source_columns=True)
    # A renamed column's old one is no part of a row's image: its values are under the new name.
    renamed = {old for old, new in settings.schema_rules.renames.items() if new in table.names}
    image = StructType([StructField(c, table[c].dataType) for c in columns if c in table.names and c not in renamed])
    if not existed:
        _set_image(spark, location, image)
    elif hashed != image.json():
        # A column dropped, or retyped: the stored rows' hashes become those of their images now, so that a
        # later change's image finds its row (equal rows may now be copies of one image: numbered again,
        # the live ones first).
        stored_rows = spark.read.format("delta").load(location)
        rehashed = stored_rows.withColumn(ROW_HASH, _hashed(F.struct(*[F.col(f"`{c}`") for c in image.names])))
        order = [F.col(DELETED_AT).isNotNull()] if DELETED_AT in table.names else []
        copy = F.row_number().over(Window.partitionBy(ROW_HASH).orderBy(*order, COPY, LSN, OFFSET))
        renumbered = rehashed.withColumn(COPY, copy.cast(table[COPY].dataType))
        overwrite_table(spark, location, renumbered)
        _set_image(spark, location, image)
    return image


def _set_image(spark: SparkSession, location: str, image: StructType) -> str:
    text = image.json()
    quoted_image = text.replace("\\", "\\\\").replace("'", "\\'")
    spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ('{IMAGE_PROPERTY}' = '{quoted_image}')")
    return text


def merge_keyless(
    spark: SparkSession, location: str, rows: DataFrame, truncated: bool, version: int, soft_deletes: bool = False
) -> None:
    """MERGE the copies to add and remove (:func:`copies`) as Delta transaction ``version`` of this
    job (Delta skips it when the table has it already); with ``truncated``, they replace the table (under
    ``soft_deletes``, the others are marked deleted)."""
    stored = [f for f in rows.schema if f.name != "_action"]
    values: dict[str, str | Column] = {f"`{f.name}`": F.col(f"s.`{f.name}`") for f in stored}
    merge = (
        DeltaTable.forPath(spark, location)
        .alias("t")
        .merge(rows.alias("s"), f"t.{ROW_HASH} = s.{ROW_HASH} AND t.{COPY} = s.{COPY}")
    )
    if soft_deletes:
        marked: dict[str, str | Column] = {
            c: F.col(f"s.{c}") for c in (LSN, OFFSET, COMMITTED_AT, OP, REFINED_AT, DELETED_AT)
        }
        merge = merge.whenMatchedUpdate("s._action = 'delete'", marked)
    else:
        merge = merge.whenMatchedDelete("s._action = 'delete'")
    # Matched: after a truncate the copy is the batch's now; under soft deletes, a copy revived.
    merge = merge.whenMatchedUpdate("s._action = 'insert'", values).whenNotMatchedInsert("s._action = 'insert'", values)
    if truncated and soft_deletes:
        merge = merge.whenNotMatchedBySourceUpdate(
            f"t.{DELETED_AT} IS NULL",
            {DELETED_AT: F.current_timestamp(), OP: F.lit(Op.DELETE.value), REFINED_AT: F.current_timestamp()},
        )
    elif truncated:
        merge = merge.whenNotMatchedBySourceDelete()
    spark.conf.set("spark.databricks.delta.write.txnAppId", TXN_APP_ID)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        merge.execute()
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def columns_now(newest_schema: int | None, columns: list[str], columns_by_schema: tuple[list[str], ...]) -> list[str]:
    """The source columns of the table now: those of the value schema its newest change's record carries
    (``newest_schema``: an index in ``columns_by_schema``, from :data:`~refine.records.parse.VALUE_SCHEMA`), or
    all the batch's ``columns`` when that is not known. A column dropped within the batch is no part of a row's
    image, and records from before an ALTER sent again after it (Kafka Connect delivers at least once) do not
    take the columns it added away."""
    if newest_schema is None:
        return columns
    return [column for column in columns_by_schema[newest_schema] if column in columns]


def merge_keyless_changes(
    spark: SparkSession,
    location: str,
    settings: TableSettings,
    applied_at: str,
    changes: DataFrame,
    columns: list[str],
    columns_by_schema: tuple[list[str], ...] = (),
    shape: TableShape | None = None,
    mask_key: bytes | None = None,
    table: str = "",
) -> None:
    """Apply a batch's parsed changes (of the source ``columns``; ``columns_by_schema``: of each value schema
    the changes' :data:`~refine.records.parse.VALUE_SCHEMA` names) to the keyless refined table at ``location``,
    each exactly once, its row images shaped by ``shape`` (:func:`refine.apply.shaping.shaped_images`)."""
    shape = shape or TableShape()
    soft = shape.deletes is DeleteMode.SOFT
    applied = read_applied(spark, applied_at)
    rows = unapplied(changes, applied).persist()
    try:
        position = F.struct(*STREAM_POSITION)
        [mark] = rows.agg(
            F.max(position).alias("last"),
            F.max(F.when(F.col("op") == Op.TRUNCATE.value, position)).alias("truncate"),
            last_snapshot_start().alias("snapshot"),
            (F.max_by(VALUE_SCHEMA, position) if VALUE_SCHEMA in rows.columns else F.lit(None)).alias("newest_schema"),
        ).collect()
        if mark.last is None:
            return  # nothing new: replayed changes only
        columns = columns_now(mark.newest_schema, columns, columns_by_schema)
        existing, counted = None, rows
        # A truncate or a snapshot's first read: the table's rows go, only the changes after it count.
        if mark.truncate is not None:
            counted = counted.where(at_or_after([F.col(c) for c in STREAM_POSITION], [F.lit(v) for v in mark.truncate]))
        if (snapshot := SnapshotStart.of(mark.snapshot)) is not None:
            counted = counted.where(from_snapshot_start(snapshot))
        reset = mark.truncate is not None or snapshot is not None
        images = shaped_images(signed_images(counted, columns), "image", shape, table, mask_key)
        shaped_type = images.schema["image"].dataType
        assert isinstance(shaped_type, StructType)  # a row
        image = keyless_table(spark, location, settings, images, shaped_type.fieldNames(), soft)
        images = typed_images(images, image)
        if soft or not reset:  # soft-deleted copies stay counted after a reset
            existing = spark.read.format("delta").load(location)
        version = (applied[-1] if applied else 0) + 1
        nets = net_changes(images, image.names, soft)
        merge_keyless(spark, location, copies(nets, existing, image.names, soft, reset), reset, version, soft)
        commit_lsn, lsn, offset = mark.last
        write_applied(spark, applied_at, commit_lsn, lsn, offset, version)
    finally:
        rows.unpersist()


def merge_keyless_batch(
    spark: SparkSession,
    changes: DataFrame,
    columns: list[str],
    *,
    location: str,
    settings: TableSettings,
    applied_at: str,
    rules: TableRules,
    explode: list[str],
    history: bool,
    table: str,
    columns_by_schema: tuple[list[str], ...] = (),
    shape: TableShape | None = None,
    mask_key: bytes | None = None,
) -> None:
    """Apply a batch's valid parsed ``changes`` (of the refined ``columns``; ``columns_by_schema``: of each of
    the batch's value schemas) to the keyless refined table ``table`` at ``location``
    (:func:`merge_keyless_changes`). Expectations (``rules``) are not checked on such rows yet, and exploded
    arrays, a history and ignored NULLs need a primary key: a ConfigError for any of them."""
    rules.refuse_unchecked("tables without a primary key")
    ignores_nulls = shape is not None and shape.ignore_null_updates not in (False, [])
    for wanted, setting in [
        (explode, "explode"),
        (history, "SCD type 2 (history)"),
        (ignores_nulls, "ignore_null_updates"),
    ]:
        if wanted:
            raise ConfigError(
                f"{setting} needs a primary key: the source table has none (Kafka keys are null)", table=table
            )
    merge_keyless_changes(
        spark, location, settings, applied_at, changes, columns, columns_by_schema, shape, mask_key, table
    )
