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
from refine.apply.merge import COMMITTED_AT, LSN, OFFSET, OP, REFINED_AT, TableSettings, ensure_refined_table
from refine.apply.rules import TableRules
from refine.apply.schema_changes import overwrite_table
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


def net_changes(rows: DataFrame, columns: list[str]) -> DataFrame:
    """Per row image, how many copies the changes add (``net`` < 0: remove), with the image and the
    metadata of its last addition."""
    meta: list[str | Column] = [
        F.col("source_lsn").alias(LSN),
        F.col("kafka_offset").alias(OFFSET),
        F.col("source_committed_at").alias(COMMITTED_AT),
        F.col("op").alias(OP),
        STREAM_COMMIT,
    ]
    after_type = rows.schema["after"].dataType
    assert isinstance(after_type, StructType)  # a row
    added = rows.where(F.col("op").isin(Op.READ.value, Op.CREATE.value, Op.UPDATE.value)).select(
        # Under REPLICA IDENTITY FULL the old row is whole: it has the values an update left TOASTed.
        replace_placeholders(F.col("after"), F.col("before"), after_type).alias("image"),
        F.lit(1).alias("delta"),
        *meta,
    )
    removed = rows.where(F.col("op").isin(Op.UPDATE.value, Op.DELETE.value)).select(
        F.col("before").alias("image"), F.lit(-1).alias("delta"), *meta
    )
    changes = added.unionByName(removed).withColumn(ROW_HASH, _hashed(F.col("image")))
    position = F.when(F.col("delta") > 0, F.struct(STREAM_COMMIT, LSN, OFFSET))
    last_added = F.max_by(F.struct("image", LSN, OFFSET, COMMITTED_AT, OP), position)
    nets = changes.groupBy(ROW_HASH).agg(F.sum("delta").alias("net"), last_added.alias("last"))
    return nets.where("net <> 0").select(
        ROW_HASH,
        "net",
        *[F.col(f"last.image.`{column}`").alias(column) for column in columns],
        *[F.col(f"last.{column}").alias(column) for column in (LSN, OFFSET, COMMITTED_AT, OP)],
    )


def copies(nets: DataFrame, existing: DataFrame | None, columns: list[str]) -> DataFrame:
    """One row per copy to insert (``_action`` insert) or delete: copies n+1..n+k are added, the
    highest ones removed (n: the copies the table has; 0 without ``existing``, after a truncate)."""
    if existing is None:
        counted = nets.withColumn("_have", F.lit(0))
    else:
        have = (
            existing.join(nets.select(ROW_HASH), ROW_HASH, "left_semi")
            .groupBy(ROW_HASH)
            .agg(F.max(COPY).alias("_have"))
        )
        counted = nets.join(have, ROW_HASH, "left").withColumn("_have", F.coalesce("_have", F.lit(0)))
    adds = F.col("net") > 0
    low = F.when(adds, F.col("_have") + 1).otherwise(F.greatest(F.col("_have") + F.col("net"), F.lit(0)) + 1)
    high = F.when(adds, F.col("_have") + F.col("net")).otherwise(F.col("_have"))
    return counted.where(low <= high).select(
        *[F.col(f"`{column}`") for column in columns],
        LSN,
        OFFSET,
        COMMITTED_AT,
        OP,
        F.current_timestamp().alias(REFINED_AT),
        ROW_HASH,
        F.explode(F.sequence(low, high)).alias(COPY),
        F.when(adds, "insert").otherwise("delete").alias("_action"),
    )


def keyless_table(
    spark: SparkSession, location: str, settings: TableSettings, rows: DataFrame, columns: list[str]
) -> StructType:
    """Make the keyless table at ``location`` take a batch's parsed ``rows`` (of the source ``columns``), as
    :func:`refine.apply.merge.ensure_refined_table` does, with its row hashes those of the images the batch's are
    computed from (:func:`row_images`); returns the image's columns and types.

    The columns and types the stored hashes were computed over are the table's ``IMAGE_PROPERTY``, set before
    anything changes them: a job stopped between the table's rewrite and its rehash rehashes on its next run."""
    probe = copies(net_changes(rows, columns), None, columns)  # a plan, never run: the stored columns' types
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
        # later change's image finds its row (equal rows may now be copies of one image: numbered again).
        stored_rows = spark.read.format("delta").load(location)
        rehashed = stored_rows.withColumn(ROW_HASH, _hashed(F.struct(*[F.col(f"`{c}`") for c in image.names])))
        copy = F.row_number().over(Window.partitionBy(ROW_HASH).orderBy(COPY, LSN, OFFSET))
        renumbered = rehashed.withColumn(COPY, copy.cast(table[COPY].dataType))
        overwrite_table(spark, location, renumbered)
        _set_image(spark, location, image)
    return image


def _set_image(spark: SparkSession, location: str, image: StructType) -> str:
    text = image.json()
    quoted_image = text.replace("\\", "\\\\").replace("'", "\\'")
    spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ('{IMAGE_PROPERTY}' = '{quoted_image}')")
    return text


def row_images(rows: DataFrame, image: StructType) -> DataFrame:
    """Parsed ``rows`` with their ``before`` and ``after`` of the table's ``image`` columns and types: a row's
    hash is that of the values the table stores."""

    def typed(column: str) -> Column:
        value = F.col(column)
        return F.when(value.isNotNull(), F.struct(*[value[f.name].cast(f.dataType).alias(f.name) for f in image]))

    return rows.withColumn("before", typed("before")).withColumn("after", typed("after"))


def merge_keyless(spark: SparkSession, location: str, rows: DataFrame, truncated: bool, version: int) -> None:
    """MERGE the copies to add and remove (:func:`copies`) as Delta transaction ``version`` of this
    job (Delta skips it when the table has it already); with ``truncated``, they replace the table."""
    stored = [f for f in rows.schema if f.name != "_action"]
    values: dict[str, str | Column] = {f"`{f.name}`": F.col(f"s.`{f.name}`") for f in stored}
    merge = (
        DeltaTable.forPath(spark, location)
        .alias("t")
        .merge(rows.alias("s"), f"t.{ROW_HASH} = s.{ROW_HASH} AND t.{COPY} = s.{COPY}")
        .whenMatchedDelete("s._action = 'delete'")
        .whenMatchedUpdate("s._action = 'insert'", values)  # only after a truncate: the copy is the batch's now
        .whenNotMatchedInsert("s._action = 'insert'", values)
    )
    if truncated:
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
) -> None:
    """Apply a batch's parsed changes (of the source ``columns``; ``columns_by_schema``: of each value schema
    the changes' :data:`~refine.records.parse.VALUE_SCHEMA` names) to the keyless refined table at ``location``,
    each exactly once."""
    applied = read_applied(spark, applied_at)
    rows = unapplied(changes, applied).persist()
    try:
        position = F.struct(*STREAM_POSITION)
        [mark] = rows.agg(
            F.max(position).alias("last"),
            F.max(F.when(F.col("op") == Op.TRUNCATE.value, position)).alias("truncate"),
            last_snapshot_start().alias("snapshot"),
            F.max_by(VALUE_SCHEMA, position).alias("newest_schema") if VALUE_SCHEMA in rows.columns else F.lit(None),
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
        image = keyless_table(spark, location, settings, counted, columns)
        counted, columns = row_images(counted, image), image.names
        if not reset:
            existing = spark.read.format("delta").load(location)
        version = (applied[-1] if applied else 0) + 1
        merge_keyless(spark, location, copies(net_changes(counted, columns), existing, columns), reset, version)
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
) -> None:
    """Apply a batch's valid parsed ``changes`` (of the refined ``columns``; ``columns_by_schema``: of each of
    the batch's value schemas) to the keyless refined table ``table`` at ``location``
    (:func:`merge_keyless_changes`). Expectations (``rules``) are not checked on such rows yet, and exploded
    arrays and a history need a primary key: a ConfigError for any of them."""
    rules.refuse_unchecked("tables without a primary key")
    for wanted, setting in [(explode, "explode"), (history, "SCD type 2 (history)")]:
        if wanted:
            raise ConfigError(
                f"{setting} needs a primary key: the source table has none (Kafka keys are null)", table=table
            )
    merge_keyless_changes(spark, location, settings, applied_at, changes, columns, columns_by_schema)
