"""What the commands share: the printer of a job's lines, live on a terminal and plain elsewhere."""

from __future__ import annotations

import io

from cdc.cli.common import TerminalLines
from cdc.core.streaming import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_progress_line_is_drawn_over_the_last():
    screen = Terminal()
    lines = TerminalLines(screen)
    lines("raw t -> /w/raw/t")
    lines(ProgressLine("raw t batch 0: 300 rows, 300/1,000 (30%)"))
    lines(ProgressLine("raw t batch 1: 300 rows, 600/1,000 (60%)"))
    lines("raw t: landed 600 records in 2 micro-batches -> /w/raw/t")
    lines(ProgressLine("raw u batch 0: 5 rows, 5/5 (100%)"))
    lines.end_line()  # as the CLI does before an error line
    lines.end_line()  # (only once)
    assert screen.getvalue() == (
        "raw t -> /w/raw/t\n"
        "\r\x1b[Kraw t batch 0: 300 rows, 300/1,000 (30%)"
        "\r\x1b[Kraw t batch 1: 300 rows, 600/1,000 (60%)\n"
        "raw t: landed 600 records in 2 micro-batches -> /w/raw/t\n"
        "\r\x1b[Kraw u batch 0: 5 rows, 5/5 (100%)\n"
    )


def test_elsewhere_every_line_is_printed_as_it_is():
    log = io.StringIO()
    lines = TerminalLines(log)
    lines(ProgressLine("raw t batch 0: 300 rows"))
    lines(ProgressLine("raw t batch 1: 300 rows"))
    lines("raw t: landed 600 records")
    lines.end_line()
    assert log.getvalue() == "raw t batch 0: 300 rows\nraw t batch 1: 300 rows\nraw t: landed 600 records\n"
