"""The speed targets the benches measure (bench/README.md's table), and the line each bench prints
for its figure beside its target:

    >>> print(FIRST_BATCH.verdict(23.7, "100 changes into 1,000,000 rows, median of 3"))
    target: a fresh process's first batch <= 10 s: 23.7 s (100 changes into 1,000,000 rows, median of 3): not met
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A figure's bound on a 2-core machine: at least ``bound`` (``at_least``) or at most ``bound``."""

    what: str
    bound: float
    unit: str
    at_least: bool

    def met(self, figure: float) -> bool:
        return figure >= self.bound if self.at_least else figure <= self.bound

    def verdict(self, figure: float, measured: str) -> str:
        """One line: the target, the ``figure`` and how it was ``measured``, met or not met."""
        sign = ">=" if self.at_least else "<="
        return (
            f"target: {self.what} {sign} {_number(self.bound)}{self.unit}: {_number(figure)}{self.unit} "
            f"({measured}): {'met' if self.met(figure) else 'not met'}"
        )


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.2f}".rstrip("0").rstrip(".")


RAW_RATE = Target("raw landing of ~1 KB messages", 150_000, " messages/s", at_least=True)
RAW_AGAINST_PLAIN_STREAM = Target("raw landing against a plain Spark kafka -> delta stream", 1.2, "x", at_least=True)
REFINE_AGAINST_DELTA_MERGE = Target("refine against Delta's own MERGE of the same changes", 0.95, "x", at_least=True)
WARM_SMALL_BATCH = Target(
    "a warm batch of <= 100 changes into a 1M-row table against Delta's MERGE of the same rows",
    1.2,
    "x",
    at_least=False,
)
FIRST_BATCH = Target("a fresh process's first batch", 10.0, " s", at_least=False)
COMMIT_TO_REFINED_P95 = Target(
    "a Postgres commit visible in its refined table at 1 commit/s, p95", 2.0, " s", at_least=False
)
MANY_TABLES_P95 = Target(
    "50 tables at 2 commits/s in all: a commit visible in its refined table, p95", 10.0, " s", at_least=False
)
MANY_TABLES_AGAINST_FLOOR = Target(
    "200 tables at 20 commits/s in all: commit to refined p95 against the floor (bare MERGEs into every table, "
    "two at a time)",
    1.5,
    "x",
    at_least=False,
)
MANY_TABLES_MEMORY = Target("many tables in one `cdc sync`: peak memory", 4.0, " GiB", at_least=False)
