"""Postgres -> Debezium -> Kafka -> `cdc raw` -> `cdc refine`: refined tables equal the source tables."""

import gc
import json
from datetime import date, datetime

import psycopg
import pytest
from py4j.protocol import Py4JError
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import CdcError
from cdc.core.tables import is_delta_table, raw_table_location
from cdc.raw.table import RAW_SCHEMA, create_raw_table
from cdc.stack.postgres import add_to_publication
from cdc.stack.workload import run_workload
from refine.apply.merge import METADATA_COLUMNS
from refine.config import refined_table_location


def test_refined_tables_equal_postgres(
    spark, kafka, stack_config, postgres_connector, tmp_path, land_and_refine, postgres_table
):
    dsn = stack_config.postgres.dsn()
    run_workload(dsn, customers=5, seed=11)  # inserts, TOAST-preserving updates, deletes, NULLs
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE shop.orders")
        conn.execute(
            "INSERT INTO shop.orders VALUES (1, 1, 'paid', 10.50, '2026-01-01 10:00:00.123456'), "
            "(1, 2, 'pending', 0.01, '2026-01-02 00:00:00')"
        )
        conn.execute("UPDATE shop.orders SET status = 'shipped' WHERE order_no = 2")
        conn.execute("UPDATE shop.customers SET full_name = 'Renamed' WHERE id = (SELECT min(id) FROM shop.customers)")
    prefix = postgres_connector.topic_prefix
    kafka.wait_for_last_value(f"{prefix}.shop.orders", lambda value: b'"status":"shipped"' in (value or b""))
    kafka.wait_for_last_value(f"{prefix}.shop.customers", lambda value: b'"full_name":"Renamed"' in (value or b""))

    warehouse = str(tmp_path)
    read = lambda name: spark.read.format("delta").load(refined_table_location(warehouse, name))  # noqa: E731
    for table in ("orders", "customers"):
        topic = f"{prefix}.shop.{table}"
        explode = ["tags"] if table == "customers" else []
        for _ in range(2):  # a rerun changes nothing
            land_and_refine(warehouse, topic, history=True, explode=explode)
            source = postgres_table(table)
            assertDataFrameEqual(read(topic).drop(*METADATA_COLUMNS), source)
            # The history's current versions are the table (the orders before the truncate are closed).
            assertDataFrameEqual(read(f"{topic}__history").where("_cdc_is_current").select(*source.columns), source)
        if explode:
            tags = postgres_table(table).select("id", F.posexplode("tags").alias("pos", "value"))
            assertDataFrameEqual(read(f"{topic}__tags").select("id", "pos", "value"), tags)
    truncated = read(f"{prefix}.shop.orders__history").where("_cdc_op = 't'")
    assert truncated.count() > 0
    assert truncated.where("NOT _cdc_is_deleted OR _cdc_is_current").isEmpty()
    customers = read(f"{prefix}.shop.customers")
    assert customers.where(F.col("notes").contains("__debezium_unavailable_value")).count() == 0
    assert customers.where(F.col("_cdc_op") == "u").count() > 0


def test_refine_from_the_command_line(
    spark, kafka, stack_config, postgres_connector, tmp_path, monkeypatch, capsys, postgres_table
):
    from cdc.cli import main

    run_workload(stack_config.postgres.dsn(), customers=2, seed=12)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    assert main(["raw", "--topic", topic, "--warehouse", str(tmp_path), "--available-now"]) == 0
    assert main(["refine", "--table", topic, "--warehouse", str(tmp_path), "--available-now"]) == 0
    assert f"refine {topic}: " in capsys.readouterr().out
    refined = spark.read.format("delta").load(refined_table_location(str(tmp_path), topic))
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_table("orders"))

    assert main(["refine", "--table", "no.such.table", "--warehouse", str(tmp_path), "--available-now"]) == 8
    assert "no raw table for this topic: run `cdc raw` first" in capsys.readouterr().err


def test_a_batch_refused_by_another_writers_commit_runs_again_and_the_job_goes_on(
    spark, kafka, stack_config, postgres_connector, tmp_path, monkeypatch, land, postgres_table, refined_table
):
    """`cdc optimize` compacting a refined table while its refinement runs: Delta refuses whichever of
    the two commits second (a real such conflict: tests/cdc/core/test_shared_tables.py). The batch runs again."""
    from py4j.protocol import Py4JJavaError

    from cdc.core.config import validate
    from refine.apply import keyed
    from refine.job import RefineJobConfig, run_refine_job

    run_workload(stack_config.postgres.dsn(), customers=3, seed=14)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    kafka.wait_for_last_value(topic, lambda value: value is None)
    warehouse = str(tmp_path)
    land(warehouse, topic)
    merge_changes, refused = keyed.merge_changes, []

    def refused_once_after_its_commit(*args, **kwargs) -> None:
        merge_changes(*args, **kwargs)  # it landed: the batch's rerun must change nothing more
        if not refused:
            refused.append(True)
            raise Py4JJavaError(
                "",
                spark.sparkContext._jvm.io.delta.exceptions.ConcurrentAppendException(
                    "Files were added to the root of the table by a concurrent update"
                ),
            )

    monkeypatch.setattr(keyed, "merge_changes", refused_once_after_its_commit)
    printed: list[str] = []
    config = validate(
        RefineJobConfig, {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}}, "refine job"
    )
    run_refine_job(spark, config, say=printed.append)
    assert refused
    assert any(
        line.startswith(f"refine {topic} batch 0: ")
        and line.endswith("(run again after 1 conflicting commit(s) by another writer)")
        for line in printed
    ), printed
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))


def test_undecodable_records_go_to_quarantine_and_the_job_goes_on(
    spark, kafka, stack_config, postgres_connector, tmp_path, monkeypatch, capsys, land_and_refine, postgres_table
):
    import json

    from cdc.cli import main
    from refine.quality.quarantine import quarantine_location

    run_workload(stack_config.postgres.dsn(), customers=2, seed=13)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)
    kafka.produce(topic, [(b'{"payload":{"customer_id":1,"order_no":1}}', b"{not json")])
    bad_offset = kafka.records(topic)[-1][2]

    land_and_refine(str(tmp_path), topic)

    quarantined = spark.read.format("delta").load(quarantine_location(str(tmp_path)))
    [row] = quarantined.collect()
    assert (row.topic, row.offset, row.raw_value, row.reason) == (
        topic,
        bad_offset,
        "{not json",
        "value is not a Debezium JSON envelope",
    )
    refined = spark.read.format("delta").load(refined_table_location(str(tmp_path), topic))
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_table("orders"))

    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    capsys.readouterr()
    assert main(["status", "--warehouse", str(tmp_path), "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)["raw_tables"]
    assert status["quarantined"] == 1


def test_a_run_says_what_it_quarantined_and_can_fail_on_it(
    spark, kafka, stack_config, postgres_connector, tmp_path, monkeypatch, capsys, postgres_table
):
    from cdc.cli import main
    from refine.quality.quarantine import quarantine_location

    run_workload(stack_config.postgres.dsn(), customers=2, seed=14)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)
    kafka.produce(topic, [(b'{"payload":{"customer_id":1,"order_no":1}}', b"{not json")])
    warehouse = str(tmp_path)
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    assert main(["raw", "--topic", topic, "--warehouse", warehouse, "--available-now"]) == 0
    capsys.readouterr()

    refine = ["refine", "--table", topic, "--warehouse", warehouse, "--available-now", "--fail-on-quarantine"]
    assert main(refine) == 11
    out, err = capsys.readouterr()
    quarantine, raw = quarantine_location(warehouse), f"{warehouse}/raw/{topic}"
    assert f"; 1 records quarantined (in {quarantine}, source_table {raw})" in out
    assert err.splitlines()[0] == f"cdc: error: 1 records went to the quarantine ({topic}) (quarantine={quarantine})"
    # Everything else was applied.
    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_table("orders"))

    assert main(refine) == 0  # a run that quarantined nothing new
    assert "quarantined" not in capsys.readouterr().out


def test_a_recreated_connectors_snapshot_leaves_the_refined_tables_equal_to_postgres(
    spark,
    kafka,
    stack_config,
    postgres_connector,
    recreate_postgres_connector,
    tmp_path,
    land_and_refine,
    postgres_table,
    refined_table,
):
    """A new snapshot reads each table whole again: rows deleted while no connector ran go (a keyed and a
    keyless table), and the keyless table's rows are not doubled by being read again."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    tables = ("orders", "page_views")
    topics = {table: f"{postgres_connector.topic_prefix}.shop.{table}" for table in tables}
    run_workload(dsn, customers=3, seed=61)

    def refined_after_marker(marker: datetime) -> None:
        """Insert a marker row in each table, wait for both in Kafka, then land and refine (twice: a rerun
        changes nothing) and compare with Postgres."""
        with psycopg.connect(dsn) as conn:
            customer = conn.execute("SELECT min(id) FROM shop.customers").fetchone()[0]
            conn.execute(
                "INSERT INTO shop.orders (customer_id, order_no, status, amount, ordered_at) "
                "VALUES (%s, (SELECT coalesce(max(order_no), 0) + 1 FROM shop.orders WHERE customer_id = %s), "
                "'pending', 1, %s)",
                (customer, customer, marker),
            )
            conn.execute("INSERT INTO shop.page_views VALUES (NULL, %s, now())", (f"/marker/{marker.isoformat()}",))
        micros = int((marker - datetime(1970, 1, 1)).total_seconds()) * 1_000_000  # ordered_at: MicroTimestamp
        kafka.wait_for_last_value(
            topics["orders"],
            lambda value: value is not None and json.loads(value)["payload"]["after"]["ordered_at"] == micros,
        )
        kafka.wait_for_last_value(
            topics["page_views"], lambda value: value is not None and f"/marker/{marker.isoformat()}".encode() in value
        )
        for _ in range(2):
            for table in tables:
                land_and_refine(warehouse, topics[table], history=table == "orders")
                assertDataFrameEqual(refined_table(warehouse, topics[table]), postgres_table(table))
        history = spark.read.format("delta").load(refined_table_location(warehouse, f"{topics['orders']}__history"))
        source = postgres_table("orders")
        assertDataFrameEqual(history.where("_cdc_is_current").select(*source.columns), source)

    refined_after_marker(datetime(2026, 4, 1))

    def while_away() -> None:  # changes no connector streams
        with psycopg.connect(dsn) as conn:
            conn.execute("DELETE FROM shop.orders WHERE customer_id = (SELECT max(customer_id) FROM shop.orders)")
            conn.execute("UPDATE shop.orders SET status = 'shipped' WHERE order_no = 1")
            conn.execute(
                "DELETE FROM shop.page_views WHERE customer_id = (SELECT max(customer_id) FROM shop.page_views)"
            )

    recreate_postgres_connector(while_away)
    refined_after_marker(datetime(2026, 4, 2))
    # The snapshot closed the versions open before it; the orders deleted meanwhile stay closed.
    closed = spark.read.format("delta").load(refined_table_location(warehouse, f"{topics['orders']}__history"))
    assert closed.where("_cdc_op = 'r' AND _cdc_is_deleted AND NOT _cdc_is_current").count() > 0
    for table in tables:  # the new snapshot: after the first marker, its first read marked as such
        payloads = [json.loads(value)["payload"] for *_, value, _ in kafka.records(topics[table]) if value is not None]
        first_marker = next(
            i
            for i, payload in enumerate(payloads)
            if payload["after"]
            and (
                payload["after"].get("ordered_at") == 1_775_001_600_000_000
                or payload["after"].get("url", "").startswith("/marker/")
            )
        )
        reads = [payload["source"]["snapshot"] for payload in payloads[first_marker + 1 :] if payload["op"] == "r"]
        assert reads, reads
        assert reads[0] in ("first", "first_in_data_collection"), reads
        assert reads[-1].startswith("last"), reads


def test_a_recreated_connectors_snapshot_of_a_one_row_table_removes_the_rows_deleted_while_away(
    spark, kafka, stack_config, postgres_connector, recreate_postgres_connector, tmp_path, unique_name, land_and_refine
):
    """A table of one row gets one snapshot read, marked ``last`` or ``last_in_data_collection``, never
    ``first``: it still starts the new snapshot, so the rows deleted while no connector ran go (a keyed table
    with its history, and a keyless one). The names sort the tables after every other, so neither is the
    snapshot's first table (whose one read would be marked ``first``)."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    tables = {"keyed": f"zz_{unique_name}_keyed", "keyless": f"zz_{unique_name}_keyless"}
    topics = {kind: f"{postgres_connector.topic_prefix}.shop.{table}" for kind, table in tables.items()}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE shop.{tables['keyed']} (id int PRIMARY KEY, note text)")
        conn.execute(f"CREATE TABLE shop.{tables['keyless']} (n int, note text)")
        conn.execute(f"ALTER TABLE shop.{tables['keyless']} REPLICA IDENTITY FULL")
        for table in tables.values():
            add_to_publication(conn, postgres_connector.name, f"shop.{table}")
            conn.execute(f"INSERT INTO shop.{table} VALUES (1, 'one'), (2, 'two'), (3, 'three')")

    def source(kind: str):
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(f"SELECT * FROM shop.{tables[kind]}").fetchall()
        return spark.createDataFrame(rows, "id int, note string" if kind == "keyed" else "n int, note string")

    def refined_equal_to_source() -> None:
        for _ in range(2):  # a rerun changes nothing
            for kind, topic in topics.items():
                land_and_refine(warehouse, topic, history=kind == "keyed")
                refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
                assertDataFrameEqual(refined.select(*source(kind).columns), source(kind))
        history = spark.read.format("delta").load(refined_table_location(warehouse, f"{topics['keyed']}__history"))
        assertDataFrameEqual(history.where("_cdc_is_current").select("id", "note"), source("keyed"))

    try:
        for topic in topics.values():
            kafka.wait_for_last_value(topic, lambda value: value is not None and b"three" in value)
        refined_equal_to_source()
        streamed = {kind: len(kafka.records(topic)) for kind, topic in topics.items()}

        def while_away() -> None:  # deletes no connector streams
            with psycopg.connect(dsn) as conn:
                for table in tables.values():
                    conn.execute(f"DELETE FROM shop.{table} WHERE note <> 'two'")

        recreate_postgres_connector(while_away)
        for kind, topic in topics.items():
            kafka.wait_for_last_value(topic, lambda value: value is not None and b'"op":"r"' in value)
            records = [value for *_, value, _ in kafka.records(topic)]
            reads = [json.loads(value)["payload"]["source"]["snapshot"] for value in records if value is not None]
            assert reads[streamed[kind] :] in (["last"], ["last_in_data_collection"]), reads
        refined_equal_to_source()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in tables.values():
                conn.execute(f"DROP TABLE shop.{table}")


ORDERS_WITH_NOTE = (
    "SELECT customer_id, order_no, status::text, amount, ordered_at, note FROM shop.orders",
    "customer_id long, order_no int, status string, amount decimal(10,2), ordered_at timestamp_ntz, note string",
)


def end_phase(conn: psycopg.Connection, phase: int) -> None:
    """One transaction over the three tables, ending a phase with a row each that the test waits for
    (:func:`phase_markers`)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO shop.customers (id, email, signed_up_at) "
            "VALUES ((SELECT max(id) + 1 FROM shop.customers), %s, '2026-04-01Z')",
            (f"phase-{phase}@",),
        )
        conn.execute(
            "INSERT INTO shop.orders (customer_id, order_no, amount, ordered_at) VALUES (%s, 1, 0.5, '2026-04-01')",
            (-phase,),
        )
        conn.execute("INSERT INTO shop.page_views VALUES (NULL, %s, '2026-04-01Z')", (f"/phase-{phase}",))


def phase_markers(phase: int) -> dict[str, str]:
    return {"customers": f'"phase-{phase}@"', "orders": f'"customer_id":-{phase},', "page_views": f'"/phase-{phase}"'}


def first_phase(dsn: str) -> None:
    """Every kind of change the refined tables must follow, before the first refinement."""
    run_workload(dsn, customers=4, seed=61)  # types, NULLs, TOAST-preserving updates, deletes, duplicates
    with psycopg.connect(dsn) as conn:
        with conn.transaction():  # a transaction over the three tables
            new = conn.execute("SELECT max(id) + 1 FROM shop.customers").fetchone()[0]
            conn.execute(
                "INSERT INTO shop.customers (id, email, signed_up_at, notes, avatar, tags, profile) "
                "VALUES (%s, 'tx@example.com', '1969-07-20 20:17:40Z', repeat('toast ', 2000), "
                "'\\x00ff'::bytea, ARRAY['a', 'b'], 'null'::jsonb)",
                (new,),
            )
            conn.execute("INSERT INTO shop.orders VALUES (%s, 1, 'cancelled', 0, '1999-12-31 23:59:59.999999')", (new,))
            conn.execute(
                "INSERT INTO shop.page_views VALUES (%s, '/tx', '2026-03-01Z'), (%s, '/tx', '2026-03-01Z')", (new, new)
            )
        conn.execute(
            "UPDATE shop.customers SET email = 'touched@example.com' WHERE id = %s", (new,)
        )  # TOAST left alone
        conn.execute("UPDATE shop.customers SET id = id + 10000 WHERE id = %s", (new,))  # new key, TOASTed notes
        conn.execute("UPDATE shop.orders SET order_no = 2 WHERE customer_id = %s", (new,))
        conn.execute(
            "DELETE FROM shop.page_views WHERE ctid = (SELECT min(ctid) FROM shop.page_views WHERE url = '/tx')"
        )
        conn.execute("TRUNCATE shop.orders")
        conn.execute("INSERT INTO shop.orders VALUES (%s, 3, 'paid', 12.30, '2026-03-02 10:00:00')", (new,))
        end_phase(conn, 1)


def second_phase(dsn: str) -> None:
    """A column added at the source mid-stream, then used."""
    with psycopg.connect(dsn) as conn:
        conn.execute("ALTER TABLE shop.orders ADD COLUMN note text")
        conn.execute("UPDATE shop.orders SET note = 'gift wrap' WHERE order_no = 3")
        conn.execute("INSERT INTO shop.orders VALUES (0, 100, 'pending', 5, '2026-03-03 00:00:00', NULL)")
        end_phase(conn, 2)


@pytest.fixture
def orders_note_column(stack_config):
    """The `note` column the scripted workload adds to shop.orders, dropped again afterwards."""
    yield
    with psycopg.connect(stack_config.postgres.dsn()) as conn:
        conn.execute("ALTER TABLE shop.orders DROP COLUMN IF EXISTS note")


def test_scripted_workload_refines_equal_to_postgres(
    spark,
    kafka,
    stack_config,
    postgres_connector,
    tmp_path,
    orders_note_column,
    land_and_refine,
    postgres_table,
    refined_table,
):
    dsn, warehouse, prefix = stack_config.postgres.dsn(), str(tmp_path), postgres_connector.topic_prefix
    topics = {table: f"{prefix}.shop.{table}" for table in ("customers", "orders", "page_views")}

    def refine_and_compare(phase: int, expected: dict) -> None:
        for table, marker in phase_markers(phase).items():
            kafka.wait_for_last_value(topics[table], lambda value: value is not None and marker.encode() in value)
        for _ in range(2):  # a rerun over the same input changes nothing
            for table, topic in topics.items():
                land_and_refine(warehouse, topic)
                source = expected[table] if table in expected else postgres_table(table)
                assertDataFrameEqual(refined_table(warehouse, topic), source)

    first_phase(dsn)
    refine_and_compare(1, {})
    second_phase(dsn)
    with psycopg.connect(dsn) as conn:
        orders = spark.createDataFrame(conn.execute(ORDERS_WITH_NOTE[0]).fetchall(), ORDERS_WITH_NOTE[1])
    refine_and_compare(2, {"orders": orders})
    assert (
        refined_table(warehouse, topics["customers"]).where(F.col("notes").contains("__debezium_unavailable")).count()
        == 0
    )


def test_batches_are_parsed_with_the_last_schemas_or_again_when_a_record_has_another(
    spark, kafka, stack_config, postgres_connector, tmp_path, orders_note_column, land, refined_table, monkeypatch
):
    """A batch is parsed in one pass with the wrapper schemas of the last batch (in a new job: of a record
    of the raw table's newest commit); a batch holding another is parsed again from its records, and its
    changes are still counted once."""
    from cdc.core.config import validate
    from cdc.core.tables import raw_table_location
    from refine.batch import RefineBatch
    from refine.job import RefineJobConfig, run_refine_job

    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    config = validate(
        RefineJobConfig, {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}}, "refine job"
    )
    run_workload(dsn, customers=2, seed=15)
    with psycopg.connect(dsn) as conn:
        conn.execute("ALTER TABLE shop.orders ADD COLUMN note text")
        conn.execute("INSERT INTO shop.orders VALUES (0, 101, 'pending', 5, '2026-03-03 00:00:00', 'first note')")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"first note" in value)
    land(warehouse, topic)
    # Each run is a new job, which guesses from the raw table's newest commit.
    parsed_again = []
    refine_again = RefineBatch._refine
    monkeypatch.setattr(RefineBatch, "_refine", lambda self, *args: parsed_again.append(1) or refine_again(self, *args))

    def refine_and_compare() -> None:
        lines = []
        run_refine_job(spark, config, say=lines.append)
        with psycopg.connect(dsn) as conn:
            orders = spark.createDataFrame(conn.execute(ORDERS_WITH_NOTE[0]).fetchall(), ORDERS_WITH_NOTE[1])
        assertDataFrameEqual(refined_table(warehouse, topic), orders)
        return lines[-1]

    records = spark.read.format("delta").load(raw_table_location(warehouse, topic)).count()
    # The batch holds the schemas from before and after the column was added: it is parsed again.
    assert refine_and_compare().startswith(f"refine {topic}: {records:,} changes")
    assert parsed_again == [1]
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE shop.orders SET note = 'second note' WHERE order_no = 101")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"second note" in value)
    land(warehouse, topic)
    # A new job: its guess, the newest commit's schema, is the batch's.
    assert refine_and_compare().startswith(f"refine {topic}: 1 changes")
    assert parsed_again == [1]


def test_continuous_refine_follows_postgres_and_stops_on_sigterm(
    spark,
    kafka,
    stack_config,
    postgres_connector,
    tmp_path,
    cdc_process,
    wait_for,
    land,
    postgres_table,
    refined_table,
    stop_like_a_service_manager,
):
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    run_workload(dsn, customers=2, seed=72)
    kafka.wait_for_last_value(topic, lambda value: value is None)
    land(warehouse, topic)
    process = cdc_process(["refine", "--table", topic, "--warehouse", warehouse, "--trigger-interval", "1"])
    location = refined_table_location(warehouse, topic)
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute(
                "UPDATE shop.customers SET full_name = 'Streamed' WHERE id = (SELECT max(id) FROM shop.customers)"
            )
        kafka.wait_for_last_value(topic, lambda value: value is not None and b'"Streamed"' in value)
        land(warehouse, topic)
        wait_for(
            lambda: (
                is_delta_table(spark, location)
                and refined_table(warehouse, topic).where("full_name = 'Streamed'").count() == 1
            ),
            600,
            "the change in the refined table",
            1.0,
        )
    finally:
        stop_like_a_service_manager(process)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))


def test_a_batch_decodes_its_records_in_one_query(
    spark, kafka, stack_config, postgres_connector, tmp_path, land, refine, refined_table, postgres_table
):
    """The queries that apply a batch (the MERGEs of the table, its history and its child table) plan over
    the decoded changes, not over the decoding's plan (hundreds of expressions per schema) again: planned by
    each, it cost minutes and most of a 2 GB driver for a batch of 20 changes under Spark 4.2."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    run_workload(dsn, customers=3, seed=67)
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    land(warehouse, topic)
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    before = max((executions.apply(i).executionId() for i in range(executions.size())), default=-1)

    refine(warehouse, topic, history=True, explode=["tags"])

    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    plans = [executions.apply(i) for i in range(executions.size())]
    plans = [plan.physicalPlanDescription() for plan in plans if plan.executionId() > before]
    assert len(plans) > 5, len(plans)  # the MERGEs ran
    # Delta reads each table's log with from_json too.
    decoding = [plan for plan in plans if "from_json" in plan and "Delta Table State" not in plan]
    # The query that reads the batch's facts, and the decoded changes' own plan (computed_once).
    assert len(decoding) == 2, f"{len(decoding)} of the batch's {len(plans)} queries planned the decoding"
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))


def test_a_failed_refine_keeps_no_stopped_query_alive(spark, tmp_path, refine):
    """py4j keeps a query's batch function for as long as the JVM keeps the query. A batch's error kept on that
    function, raised with the frames that hold the job's queries, kept the stopped query (its last plan and
    broadcasts) alive in both heaps for the life of the process."""
    warehouse, topic = str(tmp_path), "failing.shop.items"
    raw = raw_table_location(warehouse, topic)
    create_raw_table(spark, raw, topic)
    at = datetime(2026, 1, 1)
    record = (None, None, "not json", None, topic, 0, 0, at, "CreateTime", [], at, 0, date(2026, 1, 1))
    spark.createDataFrame([record], RAW_SCHEMA).write.format("delta").mode("append").save(raw)
    (tmp_path / "_cdc").mkdir(exist_ok=True)
    (tmp_path / "_cdc" / "quarantine").write_text("not a table")  # where the batch writes: it fails

    with pytest.raises(CdcError, match="batch=0"):
        refine(warehouse, topic)
    gc.collect()

    def name(query: StreamingQuery) -> str | None:
        try:
            return query.name
        except Py4JError:  # its JVM object released
            return None

    kept = [
        query for query in gc.get_objects() if isinstance(query, StreamingQuery) and name(query) == f"refine {topic}"
    ]
    assert not kept, "the failed run's stopped query is still reachable"
