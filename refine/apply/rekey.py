"""Primary-key changes: the new key's create takes the TOASTed values the old row had (pure transforms).

Debezium turns an UPDATE of a primary key into a delete of the old key, its tombstone, and a create
of the new key at the same LSN; the create carries TOAST placeholders for the large values the update
left alone, and the header ``__debezium.oldkey`` (the old key as JSON) links it to the old row. That
row's values are the old key's state just before the create: an earlier change in the batch, else a
stored row (the refined table's current row or, when the delete came in an earlier batch, its
image kept by :mod:`refine.apply.deleted`). That state may itself come from a key change (A to B, then B
to C in one batch): such chains are resolved one link per round (:func:`fill_from_old_keys`).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc.core.tables import is_delta_table, table_version
from refine.apply.latest import POSITION_COLUMNS, at_or_after
from refine.apply.merge import LSN, OFFSET
from refine.records.decode import decode, json_type
from refine.records.envelope import ConnectSchema, Op
from refine.records.toast import fill_from_earlier_changes, has_placeholder, replace_placeholders

OLD_KEY_HEADER, NEW_KEY_HEADER = "__debezium.oldkey", "__debezium.newkey"


def old_key(headers: Column, key_schema: ConnectSchema) -> Column:
    """The key a create's row had before a primary-key change (null for any other record)."""
    text = F.try_element_at(F.filter(headers, lambda header: header["key"] == OLD_KEY_HEADER), F.lit(1))["value"]
    # (from_json takes any DataType: pyspark's annotation is too narrow)
    return decode(F.from_json(text.cast("string"), json_type(key_schema)), key_schema)  # type: ignore[arg-type]


def is_key_change(headers: Column) -> Column:
    """Whether a record is part of a primary-key change (Debezium links its records by these headers)."""
    return F.exists(headers, lambda header: header["key"].isin(OLD_KEY_HEADER, NEW_KEY_HEADER))


def stored_states(
    spark: SparkSession, locations: list[str], key_columns: list[str], row_type: StructType
) -> DataFrame | None:
    """The rows of the refined-shaped tables at ``locations`` (those that exist) as states: ``key``
    and ``image`` structs and the position; None when there is none.

    Each table is read at its version of now: the changes filled from these states are computed again
    after the batch's MERGE has changed the tables (the history reads them then), and a plain read
    would see the new rows there (the old key's row gone, its values lost)."""
    states = []
    for location in locations:
        if not is_delta_table(spark, location):
            continue
        version = table_version(spark, location)
        stored = spark.read.format("delta").option("versionAsOf", version).load(location)
        present = set(stored.columns)
        image = F.struct(
            *[
                (F.col(f"`{f.name}`") if f.name in present else F.lit(None).cast(f.dataType)).alias(f.name)
                for f in row_type.fields
            ]
        )
        states.append(
            stored.select(
                F.struct(*[F.col(f"`{k}`") for k in key_columns]).alias("key"),
                F.col(LSN).alias("state_lsn"),
                F.col(OFFSET).alias("state_offset"),
                image.alias("image"),
            )
        )
    return reduce(DataFrame.unionByName, states) if states else None


def batch_states(changes: DataFrame) -> DataFrame:
    """The row states a batch's changes leave (deletes and truncates leave none)."""
    lsn, offset = POSITION_COLUMNS
    return changes.where(F.col("after").isNotNull()).select(
        "key", F.col(lsn).alias("state_lsn"), F.col(offset).alias("state_offset"), F.col("after").alias("image")
    )


def with_state_before(
    rows: DataFrame, looks_up: Column, key: Column, states: DataFrame, stored: DataFrame | None
) -> DataFrame:
    """``rows`` with ``image``: for the rows where ``looks_up`` holds, the state of ``key`` just before
    the row's position, from ``states`` or ``stored`` (null if there is none)."""
    lsn, offset = POSITION_COLUMNS
    rows = rows.withColumn("lookup_id", F.struct("kafka_partition", "kafka_offset"))
    lookups = rows.where(looks_up).select(
        "lookup_id", key.alias("key"), F.col(lsn).alias("lookup_lsn"), F.col(offset).alias("lookup_offset")
    )
    if stored is not None:  # only the stored rows of the keys looked up, never the whole table
        states = states.unionByName(stored.join(lookups.select("key").distinct(), "key", "left_semi"))
    before = ~at_or_after(
        [F.col("s.state_lsn"), F.col("s.state_offset")], [F.col("l.lookup_lsn"), F.col("l.lookup_offset")]
    )
    found = lookups.alias("l").join(states.alias("s"), (F.col("l.key") == F.col("s.key")) & before)
    latest = Window.partitionBy("l.lookup_id").orderBy(F.col("s.state_lsn").desc(), F.col("s.state_offset").desc())
    prior = (
        found.withColumn("_rank", F.row_number().over(latest))
        .where("_rank = 1")
        .select(F.col("l.lookup_id").alias("lookup_id"), F.col("s.image").alias("image"))
    )
    return rows.join(prior, "lookup_id", "left").drop("lookup_id")


def chain_depth(changes: DataFrame, rekeyed: Column) -> int:
    """The longest chain of primary-key changes in ``changes`` (A to B, then B to C: 2), each
    create's link the last key change into its old key before it. Its links are the batch's key
    changes only, and it takes one small query per link of the longest chain: independent key
    changes, however many, take one."""
    lsn, offset = POSITION_COLUMNS
    links = changes.where(rekeyed).select(
        F.struct("kafka_partition", "kafka_offset").alias("id"),
        "key",
        "old_key",
        F.col(lsn).alias("lsn"),
        F.col(offset).alias("offset"),
    )
    earlier = ~at_or_after([F.col("p.lsn"), F.col("p.offset")], [F.col("c.lsn"), F.col("c.offset")])
    chained = (
        links.alias("c")
        .join(links.alias("p"), (F.col("c.old_key") == F.col("p.key")) & earlier)
        .groupBy(F.col("c.id").alias("id"))
        .agg(F.max(F.struct("p.lsn", "p.offset", "p.id"))["id"].alias("parent"))
    ).persist()
    try:
        depth, links_at_depth = 1, chained  # the creates at least depth + 1 links down a chain
        while not links_at_depth.isEmpty():
            depth += 1
            links_at_depth = chained.join(links_at_depth.select(F.col("id").alias("parent")), "parent", "left_semi")
        return depth
    finally:
        chained.unpersist()


def _checkpointed(rows: DataFrame) -> DataFrame:
    """``rows`` computed once, with a lineage of their own and their measured size. A checkpoint alone keeps
    its plan's size estimate, which each round's joins multiply: its digits grew threefold per round and
    a chain of 10 links never finished planning."""
    cached = rows.persist()
    try:
        cached.count()  # the cache's measured size now stands for the plan's estimate
        return cached.localCheckpoint()
    finally:
        cached.unpersist()


def fill_from_old_keys(changes: DataFrame, key_schema: ConnectSchema, stored: DataFrame | None) -> DataFrame:
    """``changes`` with each key's placeholders filled from its earlier changes, and a primary-key
    change's create filled from the old key's state (see the module's doc).

    A create's own placeholders come from its old key, never from the changes its new key had before
    it (a row deleted earlier): each key change starts a segment of its key's changes that is filled
    on its own. The old key's state may itself be the create of an earlier key change (A to B to C
    in one batch): each round fills one more link of the chains, as many rounds as the longest has.
    Only the changes of the keys a key change links (its new and its old key) can change in a round,
    so with more than one round the rounds run over those alone and the others are filled once."""
    key_columns = [field.field_name for field in key_schema.fields or ()]
    order = [F.col(c) for c in POSITION_COLUMNS]
    changes = changes.withColumn("old_key", old_key(F.col("kafka_headers"), key_schema))
    rekeyed = (F.col("op") == Op.CREATE.value) & F.col("old_key").isNotNull()
    depth = chain_depth(changes, rekeyed)
    if depth == 1:  # one round, over the whole batch: nothing to split
        filled = _fill_one_link(_first_fill(changes, key_columns, stored), key_columns, stored, rekeyed)
        # Computed once, as below: its plan reads the changes twice and is read by three writers.
        return _checkpointed(filled.drop("old_key", "key_segment"))
    # Up to two keys per key change (no broadcast forced: a bulk update of keys has millions); null-safe,
    # as the rounds fill a change of a null key too.
    linked_keys = changes.where(rekeyed).select(F.explode(F.array("key", "old_key")).alias("linked")).distinct()
    is_linked = changes["key"].eqNullSafe(linked_keys["linked"])
    linked = _first_fill(changes.join(linked_keys, is_linked, "left_semi"), key_columns, stored)
    for round_ in range(depth):
        if round_:  # each round reads the last one's rows twice: cut the lineage, or the plan doubles per round
            linked = _checkpointed(linked)
        linked = _fill_one_link(linked, key_columns, stored, rekeyed)
    # What the rounds would leave the other keys: the first fill, then one more fill from earlier
    # changes (again, it changes nothing), which takes a stored value that filled an earlier change
    # into a later one whose own (later) stored state held a placeholder.
    unlinked = _first_fill(changes.join(linked_keys, is_linked, "left_anti"), key_columns, stored)
    unlinked = fill_from_earlier_changes(unlinked, key_columns, order, within=(F.col("key_segment"),))
    # Computed once: the readers of the filled changes (the last change per key, the deleted rows'
    # images, the history) would each plan and compute both parts again.
    return _checkpointed(linked.unionByName(unlinked).select(*changes.drop("old_key").columns))


def _first_fill(changes: DataFrame, key_columns: list[str], stored: DataFrame | None) -> DataFrame:
    """``changes`` (with ``old_key``) with ``key_segment`` (how many key changes into its key come at
    or before each change) and filled from the earlier changes of their segment; a key's changes before
    any key change into it continue its stored row, whose values fill the placeholders left."""
    order = [F.col(c) for c in POSITION_COLUMNS]
    rekeyed = (F.col("op") == Op.CREATE.value) & F.col("old_key").isNotNull()
    segments = Window.partitionBy(*[F.col(f"key.`{k}`") for k in key_columns]).orderBy(*order)
    changes = changes.withColumn("key_segment", F.count(F.when(rekeyed, 1)).over(segments))
    filled = fill_from_earlier_changes(changes, key_columns, order, within=(F.col("key_segment"),))
    if stored is None:
        return filled
    after_type = changes.schema["after"].dataType
    assert isinstance(after_type, StructType)  # a row
    # Those values reach the new key of a later key change through its old key's state.
    continues_stored = (F.col("key_segment") == 0) & has_placeholder(F.col("after"), after_type)
    with_stored = with_state_before(filled, continues_stored, F.col("key"), stored.limit(0), stored)
    from_stored = F.when(
        F.col("image").isNotNull(), replace_placeholders(F.col("after"), F.col("image"), after_type)
    ).otherwise(F.col("after"))
    return with_stored.withColumn("after", from_stored).drop("image")


def _fill_one_link(filled: DataFrame, key_columns: list[str], stored: DataFrame | None, rekeyed: Column) -> DataFrame:
    """One round: each key change's create filled from its old key's state before it (as ``filled``
    has it), then each segment's later changes from their earlier ones again."""
    after_type = filled.schema["after"].dataType
    assert isinstance(after_type, StructType)  # a row
    order = [F.col(c) for c in POSITION_COLUMNS]
    with_prior = with_state_before(filled, rekeyed, F.col("old_key"), batch_states(filled), stored)
    after = replace_placeholders(F.col("after"), F.col("image"), after_type)
    return fill_from_earlier_changes(
        with_prior.withColumn("after", after).drop("image"), key_columns, order, within=(F.col("key_segment"),)
    )
