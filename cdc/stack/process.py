"""Supervising one background server process: start, find again from a pid file, wait, stop.

Each component runs in its own session (process group), so `stop` ends the server and every child
it forked. The pid file records the process' start time too, so that a pid reused by an unrelated
process after a reboot is never taken for ours.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.core.errors import StackError


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def account_kwargs(user: str | None) -> dict[str, Any]:
    """subprocess arguments that run a child as ``user`` with that user's own group (None: as we are)."""
    if user is None:
        return {}
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    if not path.exists():
        return ""
    with open(path, "rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 64 * 1024))
        return "\n".join(log.read().decode("utf-8", "replace").splitlines()[-lines:])


def _start_time(pid: int) -> str | None:
    """The live process' start time in clock ticks since boot (/proc/PID/stat field 22), or None.

    A zombie (exited, not yet reaped) counts as gone.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass
class ManagedProcess:
    """A server process of the local stack, known by its pid file; output goes to its log file."""

    name: str
    log_file: Path
    pid_file: Path

    def pid(self) -> int | None:
        """The pid of our running process, or None when it is not running."""
        try:
            pid_text, started = self.pid_file.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return pid if _start_time(pid) == started else None

    def start(self, command: Sequence[str], env: dict[str, str] | None = None, user: str | None = None) -> int:
        """Start ``command`` in a new session, output appended to the log file; return its pid."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                **account_kwargs(user),
            )
        self.pid_file.write_text(f"{process.pid} {_start_time(process.pid)}\n")
        return process.pid

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``ready`` until it is true; fail with the log's tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if self.pid() is None:
                raise StackError(
                    f"{self.name} exited while starting", component=self.name, log_tail=tail(self.log_file)
                )
            time.sleep(0.25)
        raise StackError(
            f"{self.name} did not {what} within {timeout_s:.0f} s",
            component=self.name,
            log_tail=tail(self.log_file),
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``timeout_s``."""
        pid = self.pid()
        if pid is not None:
            _signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self.pid() is not None and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if self.pid() is not None:
                _signal_group(pid, signal.SIGKILL)
                while self.pid() is not None:
                    _reap(pid)
                    time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect our own child's exit status so that it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
