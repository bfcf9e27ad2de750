"""A small, deterministic workload on the demo schema: inserts, updates and deletes on every table.

It exercises what Debezium encodes specially: numerics (fixed and variable scale, negative),
timestamps with and without zone, dates before 1970, nested jsonb, text arrays, uuids, enums,
bytea, NULLs, a TOASTed column left unchanged by updates, and a keyless table with duplicate rows.
Each run adds new customers after the highest existing id, so runs can be repeated.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg

TABLES = ("customers", "orders", "page_views")


@dataclass
class WorkloadReport:
    """How many rows the run inserted, updated and deleted per table (``shop.<table>``)."""

    changes: dict[str, Counter[str]] = field(default_factory=lambda: {table: Counter() for table in TABLES})

    def count(self, table: str, op: str, rows: int = 1) -> None:
        self.changes[table][op] += rows

    def expected_events(self, table: str) -> int:
        """Debezium records the run produces for ``table``: one per change, plus a tombstone per delete.

        (The keyless table's deletes are followed by tombstones too, with a null key.)
        """
        ops = self.changes[table]
        return ops["insert"] + ops["update"] + 2 * ops["delete"]


def large_note(rng: random.Random) -> str:
    """Text of ~6 KB: above Postgres' TOAST threshold, so it is stored out of line."""
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit"]
    return " ".join(rng.choice(words) for _ in range(1000))


def run_workload(dsn: str, *, customers: int = 10, seed: int = 0) -> WorkloadReport:
    """Apply the workload through ``dsn``, in a few transactions; return what it changed."""
    rng = random.Random(seed)
    report = WorkloadReport()
    with psycopg.connect(dsn) as conn:
        # New customers get ids no customer and no order has used: other writers of shop.orders (tests,
        # users) may hold orders of customers that shop.customers never had.
        [first_id] = conn.execute(
            "SELECT coalesce(greatest((SELECT max(id) FROM shop.customers), "
            "(SELECT max(customer_id) FROM shop.orders)), 0) + 1"
        ).fetchall()[0]
        ids = list(range(first_id, first_id + customers))
        with conn.transaction():
            for customer_id in ids:
                _insert_customer(conn, rng, customer_id)
                report.count("customers", "insert")
                for order_no in range(1, rng.randint(1, 3) + 1):
                    _insert_order(conn, rng, customer_id, order_no)
                    report.count("orders", "insert")
                views = [(customer_id, f"/products/{rng.randint(1, 5)}") for _ in range(2)]
                views.append(views[0])  # a duplicate row: legal in a keyless table
                for view_customer, url in views:
                    conn.execute(
                        "INSERT INTO shop.page_views VALUES (%s, %s, %s)",
                        (
                            view_customer,
                            url,
                            datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=customer_id),
                        ),
                    )
                    report.count("page_views", "insert")

        with conn.transaction():
            # Updates leave the TOASTed notes alone: Debezium sends its unavailable-value placeholder.
            for customer_id in ids[::2]:
                conn.execute(
                    "UPDATE shop.customers SET balance = balance + %s, tags = array_append(tags, 'updated') "
                    "WHERE id = %s",
                    (Decimal("10.05"), customer_id),
                )
                report.count("customers", "update")
            result = conn.execute(
                "UPDATE shop.orders SET status = 'paid' WHERE customer_id = ANY(%s) AND order_no = 1", (ids[::3],)
            )
            report.count("orders", "update", result.rowcount)
            result = conn.execute(
                "UPDATE shop.page_views SET url = url || '?ref=mail' "
                "WHERE ctid = (SELECT ctid FROM shop.page_views WHERE customer_id = %s LIMIT 1)",
                (ids[0],),
            )
            report.count("page_views", "update", result.rowcount)

        with conn.transaction():
            deleted = ids[-1]
            result = conn.execute("DELETE FROM shop.orders WHERE customer_id = %s", (deleted,))
            report.count("orders", "delete", result.rowcount)
            conn.execute("DELETE FROM shop.customers WHERE id = %s", (deleted,))
            report.count("customers", "delete")
            # Removes one of the two identical rows, which a consumer must do too.
            result = conn.execute(
                "DELETE FROM shop.page_views WHERE ctid = (SELECT ctid FROM shop.page_views "
                "WHERE customer_id = %s ORDER BY url LIMIT 1)",
                (deleted,),
            )
            report.count("page_views", "delete", result.rowcount)
    return report


def _insert_customer(conn: psycopg.Connection, rng: random.Random, customer_id: int) -> None:
    profile = {
        "tier": rng.choice(["gold", "silver"]),
        "address": {"city": rng.choice(["Lyon", "Oslo", "Porto"]), "zip": f"{rng.randint(1000, 9999)}"},
        "devices": [{"kind": "phone", "os": rng.choice(["ios", "android"])}],
    }
    conn.execute(
        "INSERT INTO shop.customers (id, email, full_name, balance, credit_limit, signed_up_at, birth_date, "
        "profile, tags, external_id, is_active, notes, avatar) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s)",
        (
            customer_id,
            f"customer{customer_id}@example.com",
            None if customer_id % 4 == 0 else f"Customer {customer_id}",
            Decimal(rng.randint(-50000, 500000)) / 100,
            Decimal(f"{rng.randint(-9999, 99999)}.{rng.randint(0, 999):03d}"),
            datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
            + timedelta(seconds=rng.randint(0, 10**7), microseconds=rng.randint(0, 999999)),
            date(1950, 1, 1) + timedelta(days=rng.randint(0, 25000)),
            json.dumps(profile),
            ["new", rng.choice(["web", "app"])],
            uuid.UUID(int=rng.getrandbits(128)),
            customer_id % 5 != 0,
            large_note(rng),
            bytes(rng.getrandbits(8) for _ in range(16)),
        ),
    )


def _insert_order(conn: psycopg.Connection, rng: random.Random, customer_id: int, order_no: int) -> None:
    conn.execute(
        "INSERT INTO shop.orders (customer_id, order_no, status, amount, ordered_at) VALUES (%s, %s, %s, %s, %s)",
        (
            customer_id,
            order_no,
            rng.choice(["pending", "shipped"]),
            Decimal(rng.randint(100, 99999)) / 100,
            datetime(2026, 3, 1) + timedelta(seconds=rng.randint(0, 10**6), microseconds=rng.randint(0, 999999)),
        ),
    )
