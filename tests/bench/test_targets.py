"""The line each bench prints beside a target: met at the bound, not met past it, either way round."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from targets import FIRST_BATCH, REFINE_AGAINST_DELTA_MERGE


def test_a_figure_at_its_bound_meets_it_and_one_past_it_does_not():
    assert FIRST_BATCH.verdict(10.0, "x").endswith(": met")
    assert FIRST_BATCH.verdict(10.01, "x").endswith(": not met")
    assert REFINE_AGAINST_DELTA_MERGE.verdict(0.95, "x").endswith(": met")
    assert REFINE_AGAINST_DELTA_MERGE.verdict(0.55, "1,000,000 rows, plain") == (
        "target: refine against Delta's own MERGE of the same changes >= 0.95x: 0.55x (1,000,000 rows, plain): not met"
    )
