"""``cdc validate`` and ``cdc graph``: a pipeline file checked, or drawn. Neither starts Spark."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cdc.cli.common import Commands, Options, add_command
from cdc.core.config import Settings
from cdc.pipeline.load import PipelineError, load_pipeline


def validate_pipeline(args: argparse.Namespace, settings: Settings) -> int:
    try:
        load_pipeline(args.file)
    except PipelineError as error:
        print("\n".join(error.problems), file=sys.stderr)
        return error.exit_code
    print("OK")
    return 0


def graph(args: argparse.Namespace, settings: Settings) -> int:
    from cdc.pipeline.graph import write_graph

    print(f"wrote {write_graph(load_pipeline(args.file), args.output)}")
    return 0


def add_commands(commands: Commands, options: Options) -> None:
    checking = add_command(
        commands,
        "validate",
        validate_pipeline,
        "check a pipeline file: OK, or one line per problem naming the key and the reason (exit 2)",
    )
    checking.add_argument("file", type=Path, help="the pipeline file (YAML)")
    drawing = add_command(commands, "graph", graph, "draw a pipeline's DAG (topics -> raw -> refined -> business)")
    drawing.add_argument("file", type=Path, help="the pipeline file (YAML)")
    drawing.add_argument("-o", "--output", type=Path, required=True, help="OUT.html (a page) or OUT.svg (an image)")
