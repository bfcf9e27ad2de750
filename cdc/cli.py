"""The ``cdc`` command. Each command only builds settings and calls the library.

Errors the tool raises on purpose (:class:`cdc.errors.CdcError`) print as one line and exit with
their code; the traceback shows only under ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cdc import jars
from cdc.config import Settings, load_settings, validate
from cdc.errors import CdcError, ConfigError, DependencyError

Command = Callable[[argparse.Namespace, Settings], int]


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the command-line options on top."""
    overrides: dict[str, Any] = {}
    if getattr(args, "state_dir", None):
        overrides["stack"] = {"state_dir": args.state_dir}
    for option in ("warehouse", "kafka_secrets_file"):
        if getattr(args, option, None):
            overrides[option] = getattr(args, option)
    return load_settings(overrides)


def stack_up(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.stack.local import LocalStack

    _print_status(LocalStack(settings.stack).up(), as_json=args.json)
    return 0


def stack_down(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.stack.local import LocalStack

    LocalStack(settings.stack).down()
    print("stack stopped")
    return 0


def stack_status(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.stack.local import LocalStack

    statuses = LocalStack(settings.stack).status()
    _print_status(statuses, as_json=args.json)
    return 0 if all(status.up for status in statuses) else 1


def _print_status(statuses: Sequence, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"components": [status.as_dict() for status in statuses]}, indent=2))
        return
    for status in statuses:
        state = "up" if status.up else "down"
        print(f"{status.name:<9} {state:<5} {status.address}" + (f"  pid {status.pid}" if status.pid else ""))


def connectors_register(args: argparse.Namespace, settings: Settings) -> int:
    from connectors import definitions
    from connectors.client import ConnectClient

    client = ConnectClient(settings.stack.connect.url)
    for kind in args.kinds:
        connector = definitions.load(kind)
        client.register(connector)
        client.wait_running(connector.name, timeout_s=args.timeout)
        print(f"{connector.name} running")
    return 0


def connectors_list(args: argparse.Namespace, settings: Settings) -> int:
    from connectors.client import ConnectClient

    client = ConnectClient(settings.stack.connect.url)
    for name in client.connectors():
        status = client.status(name)
        tasks = ", ".join(f"task {task['id']} {task['state']}" for task in status["tasks"])
        print(f"{name:<20} {status['connector']['state']:<8} {tasks}")
    return 0


def workload(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.stack.workload import run_workload

    report = run_workload(settings.stack.postgres.dsn(), customers=args.customers, seed=args.seed)
    for table, ops in report.changes.items():
        print(f"shop.{table:<11} " + " ".join(f"{op}={count}" for op, count in sorted(ops.items())))
    return 0


def demo(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.demo import run_demo

    run_demo(settings, args.example, args.output_dir)
    return 0


def _trigger(args: argparse.Namespace) -> dict[str, object]:
    if args.available_now:
        return {"kind": "available_now"}
    return {"kind": "continuous", "interval_s": args.trigger_interval or 2.0}


def _job_session(settings: Settings, *, refines_continuously: bool):
    """The Spark session a landing or refining job runs in (see :func:`cdc.spark.job_spark_config`)."""
    from cdc.spark import build_spark_session, job_spark_config

    return build_spark_session(job_spark_config(settings.spark, refines_continuously=refines_continuously))


def raw(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.raw.config import RawJobConfig
    from cdc.raw.job import run_raw_job

    options = {
        "warehouse": settings.warehouse,
        "trigger": _trigger(args),
        "kafka": kafka_settings(settings),
        "on_gap": "record" if args.allow_gaps else None,
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "reset": args.reset,
        "force_destroy_raw_data": args.force_destroy_raw_data,
    }
    if args.pipeline:
        from cdc.pipeline.load import load_pipeline
        from cdc.pipeline.run import raw_job_config

        config = raw_job_config(load_pipeline(args.pipeline), options)
    else:
        topics = (
            {"kind": "topics", "topics": args.topics} if args.topics else {"kind": "pattern", "pattern": args.pattern}
        )
        config = validate(
            RawJobConfig, {**options, "topics": topics, "on_gap": options["on_gap"] or "fail"}, "raw job settings"
        )
    spark = _job_session(settings, refines_continuously=False)
    run_raw_job(spark, config, stop=_stop_on_signals())
    return 0


def refine(args: argparse.Namespace, settings: Settings) -> int:
    from refine.job import RefineJobConfig, run_refine_job

    if args.reinfer_schema and not args.pipeline:
        raise ConfigError("--reinfer-schema applies to the event sources of a --pipeline")
    if args.pipeline:
        from cdc.pipeline.load import load_pipeline
        from cdc.pipeline.run import PipelineRefineConfig, run_pipeline_refine

        pipeline = load_pipeline(args.pipeline)  # checked before Spark starts
        config = validate(
            PipelineRefineConfig,
            {
                "warehouse": settings.warehouse,
                "trigger": _trigger(args),
                "reinfer_schema": args.reinfer_schema,
                "rebuild": args.rebuild,
            },
            "refine job settings",
        )
        spark = _job_session(settings, refines_continuously=not args.available_now)
        run_pipeline_refine(spark, pipeline, config, stop=_stop_on_signals())
        return 0
    columns = dict(column.partition("=")[::2] for column in args.column or ())
    config = validate(
        RefineJobConfig,
        {
            "table": args.table,
            "warehouse": settings.warehouse,
            "columns": columns or None,
            "key": args.key,
            "trigger": _trigger(args),
        },
        "refine job settings",
    )
    spark = _job_session(settings, refines_continuously=not args.available_now)
    if args.rebuild:
        from refine.rebuild import rebuild_refined_table

        rebuild_refined_table(spark, config)
    run_refine_job(spark, config, stop=_stop_on_signals())
    return 0


def sync(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.sync import SyncJobConfig, run_sync_job

    run = {"warehouse": settings.warehouse, "trigger": _trigger(args)}
    raw = {
        **run,
        "kafka": kafka_settings(settings),
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "on_gap": "record" if args.allow_gaps else None,
    }
    if args.pipeline:
        from cdc.pipeline.load import load_pipeline
        from cdc.pipeline.run import raw_job_config

        pipeline = load_pipeline(args.pipeline)
        document = {
            "raw": raw_job_config(pipeline, raw),
            "refine": {"kind": "pipeline", "pipeline": pipeline, "run": run},
        }
    else:
        topics = {"kind": "topics", "topics": args.topics}
        document = {
            "raw": {**raw, "topics": topics, "on_gap": raw["on_gap"] or "fail"},
            "refine": {"kind": "topics", "jobs": [{**run, "table": topic} for topic in args.topics]},
        }
    config = validate(SyncJobConfig, document, "sync job settings")
    spark = _job_session(settings, refines_continuously=not args.available_now)
    run_sync_job(spark, config, stop=_stop_on_signals())
    return 0


def validate_pipeline(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.pipeline.load import PipelineError, load_pipeline

    try:
        load_pipeline(args.file)
    except PipelineError as error:
        print("\n".join(error.problems), file=sys.stderr)
        return error.exit_code
    print("OK")
    return 0


def graph(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.pipeline.graph import write_graph
    from cdc.pipeline.load import load_pipeline

    print(f"wrote {write_graph(load_pipeline(args.file), args.output)}")
    return 0


def status(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.config import KafkaConnection
    from cdc.spark import build_spark_session
    from cdc.status import expectation_totals, raw_table_statuses
    from cdc.storage import normalize_location

    kafka = validate(KafkaConnection, kafka_settings(settings), "Kafka settings")
    spark, warehouse = build_spark_session(settings.spark), normalize_location(settings.warehouse)
    tables = raw_table_statuses(spark, warehouse, kafka)
    expectations = expectation_totals(spark, warehouse)
    if args.json:
        print(
            json.dumps(
                {
                    "raw_tables": [table.as_dict() for table in tables],
                    "expectations": [total.as_dict() for total in expectations],
                },
                indent=2,
            )
        )
        return 0
    print(
        f"{'raw table':<32} {'version':>7} {'rows':>12} {'gaps':>4} {'quarantined':>11}  partitions (consumed/end, lag)"
    )
    for table in tables:
        partitions = " ".join(
            f"p{p.partition} {p.consumed}/{'?' if p.end is None else p.end} lag {'?' if p.lag is None else p.lag}"
            for p in table.partitions
        )
        print(
            f"{table.topic:<32} {table.version:>7} {table.rows:>12,} {table.recorded_gaps:>4} {table.quarantined:>11,}  "
            f"{partitions}"
        )
    if expectations:
        print(f"\n{'table':<40} {'expectation':<24} {'action':<6} {'batches':>7} {'passed':>12} {'failed':>10}")
    for total in expectations:
        print(
            f"{total.table:<40} {total.expectation:<24} {total.action:<6} {total.batches:>7} {total.passed:>12,} "
            f"{total.failed:>10,}"
        )
    return 0


def optimize(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.maintenance import optimize_table, resolve_table
    from cdc.spark import build_spark_session
    from cdc.storage import normalize_location

    spark = build_spark_session(settings.spark)
    location = resolve_table(spark, args.table, normalize_location(settings.warehouse))
    zorder_by = [column.strip() for column in (args.zorder_by or "").split(",") if column.strip()]
    result = optimize_table(spark, location, zorder_by)
    print(
        f"optimized {location}: {result.files_removed} files compacted into {result.files_added}"
        + (f", Z-ordered by {', '.join(zorder_by)}" if zorder_by else "")
    )
    return 0


def vacuum(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.maintenance import resolve_table, vacuum_table
    from cdc.spark import build_spark_session
    from cdc.storage import normalize_location

    spark = build_spark_session(settings.spark)
    location = resolve_table(spark, args.table, normalize_location(settings.warehouse))
    vacuum_table(spark, location, args.retain_hours, args.i_know_vacuum_below_retention_loses_time_travel)
    print(f"vacuumed {location}" + ("" if args.retain_hours is None else f" (retained {args.retain_hours:g} hours)"))
    return 0


def kafka_settings(settings: Settings) -> dict[str, object]:
    """The Kafka connection: CDC_KAFKA__* with the secrets file's settings on top."""
    from cdc.source import load_secrets_file

    document = settings.kafka.model_dump()
    if settings.kafka_secrets_file:
        document |= load_secrets_file(settings.kafka_secrets_file)
    return document


def _stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM (a scheduler stopping the job), for the job to stop between calls.

    Raising KeyboardInterrupt instead could land in the middle of a call into Spark's JVM.
    """
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        # A stop of the whole process group (systemd's) signals the JVM too, and it exits on its own:
        # py4j then logs every later call's failure, even one the job expects and catches (stopping
        # its queries, Python's own clean-up at exit), with a traceback, through the root logger; and
        # the failure of a micro-batch the JVM's exit cut short (replayed by the next run) through its own.
        for logger in (logging.getLogger(), logging.getLogger("py4j.clientserver")):
            logger.addFilter(_not_py4j_failures_after_jvm_exit)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    return stop


def _not_py4j_failures_after_jvm_exit(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not message.startswith(
        ("Exception while sending command", "There was an exception while executing the Python Proxy")
    )


def jars_fetch(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.spark import build_class_archive

    for bundle in (jars.SPARK_BUNDLE, jars.KAFKA_BUNDLE, jars.DEBEZIUM_POSTGRES_BUNDLE):
        resolved = jars.resolve(bundle)
        print(f"{bundle.name:<28} {len(resolved):>3} jars in {resolved[0].parent.parent}")
    print(f"{'helpers (cdc/jvm)':<28} {1:>3} jar  at {jars.helpers_jar()}")
    from cdc.stack.mongo_harness import harness_classpath  # the MongoDB part of the test stack

    print(f"{'MongoDB harness':<28} {len(harness_classpath()):>3} jars at {harness_classpath()[0].parent}")
    try:
        archive = build_class_archive(settings.spark)
    except DependencyError as error:  # an optimisation: jobs run without it, only start slower
        print(f"{'class archive (driver JVM)':<28} not built, jobs start without it: {error}")
    else:
        print(f"{'class archive (driver JVM)':<28} {archive.stat().st_size >> 20:>3} MiB at {archive}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdc",
        description="Land Debezium change topics from Kafka in Delta Lake and refine them with Spark.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    state_dir = argparse.ArgumentParser(add_help=False)
    state_dir.add_argument(
        "--state-dir", type=Path, help="folder of the stack's data, logs and pid files (default .cdc/stack)"
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print machine-readable JSON")

    stack = commands.add_parser("stack", help="run the local CDC stack (Postgres, Kafka, Kafka Connect)")
    stack_commands = stack.add_subparsers(dest="action", required=True, metavar="ACTION")
    _add(stack_commands, "up", stack_up, "start every component and wait until it answers", [state_dir, as_json])
    _add(stack_commands, "down", stack_down, "stop every component", [state_dir])
    _add(
        stack_commands,
        "status",
        stack_status,
        "show each component, up or down (exit 1 if one is down)",
        [state_dir, as_json],
    )

    connectors = commands.add_parser("connectors", help="manage Debezium connectors through Kafka Connect")
    connector_commands = connectors.add_subparsers(dest="action", required=True, metavar="ACTION")
    register = _add(connector_commands, "register", connectors_register, "create or update shipped connectors")
    register.add_argument("kinds", nargs="*", default=["postgres"], help="connectors/<kind>.json (default postgres)")
    register.add_argument("--timeout", type=float, default=60.0, help="seconds to wait until it runs")
    _add(connector_commands, "list", connectors_list, "list connectors and the state of their tasks")

    run = _add(commands, "workload", workload, "apply a sample workload to the demo database")
    run.add_argument("--customers", type=int, default=10, help="new customers to insert (default 10)")
    run.add_argument("--seed", type=int, default=0, help="random seed (default 0)")

    warehouse = argparse.ArgumentParser(add_help=False)
    warehouse.add_argument("--warehouse", help="root of the Delta tables, a path or URI (default ./warehouse)")
    warehouse.add_argument("--kafka-secrets-file", type=Path, help="YAML/JSON file of Kafka settings (SASL, SSL)")

    demos = _add(commands, "demo", demo, "run an example pipeline end to end on the local stack", [state_dir])
    demos.add_argument("--warehouse", help="root of the Delta tables, a path or URI (default ./warehouse)")
    demos.add_argument(
        "example",
        nargs="?",
        choices=["shop", "games"],
        default="shop",
        help="shop: examples/pipelines/shop.yaml over the demo Postgres database (default); "
        "games: examples/pipelines/game_events.yaml over generated game events",
    )
    demos.add_argument(
        "--output-dir",
        type=Path,
        default=Path(".cdc/demo"),
        help="where the pipeline's graph page is written (default .cdc/demo)",
    )

    landing = argparse.ArgumentParser(add_help=False)
    landing.add_argument(
        "--max-offsets-per-trigger", type=int, metavar="N", help="at most N records per raw micro-batch"
    )
    landing.add_argument(
        "--allow-gaps",
        action="store_true",
        help="when Kafka deleted offsets not landed yet, go on and record the gap (default: stop)",
    )

    land = _add(commands, "raw", raw, "land Kafka topics as-is in raw Delta tables, exactly once", [warehouse, landing])
    selection = land.add_mutually_exclusive_group(required=True)
    selection.add_argument("--topic", action="append", dest="topics", metavar="TOPIC", help="a topic (repeatable)")
    selection.add_argument("--pattern", metavar="REGEX", help="every topic whose whole name matches REGEX")
    selection.add_argument("--pipeline", type=Path, metavar="FILE", help="the topics of a pipeline file's sources")
    _add_trigger(land, "land what is there, then stop")
    land.add_argument("--reset", action="store_true", help="delete the table and checkpoint, land from the start")
    land.add_argument(
        "--force-destroy-raw-data",
        action="store_true",
        help="with --reset: allow deleting raw tables, whose data may exist nowhere else",
    )

    refining = _add(
        commands,
        "refine",
        refine,
        "decode raw tables (Debezium changes, JSON events) and MERGE them into refined tables",
        [warehouse],
    )
    refined = refining.add_mutually_exclusive_group(required=True)
    refined.add_argument("--table", metavar="TOPIC", help="the raw table to refine, named by its topic")
    refined.add_argument("--pipeline", type=Path, metavar="FILE", help="every refined table of a pipeline file")
    refining.add_argument(
        "--reinfer-schema",
        action="store_true",
        help="with --pipeline: infer the kept schemas of event sources again from their raw tables",
    )
    _add_trigger(refining, "refine what is there, then stop")
    refining.add_argument(
        "--column",
        action="append",
        metavar="NAME=TYPE",
        help="a column's Spark type (e.g. amount=decimal(12,2); at=timestamp_ntz(3) for a Postgres timestamp(3)): "
        "the row's schema for values written without one (then --key too), else an override of the decoded type; repeatable",
    )
    refining.add_argument(
        "--key", action="append", metavar="NAME", help="a primary-key column of a schemaless topic; repeatable"
    )
    refining.add_argument(
        "--rebuild",
        action="store_true",
        help="first make the refined table(s) again from the raw table's current contents, with history "
        "and child tables, each replaced in one commit (the old version stays for time travel); stop the "
        "table's running refine first",
    )

    syncing = _add(
        commands, "sync", sync, "land topics and refine them in one Spark application (one JVM)", [warehouse, landing]
    )
    synced = syncing.add_mutually_exclusive_group(required=True)
    synced.add_argument(
        "--topic",
        action="append",
        dest="topics",
        metavar="TOPIC",
        help="a Debezium topic to land and refine (repeatable)",
    )
    synced.add_argument("--pipeline", type=Path, metavar="FILE", help="the topics and tables of a pipeline file")
    _add_trigger(syncing, "land what is there, refine it, then stop")

    checking = _add(
        commands,
        "validate",
        validate_pipeline,
        "check a pipeline file: OK, or one line per problem naming the key and the reason (exit 2)",
    )
    checking.add_argument("file", type=Path, help="the pipeline file (YAML)")
    drawing = _add(commands, "graph", graph, "draw a pipeline's DAG (topics -> raw -> refined -> business)")
    drawing.add_argument("file", type=Path, help="the pipeline file (YAML)")
    drawing.add_argument("-o", "--output", type=Path, required=True, help="OUT.html (a page) or OUT.svg (an image)")

    _add(
        commands,
        "status",
        status,
        "list raw tables (Delta version, rows, consumed vs end offsets: lag) and expectation totals",
        [warehouse, as_json],
    )

    table = argparse.ArgumentParser(add_help=False)
    table.add_argument(
        "--table",
        required=True,
        metavar="PATH_OR_NAME",
        help="a Delta table's path or URI, a path under the warehouse (refined/TOPIC), or a catalog name",
    )
    compact = _add(
        commands, "optimize", optimize, "compact a Delta table's small files, optionally Z-ordered", [warehouse, table]
    )
    compact.add_argument("--zorder-by", metavar="COLUMN,...", help="cluster the rows by these columns (Z-order)")
    clean = _add(
        commands, "vacuum", vacuum, "delete files older versions of a Delta table no longer need", [warehouse, table]
    )
    clean.add_argument(
        "--retain-hours",
        type=float,
        metavar="N",
        help="keep the files that versions of the last N hours need "
        "(default: the table's retention, 168); below 168 is refused unless overridden",
    )
    clean.add_argument(
        "--i-know-vacuum-below-retention-loses-time-travel",
        action="store_true",
        help="allow a retention below 168 hours (never on raw tables)",
    )

    jar_commands = commands.add_parser("jars", help="JVM dependencies").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    _add(jar_commands, "fetch", jars_fetch, "resolve and cache every jar bundle from Maven Central, build the helpers")
    return parser


def _add_trigger(command: argparse.ArgumentParser, once_help: str) -> None:
    trigger = command.add_mutually_exclusive_group()
    trigger.add_argument("--available-now", action="store_true", help=once_help)
    trigger.add_argument(
        "--trigger-interval",
        type=float,
        metavar="SECONDS",
        help="run continuously, a micro-batch every SECONDS (default 2)",
    )


def _add(
    commands: argparse._SubParsersAction,
    name: str,
    handler: Command,
    help_text: str,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    command = commands.add_parser(name, help=help_text, description=help_text, parents=list(parents))
    command.set_defaults(handler=handler)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Progress lines reach a pipe (a log collector, `tee`) as they are printed, not in 8 KiB blocks.
    sys.stdout.reconfigure(line_buffering=True)
    if args.debug or "cdc.spark" in sys.modules:  # (not imported for the commands without Spark)
        import cdc.spark

        cdc.spark.show_failure_logs = args.debug  # Spark's own logs of a failure, with its stack
    try:
        return args.handler(args, _settings(args))
    except CdcError as error:
        if args.debug:
            traceback.print_exc()
        print(f"cdc: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("cdc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
