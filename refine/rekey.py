"""Primary-key changes: the new key's create takes the TOASTed values the old row had (pure transforms).

Debezium turns an UPDATE of a primary key into a delete of the old key, its tombstone, and a create
of the new key at the same LSN; the create carries TOAST placeholders for the large values the update
left alone, and the header ``__debezium.oldkey`` (the old key as JSON) links it to the old row. That
row's values are the old key's state just before the create: an earlier change in the batch, else a
stored row (the refined table's current row or, when the delete came in an earlier batch, its
image kept by :mod:`refine.deleted`). That state may itself come from a key change (A to B, then B
to C in one batch): :func:`fill_from_old_keys` fills each chain of key changes as one sequence.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc.core.tables import is_delta_table, table_version
from refine.decode import decode, json_type
from refine.envelope import TOMBSTONE, ConnectSchema, Op
from refine.latest import POSITION_COLUMNS, at_or_after
from refine.merge import LSN, OFFSET
from refine.toast import fill_from_earlier_changes, has_placeholder

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


def _lifetimes(changes: DataFrame, key_columns: list[str], rekeyed: Column) -> tuple[DataFrame, DataFrame]:
    """``changes`` with ``lifetime``: the key and the number of its creates (and snapshot reads) up to
    the change, which names one life of its row (from a create to the delete that ends it; 0: the
    life it began before the batch); and the links: each key change's create's lifetime and the
    ``parent`` lifetime of its old key that the key change ends."""
    lsn, offset = POSITION_COLUMNS
    starts_life = F.col("op").isin(Op.CREATE.value, Op.READ.value)
    per_key = Window.partitionBy(*[F.col(f"key.`{k}`") for k in key_columns]).orderBy(
        *[F.col(c) for c in POSITION_COLUMNS]
    )
    changes = changes.withColumn("lifetime", F.struct("key", F.count(F.when(starts_life, 1)).over(per_key).alias("n")))
    starts = changes.where(starts_life).select(
        F.col("key").alias("s_key"), F.col(lsn).alias("s_lsn"), F.col(offset).alias("s_offset")
    )
    creates = changes.where(rekeyed).select(
        "lifetime", "old_key", F.col(lsn).alias("c_lsn"), F.col(offset).alias("c_offset")
    )
    earlier = ~at_or_after([F.col("s_lsn"), F.col("s_offset")], [F.col("c_lsn"), F.col("c_offset")])
    links = (
        creates.join(starts, (F.col("old_key") == F.col("s_key")) & earlier, "left")
        .groupBy("lifetime", "old_key")
        .agg(F.count("s_key").alias("n"))
        .select("lifetime", F.struct(F.col("old_key").alias("key"), "n").alias("parent"))
    )
    return changes, links


def _checkpointed(rows: DataFrame) -> DataFrame:
    """``rows`` computed once, with a lineage of their own and their measured size (a checkpoint alone
    keeps its plan's size estimate, which each round's join multiplies)."""
    cached = rows.persist()
    try:
        cached.count()  # the cache's measured size now stands for the plan's estimate
        return cached.localCheckpoint()
    finally:
        cached.unpersist()


def chain_roots(links: DataFrame, max_rounds: int = 64) -> DataFrame:
    """Each linked lifetime's ``root``: the first lifetime of its chain of key changes (A to B to C:
    A's). Pointer jumping: each round links every lifetime to its parent's parent, so a chain of n
    links takes about log2(n) rounds; independent key changes (a bulk re-key) take one small query."""

    def unresolved(roots: DataFrame) -> bool:
        return not roots.join(links.select(F.col("lifetime").alias("root")), "root", "left_semi").isEmpty()

    roots = links.select("lifetime", F.col("parent").alias("root"))
    for _ in range(max_rounds):
        if not unresolved(roots):
            return roots
        further = roots.select(F.col("lifetime").alias("via"), F.col("root").alias("further"))
        roots = _checkpointed(
            roots.join(further, F.col("root") == F.col("via"), "left").select(
                "lifetime", F.coalesce("further", "root").alias("root")
            )
        )
    # Each parent begins before its child (a lifetime begins at a create): a chain cannot loop.
    raise AssertionError(f"key-change chains still unresolved after {max_rounds} rounds")


def fill_from_old_keys(changes: DataFrame, key_schema: ConnectSchema, stored: DataFrame | None) -> DataFrame:
    """``changes`` with each key's placeholders filled from its earlier changes, and a primary-key
    change's create filled from the old key's state (see the module's doc).

    A row's lives linked by key changes (A's life, then B's from the key change A to B, then C's...)
    make one sequence, its chain, in source order: the lives do not overlap, as each key change ends
    the old key's life. A placeholder takes the last real value before it in its chain, its first
    life's stored row included. A create's placeholders so never come from the changes its new key
    had before it (a row deleted earlier), which belong to another chain."""
    key_columns = [field.field_name for field in key_schema.fields or ()]
    order = [F.col(c) for c in POSITION_COLUMNS]
    changes = changes.withColumn("old_key", old_key(F.col("kafka_headers"), key_schema))
    rekeyed = (F.col("op") == Op.CREATE.value) & F.col("old_key").isNotNull()
    changes, links = _lifetimes(changes, key_columns, rekeyed)
    roots = chain_roots(links)
    chains = changes.join(roots, "lifetime", "left").withColumn("chain", F.coalesce("root", "lifetime")).drop("root")
    after_type = changes.schema["after"].dataType
    assert isinstance(after_type, StructType)  # a row
    if stored is not None:
        # A chain whose first life began before the batch continues the stored row of its first key,
        # read as the chain's first change (when a placeholder needs it). Only a stored state from before
        # the chain's first change in the batch: a batch run again after its MERGE committed finds the
        # key's row of a later life there (a key swapped through a temporary key), not this chain's.
        lsn, offset = POSITION_COLUMNS
        # (A tombstone has no position of its own: it would start every chain before its stored row.)
        first_lives = chains.where((F.col("chain.n") == 0) & (F.col("op") != TOMBSTONE))
        needing = first_lives.where(has_placeholder(F.col("after"), after_type)).select("chain").distinct()
        starts = (
            first_lives.join(needing, "chain", "left_semi")
            .groupBy(F.col("chain.key").alias("key"))
            .agg(F.min(F.struct(F.col(lsn).alias("lsn"), F.col(offset).alias("offset"))).alias("start"))
        )
        before_start = ~at_or_after(
            [F.col("state_lsn"), F.col("state_offset")], [F.col("start.lsn"), F.col("start.offset")]
        )
        stored_rows = (
            stored.join(starts, "key")
            .where(before_start)
            .select(
                F.struct("key", F.lit(0).cast("bigint").alias("n")).alias("chain"),
                F.col("state_lsn").alias(lsn),
                F.col("state_offset").alias(offset),
                F.col("image").alias("after"),
                F.lit(True).alias("_stored"),
            )
        )
        chains = chains.unionByName(stored_rows, allowMissingColumns=True)
    filled = fill_from_earlier_changes(chains, [], order, within=(F.col("chain"),))
    if stored is not None:
        filled = filled.where(F.col("_stored").isNull()).drop("_stored")
    return filled.drop("old_key", "lifetime", "chain")
