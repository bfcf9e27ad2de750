"""The schema of an event topic: given in the pipeline file, or inferred once and kept.

An inferred schema is computed in Spark over the whole raw table (``schema_of_variant_agg`` over
the values that are JSON objects: one merged type string comes back to the driver, never the
data), then kept as Spark's JSON form at ``<warehouse>/_cdc/schemas/<topic>.json``. Later runs
read the kept file, so every batch is parsed with the same schema; ``reinfer`` computes it again
(for fields that appeared since; columns are only ever added to refined tables).
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc.core.ddl import inferred_schema
from cdc.core.errors import TableError
from cdc.core.storage import Storage
from cdc.core.tables import raw_table_location


def schema_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/_cdc/schemas/{topic}.json"


def infer_schema(spark: SparkSession, raw_table: str) -> StructType:
    """The merged schema of every JSON object value in the raw table; fails when there is none."""
    values = spark.read.format("delta").load(raw_table).select(F.try_parse_json("value").alias("v"))
    merged = (
        values.where(F.schema_of_variant("v").startswith("OBJECT<"))
        .select(F.schema_of_variant_agg("v"))
        .collect()[0][0]
    )
    if merged is None:
        raise TableError(
            "cannot infer the events' schema: the raw table holds no JSON object yet; land events "
            "first or give the schema in the pipeline file",
            table=raw_table,
        )
    return inferred_schema(merged)


def infers_schema(spark: SparkSession, warehouse: str, topic: str, ddl: str | None, reinfer: bool = False) -> bool:
    """Whether :func:`event_schema` infers ``topic``'s schema from its raw table (which must then hold
    events): no ``ddl``, and no kept schema yet or ``reinfer``."""
    return ddl is None and (reinfer or not Storage(spark).exists(schema_location(warehouse, topic)))


def event_schema(spark: SparkSession, warehouse: str, topic: str, ddl: str | None, reinfer: bool = False) -> StructType:
    """The schema to parse ``topic``'s events with: ``ddl`` when given, else the kept inferred one
    (inferred now when there is none yet, or when ``reinfer``)."""
    if ddl is not None:
        schema = StructType.fromDDL(ddl)
        assert isinstance(schema, StructType)  # a pipeline's DDL is checked to be a struct (cdc/core/ddl.py)
        return schema
    storage = Storage(spark)
    location = schema_location(warehouse, topic)
    if not infers_schema(spark, warehouse, topic, ddl, reinfer):
        return StructType.fromJson(json.loads(storage.read_text(location)))
    schema = infer_schema(spark, raw_table_location(warehouse, topic))
    storage.write_text(location, schema.json())
    return schema
