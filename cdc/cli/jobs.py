"""``cdc raw``, ``cdc refine`` and ``cdc sync``: options in, a :class:`~cdc.api.Lakehouse` job out."""

from __future__ import annotations

import argparse
from pathlib import Path

from cdc.cli.common import Commands, Options, add_command, add_trigger, lakehouse, stop_on_signals, trigger_options
from cdc.core.config import Settings
from cdc.core.errors import ConfigError
from refine.apply.schema_changes import SchemaChangePolicy
from refine.config import Connector


def raw(args: argparse.Namespace, settings: Settings) -> int:
    lakehouse(settings).land(
        args.topics,
        pattern=args.pattern,
        pipeline=args.pipeline,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        allow_gaps=args.allow_gaps,
        reset=args.reset,
        force_destroy_raw_data=args.force_destroy_raw_data,
        stop=stop_on_signals(),
        **trigger_options(args),
    )
    return 0


def refine(args: argparse.Namespace, settings: Settings) -> int:
    if args.reinfer_schema and not args.pipeline:
        raise ConfigError("--reinfer-schema applies to the event sources of a --pipeline")
    columns = dict(column.partition("=")[::2] for column in args.column or ())
    lakehouse(settings).refine(
        args.table,
        pipeline=args.pipeline,
        columns=columns or None,
        key=args.key,
        connector=args.connector,
        rebuild=args.rebuild,
        reinfer_schema=args.reinfer_schema,
        fail_on_quarantine=args.fail_on_quarantine,
        schema_changes=args.schema_changes,
        stop=stop_on_signals(),
        **trigger_options(args),
    )
    return 0


def sync(args: argparse.Namespace, settings: Settings) -> int:
    lakehouse(settings).sync(
        args.topics,
        pattern=args.pattern,
        pipeline=args.pipeline,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        allow_gaps=args.allow_gaps,
        schema_changes=args.schema_changes,
        stop=stop_on_signals(),
        **trigger_options(args),
    )
    return 0


def add_commands(commands: Commands, options: Options) -> None:
    _add_raw(commands, options)
    _add_refine(commands, options)
    _add_sync(commands, options)


def _add_raw(commands: Commands, options: Options) -> None:
    land = add_command(
        commands,
        "raw",
        raw,
        "land Kafka topics as-is in raw Delta tables, exactly once",
        [options.warehouse, options.kafka, options.landing],
    )
    selection = land.add_mutually_exclusive_group(required=True)
    selection.add_argument("--topic", action="append", dest="topics", metavar="TOPIC", help="a topic (repeatable)")
    selection.add_argument("--pattern", metavar="REGEX", help="every topic whose whole name matches REGEX")
    selection.add_argument("--pipeline", type=Path, metavar="FILE", help="the topics of a pipeline file's sources")
    add_trigger(land, "land what is there, then stop")
    land.add_argument("--reset", action="store_true", help="delete the table and checkpoint, land from the start")
    land.add_argument(
        "--force-destroy-raw-data",
        action="store_true",
        help="with --reset: allow deleting raw tables, whose data may exist nowhere else",
    )


def _add_refine(commands: Commands, options: Options) -> None:
    refining = add_command(
        commands,
        "refine",
        refine,
        "decode raw tables (Debezium changes, JSON events) and MERGE them into refined tables",
        [options.warehouse],
    )
    refined = refining.add_mutually_exclusive_group(required=True)
    refined.add_argument(
        "--table",
        metavar="TOPIC",
        help="the raw table to refine, named by its topic (or its refined table's catalog name)",
    )
    refined.add_argument("--pipeline", type=Path, metavar="FILE", help="every refined table of a pipeline file")
    refining.add_argument(
        "--reinfer-schema",
        action="store_true",
        help="with --pipeline: infer the kept schemas of event sources again from their raw tables",
    )
    add_trigger(refining, "refine what is there, then stop")
    refining.add_argument(
        "--column",
        action="append",
        metavar="NAME=TYPE",
        help="a column's Spark type (e.g. amount=decimal(12,2); at=timestamp_ntz(3) for a Postgres timestamp(3)): "
        "the row's schema for values written without one (then --key too), else an override of the decoded type; "
        "repeatable",
    )
    refining.add_argument(
        "--key", action="append", metavar="NAME", help="a primary-key column of a schemaless topic; repeatable"
    )
    refining.add_argument(
        "--connector",
        choices=[connector.value for connector in Connector],
        default=Connector.AUTO.value,
        help="the Debezium connector that wrote the topic, which tells rows flattened by a transform apart "
        "(auto: MongoDB documents when the key is {id} and equals the row's _id)",
    )
    refining.add_argument(
        "--fail-on-quarantine",
        action="store_true",
        help="exit 11 after a run that sent records to the quarantine (every other change is applied)",
    )
    _add_schema_changes(refining)
    refining.add_argument(
        "--rebuild",
        action="store_true",
        help="first make the refined table(s) again from the raw table's current contents, with history "
        "and child tables, each replaced in one commit (the old version stays for time travel); stop the "
        "table's running refine first",
    )


def _add_sync(commands: Commands, options: Options) -> None:
    syncing = add_command(
        commands,
        "sync",
        sync,
        "land topics and refine them in one Spark application (one JVM)",
        [options.warehouse, options.kafka, options.landing],
    )
    synced = syncing.add_mutually_exclusive_group(required=True)
    synced.add_argument(
        "--topic",
        action="append",
        dest="topics",
        metavar="TOPIC",
        help="a Debezium topic to land and refine (repeatable)",
    )
    synced.add_argument(
        "--pattern",
        metavar="REGEX",
        help="every Debezium topic whose whole name matches (a whole database; Debezium's own topics left out), "
        "each refined into a table named as its topic, those created while the job runs included",
    )
    synced.add_argument("--pipeline", type=Path, metavar="FILE", help="the topics and tables of a pipeline file")
    add_trigger(syncing, "land what is there, refine it, then stop")
    _add_schema_changes(syncing)


def _add_schema_changes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schema-changes",
        choices=[policy.value for policy in SchemaChangePolicy],
        help="what a table does when a source column changes type, is dropped or renamed, over the pipeline's "
        "setting (default lenient: widen, keep dropped columns; exception: stop; ignore: keep the schema, "
        "quarantine what no longer fits; evolve: apply all, drops included)",
    )
