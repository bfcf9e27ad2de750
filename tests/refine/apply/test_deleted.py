"""Deleted rows stay deleted when Debezium's records are delivered again; a genuine re-insert comes back; a
change delivered again is no new version in the history."""

import psycopg
from pyspark.testing import assertDataFrameEqual

from cdc.stack.postgres import add_to_publication
from cdc.stack.workload import run_workload


def test_replayed_records_never_resurrect_a_deleted_row(
    kafka, stack_config, postgres_connector, tmp_path, land_and_refine, postgres_table, refined_table
):
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    prefix = postgres_connector.topic_prefix
    run_workload(dsn, customers=3, seed=41)  # ends by deleting its last customer and that customer's orders
    for table in ("customers", "orders"):
        topic = f"{prefix}.shop.{table}"
        records = kafka.wait_for_last_value(topic, lambda value: value is None)
        land_and_refine(warehouse, topic)
        kafka.produce_again(topic, records)
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table(table))

    with psycopg.connect(dsn) as conn:  # the deleted customer comes back, at a later position
        deleted = conn.execute("SELECT max(id) + 1 FROM shop.customers").fetchone()[0]
        conn.execute(
            "INSERT INTO shop.customers (id, email, signed_up_at) VALUES (%s, 'back@example.com', now())", (deleted,)
        )
    topic = f"{prefix}.shop.customers"
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"back@example.com" in value)
    land_and_refine(warehouse, topic)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))
    assert refined_table(warehouse, topic).where(f"id = {deleted}").count() == 1


def test_replayed_records_never_undo_a_truncate(
    kafka, stack_config, postgres_connector, tmp_path, land_and_refine, postgres_table, refined_table
):
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    run_workload(dsn, customers=2, seed=42)
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE shop.orders")
        conn.execute("INSERT INTO shop.orders VALUES (1, 1, 'paid', 1.00, '2026-05-01 00:00:00')")
    records = kafka.wait_for_last_value(topic, lambda value: value is not None and b'"op":"c"' in value)
    land_and_refine(warehouse, topic)
    kafka.produce_again(topic, records[:-2])  # the records before the truncate
    land_and_refine(warehouse, topic)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("orders"))


def test_a_truncate_in_a_tables_first_batch_with_no_delete(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name, land_and_refine, refined_table
):
    dsn, warehouse, table = stack_config.postgres.dsn(), str(tmp_path), f"t{unique_name}"
    topic = f"{postgres_connector.topic_prefix}.shop.{table}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE shop.{table} (id int PRIMARY KEY, note text)")
        add_to_publication(conn, postgres_connector.name, f"shop.{table}")
        conn.execute(f"INSERT INTO shop.{table} VALUES (1, 'before'), (2, 'before')")
        conn.execute(f"TRUNCATE shop.{table}")
        conn.execute(f"INSERT INTO shop.{table} VALUES (2, 'after'), (3, 'after')")
    try:
        kafka.wait_for_last_value(topic, lambda value: value is not None and b'"id":3' in value)
        for _ in range(2):  # a rerun changes nothing
            land_and_refine(warehouse, topic, history=True)
            current = spark.read.format("delta").load(f"{warehouse}/refined/{topic}__history").where("_cdc_is_current")
            assertDataFrameEqual(refined_table(warehouse, topic).select("id", "note"), [(2, "after"), (3, "after")])
            assertDataFrameEqual(current.select("id", "note"), [(2, "after"), (3, "after")])
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE shop.{table}")


def test_records_delivered_again_add_no_history_version(
    spark, kafka, stack_config, postgres_connector, tmp_path, unique_name, land_and_refine
):
    """Versions written in Postgres, one per statement; their records delivered again (at new offsets, as a
    restarted Kafka Connect task sends them), in the history's first batch and after it, leave the history as
    it was."""
    dsn, warehouse, table = stack_config.postgres.dsn(), str(tmp_path), f"t{unique_name}"
    topic = f"{postgres_connector.topic_prefix}.shop.{table}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE shop.{table} (id int PRIMARY KEY, note text)")
        add_to_publication(conn, postgres_connector.name, f"shop.{table}")
        for statement in ("INSERT INTO {} VALUES (1, 'a'), (2, 'x')", "UPDATE {} SET note = 'b' WHERE id = 1"):
            conn.execute(statement.format(f"shop.{table}"))
        conn.execute(f"DELETE FROM shop.{table} WHERE id = 2")
    expected = [(1, "a", False, False), (1, "b", True, False), (2, "x", False, False), (2, None, False, True)]
    try:
        records = kafka.wait_for_last_value(topic, lambda value: value is None)  # the delete's tombstone
        kafka.produce_again(topic, records)  # the first batch holds each record twice
        for run in range(3):  # the first batch, the records again, then a rerun
            land_and_refine(warehouse, topic, history=True)
            history = spark.read.format("delta").load(f"{warehouse}/refined/{topic}__history")
            versions = history.select("id", "note", "_cdc_is_current", "_cdc_is_deleted")
            assertDataFrameEqual(versions, expected)
            if run == 0:
                kafka.produce_again(topic, records)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE shop.{table}")
