"""The shop workload against a shop schema other writers share."""

from __future__ import annotations

import psycopg

from cdc.stack.workload import run_workload


def test_the_workload_adds_customers_whose_ids_no_order_holds(stack, stack_config):
    dsn = stack_config.postgres.dsn()
    with psycopg.connect(dsn) as conn:
        [next_id] = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM shop.customers").fetchone() or (1,)
        # Orders of customers shop.customers never had, as another test's bulk load leaves them.
        conn.execute(
            "INSERT INTO shop.orders SELECT %s + n, m, 'paid', 1, '2026-01-01' "
            "FROM generate_series(0, 9) AS n, generate_series(1, 3) AS m",
            (next_id,),
        )
    try:
        report = run_workload(dsn, customers=4, seed=5)
        assert report.changes["customers"]["insert"] == 4
    finally:
        with psycopg.connect(dsn) as conn:
            conn.execute("DELETE FROM shop.orders WHERE customer_id BETWEEN %s AND %s", (next_id, next_id + 9))
