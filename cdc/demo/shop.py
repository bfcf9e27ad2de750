"""The shop demo: Postgres changes -> Debezium -> Kafka, shown as they land, then the pipeline
examples/pipelines/shop.yaml landed, refined and compared with Postgres.

Each run applies a new workload (new customers after the highest id), so a rerun lands and refines
only the new changes, and the refined tables still equal Postgres.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from cdc.core.config import KafkaConnection, Settings
from cdc.core.source import KafkaTopics
from cdc.core.storage import normalize_location
from cdc.demo.show import Say, land_and_refine, preview, show_business_tables, write_pipeline_graph
from cdc.pipeline.config import DebeziumPostgresSource, Pipeline
from cdc.stack.events import ChangeEvent, read_events
from cdc.stack.workload import TABLES, run_workload
from connectors import definitions
from connectors.client import ConnectClient
from refine.apply.merge import METADATA_COLUMNS
from refine.config import refined_table_location


def shop_demo(
    spark: SparkSession, settings: Settings, pipeline: Pipeline, output_dir: Path, say: Say = print, customers: int = 10
) -> dict[str, list[ChangeEvent]]:
    """Register the Postgres connector, run the workload, show its events; land, refine and show the
    pipeline's tables next to Postgres; write its graph. Return the events the workload produced."""
    stack_config = settings.stack
    connector = definitions.load("postgres")
    client = ConnectClient(stack_config.connect.url)
    client.register(connector)
    client.wait_running(connector.name)
    say(f"connector {connector.name} running; topics {connector.topic_prefix}.shop.<table>")

    topics = {table: f"{connector.topic_prefix}.shop.{table}" for table in TABLES}
    bootstrap = stack_config.kafka.bootstrap_servers
    start = {
        partition: held.end
        for partition, held in KafkaTopics(KafkaConnection(bootstrap_servers=bootstrap))
        .offsets(list(topics.values()))
        .items()
    }
    report = run_workload(stack_config.postgres.dsn(), customers=customers)
    say("workload applied: " + "; ".join(f"{table} {dict(ops)}" for table, ops in report.changes.items()))

    # Waiting for every change of the workload to reach Kafka: the landing below then sees them all.
    # (Snapshot reads are not counted: a connector registered just now may still be writing them.)
    expected = {topic: report.expected_events(table) for table, topic in topics.items()}
    events = read_events(bootstrap, expected, start=start, skip_snapshot=True)
    for topic, received in events.items():
        ops = Counter(event.op for event in received)
        say(f"  {topic:<24} {len(received):>3} events  " + " ".join(f"{op}={n}" for op, n in sorted(ops.items())))
    sample = next(event for event in events[topics["customers"]] if event.op == "u")
    assert sample.payload is not None  # an update's
    after = sample.payload["after"]
    say(f"a customer update, key {sample.key}, offset {sample.offset}, as Debezium encodes it:")
    say(f"  balance    = {after['balance']!r}  (numeric(12,2): base64 unscaled integer, scale in the schema)")
    say(f"  birth_date = {after['birth_date']!r}  (date: days since 1970-01-01)")
    say(f"  notes      = {after['notes']!r}  (TOASTed column the update left alone)")

    land_and_refine(spark, settings, pipeline, say)
    show_refined_tables(spark, settings, pipeline, say)
    show_business_tables(spark, normalize_location(settings.warehouse), pipeline.business, say)
    write_pipeline_graph(pipeline, output_dir, say)
    return events


def postgres_table(source: DebeziumPostgresSource) -> str:
    """The `schema.table` a Debezium Postgres topic (`<prefix>.<schema>.<table>`) carries."""
    assert source.topic is not None, "the shop example names its topics"
    return source.topic.split(".", 1)[1]


def show_refined_tables(spark: SparkSession, settings: Settings, pipeline: Pipeline, say: Say) -> None:
    """Each refined table: its rows next to its Postgres table's, and its first rows by key."""
    import psycopg

    with psycopg.connect(settings.stack.postgres.dsn()) as conn:
        for name, table in pipeline.refined.items():
            source = pipeline.sources[table.source]
            assert isinstance(source, DebeziumPostgresSource)  # the shop's tables come from Postgres
            location = refined_table_location(normalize_location(settings.warehouse), name)
            refined = spark.read.format("delta").load(location)
            in_postgres = conn.execute(f"SELECT count(*) FROM {postgres_table(source)}").fetchall()[0][0]
            rows = refined.count()
            say(f"refined {name}: {rows} rows (Postgres {postgres_table(source)}: {in_postgres})  {location}")
            columns = [column for column in refined.columns if column not in METADATA_COLUMNS]
            for line in preview(refined.select(*columns), order_by=columns[:2]):
                say(line)
