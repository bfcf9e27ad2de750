"""The lifecycle every local-stack server shares: prepare once, start, wait until it answers, stop."""

from __future__ import annotations

from pathlib import Path

from cdc.core.config import StackConfig
from cdc.core.errors import StackError
from cdc.stack.base import ComponentStatus
from cdc.stack.process import ManagedProcess, port_open


def _ephemeral_hint(port: int) -> str:
    """Why a port may be taken by nobody the user knows of: the kernel hands out ports of its ephemeral range."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return ""
    if low <= port <= high:
        return (
            f" (it lies in the kernel's ephemeral range {low}-{high}, which any program's outgoing "
            "connections and port-0 listeners draw from: a port below it is never taken that way)"
        )
    return ""


class Component:
    """A server of the local stack. Subclasses say how to prepare, run and probe it."""

    name: str

    def __init__(self, config: StackConfig, port: int) -> None:
        self.config = config
        self.port = port
        self.home = config.state_dir / self.name
        self.log_file = config.state_dir / "logs" / f"{self.name}.log"
        self.process = ManagedProcess(self.name, self.log_file, config.state_dir / "run" / f"{self.name}.pid")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line (run in the foreground; the stack supervises it)."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """Environment variables the server needs beyond this process' own."""
        return {}

    def user(self) -> str | None:
        """The system user to run the server as (None: this process' user)."""
        return None

    def is_up(self) -> bool:
        """True when the server answers requests (not merely when its process exists)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """One-time set-up before the first start (initdb, storage format, plugin folder)."""

    def after_start(self) -> None:
        """Work that needs the running server (create the demo database, ...)."""

    def start(self) -> None:
        """Start the server unless it already runs; return once it answers."""
        process = self.process
        timeout_s = self.config.start_timeout_s
        if process.pid() is None:
            if port_open(self.port):
                raise StackError(
                    f"port {self.port} on 127.0.0.1 is taken by a process this stack did not start; "
                    f"stop it or choose another port{_ephemeral_hint(self.port)}",
                    component=self.name,
                )
            self.prepare()
            process.start(self.command(), self.env(), self.user())
        process.wait_until(self.is_up, timeout_s, f"answer on {self.address}")
        self.after_start()

    def stop(self) -> None:
        self.process.stop()

    def status(self) -> ComponentStatus:
        pid = self.process.pid()
        return ComponentStatus(self.name, self.address, up=pid is not None and self.is_up(), pid=pid)
