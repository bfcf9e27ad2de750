"""DataFrames whose plan is cut short: a large plan analysed and optimised again by every query built on it
costs the driver time and heap per query."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame


@contextmanager
def computed_once(frame: DataFrame) -> Iterator[DataFrame]:
    """``frame`` as a DataFrame whose plan is a single leaf, valid within the ``with`` block: its rows are
    computed by the first query that reads them and kept in the executors' block stores (memory, then disk)
    until the block ends. The queries built on it plan that leaf, not ``frame``'s plan again.

    Example::

        with computed_once(parsed) as changes:
            changes.agg(...).collect()  # computes the rows, once
            merge(changes)  # plans over the leaf

    Unlike a cached DataFrame, the rows are not computed again if an executor holding some of them is lost:
    the query fails, and a micro-batch's rerun starts over."""
    held = frame.localCheckpoint(eager=False)
    try:
        yield held
    finally:
        held._jdf.queryExecution().analyzed().rdd().unpersist(False)
