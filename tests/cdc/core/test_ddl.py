"""DDL type strings of cdc/core/ddl.py, checked by Spark's own parser."""

from pyspark.sql.types import ArrayType, LongType, MapType, StringType, StructField, StructType

from cdc.core.ddl import quoted, sql_type


def test_sql_types_with_any_field_names_parse_back_to_themselves(spark, tmp_path):
    names = ["plain", "content-type", "back`tick", "dot.ted", "ünï"]  # (Delta refuses spaces without column mapping)
    nested = StructType([StructField(name, LongType()) for name in names])
    data_type = StructType(
        [
            StructField("meta", nested),
            StructField("items", ArrayType(nested)),
            StructField("labels", MapType(StringType(), ArrayType(nested))),
        ]
    )
    location = str(tmp_path / "table")
    spark.createDataFrame([], StructType([StructField("id", LongType())])).write.format("delta").save(location)
    columns = ", ".join(f"{quoted(f.name)} {sql_type(f.dataType)}" for f in data_type.fields)
    spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({columns})")
    assert spark.read.format("delta").load(location).schema == StructType(
        [StructField("id", LongType()), *data_type.fields]
    )
