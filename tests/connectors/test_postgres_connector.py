"""Debezium's Postgres connector on the real stack: row changes arrive in Kafka as documented.

These checks pin down what later stages decode (see ../shared/debezium-facts.md): snapshot reads,
creates, updates with TOAST placeholders, key-only deletes followed by tombstones, the keyless
table's null keys and full `before` rows, and the encodings of decimals, dates and timestamps.
"""

import base64
from datetime import date, timedelta
from decimal import Decimal

import psycopg
import pytest

from cdc.stack.events import TOMBSTONE, read_events
from cdc.stack.workload import TABLES, run_workload

PLACEHOLDER = "__debezium_unavailable_value"


@pytest.fixture
def changes(stack, stack_config, unique_name, request):
    """Rows present before the connector starts, then the workload: all the events, by table."""
    dsn = stack_config.postgres.dsn()
    run_workload(dsn, customers=2, seed=1)  # before the connector: snapshot reads
    with psycopg.connect(dsn) as conn:
        existing = {table: conn.execute(f"SELECT count(*) FROM shop.{table}").fetchone()[0] for table in TABLES}
    connector = request.getfixturevalue("postgres_connector")
    report = run_workload(dsn, customers=4, seed=2)
    topics = {table: f"{connector.topic_prefix}.shop.{table}" for table in TABLES}
    expected = {topics[table]: existing[table] + report.expected_events(table) for table in TABLES}
    events = read_events(stack_config.kafka.bootstrap_servers, expected, timeout_s=120)
    return {table: events[topics[table]] for table in TABLES}, report, existing


def test_every_change_arrives_once_in_order(changes):
    events, report, existing = changes
    for table in TABLES:
        ops = [event.op for event in events[table]]
        ops_after_snapshot = ops[existing[table] :]
        assert ops[: existing[table]] == ["r"] * existing[table]
        assert ops_after_snapshot.count("c") == report.changes[table]["insert"]
        assert ops_after_snapshot.count("u") == report.changes[table]["update"]
        assert ops_after_snapshot.count("d") == report.changes[table]["delete"]
        assert ops_after_snapshot.count(TOMBSTONE) == report.changes[table]["delete"]
        # A tombstone directly follows its delete, with the same key.
        for index, event in enumerate(events[table]):
            if event.op == "d":
                assert events[table][index + 1].op == TOMBSTONE
                assert events[table][index + 1].key == event.key


def test_snapshot_reads_are_marked_as_snapshot(changes):
    events, _, existing = changes
    snapshot = events["customers"][: existing["customers"]]
    assert {event.payload["source"]["snapshot"] for event in snapshot} <= {
        "true",
        "first",
        "last",
        "first_in_data_collection",
        "last_in_data_collection",
    }
    assert all(event.payload["before"] is None and event.payload["after"] for event in snapshot)


def test_update_of_other_columns_sends_the_toast_placeholder(changes):
    events, _, _ = changes
    updates = [event for event in events["customers"] if event.op == "u"]
    assert updates
    assert all(event.payload["after"]["notes"] == PLACEHOLDER for event in updates)
    creates = [event for event in events["customers"] if event.op == "c"]
    assert all(len(event.payload["after"]["notes"]) > 2000 for event in creates)


def test_delete_carries_only_the_key_under_default_replica_identity(changes):
    events, _, _ = changes
    delete = next(event for event in events["customers"] if event.op == "d")
    assert delete.key == {"id": delete.payload["before"]["id"]}
    assert delete.payload["after"] is None
    assert delete.payload["before"]["notes"] is None
    assert delete.payload["before"]["balance"] is None


def test_keyless_table_has_null_keys_and_full_before_rows(changes):
    events, _, _ = changes
    streamed = [event for event in events["page_views"] if event.op != "r"]
    assert all(event.key is None for event in streamed)
    delete = next(event for event in streamed if event.op == "d")
    assert delete.payload["before"]["url"].startswith("/products/")
    assert delete.payload["before"]["viewed_at"].endswith("Z")


def test_composite_key_and_enum(changes):
    events, _, _ = changes
    order = next(event for event in events["orders"] if event.op == "c")
    assert set(order.key) == {"customer_id", "order_no"}
    assert order.payload["after"]["status"] in {"pending", "shipped"}
    paid = [event for event in events["orders"] if event.op == "u"]
    assert all(event.payload["after"]["status"] == "paid" for event in paid)


def test_values_decode_to_what_postgres_holds(changes, stack_config):
    events, _, _ = changes
    changed_later = {event.key["id"] for event in events["customers"] if event.op in ("u", "d")}
    create = next(e for e in events["customers"] if e.op == "c" and e.key["id"] not in changed_later)
    after = create.payload["after"]
    with psycopg.connect(stack_config.postgres.dsn()) as conn:
        balance, credit_limit, birth_date, signed_up_at = conn.execute(
            "SELECT balance, credit_limit, birth_date, to_char(signed_up_at AT TIME ZONE 'UTC', "
            '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\') FROM shop.customers WHERE id = %s',
            (after["id"],),
        ).fetchone()
    # numeric(12,2): base64 of the big-endian two's-complement unscaled value; scale 2 in the schema.
    unscaled = int.from_bytes(base64.b64decode(after["balance"]), "big", signed=True)
    assert Decimal(unscaled).scaleb(-2) == balance
    # Unconstrained numeric: {scale, value}.
    variable = after["credit_limit"]
    value = int.from_bytes(base64.b64decode(variable["value"]), "big", signed=True)
    assert Decimal(value).scaleb(-variable["scale"]) == credit_limit
    assert date(1970, 1, 1) + timedelta(days=after["birth_date"]) == birth_date
    assert after["signed_up_at"] == signed_up_at


def test_records_carry_debezium_context_headers(changes, unique_name):
    events, _, _ = changes
    record = events["orders"][0]
    assert record.headers["__debezium.context.connectorLogicalName"] == unique_name.encode()
