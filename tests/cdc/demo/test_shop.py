"""The shop demo on the real stack: examples/pipelines/shop.yaml from Postgres to refined tables equal
to Postgres, run twice (the rerun adds a workload and lands and refines only its changes); every table
it writes opens in delta-rs with the rows Spark reads."""

import hashlib

from pyspark.testing import assertDataFrameEqual

from cdc.core.config import Settings
from cdc.demo import PIPELINES
from cdc.demo.shop import shop_demo
from cdc.pipeline.load import load_pipeline
from refine.apply.merge import METADATA_COLUMNS
from refine.config import refined_table_location


def test_the_shop_pipeline_equals_postgres_after_two_runs(
    spark, stack_config, shipped_postgres_connector, postgres_table, tmp_path, delta_rs_mismatches
):
    settings = Settings(stack=stack_config, warehouse=str(tmp_path / "warehouse"))
    pipeline = load_pipeline(PIPELINES["shop"])
    for _run in range(2):
        said: list[str] = []
        shop_demo(spark, settings, pipeline, tmp_path / "out", said.append, customers=3)
        for name in ("customers", "orders"):
            refined = spark.read.format("delta").load(refined_table_location(str(tmp_path / "warehouse"), name))
            assertDataFrameEqual(refined.drop(*METADATA_COLUMNS), postgres_table(name))
            rows = refined.count()
            assert any(line.startswith(f"refined {name}: {rows} rows (Postgres shop.{name}: {rows})") for line in said)
        customers = postgres_table("customers").count()
        assert any(line.startswith(f"business customer_order_totals: {customers} rows") for line in said)
        # The shaped table: active customers, email hashed (Python's hashlib the oracle).
        contacts = spark.read.format("delta").load(
            refined_table_location(str(tmp_path / "warehouse"), "customer_contacts")
        )
        live = contacts.where("_cdc_deleted_at IS NULL").select("id", "email", "signup_year").collect()
        active = postgres_table("customers").where("is_active").select("id", "email", "signed_up_at").collect()
        assert sorted(tuple(r) for r in live) == sorted(
            (r.id, hashlib.sha256(r.email.encode()).hexdigest(), r.signed_up_at.year) for r in active
        )
        assert {"avatar", "notes", "profile"}.isdisjoint(contacts.columns)
    assert (tmp_path / "out" / "shop.html").read_text().startswith("<!DOCTYPE html>")
    assert f"the pipeline's graph (topics -> raw -> refined -> business): open {tmp_path / 'out' / 'shop.html'}" in said
    # Every Delta table of the warehouse, raw, refined (in the default features), business and the
    # tool's own: delta-rs (pandas' and Polars' read_delta) reads the rows Spark reads.
    tables, mismatches = delta_rs_mismatches(tmp_path / "warehouse")
    assert {
        "raw/demo.shop.orders",
        "refined/customers",
        "refined/customers__tags",
        "refined/customers__history",
        "refined/customer_contacts",
    } <= set(tables)
    assert {"refined/orders", "refined/page_views", "business/customer_order_totals"} <= set(tables)
    assert not mismatches
