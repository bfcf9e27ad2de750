"""The ``cdc`` command. Each command only reads its options and calls the library (the job commands
call :class:`cdc.api.Lakehouse`, as a notebook would).

Errors the tool raises on purpose (:class:`cdc.core.errors.CdcError`) print as one line and exit with
their code; the traceback shows only under ``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from cdc.cli import jobs, pipelines, stack, tables
from cdc.cli.common import Options, job_lines, settings_of
from cdc.core.errors import CdcError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``cdc`` command, in the order ``cdc --help`` lists them."""
    parser = argparse.ArgumentParser(
        prog="cdc",
        description="Land Debezium change topics from Kafka in Delta Lake and refine them with Spark.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the warnings of Spark, Delta and the Kafka client on the terminal too (they always go to the "
        "log file, .cdc/logs by default)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    options = Options()
    stack.add_commands(commands, options)
    jobs.add_commands(commands, options)
    pipelines.add_commands(commands, options)
    tables.add_commands(commands, options)
    stack.add_jars_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Progress lines reach a pipe (a log collector, `tee`) as they are printed, not in 8 KiB blocks.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if args.debug or "cdc.core.session" in sys.modules:  # (not imported for the commands without Spark)
        import cdc.core.session

        cdc.core.session.show_failure_logs = args.debug  # Spark's own logs of a failure, with its stack
    if not args.verbose:
        # kafka-python logs a warning per failed connection attempt through Python's last-resort handler.
        logging.getLogger("kafka").setLevel(logging.ERROR)
    earlier_log = _log_file()  # a JVM this process started before this command (an embedding process)
    try:
        return args.handler(args, settings_of(args))
    except CdcError as error:
        job_lines.end_line()
        if args.debug:
            traceback.print_exc()
        print(f"cdc: error: {error}", file=sys.stderr)
        if (log := _log_file()) is not None and log != earlier_log and log.exists():
            print(f"cdc: Spark's log of this run: {log}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        job_lines.end_line()
        print("cdc: interrupted", file=sys.stderr)
        return 130


def _log_file() -> Path | None:
    """The log file of the JVM this process started, if it started one (:data:`cdc.core.session.log_file`)."""
    session = sys.modules.get("cdc.core.session")
    return getattr(session, "log_file", None)
