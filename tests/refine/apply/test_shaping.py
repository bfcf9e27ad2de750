"""Shaped tables: the pure stages against independent oracles (Python's hashlib and hmac), and a shaped
pipeline table on the real stack compared with Postgres read back."""

import hashlib
import hmac
import itertools
import random
from datetime import datetime

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import ConfigError
from refine.apply.shaping import (
    REDACTED,
    DeleteMode,
    MaskKey,
    MaskMethod,
    TableShape,
    fill_ignored_nulls,
    masked_reason,
    shaped_rows,
    with_masked_keys,
)

ROWS = "id long, email string, name string, active boolean, _cdc_lsn long, _cdc_offset long, _cdc_op string"


def test_masks_hash_the_values_text_as_hashlib_and_hmac_do(spark):
    rng = random.Random(7)
    texts = [
        "",
        "a",
        "Ünïcødé ✓",
        "x" * 300,
        *("".join(rng.choice("ab@.é") for _ in range(rng.randint(1, 40))) for _ in range(50)),
    ]
    keys = [b"k", b"secret key", bytes(range(64)), bytes(range(100))]  # shorter, one block, longer (hashed first)
    rows = spark.createDataFrame(
        [(i, t, t, True, 1, i, "u") for i, t in enumerate(texts)] + [(999, None, None, True, 1, 0, "u")], ROWS
    )
    for key in keys:
        shape = TableShape(mask={"email": MaskMethod.SHA256, "name": MaskMethod.HMAC_SHA256}, mask_key=MaskKey(env="K"))
        got = {r.id: (r.email, r.name) for r in shaped_rows(rows, shape, ["id"], "t", key).collect()}
        for i, text in enumerate(texts):
            assert got[i] == (
                hashlib.sha256(text.encode()).hexdigest(),
                hmac.new(key, text.encode(), hashlib.sha256).hexdigest(),
            )
        assert got[999] == (None, None)
    redacted = shaped_rows(rows, TableShape(mask={"email": "redact", "name": "nullify"}), ["id"], "t")
    assert {(r.email, r.name) for r in redacted.collect()} == {(REDACTED, None), (None, None)}


def test_numbers_hash_their_text_so_a_widened_column_hashes_the_same(spark):
    small = spark.createDataFrame(
        [(1, 5, 1, 1, "c")], "id long, n smallint, _cdc_lsn long, _cdc_offset long, _cdc_op string"
    )
    wide = small.withColumn("n", F.col("n").cast("bigint"))
    shape = TableShape(mask={"n": MaskMethod.SHA256})
    assert shaped_rows(small, shape, ["id"], "t").head().n == shaped_rows(wide, shape, ["id"], "t").head().n
    assert shaped_rows(small, shape, ["id"], "t").head().n == hashlib.sha256(b"5").hexdigest()


def test_where_turns_rows_that_stop_matching_into_deletes_and_columns_are_selected(spark):
    at = datetime(2026, 1, 2, 3, 4, 5)
    rows = spark.createDataFrame(
        [
            (1, "a@x", "A", True, 1, 1, "u"),
            (2, "b@x", "B", False, 1, 2, "u"),  # stops matching: a delete
            (3, "c@x", "C", None, 1, 3, "c"),  # NULL does not match
            (4, "d@x", "D", False, 1, 4, "d"),  # a delete of a row the table would not hold
            (5, "e@x", "E", True, 1, 5, "d"),  # a delete of one it would: kept when soft
        ],
        ROWS,
    ).withColumn("_cdc_committed_at", F.lit(at))
    shape = TableShape(
        except_columns=["name"],
        computed={"domain": "substring_index(email, '@', -1)"},
        where="active",
        deletes=DeleteMode.SOFT,
    )
    shaped = shaped_rows(rows, shape, ["id"], "t")
    assert shaped.columns == [
        "id",
        "email",
        "active",
        "_cdc_lsn",
        "_cdc_offset",
        "_cdc_op",
        "_cdc_committed_at",
        "domain",
        "_cdc_deleted_at",
    ]
    assert {r.id: (r._cdc_op, r.domain, r._cdc_deleted_at) for r in shaped.collect()} == {
        1: ("u", "x", None),
        2: ("d", "x", None),
        3: ("d", "x", None),
        4: ("d", "x", None),
        5: ("d", "x", at),
    }


def test_masked_keys_are_hashed_once_where_keys_are_compared(spark):
    changes = spark.createDataFrame(
        [((7,), None, (7, "a@x"), "c"), ((7,), (7, "a@x"), None, "d")],
        "key struct<id: bigint>, before struct<id: bigint, email: string>, after struct<id: bigint, email: string>, "
        "op string",
    )
    shape = TableShape(mask={"id": MaskMethod.SHA256, "email": MaskMethod.SHA256})
    hashed = hashlib.sha256(b"7").hexdigest()
    rows = with_masked_keys(changes, shape, ["id"], None).collect()
    assert [(r.key.id, r.before and r.before.id, r.after and r.after.id) for r in rows] == [
        (hashed, None, hashed),
        (hashed, hashed, None),
    ]
    assert rows[0].after.email == "a@x"  # the other columns are masked with the row (shaped_rows)
    refined = spark.createDataFrame(
        [(hashed, "a@x", 1, 1, "c")], "id string, email string, _cdc_lsn long, _cdc_offset long, _cdc_op string"
    )
    assert shaped_rows(refined, shape, ["id"], "t").head().id == hashed  # not hashed twice


def test_a_shapes_fingerprint_follows_what_it_makes_of_rows():
    plain = TableShape()
    masked = TableShape(mask={"email": MaskMethod.HMAC_SHA256}, mask_key=MaskKey(env="K"))
    assert plain.fingerprint(None) is None
    assert masked.fingerprint(b"one") == masked.fingerprint(b"one")
    assert masked.fingerprint(b"one") != masked.fingerprint(b"two")  # a rotated key changes every hash
    assert TableShape(where="a").fingerprint(None) != TableShape(where="b").fingerprint(None)
    assert "one" not in masked.fingerprint(b"one")


def test_quarantine_reasons_quote_no_value_of_a_masked_column(spark):
    reasons = [
        (
            'field after.email: cannot read {"x": "ann@x.org"} as string',
            "field after.email: cannot read [masked] as string",
        ),
        (
            'field email: cannot read "ann as x" as io.debezium.time.Date (int32)',
            "field email: cannot read [masked] as io.debezium.time.Date (int32)",
        ),
        (
            "field key.email: ann@x.org is not the row's after.email, bob@x.org",
            "field key.email: [masked] is not the row's after.email, [masked]",
        ),
        (
            "field after.email: ann@x.org does not fit the refined column's type int (the source's is now string; ...)",
            "field after.email: [masked] does not fit the refined column's type int (the source's is now string; ...)",
        ),
        ("field after.name: cannot read 7 as string", "field after.name: cannot read 7 as string"),  # not masked
        (
            "field after.emails: cannot read 7 as string",
            "field after.emails: cannot read 7 as string",
        ),  # another column
    ]
    rows = spark.createDataFrame([(text,) for text, _ in reasons], "reason string")
    shape = TableShape(mask={"email": "sha256"})
    got = [r.masked for r in rows.select(masked_reason(F.col("reason"), shape).alias("masked")).collect()]
    assert got == [wanted for _, wanted in reasons]


def test_bad_shapes_fail_with_the_key_named(spark):
    rows = spark.createDataFrame([(1, "a@x", "A", True, 1, 1, "u")], ROWS)
    with pytest.raises(ConfigError, match=r"computed: .*nope"):
        shaped_rows(rows, TableShape(computed={"x": "nope + 1"}), ["id"], "t")
    with pytest.raises(ConfigError, match="where: "):
        shaped_rows(rows, TableShape(where="active AND ("), ["id"], "t")
    with pytest.raises(ConfigError, match="no column avatar"):
        shaped_rows(rows, TableShape(except_columns=["avatar"]), ["id"], "t")
    with pytest.raises(ConfigError, match="primary-key column id cannot be left out"):
        TableShape(columns=["email"]).check_keys(["id"], "t")
    with pytest.raises(ConfigError, match="id can only be hashed"):
        TableShape(mask={"id": "nullify"}).check_keys(["id"], "t")
    with pytest.raises(ConfigError, match="environment variable CDC_NO_SUCH_KEY holds no key"):
        MaskKey(env="CDC_NO_SUCH_KEY").read()


def test_ignored_nulls_take_the_keys_last_value_since_its_last_delete(spark):
    changes = spark.createDataFrame(
        [
            (1, 1, "c", ("ann", 5)),
            (1, 2, "u", (None, 6)),  # name NULL: keeps ann
            (1, 3, "d", None),
            (1, 4, "c", (None, 7)),  # after a delete nothing carries over
            (2, 5, "u", ("bob", None)),
            (2, 6, "u", (None, None)),
        ],
        "id long, source_lsn long, op string, after struct<name: string, n: long>",
    ).select(F.struct("id").alias("key"), F.lit(0).cast("long").alias("kafka_offset"), "source_lsn", "op", "after")
    filled = fill_ignored_nulls(changes, ["id"], ["name", "n"]).orderBy("source_lsn").collect()
    assert [r.after and (r.after.name, r.after.n) for r in filled] == [
        ("ann", 5),
        ("ann", 6),
        None,
        (None, 7),
        ("bob", None),
        ("bob", None),
    ]


# --- on the real stack ---------------------------------------------------------------------------

KEPT = ["id", "email", "full_name", "balance", "signed_up_at", "is_active", "tags", "external_id"]
MASK_KEY = "a key only this test knows"
TRACKED = ["email", "full_name", "is_active", "tags"]  # balance, signed_up_at...: updated in place


def _shaped_source(source, ids):
    """Postgres's customers as the shaped table must hold them: active rows of ``ids``, email hashed,
    full_name HMACed (Python's hashlib and hmac), signup_year computed, the rest of KEPT as they are."""
    rows = []
    for r in source.where(F.col("id").isin(ids)).collect():
        if not r.is_active:
            continue
        rows.append(
            (
                r.id,
                hashlib.sha256(r.email.encode()).hexdigest(),
                None
                if r.full_name is None
                else hmac.new(MASK_KEY.encode(), r.full_name.encode(), hashlib.sha256).hexdigest(),
                r.balance,
                r.signed_up_at,
                r.is_active,
                r.tags,
                r.external_id,
                r.signed_up_at.year,
            )
        )
    return rows


def test_a_shaped_table_follows_postgres(
    spark, kafka, stack_config, postgres_connector, postgres_table, pipeline_run, monkeypatch
):
    """columns left out, masks, a computed column, `where`, soft deletes (a re-insert and a row matching
    again revive), clustering, a history tracking some columns and an exploded array shaped alike;
    beside it, the same source with `ignore_null_updates` and partitions, compared with a model of the
    NULLs it ignores; then a rebuild from the raw table."""
    import psycopg

    from cdc.stack.workload import _insert_customer

    monkeypatch.setenv("CDC_TEST_MASK_KEY", MASK_KEY)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    rng = random.Random(11)
    dsn = stack_config.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM shop.customers WHERE id < 1000000").fetchone()[0]
        first += 5 - first % 5 + 1  # ids first..first+3 active (id % 5 != 0), first+4 not
        ids = list(range(first, first + 6))
        for customer in ids[:5]:
            _insert_customer(conn, rng, customer)
        conn.execute("UPDATE shop.customers SET full_name = 'round zero' WHERE id = %s", (ids[0],))
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"round zero"' in value)
    a, b, c, d, _inactive, e = ids
    pipeline = {
        "name": "crm",
        "sources": {"customers": {"kind": "debezium_postgres", "topic": topic}},
        "refined": {
            "customers": {
                "source": "customers",
                "except_columns": ["avatar", "notes", "profile", "credit_limit", "birth_date"],
                "mask": {"email": "sha256", "full_name": "hmac_sha256"},
                "mask_key": {"env": "CDC_TEST_MASK_KEY"},
                "computed": {"signup_year": "year(signed_up_at)"},
                "where": "is_active",
                "deletes": "soft",
                "explode": ["tags"],
                "scd": 2,
                "track_history_columns": TRACKED,
                "cluster_by": ["id"],
            },
            "customers_kept": {
                "source": "customers",
                "columns": ["id", "full_name", "balance", "is_active"],
                "ignore_null_updates": ["full_name", "balance"],
                "partition_by": ["is_active"],
            },
        },
    }
    kept_model = {}  # id -> (full_name, balance): Postgres's values, a NULL set by an update ignored

    def check_tables(deleted: set[int]) -> None:
        source = postgres_table("customers")
        shaped = pipeline_run.table("customers")
        live = shaped.where(F.col("id").isin(ids) & F.col("_cdc_deleted_at").isNull())
        assertDataFrameEqual(
            live.select(*KEPT, "signup_year"),
            spark.createDataFrame(_shaped_source(source, ids), live.select(*KEPT, "signup_year").schema),
        )
        assert {"avatar", "notes", "profile"}.isdisjoint(shaped.columns)
        gone = {r.id for r in shaped.where(F.col("id").isin(ids) & F.col("_cdc_deleted_at").isNotNull()).collect()}
        assert gone == deleted
        children = pipeline_run.table("customers__tags").where(F.col("id").isin(ids))
        assertDataFrameEqual(
            children.select("id", "pos", "value"), live.select("id", F.posexplode("tags").alias("pos", "value"))
        )
        history = pipeline_run.table("customers__history").where(F.col("id").isin(ids))
        assertDataFrameEqual(
            history.where("_cdc_is_current").select(*KEPT, "signup_year"), live.select(*KEPT, "signup_year")
        )
        assert "_cdc_deleted_at" not in history.columns
        versions = history.orderBy("id", "_cdc_lsn", "_cdc_offset").collect()
        for v, w in itertools.pairwise(versions):  # a version only where a tracked column changed
            if v.id == w.id and not v._cdc_is_deleted and not w._cdc_is_deleted:
                assert [v[c] for c in TRACKED] != [w[c] for c in TRACKED], (v, w)
        assert {r.id for r in history.where("_cdc_is_deleted").collect()} >= deleted
        assert spark.sql(
            f"DESCRIBE DETAIL delta.`{pipeline_run.warehouse}/refined/customers`"
        ).head().clusteringColumns == ["id"]
        rows = {
            r.id: (r.full_name, r.balance)
            for r in pipeline_run.table("customers_kept").where(F.col("id").isin(ids)).collect()
        }
        present = source.where(F.col("id").isin(ids)).collect()
        for r in present:
            kept_model[r.id] = tuple(
                old if new is None and r.id in kept_model else new
                for new, old in zip((r.full_name, r.balance), kept_model.get(r.id, (None, None)), strict=True)
            )
        assert rows == {r.id: kept_model[r.id] for r in present}
        assert spark.sql(
            f"DESCRIBE DETAIL delta.`{pipeline_run.warehouse}/refined/customers_kept`"
        ).head().partitionColumns == ["is_active"]

    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        check_tables(set())  # `inactive` never matched: it never reaches the table
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE shop.customers SET full_name = 'first', balance = 5 WHERE id = %s", (a,))
        conn.execute("UPDATE shop.customers SET full_name = NULL, balance = NULL, email = 'new@x' WHERE id = %s", (a,))
        conn.execute("DELETE FROM shop.customers WHERE id = %s", (b,))
        conn.execute("UPDATE shop.customers SET is_active = false WHERE id = %s", (c,))  # leaves the shaped table
        _insert_customer(conn, rng, e)  # created and deleted within one batch: kept, soft-deleted
        conn.execute("DELETE FROM shop.customers WHERE id = %s", (e,))
        conn.execute("UPDATE shop.customers SET full_name = 'round one' WHERE id = %s", (d,))
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"round one"' in value)
    kept_model[a] = ("first", 5)  # the NULLs came in the update after 'first'/5, in the same batch
    for _ in range(2):
        assert pipeline_run(pipeline) == 0
        check_tables({b, c, e})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE shop.customers SET full_name = NULL, tags = ARRAY['x'] WHERE id = %s", (a,))
        conn.execute("UPDATE shop.customers SET balance = 7 WHERE id = %s", (a,))
        _insert_customer(conn, rng, b)  # re-inserted: revives
        conn.execute("UPDATE shop.customers SET is_active = true WHERE id = %s", (c,))  # matches again
        conn.execute("DELETE FROM shop.customers WHERE id = %s", (d,))
        conn.execute("UPDATE shop.customers SET full_name = 'round two' WHERE id = %s", (a,))
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"round two"' in value)
    kept_model.pop(b, None)  # a new row: nothing carries over
    for _ in range(2):
        assert pipeline_run(pipeline) == 0
        check_tables({d, e})
    assert kept_model[a] == ("round two", 7)
    # A rebuild from the raw table shapes alike, and keeps each table's layout.
    assert pipeline_run(pipeline, "--rebuild") == 0
    check_tables({d, e})
    # Another shape (balance masked too) is refused on the table refined with this one, then rebuilt.
    pipeline["refined"]["customers"]["mask"]["balance"] = "sha256"
    assert pipeline_run(pipeline) == ConfigError.exit_code
    assert pipeline_run(pipeline, "--rebuild") == 0
    live = pipeline_run.table("customers").where(F.col("id").isin(ids) & F.col("_cdc_deleted_at").isNull())
    source = {r.id: r.balance for r in postgres_table("customers").where(F.col("id").isin(ids)).collect()}
    assert {r.id: r.balance for r in live.collect()} == {
        i: hashlib.sha256(str(source[i]).encode()).hexdigest() for i in (a, b, c)
    }


def test_a_shaped_table_follows_alters_widening_and_dropping_its_columns(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name, land_and_refine
):
    """A masked, filtered, computed table under `smallint -> integer` and a DROP COLUMN (the lenient policy:
    widen, keep the dropped column NULL in later rows), compared with Postgres read back."""
    import psycopg

    from cdc.stack.postgres import add_to_publication
    from refine.config import refined_table_location

    dsn, warehouse, table = stack_config.postgres.dsn(), str(tmp_path), f"shop.{unique_name}"
    topic = f"{postgres_connector.topic_prefix}.{table}"
    shape = {
        "except_columns": ["note"],
        "mask": {"email": "sha256"},
        "computed": {"big": "n > 100"},
        "where": "n > 0",
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n smallint, email text, note text, tag text)")
        add_to_publication(conn, postgres_connector.name, table)
        conn.execute(f"INSERT INTO {table} VALUES (1, 5, 'a@x', 'n', 't1'), (2, -1, 'b@x', 'n', 't2')")

    def refined_equals_postgres(marker: bytes, dropped: bool) -> None:
        kafka.wait_for_last_value(topic, lambda value: value is not None and marker in value)
        with psycopg.connect(dsn) as conn:
            columns = "id, n, email" + ("" if dropped else ", tag")
            source = conn.execute(f"SELECT {columns} FROM {table} WHERE n > 0").fetchall()
        expected = {
            r[0]: (r[1], hashlib.sha256(r[2].encode()).hexdigest(), r[1] > 100, None if dropped else r[3])
            for r in source
        }
        for _ in range(2):  # a rerun changes nothing
            land_and_refine(warehouse, topic, shape=shape)
            refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
            assert "note" not in refined.columns
            got = {r.id: (r.n, r.email, r.big, r.tag) for r in refined.collect()}
            assert got == expected, (got, expected)

    refined_equals_postgres(b'"t2"', dropped=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE integer")
        conn.execute(f"UPDATE {table} SET n = 2 WHERE id = 2")  # now matches `where`
        conn.execute(f"INSERT INTO {table} VALUES (3, 70000, 'c@x', 'n', 't3')")
    refined_equals_postgres(b'"t3"', dropped=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} DROP COLUMN tag")
        conn.execute(f"UPDATE {table} SET email = 'new@x' WHERE id = 1")
        conn.execute(f"UPDATE {table} SET email = 'c2@x' WHERE id = 3")
        conn.execute(f"UPDATE {table} SET email = 'b2@x', n = 3 WHERE id = 2")
    refined_equals_postgres(b'"b2@x"', dropped=True)
    types = dict(spark.read.format("delta").load(refined_table_location(warehouse, topic)).dtypes)
    assert types["n"] == "int"  # widened
