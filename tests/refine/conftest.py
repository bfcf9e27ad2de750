"""Fixtures of the refinement tests: land a topic and refine it; read a refined table."""

from __future__ import annotations

import pytest

from cdc.core.config import validate
from cdc.raw.config import RawJobConfig
from cdc.raw.job import run_raw_job
from refine.job import RefineJobConfig, run_refine_job


@pytest.fixture
def land(spark, kafka):
    """``land(warehouse, *topics)``: `cdc raw --available-now` (one job for all the topics)."""

    def run(warehouse: str, *topics: str) -> None:
        raw = {
            "topics": {"kind": "topics", "topics": list(topics)},
            "warehouse": warehouse,
            "trigger": {"kind": "available_now"},
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        }
        run_raw_job(spark, validate(RawJobConfig, raw, "raw job"), say=lambda line: None)

    return run


@pytest.fixture
def refine(spark):
    """``refine(warehouse, topic, **settings)``: `cdc refine --available-now` (settings: more of RefineJobConfig)."""

    def run(warehouse: str, topic: str, **settings) -> None:
        config = {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}, **settings}
        run_refine_job(spark, validate(RefineJobConfig, config, "refine job"), say=lambda line: None)

    return run


@pytest.fixture
def land_and_refine(land, refine):
    """``land_and_refine(warehouse, topic, **settings)``: `cdc raw` then `cdc refine`, both available-now."""

    def run(warehouse: str, topic: str, **settings) -> None:
        land(warehouse, topic)
        refine(warehouse, topic, **settings)

    return run
