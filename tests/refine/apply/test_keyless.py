"""A table without a primary key refined as a multiset: duplicates kept, one copy removed per delete."""

import hashlib
import json
from collections import Counter
from datetime import UTC

import psycopg
from pyspark.testing import assertDataFrameEqual

from cdc.stack.postgres import add_to_publication
from cdc.stack.workload import run_workload
from refine.config import refined_table_location


def test_keyless_table_equals_postgres_with_duplicates_and_replays(
    kafka, stack_config, postgres_connector, tmp_path, land_and_refine, postgres_table, refined_table
):
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.page_views"
    run_workload(dsn, customers=3, seed=51)  # duplicate rows, an update, a delete of one of two equal rows
    records = kafka.wait_for_last_value(topic, lambda value: value is None)
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))

    kafka.produce_again(topic, records)
    land_and_refine(warehouse, topic)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))

    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE shop.page_views")
        conn.execute(
            "INSERT INTO shop.page_views VALUES (7, '/same', '2026-02-01Z'), (7, '/same', '2026-02-01Z'), "
            "(7, '/same', '2026-02-01Z'), (NULL, '/other', '2026-02-02Z')"
        )
        conn.execute(
            "DELETE FROM shop.page_views WHERE ctid = (SELECT min(ctid) FROM shop.page_views WHERE url = '/same')"
        )
        conn.execute("INSERT INTO shop.page_views VALUES (8, '/last', '2026-02-03Z')")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"/last"' in value)
    land_and_refine(warehouse, topic)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))
    assert refined_table(warehouse, topic).where("url = '/same'").count() == 2


def test_a_transaction_that_commits_after_a_later_one_is_not_taken_for_a_replay(
    kafka, stack_config, postgres_connector, tmp_path, land_and_refine, postgres_table, refined_table
):
    """Postgres logs concurrent transactions' rows interleaved and Debezium streams each at its commit:
    the one that wrote first and committed last comes after the other, with lower LSNs. Refined in
    separate batches, its rows must still count (they are not replays of what was applied)."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.page_views"
    run_workload(dsn, customers=2, seed=52)
    with psycopg.connect(dsn) as wrote_first, psycopg.connect(dsn, autocommit=True) as committed_first:
        wrote_first.execute("INSERT INTO shop.page_views VALUES (21, '/wrote-first', '2026-03-01Z')")  # open
        committed_first.execute("INSERT INTO shop.page_views VALUES (22, '/committed-first', '2026-03-02Z')")
        kafka.wait_for_last_value(topic, lambda value: value is not None and b'"/committed-first"' in value)
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))
        wrote_first.commit()
    records = kafka.wait_for_last_value(topic, lambda value: value is not None and b'"/wrote-first"' in value)
    envelopes = [json.loads(value) for *_, value, _ in records if value is not None]
    lsns = {
        envelope.get("payload", envelope)["after"]["url"]: envelope.get("payload", envelope)["source"]["lsn"]
        for envelope in envelopes
        if envelope.get("payload", envelope)["after"]
    }
    assert lsns["/wrote-first"] < lsns["/committed-first"], f"the rows' LSNs did not interleave: {lsns}"
    for _ in range(2):  # and a rerun changes nothing
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))
    kafka.produce_again(topic, records)  # replays of both are still recognised
    land_and_refine(warehouse, topic)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))


def test_records_sent_again_from_before_an_added_column_keep_the_column_and_its_values(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name, land_and_refine, refined_table
):
    """A restarted Kafka Connect task sends a suffix of what it sent again, so records from before an ALTER
    may follow, in the topic, those after it. The table's shape is still the newest change's: the added
    column and the value an update wrote to it stay (a keyless table's rows are images of its columns now)."""
    dsn, warehouse, table = stack_config.postgres.dsn(), str(tmp_path), f"shop.{unique_name}"
    topic = f"{postgres_connector.topic_prefix}.{table}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (a int, n int)")
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        add_to_publication(conn, postgres_connector.name, table)
        conn.execute(f"INSERT INTO {table} VALUES (1, 10), (2, 20)")
    before_alter = kafka.wait_for_last_value(topic, lambda value: value is not None and b'"n":20' in value)
    land_and_refine(warehouse, topic)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN x int")
        conn.execute(f"UPDATE {table} SET n = 11, x = 3 WHERE a = 1")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"x":3' in value)
    kafka.produce_again(topic, before_alter)
    expected = spark.createDataFrame([(1, 11, 3), (2, 20, None)], "a int, n int, x int")
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        refined = refined_table(warehouse, topic)
        assert "x" in refined.columns, f"the added column is missing: {refined.columns}"
        assertDataFrameEqual(refined.select("a", "n", "x"), expected)


def _shaped_rows(dsn: str, table: str) -> Counter:
    """Postgres's rows as the shaped table must hold them: those with a url, the url hashed (hashlib), the
    hour computed, `note` left out, as many of each as Postgres has."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT customer_id, url, viewed_at FROM {table} WHERE url IS NOT NULL").fetchall()
    return Counter(
        (customer, hashlib.sha256(url.encode()).hexdigest(), viewed_at.astimezone(UTC).hour)
        for customer, url, viewed_at in rows
    )


def test_a_shaped_keyless_table_follows_postgres_and_keeps_its_deleted_rows(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name, land_and_refine
):
    """Columns left out, a mask, a computed column, `where` and soft deletes on a table without a primary key
    (equal rows, a truncate, an ALTER), compared with Postgres read back; a deleted row stays, marked, as
    many copies of it as there ever were at once."""
    dsn, warehouse, table = stack_config.postgres.dsn(), str(tmp_path), f"shop.{unique_name}"
    topic = f"{postgres_connector.topic_prefix}.{table}"
    shape = {
        "except_columns": ["note"],
        "mask": {"url": "sha256"},
        "computed": {"hour": "hour(viewed_at)"},
        "where": "url IS NOT NULL",
        "deletes": "soft",
        "partition_by": ["hour"],
    }
    view = "(7, '/same', '2026-02-01 10:00Z', 'n')"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (customer_id int, url text, viewed_at timestamptz, note text)")
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        add_to_publication(conn, postgres_connector.name, table)
        conn.execute(f"INSERT INTO {table} VALUES {view}, {view}, {view}, (8, NULL, '2026-02-01 11:00Z', 'x')")
        conn.execute(f"INSERT INTO {table} VALUES (9, '/gone', '2026-02-02 12:00Z', 'n')")
        conn.execute(f"DELETE FROM {table} WHERE customer_id = 9")
        conn.execute(f"UPDATE {table} SET note = 'only the note' WHERE customer_id = 8")

    def refined_at(marker: bytes, deleted: Counter) -> None:
        kafka.wait_for_last_value(topic, lambda value: value is not None and marker in value)
        for _ in range(2):  # a rerun changes nothing
            land_and_refine(warehouse, topic, shape=shape)
            refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
            assert "note" not in refined.columns
            assert ("referrer" in refined.columns) == (marker != b'"only the note"')  # the ALTER's column is kept
            live = Counter((r.customer_id, r.url, r.hour) for r in refined.where("_cdc_deleted_at IS NULL").collect())
            assert live == _shaped_rows(dsn, table)
            gone = Counter(
                (r.customer_id, r.url, r.hour) for r in refined.where("_cdc_deleted_at IS NOT NULL").collect()
            )
            assert gone == Counter(
                {(c, hashlib.sha256(u.encode()).hexdigest(), h): n for (c, u, h), n in deleted.items()}
            )
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{refined_table_location(warehouse, topic)}`").head()
        assert detail.partitionColumns == ["hour"]

    refined_at(b'"only the note"', Counter({(9, "/gone", 12): 1}))
    with psycopg.connect(dsn, autocommit=True) as conn:
        # One copy of three goes, then two more come: four at once at most.
        conn.execute(f"DELETE FROM {table} WHERE ctid = (SELECT min(ctid) FROM {table} WHERE url = '/same')")
        conn.execute(f"INSERT INTO {table} VALUES {view}, {view}")
        conn.execute(f"UPDATE {table} SET url = '/now' WHERE customer_id = 8")  # matches `where` now
        conn.execute(f"ALTER TABLE {table} ADD COLUMN referrer text")
        conn.execute(f"INSERT INTO {table} VALUES (10, '/last', '2026-02-03 13:00Z', 'n', 'mail')")
    refined_at(b'"/last"', Counter({(9, "/gone", 12): 1}))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {table}")
        conn.execute(f"INSERT INTO {table} VALUES {view}")
    refined_at(
        b'"referrer":null',
        Counter({(9, "/gone", 12): 1, (7, "/same", 10): 3, (8, "/now", 11): 1, (10, "/last", 13): 1}),
    )
