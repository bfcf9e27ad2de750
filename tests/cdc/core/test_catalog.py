"""Tables by name: the jobs' table helpers register each table in a Hive catalog that a fresh session in
another process reads. The test run's own session has no catalog (one session per run, and an embedded
metastore admits one JVM at a time), so the writer and the reader are processes of their own, one after
the other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.core.catalog import catalog_conf, checked_name, table_name
from cdc.core.config import CatalogConfig, validate
from cdc.core.errors import ConfigError, TableError

SESSION = """
import json, sys
from pathlib import Path
from cdc.core.config import CatalogConfig, SparkConfig
from cdc.core.session import build_spark_session
folder = Path(sys.argv[1])
catalog = CatalogConfig(enabled=True, metastore_dir=folder / "metastore", refined_schema="silver")
spark = build_spark_session(
    SparkConfig(
        app_name="catalog-test",
        shuffle_partitions=1,
        driver_memory="1g",
        log_dir=None,
        catalog=catalog,
        # A session of a few minutes: the C1 compiler alone (C2 compiles for long runs, on the cores it needs).
        conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"},
    )
)
warehouse = str(folder / "warehouse")
out = {}
"""

WRITER = """
from pyspark.sql.types import LongType, StringType, StructField, StructType
from cdc.class_training import _land_and_refine
from cdc.core.errors import TableError
from cdc.pipeline.business import BusinessTableConfig, refresh_business_table
from cdc.raw.table import create_raw_table
from refine.apply.merge import TableSettings, ensure_refined_table

# `cdc raw`'s batch writer and two `cdc refine` runs of train.public.items (the class archive's training run).
_land_and_refine(spark, warehouse)
items = f"{warehouse}/refined/train.public.items"
added = StructType([*spark.read.format("delta").load(items).schema, StructField("email", StringType())])
ensure_refined_table(spark, items, TableSettings(), added)  # the source gained a column: refine adds it so

schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
customers = f"{warehouse}/refined/Customers"
for run in range(2):  # a job run twice: creation, then (as in a new process) tables met again and registered
    create_raw_table(spark, f"{warehouse}/raw/demo.shop.customers", "demo.shop.customers")
    ensure_refined_table(spark, customers, TableSettings(), schema)  # a new job's settings
# A user drops the raw table's registration (the data stays): the next job to meet it registers it again.
spark.sql("DROP TABLE raw.demo_shop_customers")
create_raw_table(spark, f"{warehouse}/raw/demo.shop.customers", "demo.shop.customers")
spark.createDataFrame([(1, "ann")], schema).write.format("delta").mode("append").save(customers)
wider = StructType([*schema, StructField("email", StringType())])
ensure_refined_table(spark, customers, TableSettings(), wider)  # the source gained a column
spark.createDataFrame([(2, "bob", "b@x")], wider).write.format("delta").mode("append").save(customers)
for run in range(2):  # a business table's query reads the refined table by its catalog name
    refresh_business_table(spark, BusinessTableConfig(
        name="counts", query="SELECT count(*) AS n FROM silver.customers", location=f"{warehouse}/business/counts"
    ))
try:  # another table whose name meets the first's in the catalog
    ensure_refined_table(spark, f"{warehouse}/refined/customers", TableSettings(), schema)
except TableError as error:
    out["conflict"] = str(error)
schemas = ("raw", "silver", "business")
out["tables"] = sorted(f"{t.namespace[0]}.{t.name}" for s in schemas for t in spark.catalog.listTables(s))
print(json.dumps(out))
"""

READER = """
from cdc.maintenance import resolve_table
rows = spark.sql("SELECT * FROM silver.customers ORDER BY id").collect()
out["rows"] = [row.asDict() for row in rows]
out["items"] = spark.sql("SELECT id, email FROM silver.train_public_items ORDER BY id").collect()
out["counts"] = spark.table("business.counts").collect()[0].n
out["raw"] = spark.table("raw.demo_shop_customers").columns
out["resolved"] = resolve_table(spark, "silver.customers", warehouse)

from cdc import Lakehouse
from cdc.core.errors import TableError
lake = Lakehouse(warehouse, spark=spark, say=lambda line: None)
ids = lambda table: sorted(row.id for row in table.toDF().select("id").collect())
out["by_name"] = ids(lake.refined_table("silver.train_public_items"))
out["rebuilt"] = [table.location for table in lake.rebuild("silver.train_public_items")]
out["after_rebuild"] = ids(lake.refined_table("train.public.items"))
out["refined_again"] = lake.refine("silver.train_public_items")
for name in ("business.counts", "silver.customers"):  # not a topic's refined table: one says which
    try:
        lake.rebuild(name)
    except TableError as error:
        out.setdefault("refused", []).append(str(error))
print(json.dumps(out))
"""


def run_session(script: str, folder: Path) -> dict:
    command = [sys.executable, "-c", SESSION + script, str(folder)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # Derby logs to its file from the first session on (its folder made before the JVM starts).
    assert "derby" not in done.stderr.lower(), done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_table_a_job_writes_is_read_by_name_from_a_new_session_in_another_process(tmp_path):
    written = run_session(WRITER, tmp_path)
    assert written["tables"] == [
        "business.counts",
        "raw.demo_shop_customers",
        "raw.train_public_items",
        "silver.customers",
        "silver.train_public_items",
    ]
    assert "silver.customers is taken by the table at" in written["conflict"]
    assert f"table={tmp_path}/warehouse/refined/customers" in written["conflict"]

    read = run_session(READER, tmp_path)
    # The column added after the registration shows through the name: Delta reads the schema from the log.
    assert read["rows"] == [{"id": 1, "name": "ann", "email": None}, {"id": 2, "name": "bob", "email": "b@x"}]
    assert read["items"] == [[key, None] for key in range(1, 6)]  # the jobs' rows, with the added column
    assert read["counts"] == 2
    assert "value" in read["raw"]
    assert read["resolved"].rstrip("/").endswith(f"{tmp_path}/warehouse/refined/Customers")
    # The commands that take a topic take its refined table's catalog name too.
    assert read["by_name"] == read["after_rebuild"] == list(range(1, 6))
    assert read["rebuilt"][0] == f"{tmp_path}/warehouse/refined/train.public.items"
    assert isinstance(read["refined_again"], int)  # refined by the name too
    for refused, location in zip(read["refused"], ("business/counts", "refined/Customers"), strict=True):
        assert refused.startswith("the catalog name ")
        assert "not the refined table of a topic landed" in refused
        assert location in refused


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/w/raw/demo.shop.customers", ("raw", "demo_shop_customers")),
        ("/w/refined/Orders-2024", ("refined", "orders_2024")),
        ("/w/refined/orders__items", ("refined", "orders__items")),
        ("s3a://bucket/w/business/daily", ("business", "daily")),
        ("/w/refined/events/click", ("refined", "events__click")),  # a split table
        ("/w/_cdc/rebuild/orders/refined/orders", None),  # a rebuild's staged table
        ("/w/_cdc/quarantine", None),
    ],
)
def test_catalog_names_keep_what_the_metastore_accepts(location, expected):
    assert table_name(location) == expected


def test_a_name_longer_than_the_metastore_keeps_is_refused_naming_the_table():
    location = f"s3a://bucket/w/refined/{'a' * 200}__{'b' * 60}"
    _layer, name = table_name(location)
    with pytest.raises(TableError, match=f"catalog name has 262 characters, the metastore keeps 256.*table={location}"):
        checked_name(name, location)
    assert checked_name("a" * 256, location) == "a" * 256


def test_the_catalog_is_off_unless_enabled_and_schema_names_are_checked(tmp_path):
    assert catalog_conf(CatalogConfig(), tmp_path) == {}
    conf = catalog_conf(CatalogConfig(enabled=True, metastore_uris="thrift://127.0.0.1:9083"), tmp_path)
    assert conf["spark.sql.catalogImplementation"] == "hive"
    assert conf["spark.hadoop.hive.metastore.uris"] == "thrift://127.0.0.1:9083"
    assert "spark.hadoop.javax.jdo.option.ConnectionURL" not in conf
    with pytest.raises(ConfigError, match="refined_schema: String should match pattern"):
        validate(CatalogConfig, {"enabled": True, "refined_schema": "my.schema"}, "catalog")
