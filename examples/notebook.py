# %% [markdown]
# # cdc-lakehouse from a notebook
#
# Land a Debezium topic from Kafka in a raw Delta table, refine it into a table equal to its Postgres
# source, and read it: from Python, as a Jupyter notebook or a Databricks job would. Each `# %%` is a
# cell (Jupyter, VS Code and Databricks open this file as a notebook); it also runs as a script:
#
#     CDC_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092 EXAMPLE_TOPIC=demo.shop.orders \
#         .venv/bin/python examples/notebook.py
#
# (`cdc stack up`, `cdc connectors register` and `cdc workload` give the local stack such a topic.)

# %%
import os

from cdc import Lakehouse

topic = os.environ.get("EXAMPLE_TOPIC", "demo.shop.orders")

# The warehouse and the Kafka connection come from CDC_WAREHOUSE and CDC_KAFKA__* here; pass them
# instead as `Lakehouse("s3a://bucket/warehouse", kafka={"bootstrap_servers": "..."})`. In a notebook
# that has a session already (Databricks: `spark`), give it: `Lakehouse(..., spark=spark)`.
lake = Lakehouse()

# %% [markdown]
# Land what Kafka holds now, exactly once: running the cell again lands only what is new.

# %%
for summary in lake.land([topic]):
    print(f"landed {summary.rows} records of {summary.topic} in {summary.table}")

# %% [markdown]
# Refine: decode Debezium's changes and MERGE them into the refined table, equal to the source table.

# %%
changes = lake.refine(topic)
print(f"refined {changes} changes")

# %%
refined = lake.refined_table(topic).toDF()
print(f"{refined.count()} rows in the refined table of {topic}")
refined.drop(*[column for column in refined.columns if column.startswith("_cdc_")]).show(5)

# %% [markdown]
# How far each raw table is behind its topic:

# %%
for table in lake.status().raw_tables:
    lags = ", ".join(f"partition {p.partition} lag {p.lag}" for p in table.partitions)
    print(f"{table.topic}: {table.rows} raw records; {lags}")
