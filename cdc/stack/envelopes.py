"""Debezium Postgres change envelopes written by hand, as the connector writes them (``before``, ``after``,
``op``, ``ts_ms`` and ``source``), for tests and benches that produce records of their own."""

from __future__ import annotations

from typing import Any

T0_MS = 1_763_700_000_000  # the commit time of LSN 0, in milliseconds


def postgres_envelope(
    op: str,
    lsn: int,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    snapshot: str = "false",
    table: str = "items",
) -> dict[str, Any]:
    """The envelope of a change to ``demo.shop.<table>`` at ``lsn`` (also its transaction id; committed
    ``lsn`` milliseconds after :data:`T0_MS`).

    Example::

        postgres_envelope("u", 42, before={"id": 1, "name": "a"}, after={"id": 1, "name": "b"})
    """
    return {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": T0_MS + lsn,
        "source": {
            "version": "3.6.3.Final",
            "connector": "postgresql",
            "name": "demo",
            "ts_ms": T0_MS + lsn,
            "snapshot": snapshot,
            "db": "demo",
            "schema": "shop",
            "table": table,
            "txId": lsn,
            "lsn": lsn,
        },
    }
