"""updateDescription paths applied to document states, in Spark expressions."""

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from refine.extended_json import to_variant
from refine.patch import apply_patch, path_type, resolve

ORDER = StructType([StructField("qty", LongType()), StructField("sku", StringType())])
COLUMNS = StructType([
    StructField("name", StringType()),
    StructField("address", StructType([StructField("city", StringType()), StructField("zip", StringType())])),
    StructField("orders", ArrayType(ORDER)),
])  # fmt: skip


def test_paths_resolve_to_fields_and_indexes():
    assert resolve(COLUMNS, "orders.1.qty") == ["orders", 1, "qty"]
    assert resolve(COLUMNS, "address.city") == ["address", "city"]
    assert resolve(COLUMNS, "address.7") == ["address", "7"]  # a field named "7" in a document
    with pytest.raises(ValueError, match="name is a string, not a document or an array"):
        resolve(COLUMNS, "name.first")
    with pytest.raises(ValueError, match="orders is an array: 'first' is not an index"):
        resolve(COLUMNS, "orders.first")
    # Setting a field of a missing document creates it.
    assert path_type(COLUMNS, "extra.note", StringType()) == StructType([StructField("note", StringType())])
    assert path_type(COLUMNS, "orders.3.qty", LongType()) == ArrayType(StructType([StructField("qty", LongType())]))


def test_patches_apply_in_order(spark):
    state = F.struct(
        F.lit("Ada").alias("name"),
        F.struct(F.lit("London").alias("city"), F.lit("N1").alias("zip")).alias("address"),
        F.array(F.struct(F.lit(1).cast("long").alias("qty"), F.lit("a").alias("sku"))).alias("orders"),
    ).cast(COLUMNS)
    patches = spark.createDataFrame(
        [('{"address.city": "Paris", "orders.0.qty": 5, "orders.2": {"sku": "c", "qty": 3}}', ["address.zip"], None),
         ('{"name": "Ada L."}', None, [("orders", 1)])],
        "updated string, removed array<string>, truncated array<struct<field: string, size: int>>",
    )  # fmt: skip
    patch = F.struct(to_variant(F.col("updated")).alias("updated"), F.col("removed"), F.col("truncated"))
    applied = apply_patch(state, COLUMNS, patch, ["address.city", "name", "orders.0.qty", "orders.2"],
                          ["address.zip"], ["orders"])  # fmt: skip
    first, second = [row.s for row in patches.select(applied.alias("s")).collect()]
    assert first.address.asDict() == {"city": "Paris", "zip": None}
    # An index past the end pads with nulls, as MongoDB does.
    assert [o and o.asDict() for o in first.orders] == [{"qty": 5, "sku": "a"}, None, {"qty": 3, "sku": "c"}]
    assert second.name == "Ada L." and second.address.city == "London"
    assert [o.asDict() for o in second.orders] == [{"qty": 1, "sku": "a"}]
