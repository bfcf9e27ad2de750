"""The end-to-end demo on the local stack: Postgres changes -> Debezium -> Kafka, shown as they land."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from cdc.config import KafkaConnection, Settings
from cdc.source import KafkaTopics
from cdc.stack.events import ChangeEvent, read_events
from cdc.stack.local import LocalStack
from cdc.stack.workload import TABLES, run_workload
from connectors import definitions
from connectors.client import ConnectClient


def run_demo(settings: Settings, say: Callable[[str], None] = print) -> dict[str, list[ChangeEvent]]:
    """Bring the stack up, register the Postgres connector, run the workload, show its events."""
    stack_config = settings.stack
    say("starting the local stack (Postgres, Kafka, Kafka Connect with Debezium) ...")
    for component in LocalStack(stack_config).up():
        say(f"  {component.name:<9} up on {component.address}")

    connector = definitions.load("postgres")
    client = ConnectClient(stack_config.connect.url)
    client.register(connector)
    client.wait_running(connector.name)
    say(f"connector {connector.name} running; topics {connector.topic_prefix}.shop.<table>")

    topics = {table: f"{connector.topic_prefix}.shop.{table}" for table in TABLES}
    bootstrap = stack_config.kafka.bootstrap_servers
    start = {partition: held.end for partition, held in KafkaTopics(KafkaConnection(bootstrap_servers=bootstrap))
             .offsets(list(topics.values())).items()}  # fmt: skip
    report = run_workload(stack_config.postgres.dsn(), customers=10)
    say("workload applied: " + "; ".join(f"{table} {dict(ops)}" for table, ops in report.changes.items()))

    expected = {topic: report.expected_events(table) for table, topic in topics.items()}
    events = read_events(bootstrap, expected, start=start)
    for topic, received in events.items():
        ops = Counter(event.op for event in received)
        say(f"  {topic:<24} {len(received):>3} events  " + " ".join(f"{op}={n}" for op, n in sorted(ops.items())))
    sample = next(event for event in events[topics["customers"]] if event.op == "u")
    after = sample.payload["after"]
    say(f"a customer update, key {sample.key}, offset {sample.offset}, as Debezium encodes it:")
    say(f"  balance    = {after['balance']!r}  (numeric(12,2): base64 unscaled integer, scale in the schema)")
    say(f"  birth_date = {after['birth_date']!r}  (date: days since 1970-01-01)")
    say(f"  notes      = {after['notes']!r}  (TOASTed column the update left alone)")
    land_and_refine(settings, list(topics.values()), say)
    return events


def land_and_refine(settings: Settings, topics: list[str], say: Callable[[str], None]) -> None:
    """`cdc raw` then `cdc refine` (both --available-now) for ``topics``; compare with Postgres."""
    import psycopg

    from cdc.config import validate
    from cdc.raw.config import RawJobConfig
    from cdc.raw.job import run_raw_job
    from cdc.spark import build_spark_session
    from refine.job import RefineJobConfig, refined_table_location, run_refine_job

    say(f"landing and refining {', '.join(topics)} into {settings.warehouse} (Spark) ...")
    spark = build_spark_session(settings.spark)
    raw = validate(RawJobConfig, {
        "topics": {"kind": "topics", "topics": topics}, "warehouse": settings.warehouse,
        "trigger": {"kind": "available_now"}, "kafka": {"bootstrap_servers": settings.stack.kafka.bootstrap_servers},
    }, "raw job settings")  # fmt: skip
    run_raw_job(spark, raw, say=say)
    with psycopg.connect(settings.stack.postgres.dsn()) as conn:
        for topic in topics:
            run_refine_job(spark, RefineJobConfig(table=topic, warehouse=raw.warehouse, trigger={"kind": "available_now"}),
                           say=say)  # fmt: skip
            refined = spark.read.format("delta").load(refined_table_location(raw.warehouse, topic))
            table = topic.split(".", 1)[1]
            in_postgres = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            say(f"  {refined_table_location(raw.warehouse, topic)}: {refined.count()} rows (Postgres {table}: {in_postgres})")
