"""Primary-key changes of rows with TOASTed values: chains resolved against a reference model, and from a
real Debezium connector to the refined table."""

import json
import random
import re

import psycopg
import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.stack.postgres import add_to_publication
from cdc.stack.workload import run_workload
from refine.apply.batch_facts import row_type_of
from refine.apply.rekey import OLD_KEY_HEADER, chain_depth, fill_from_old_keys, old_key, stored_states
from refine.records.envelope import ConnectSchema
from refine.records.toast import TOAST_PLACEHOLDER

KEY_SCHEMA = ConnectSchema.model_validate({"type": "struct", "fields": [{"type": "int64", "field": "id"}]})
CHANGES = (
    "op string, key struct<id:bigint>, after struct<id:bigint, note:string, n:int>, source_lsn bigint, "
    "kafka_offset bigint, kafka_partition int, kafka_headers array<struct<key:string, value:binary>>"
)


def random_key_changes(seed: int, steps: int, stored: int = 0) -> tuple[list[tuple], dict[int, str]]:
    """Debezium's changes of a random run of inserts, updates leaving the note alone (its placeholder),
    primary-key changes (a delete, its tombstone and a create carrying the placeholder and the old key)
    and deletes (and their tombstones), on a table whose rows 1 to ``stored`` were refined before (their
    notes "stored note K"); and, by change offset, the note a reference model of the table holds after
    each create or update."""
    rng, changes, notes, deleted = random.Random(seed), [], {}, []
    rows, next_id = {key: f"stored note {key}" for key in range(1, stored + 1)}, stored

    def new_key() -> int:  # a fresh one, or one deleted before (its old values must not come back)
        nonlocal next_id
        if deleted and rng.random() < 0.3:
            return deleted.pop(rng.randrange(len(deleted)))
        next_id += 1
        return next_id

    def emit(op: str, key: int, lsn: int, note: str | None = None, old: int | None = None) -> None:
        offset = len(changes)
        headers = [] if old is None else [(OLD_KEY_HEADER, json.dumps({"id": old}).encode())]
        after = None if op == "d" else (key, note, offset)
        changes.append((op, (key,), after, lsn, offset, 0, headers))
        if op != "d":
            notes[offset] = rows[key]
        else:
            changes.append(("tombstone", (key,), None, None, offset + 1, 0, []))

    for step in range(steps):
        kind = rng.choice(["insert", "update", "rekey", "rekey", "delete"]) if rows else "insert"
        if kind == "insert":
            key = new_key()
            rows[key] = f"note {key} at {len(changes)}"
            emit("c", key, step, rows[key])
            continue
        key = rng.choice(sorted(rows))
        if kind == "update":
            emit("u", key, step, TOAST_PLACEHOLDER)
        elif kind == "rekey":
            new = new_key()
            rows[new] = rows.pop(key)
            emit("d", key, step)
            emit("c", new, step, TOAST_PLACEHOLDER, old=key)  # a key change's pair shares its LSN
            deleted.append(key)
        else:
            del rows[key]
            emit("d", key, step)
            deleted.append(key)
    return changes, notes


def shifted(change: tuple, base: int) -> tuple:
    """A change of :func:`random_key_changes` with its keys, position and offset moved up by ``base``."""
    op, (key,), after, lsn, offset, partition, headers = change
    headers = [(name, json.dumps({"id": json.loads(value)["id"] + base}).encode()) for name, value in headers]
    after = None if after is None else (after[0] + base, after[1], after[2] + base)
    return (op, (key + base,), after, None if lsn is None else lsn + base, offset + base, partition, headers)


@pytest.mark.parametrize("refined_before", [0, 6])
def test_key_change_chains_take_the_first_keys_values_like_a_reference_model(spark, refined_before):
    """Three random runs in one batch, each on keys, positions and offsets of its own (1000 apart):
    chains of different keys are independent, and must stay so."""
    changes, notes, stored = [], {}, []
    for seed in range(3):
        run, run_notes = random_key_changes(seed, 40, refined_before)
        base = 1000 * seed
        changes += [shifted(change, base) for change in run]
        notes |= {offset + base: note for offset, note in run_notes.items()}
        stored += [
            ((key + base,), -1, key + base, (key + base, f"stored note {key}", 0))
            for key in range(1, refined_before + 1)
        ]
    states = spark.createDataFrame(
        stored,
        "key struct<id:bigint>, state_lsn bigint, state_offset bigint, image struct<id:bigint, note:string, n:int>",
    )
    filled = fill_from_old_keys(spark.createDataFrame(changes, CHANGES), KEY_SCHEMA, states)
    assertDataFrameEqual(filled.where("after IS NOT NULL").select("kafka_offset", "after.note"), sorted(notes.items()))


def test_a_stored_rows_update_then_key_change_in_one_batch_carry_its_values_to_the_new_key(spark):
    """The old key's state before its key change is an update of a row refined in an earlier batch,
    with the placeholder for the value it left alone: the new key takes the stored row's value."""
    stored = spark.createDataFrame(
        [((1,), 1, 1, (1, "stored note", 0))],
        "key struct<id:bigint>, state_lsn bigint, state_offset bigint, image struct<id:bigint, note:string, n:int>",
    )
    changes = [
        ("u", (1,), (1, TOAST_PLACEHOLDER, 1), 5, 10, 0, []),
        ("d", (1,), None, 6, 11, 0, []),
        ("tombstone", (1,), None, None, 12, 0, []),  # the delete's tombstone: no LSN of its own
        ("c", (2,), (2, TOAST_PLACEHOLDER, 1), 6, 13, 0, [(OLD_KEY_HEADER, json.dumps({"id": 1}).encode())]),
    ]
    filled = fill_from_old_keys(spark.createDataFrame(changes, CHANGES), KEY_SCHEMA, stored)
    notes = filled.where("after IS NOT NULL").select("kafka_offset", "after.note")
    assertDataFrameEqual(notes, [(10, "stored note"), (13, "stored note")])


def test_a_batch_run_again_after_its_merge_never_fills_a_key_from_another_rows_later_life(spark):
    """Rows A (note X) and B (note W) swap keys through a temporary key T. Run again after its MERGE
    committed, the batch finds A's stored row holding W (B's row, re-keyed to A): the chain A to T to
    B must not take it. Its placeholders stay (the MERGE keeps the refined row's value)."""
    stored = spark.createDataFrame(
        [((1,), 20, 4, (1, "W", 0)), ((2,), 30, 6, (2, "X", 0))],  # A and B as the first run left them
        "key struct<id:bigint>, state_lsn bigint, state_offset bigint, image struct<id:bigint, note:string, n:int>",
    )

    def rekey(lsn: int, offset: int, old: int, new: int) -> list[tuple]:
        header = [(OLD_KEY_HEADER, json.dumps({"id": old}).encode())]
        return [
            ("d", (old,), None, lsn, offset, 0, []),
            ("c", (new,), (new, TOAST_PLACEHOLDER, 0), lsn, offset + 1, 0, header),
        ]

    changes = [*rekey(10, 1, 1, 3), *rekey(20, 3, 2, 1), *rekey(30, 5, 3, 2)]  # A to T, B to A, T to B
    filled = fill_from_old_keys(spark.createDataFrame(changes, CHANGES), KEY_SCHEMA, stored)
    notes = {row.id: row.note for row in filled.where("op = 'c'").select("after.id", "after.note").collect()}
    assert notes[2] in (TOAST_PLACEHOLDER, "X"), notes  # B: A's note, or none
    assert notes[1] in (TOAST_PLACEHOLDER, "W"), notes  # A: B's note, or none


def test_filled_changes_computed_again_after_the_batchs_merge_keep_the_stored_rows_read_before_it(spark, tmp_path):
    """The history computes the filled changes again after the batch's MERGE has removed the old key's
    stored row: they still take its values, as read when the batch began."""
    refined, row_schema = (
        str(tmp_path / "refined"),
        "id bigint, note string, n int, _cdc_lsn bigint, _cdc_offset bigint",
    )
    spark.createDataFrame([(1, "stored note", 0, 1, 1)], row_schema).write.format("delta").save(refined)
    changes = spark.createDataFrame(
        [
            ("u", (1,), (1, TOAST_PLACEHOLDER, 1), 5, 10, 0, []),
            ("d", (1,), None, 6, 11, 0, []),
            ("c", (2,), (2, TOAST_PLACEHOLDER, 1), 6, 12, 0, [(OLD_KEY_HEADER, json.dumps({"id": 1}).encode())]),
        ],
        CHANGES,
    )
    stored = stored_states(spark, [refined, str(tmp_path / "deleted")], ["id"], row_type_of(changes))
    filled = fill_from_old_keys(changes, KEY_SCHEMA, stored)

    def notes() -> DataFrame:
        return filled.where("after IS NOT NULL").select("kafka_offset", "after.note")

    assertDataFrameEqual(notes(), [(10, "stored note"), (12, "stored note")])
    spark.sql(f"DELETE FROM delta.`{refined}` WHERE id = 1")  # what the batch's MERGE does, then the insert
    spark.createDataFrame([(2, "stored note", 1, 6, 12)], row_schema).write.format("delta").mode("append").save(refined)
    assertDataFrameEqual(notes(), [(10, "stored note"), (12, "stored note")])


def test_a_row_re_keyed_fifteen_times_in_one_batch_keeps_its_values(spark):
    """Each round of a chain is planned on measured sizes: estimated ones multiplied through the rounds'
    joins until planning a chain of 10 links never ended."""
    changes = [("c", (0,), (0, "first", 0), 0, 0, 0, [])]
    for hop in range(1, 16):
        changes.append(("d", (hop - 1,), None, hop, 2 * hop - 1, 0, []))
        changes.append(
            (
                "c",
                (hop,),
                (hop, TOAST_PLACEHOLDER, hop),
                hop,
                2 * hop,
                0,
                [(OLD_KEY_HEADER, json.dumps({"id": hop - 1}).encode())],
            )
        )
    filled = fill_from_old_keys(spark.createDataFrame(changes, CHANGES), KEY_SCHEMA, None)
    assert {row.note for row in filled.where("after IS NOT NULL").select("after.note").collect()} == {"first"}


def test_chains_of_two_or_more_links_fill_every_change_and_keep_the_columns_in_order(spark):
    """With chains of two links the rounds run over the linked keys' changes alone: a change whose key
    is null (never a Debezium key, and filled all the same) is one of them, and the columns keep their order."""

    def key_change(old: int, new: int | None, offset: int) -> list[tuple]:
        new_key = None if new is None else (new,)
        headers = [(OLD_KEY_HEADER, json.dumps({"id": old}).encode())]
        return [
            ("d", (old,), None, offset, offset, 0, []),
            ("c", new_key, (new, TOAST_PLACEHOLDER, 0), offset, offset + 1, 0, headers),
        ]

    changes = [
        ("c", (1,), (1, "first", 0), 0, 0, 0, []),
        *key_change(1, 2, 1),
        *key_change(2, 3, 3),
        *key_change(3, None, 5),
        ("c", (7,), (7, "unlinked", 0), 7, 7, 0, []),
        ("u", (7,), (7, TOAST_PLACEHOLDER, 1), 8, 8, 0, []),
    ]
    batch = spark.createDataFrame(changes, CHANGES)
    filled = fill_from_old_keys(batch, KEY_SCHEMA, None)
    assert filled.columns == batch.columns
    assertDataFrameEqual(
        filled.where("after IS NOT NULL").select("kafka_offset", "after.note"),
        [(0, "first"), (2, "first"), (4, "first"), (6, "first"), (7, "unlinked"), (8, "unlinked")],
    )


def test_the_chain_depth_is_the_longest_chain_of_key_changes(spark):
    def depth(changes: list[tuple]) -> int:
        frame = spark.createDataFrame(changes, CHANGES).withColumn(
            "old_key", old_key(F.col("kafka_headers"), KEY_SCHEMA)
        )
        return chain_depth(frame, (F.col("op") == "c") & F.col("old_key").isNotNull())

    def rekey(offset: int, old: int, new: int) -> tuple:
        return (
            "c",
            (new,),
            (new, TOAST_PLACEHOLDER, 0),
            offset,
            offset,
            0,
            [(OLD_KEY_HEADER, json.dumps({"id": old}).encode())],
        )

    assert depth([("c", (1,), (1, "a", 0), 0, 0, 0, [])]) == 1  # no key change: one round, as before
    assert depth([rekey(i, i, 1000 + i) for i in range(1, 200)]) == 1  # a bulk re-key of independent rows
    assert depth([rekey(1, 1, 2), rekey(2, 2, 3), rekey(3, 3, 4), rekey(4, 10, 11)]) == 3
    assert depth([rekey(2, 2, 3), rekey(3, 1, 2)]) == 1  # 1 to 2 after 2 to 3: no chain


def change(
    op: str, key: int, note: str | None, lsn: int | None, offset: int, partition: int = 0, old: int | None = None
):
    """A change as the tests above write them (a tombstone or delete has no row)."""
    headers = [] if old is None else [(OLD_KEY_HEADER, json.dumps({"id": old}).encode())]
    return (op, (key,), None if op in ("d", "tombstone") else (key, note, 0), lsn, offset, partition, headers)


def stored_row(key: int, lsn: int, offset: int, note: str) -> tuple:
    return ((key,), lsn, offset, (key, note, 0))


STORED = "key struct<id:bigint>, state_lsn bigint, state_offset bigint, image struct<id:bigint, note:string, n:int>"
A, B, C = 1, 2, 3


@pytest.mark.parametrize(
    ("changes", "stored", "wanted"),
    [
        pytest.param(  # A to B, B updated, A re-inserted, A to C: a connector restart replays from A to B
            [
                change("d", A, None, 30, 5),
                change("tombstone", A, None, None, 6),
                change("c", C, TOAST_PLACEHOLDER, 30, 7, old=A),
                change("d", A, None, 10, 8),
                change("tombstone", A, None, None, 9),
                change("c", B, TOAST_PLACEHOLDER, 10, 10, old=A),
                change("u", B, "b", 15, 11),
            ],
            [stored_row(A, 20, 4, "a2"), stored_row(B, 15, 3, "b")],
            {7: "a2", 10: TOAST_PLACEHOLDER, 11: "b"},
            id="two key changes out of one key, its re-insert between them in an earlier batch",
        ),
        pytest.param(  # the updates of A delivered again after the refined row took them
            [
                change("u", A, TOAST_PLACEHOLDER, 350, 2),
                change("u", A, TOAST_PLACEHOLDER, 360, 3),
                change("d", A, None, 400, 4),
                change("tombstone", A, None, None, 5),
                change("c", B, TOAST_PLACEHOLDER, 400, 6, old=A),
            ],
            [stored_row(A, 360, 1, "X")],
            {2: TOAST_PLACEHOLDER, 3: "X", 6: "X"},
            id="replayed updates before a key change",
        ),
        pytest.param(  # run again after its MERGE: A's image kept at its delete, B refined
            [
                change("c", B, "oldB", 3, 9),
                change("d", B, None, 4, 10),
                change("u", A, TOAST_PLACEHOLDER, 5, 12),
                change("d", A, None, 6, 13),
                change("tombstone", A, None, None, 14),
                change("c", B, TOAST_PLACEHOLDER, 6, 15, old=A),
            ],
            [stored_row(A, 6, 13, "X"), stored_row(B, 6, 15, "X")],
            {9: "oldB", 12: TOAST_PLACEHOLDER, 15: "X"},
            id="a batch run again after its merge, onto a key deleted earlier in it",
        ),
    ],
)
def test_a_key_change_never_takes_another_lifes_values_on_replays_and_reruns(spark, changes, stored, wanted):
    """Cases a reviewer found where filling chains in one window per chain went wrong: each create
    takes the old key's state just before it, or keeps its placeholder (the MERGE keeps the refined
    row's value), never a value of another life of its new key."""
    filled = fill_from_old_keys(
        spark.createDataFrame(changes, CHANGES), KEY_SCHEMA, spark.createDataFrame(stored, STORED)
    )
    notes = {
        row.kafka_offset: row.note
        for row in filled.where("after IS NOT NULL").select("kafka_offset", "after.note").collect()
    }
    assert notes == wanted


def change_primary_keys(dsn: str) -> None:
    """Re-key a row refined earlier, and a row inserted and updated (TOAST placeholder) since."""
    with psycopg.connect(dsn) as conn:
        refined_earlier = conn.execute("SELECT min(id) FROM shop.customers").fetchone()[0]
        conn.execute("UPDATE shop.customers SET id = id + 1000 WHERE id = %s", (refined_earlier,))
    run_workload(dsn, customers=2, seed=32)  # updates its first customer, leaving the TOASTed notes alone
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE shop.customers SET id = id + 1000 WHERE id = (SELECT min(id) FROM shop.customers WHERE id > %s)",
            (refined_earlier + 1000,),
        )


# The most plan nodes a MERGE's source of a batch with key changes has: the batch's filled changes and its
# rows computed once are leaves of each write's plan (the history's, the largest, ~130 nodes). With the
# fills planned again by each write (~4,100 nodes), a warm driver took 60 s for a batch of 20 changes
# with history and a child table.
MOST_MERGE_SOURCE_NODES = 200


def plan_nodes(frame: DataFrame) -> int:
    """The nodes of ``frame``'s logical plan as built (a line each in its tree string)."""
    return len(frame._jdf.queryExecution().logical().treeString().splitlines())


def test_new_key_takes_the_old_rows_toasted_values(
    kafka,
    stack_config,
    postgres_connector,
    tmp_path,
    wait_for,
    land_and_refine,
    postgres_table,
    refined_table,
    monkeypatch,
):
    """With history and a child table: each of the batch's MERGEs plans its changes as computed rows."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    settings = {"history": True, "explode": ["tags"]}
    run_workload(dsn, customers=3, seed=31)
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    land_and_refine(warehouse, topic, **settings)

    change_primary_keys(dsn)

    def rekeyed_creates() -> list[tuple]:
        return [record for record in kafka.records(topic) if any(key == "__debezium.oldkey" for key, _ in record[5])]

    wait_for(lambda: len(rekeyed_creates()) == 2, 60, "both primary-key changes in Kafka", 0.5)
    assert all(TOAST_PLACEHOLDER.encode() in record[4] for record in rekeyed_creates())
    sources: list[int] = []  # each MERGE's source, in plan nodes
    merge = DeltaTable.merge

    def measured_merge(table: DeltaTable, source: DataFrame, condition):
        sources.append(plan_nodes(source))
        return merge(table, source, condition)

    monkeypatch.setattr(DeltaTable, "merge", measured_merge)
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic, **settings)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))
    assert refined_table(warehouse, topic).where(F.col("notes") == TOAST_PLACEHOLDER).count() == 0
    assert len(sources) >= 3, sources  # the rows, the children, the history
    assert max(sources) <= MOST_MERGE_SOURCE_NODES, sources


def test_new_key_in_the_batch_after_the_old_keys_delete(
    kafka,
    stack_config,
    postgres_connector,
    tmp_path,
    unique_name,
    wait_for,
    land_and_refine,
    postgres_table,
    refined_table,
):
    """Raw landing may end a batch between the delete of the old key and the create of the new one."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    run_workload(dsn, customers=2, seed=33)
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE shop.customers SET id = id + 1000 WHERE id = (SELECT min(id) FROM shop.customers)")
    records: list[tuple] = []

    def ends_with_the_rekeyed_create() -> bool:
        # The new key's create carries the old key in a header; the workload's own creates do not.
        records[:] = kafka.records(topic)
        return bool(records) and any(key == "__debezium.oldkey" for key, _ in records[-1][5])

    wait_for(ends_with_the_rekeyed_create, 60, "the primary-key change in Kafka", 0.5)
    split = len(records) - 1  # the delete and its tombstone in the first batch, the create in the next
    copy = kafka.create_topic(f"{unique_name}.copy")
    for chunk in (records[:split], records[split:]):
        kafka.produce_again(copy, chunk)
        land_and_refine(warehouse, copy)
    assertDataFrameEqual(refined_table(warehouse, copy), postgres_table("customers"))


# A value of ~20 KB of random text, out of line and uncompressed (STORAGE EXTERNAL): always TOASTed.
BIG_NOTE = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 640))"
END_MARKER = "INSERT INTO shop.{table} VALUES (100000, 0, 'end')"  # the last record, awaited in Kafka
CHAINS = {
    "re-keyed, updated, re-keyed": [
        [
            "INSERT INTO shop.{table} VALUES (1, 0, " + BIG_NOTE + ")",
            "UPDATE shop.{table} SET id = 2 WHERE id = 1",
            "UPDATE shop.{table} SET n = 1 WHERE id = 2",
            "UPDATE shop.{table} SET id = 3 WHERE id = 2",
        ],
    ],
    "three hops": [
        [
            "INSERT INTO shop.{table} VALUES (1, 0, " + BIG_NOTE + ")",
            "UPDATE shop.{table} SET id = 2 WHERE id = 1",
            "UPDATE shop.{table} SET id = 3 WHERE id = 2",
            "UPDATE shop.{table} SET id = 4 WHERE id = 3",
        ],
    ],
    "refined, then re-keyed twice with an update between": [
        ["INSERT INTO shop.{table} VALUES (1, 0, " + BIG_NOTE + ")"],
        [
            "UPDATE shop.{table} SET id = 2 WHERE id = 1",
            "UPDATE shop.{table} SET n = 1 WHERE id = 2",
            "UPDATE shop.{table} SET id = 3 WHERE id = 2",
        ],
    ],
    "re-keyed onto a key deleted earlier in the batch": [
        [
            "INSERT INTO shop.{table} VALUES (5, 0, 'the deleted row''s note')",
            "INSERT INTO shop.{table} VALUES (1, 0, " + BIG_NOTE + ")",
            "DELETE FROM shop.{table} WHERE id = 5",
            "UPDATE shop.{table} SET id = 5 WHERE id = 1",
        ],
    ],
    "refined, then updated and re-keyed": [
        ["INSERT INTO shop.{table} VALUES (1, 0, " + BIG_NOTE + ")"],
        ["UPDATE shop.{table} SET n = 1 WHERE id = 1", "UPDATE shop.{table} SET id = 2 WHERE id = 1"],
    ],
}


def with_keys_from(statement: str, base: int) -> str:
    """A statement of :data:`CHAINS` with its primary keys moved up by ``base``."""
    return re.sub(r"\b(id = |VALUES \()(\d+)", lambda m: f"{m.group(1)}{int(m.group(2)) + base}", statement)


def test_chained_key_changes_keep_the_toasted_values(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name, land_and_refine, refined_table
):
    """Every chain of :data:`CHAINS` on keys of its own (10 apart) in one table, its first batch's
    statements refined together with the others' first batches, then the second batches (with history):
    a key change's create takes its TOASTed values from the old key's state even when that state is
    itself a key change's create."""
    dsn, warehouse, table = stack_config.postgres.dsn(), str(tmp_path), f"rekey_{unique_name}"
    topic = f"{postgres_connector.topic_prefix}.shop.{table}"
    batches: list[list[str]] = [[], []]
    for number, chain in enumerate(CHAINS.values()):
        for batch, statements in zip(batches, chain, strict=False):
            batch.extend(with_keys_from(statement, 10 * number) for statement in statements)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE shop.{table} (id int PRIMARY KEY, n int, notes text)")
        conn.execute(f"ALTER TABLE shop.{table} ALTER COLUMN notes SET STORAGE EXTERNAL")
        add_to_publication(conn, postgres_connector.name, f"shop.{table}")

    def source():
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(f"SELECT id, n, notes FROM shop.{table}").fetchall()
        return spark.createDataFrame(rows, "id int, n int, notes string")

    try:
        for number, statements in enumerate(batches):
            with psycopg.connect(dsn, autocommit=True) as conn:
                for statement in [*statements, END_MARKER.replace("100000", str(100000 + number))]:
                    conn.execute(statement.format(table=table))
            kafka.wait_for_last_value(topic, lambda value: value is not None and b'"notes":"end"' in value)
            for _ in range(2):  # a rerun changes nothing
                land_and_refine(warehouse, topic, history=True)
                history = spark.read.format("delta").load(f"{warehouse}/refined/{topic}__history")
                assertDataFrameEqual(refined_table(warehouse, topic).select("id", "n", "notes"), source())
                assertDataFrameEqual(history.where("_cdc_is_current").select("id", "n", "notes"), source())
                assert history.where(F.col("notes") == TOAST_PLACEHOLDER).count() == 0
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE shop.{table}")
