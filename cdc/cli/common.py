"""What the ``cdc`` commands share: their common options, the settings and the Lakehouse they build, and
the stop on signals."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cdc.core.config import Settings, load_settings

if TYPE_CHECKING:
    from cdc.api import Lakehouse

Command = Callable[[argparse.Namespace, Settings], int]
Commands = argparse._SubParsersAction


class Options:
    """The option groups several commands share, as argparse parent parsers."""

    def __init__(self) -> None:
        self.state_dir = argparse.ArgumentParser(add_help=False)
        self.state_dir.add_argument(
            "--state-dir", type=Path, help="folder of the stack's data, logs and pid files (default .cdc/stack)"
        )
        self.as_json = argparse.ArgumentParser(add_help=False)
        self.as_json.add_argument("--json", action="store_true", help="print machine-readable JSON")
        self.warehouse = argparse.ArgumentParser(add_help=False)
        self.warehouse.add_argument("--warehouse", help="root of the Delta tables, a path or URI (default ./warehouse)")
        self.kafka = argparse.ArgumentParser(add_help=False)  # only for the commands that read Kafka
        self.kafka.add_argument("--kafka-secrets-file", type=Path, help="YAML/JSON file of Kafka settings (SASL, SSL)")
        self.landing = argparse.ArgumentParser(add_help=False)
        self.landing.add_argument(
            "--max-offsets-per-trigger", type=int, metavar="N", help="at most N records per raw micro-batch"
        )
        self.landing.add_argument(
            "--allow-gaps",
            action="store_true",
            help="when Kafka deleted offsets not landed yet, go on and record the gap (default: stop)",
        )


def add_command(
    commands: Commands,
    name: str,
    handler: Command,
    help_text: str,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    command = commands.add_parser(name, help=help_text, description=help_text, parents=list(parents))
    command.set_defaults(handler=handler)
    return command


def add_trigger(command: argparse.ArgumentParser, once_help: str) -> None:
    trigger = command.add_mutually_exclusive_group()
    trigger.add_argument("--available-now", action="store_true", help=once_help)
    trigger.add_argument(
        "--trigger-interval",
        type=float,
        metavar="SECONDS",
        help="run continuously, a micro-batch every SECONDS (default 2)",
    )


def trigger_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a Lakehouse job for ``--available-now`` / ``--trigger-interval``."""
    return {"continuous": not args.available_now, "interval_s": args.trigger_interval or 2.0}


def settings_of(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the command-line options on top."""
    overrides: dict[str, Any] = {}
    if getattr(args, "verbose", False):
        overrides["spark"] = {"console_log_level": "warn"}
    if getattr(args, "state_dir", None):
        overrides["stack"] = {"state_dir": args.state_dir}
    for option in ("warehouse", "kafka_secrets_file"):
        if getattr(args, option, None):
            overrides[option] = getattr(args, option)
    return load_settings(overrides)


class TerminalLines:
    """Prints a job's lines to ``stream``. On a terminal, a :class:`~cdc.core.streaming.ProgressLine` is
    drawn over the one before it (live progress), and the next other line starts below it; elsewhere (a
    pipe, a file) every line is printed as it is."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream  # None: sys.stdout as it is when a line is printed
        self.drawn = False  # a progress line is on the screen, without its newline

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def __call__(self, line: str) -> None:
        from cdc.core.streaming import ProgressLine

        if isinstance(line, ProgressLine) and self.stream.isatty():
            self.stream.write("\r\x1b[K" + line)  # back to the line's start, cleared
            self.stream.flush()
            self.drawn = True
            return
        self.end_line()
        print(line, file=self.stream, flush=True)

    def end_line(self) -> None:
        """Ends a progress line left on the screen (before anything else is printed, errors included)."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


job_lines = TerminalLines()  # the job commands' lines, on this process's stdout


def lakehouse(settings: Settings) -> Lakehouse:
    """The Lakehouse a job command calls (imported here: the commands without Spark start without it)."""
    from cdc.api import Lakehouse

    return Lakehouse(settings=settings, say=job_lines)


def stop_on_signals() -> threading.Event:
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
            logger.addFilter(not_py4j_failures_after_jvm_exit)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    return stop


def not_py4j_failures_after_jvm_exit(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not message.startswith(
        ("Exception while sending command", "There was an exception while executing the Python Proxy")
    )
