"""The commands of the local stack and its demos (``cdc stack``, ``cdc connectors``, ``cdc workload``,
``cdc demo``) and of the JVM dependencies (``cdc jars``). They sit beside the library: none of it
imports them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from cdc.cli.common import Commands, Options, add_command
from cdc.core import jars
from cdc.core.config import Settings
from cdc.core.errors import DependencyError


def stack_up(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.stack.local import LocalStack

    config = settings.stack
    if args.spark_cluster:
        config = config.model_copy(update={"spark_cluster": config.spark_cluster.model_copy(update={"enabled": True})})
    _print_status(LocalStack(config).up(), as_json=args.json)
    if config.spark_cluster.enabled and not args.json:
        print(f"jobs run on the Spark cluster with CDC_SPARK__MASTER={config.spark_cluster.master_url}")
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
        print(f"{status.name:<14} {state:<5} {status.address}" + (f"  pid {status.pid}" if status.pid else ""))


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


def jars_fetch(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.core.session import build_class_archive
    from cdc.stack.mongo_harness import harness_classpath  # the MongoDB part of the test stack

    for bundle in (
        jars.SPARK_BUNDLE,
        jars.KAFKA_BUNDLE,
        jars.DEBEZIUM_POSTGRES_BUNDLE,
        jars.S3A_BUNDLE,
        jars.S3PROXY_BUNDLE,
    ):
        resolved = jars.resolve(bundle)
        print(f"{bundle.name:<28} {len(resolved):>3} jars in {resolved[0].parent.parent}")
    print(f"{'helpers (cdc/core/jvm)':<28} {1:>3} jar  at {jars.helpers_jar()}")
    print(f"{'MongoDB harness':<28} {len(harness_classpath()):>3} jars at {harness_classpath()[0].parent}")
    try:
        archive = build_class_archive(settings.spark)
    except DependencyError as error:  # an optimisation: jobs run without it, only start slower
        print(f"{'class archive (driver JVM)':<28} not built, jobs start without it: {error}")
    else:
        print(f"{'class archive (driver JVM)':<28} {archive.stat().st_size >> 20:>3} MiB at {archive}")
    return 0


def add_commands(commands: Commands, options: Options) -> None:
    _add_stack(commands, options)
    _add_connectors(commands)
    run = add_command(commands, "workload", workload, "apply a sample workload to the demo database")
    run.add_argument("--customers", type=int, default=10, metavar="N", help="new customers to insert (default 10)")
    run.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    _add_demo(commands, options)


def add_jars_commands(commands: Commands) -> None:
    jar_commands = commands.add_parser("jars", help="JVM dependencies").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    add_command(
        jar_commands, "fetch", jars_fetch, "resolve and cache every jar bundle from Maven Central, build the helpers"
    )


def _add_stack(commands: Commands, options: Options) -> None:
    stack = commands.add_parser("stack", help="run the local CDC stack (Postgres, Kafka, Kafka Connect)")
    stack_commands = stack.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = add_command(
        stack_commands,
        "up",
        stack_up,
        "start every component and wait until it answers",
        [options.state_dir, options.as_json],
    )
    up.add_argument(
        "--spark-cluster",
        action="store_true",
        help="also start a standalone Spark master and its workers on 127.0.0.1 (CDC_STACK__SPARK_CLUSTER__ENABLED)",
    )
    add_command(stack_commands, "down", stack_down, "stop every component (the Spark cluster too)", [options.state_dir])
    add_command(
        stack_commands,
        "status",
        stack_status,
        "show each component, up or down (exit 1 if one is down)",
        [options.state_dir, options.as_json],
    )


def _add_connectors(commands: Commands) -> None:
    connectors = commands.add_parser("connectors", help="manage Debezium connectors through Kafka Connect")
    connector_commands = connectors.add_subparsers(dest="action", required=True, metavar="ACTION")
    register = add_command(connector_commands, "register", connectors_register, "create or update shipped connectors")
    register.add_argument("kinds", nargs="*", default=["postgres"], help="connectors/<kind>.json (default postgres)")
    register.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="seconds to wait until it runs"
    )
    add_command(connector_commands, "list", connectors_list, "list connectors and the state of their tasks")


def _add_demo(commands: Commands, options: Options) -> None:
    demos = add_command(
        commands, "demo", demo, "run an example pipeline end to end on the local stack", [options.state_dir]
    )
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
