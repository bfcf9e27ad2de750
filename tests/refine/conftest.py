"""Fixtures of the refinement tests: land a topic and refine it; read a Postgres table as Spark does."""

from __future__ import annotations

import psycopg
import pytest

from cdc.config import validate
from cdc.raw.config import RawJobConfig
from cdc.raw.job import run_raw_job
from refine.job import RefineJobConfig, run_refine_job

# Each demo table as a query and the Spark schema its refined table has.
SOURCE_TABLES = {
    "orders": (
        "SELECT customer_id, order_no, status::text, amount, ordered_at FROM shop.orders",
        "customer_id long, order_no int, status string, amount decimal(10,2), ordered_at timestamp_ntz",
    ),
    "customers": (
        "SELECT id, email, full_name, balance, credit_limit, signed_up_at, birth_date, profile::text, tags, "
        "external_id::text, is_active, notes, avatar FROM shop.customers",
        "id long, email string, full_name string, balance decimal(12,2), credit_limit decimal(38,18), "
        "signed_up_at timestamp, birth_date date, profile string, tags array<string>, external_id string, "
        "is_active boolean, notes string, avatar binary",
    ),
    "page_views": (
        "SELECT customer_id, url, viewed_at FROM shop.page_views",
        "customer_id long, url string, viewed_at timestamp",
    ),
}


@pytest.fixture
def land(spark, kafka):
    """``land(warehouse, topic)``: `cdc raw --available-now`."""

    def run(warehouse: str, topic: str) -> None:
        raw = {"topics": {"kind": "topics", "topics": [topic]}, "warehouse": warehouse,
               "trigger": {"kind": "available_now"}, "kafka": {"bootstrap_servers": kafka.bootstrap_servers}}  # fmt: skip
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


@pytest.fixture
def postgres_table(spark, stack_config):
    """``postgres_table(name)``: the demo table ``shop.<name>`` in Postgres as a Spark DataFrame."""

    def read(name: str):
        query, schema = SOURCE_TABLES[name]
        with psycopg.connect(stack_config.postgres.dsn()) as conn:
            return spark.createDataFrame(conn.execute(query).fetchall(), schema)

    return read


@pytest.fixture
def refined_table(spark):
    """``refined_table(warehouse, topic)``: the refined table without its metadata columns."""
    from refine.job import refined_table_location
    from refine.merge import METADATA_COLUMNS

    def read(warehouse: str, topic: str):
        table = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        return table.drop(*[column for column in table.columns if column.startswith("_cdc_")], *METADATA_COLUMNS)

    return read
