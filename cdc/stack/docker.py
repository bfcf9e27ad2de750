"""The CDC stack as containers: docker/compose.yml, driven through testcontainers' DockerCompose.

The Docker counterpart of :class:`cdc.stack.local.LocalStack`, for machines with a Docker engine:
Postgres, Kafka and Kafka Connect answer on the same 127.0.0.1 ports, so every other command works
against either. The compose file publishes fixed ports, so this backend needs the default ports.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from cdc.core.config import StackConfig
from cdc.core.errors import ConfigError, DependencyError, StackError
from cdc.stack.base import CONNECT, KAFKA, OBJECT_STORE, POSTGRES, ComponentStatus
from cdc.stack.process import port_open

if TYPE_CHECKING:
    from testcontainers.compose import DockerCompose

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker" / "compose.yml"
# The one-shot service that registers connectors/*.json once Connect is healthy, then exits.
CONNECT_INIT = "connect-init"
LOG_LINES = 25


class PublishedPort(NamedTuple):
    address: str
    host_port: int
    container_port: int


def published_ports(compose: Mapping[str, Any]) -> dict[str, list[PublishedPort]]:
    """The ports each service of a compose model publishes, from the "[address:]port:port" syntax."""
    published: dict[str, list[PublishedPort]] = {}
    for name, service in compose["services"].items():
        for entry in service.get("ports", []):
            *address, host_port, container_port = str(entry).split(":")
            # Without an address Docker publishes on every interface.
            port = PublishedPort(address[0] if address else "0.0.0.0", int(host_port), int(container_port))
            published.setdefault(name, []).append(port)
    return published


class DockerComposeStack:
    """Every component a service of the compose project ``cdc-lakehouse``."""

    def __init__(self, config: StackConfig, compose_file: Path = COMPOSE_FILE) -> None:
        self.config = config
        self.compose_file = compose_file
        self.ports = {
            POSTGRES: config.postgres.port,
            KAFKA: config.kafka.port,
            CONNECT: config.connect.port,
            OBJECT_STORE: config.object_store.port,
        }
        compose = yaml.safe_load(compose_file.read_text())
        self._services = list(compose["services"])
        self._check_ports(published_ports(compose))

    def up(self) -> list[ComponentStatus]:
        _require_docker()
        # `up --wait` counts a container that has exited as failed, even with exit code 0, so the
        # long-running services are waited for first and the one-shot connect-init runs after.
        long_running = [name for name in self._services if name != CONNECT_INIT]
        try:
            self._compose(long_running, wait=True).start()
            self._run_connect_init()
        except subprocess.CalledProcessError as error:
            raise StackError(
                f"docker compose failed (exit code {error.returncode})",
                component="compose",
                log_tail=_last_lines(error.stderr.decode(errors="replace")),
            ) from None
        return self.status()

    def down(self) -> None:
        _require_docker()
        # `down --volumes`: containers, network and data go, as a fresh `up` expects.
        self._compose().stop(down=True)

    def status(self) -> list[ComponentStatus]:
        return [
            ComponentStatus(name, f"127.0.0.1:{port}", up=port_open(port), detail="docker compose")
            for name, port in self.ports.items()
        ]

    def _compose(self, services: list[str] | None = None, wait: bool = True) -> DockerCompose:
        # Imported here: testcontainers is an optional dependency that only this backend needs.
        try:
            from testcontainers.compose import DockerCompose
        except ImportError:
            raise DependencyError(
                "the Docker stack needs testcontainers: pip install 'testcontainers>=4.8'", package="testcontainers"
            ) from None
        return DockerCompose(
            self.compose_file.parent, compose_file_name=self.compose_file.name, services=services, wait=wait
        )

    def _run_connect_init(self) -> None:
        """Start connect-init and wait for it to exit; its output explains a failure."""
        compose = self._compose([CONNECT_INIT], wait=False)
        compose.start()
        deadline = time.monotonic() + self.config.start_timeout_s
        while (container := compose.get_container(CONNECT_INIT, include_all=True)).State != "exited":
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        if container.State != "exited" or container.ExitCode != 0:
            outcome = (
                f"exit code {container.ExitCode}"
                if container.State == "exited"
                else f"still running after {self.config.start_timeout_s:.0f}s"
            )
            raise StackError(
                f"{CONNECT_INIT} could not register the connectors ({outcome})",
                component=CONNECT,
                log_tail=_last_lines(compose.get_logs(CONNECT_INIT)[0]),
            )

    def _check_ports(self, published: dict[str, list[PublishedPort]]) -> None:
        for name, port in self.ports.items():
            addresses = [f"{entry.address}:{entry.host_port}" for entry in published.get(name, [])]
            if f"127.0.0.1:{port}" not in addresses:
                raise ConfigError(
                    f"{self.compose_file} publishes {name} on {addresses}, not on 127.0.0.1:{port}: "
                    "the Docker stack takes the default ports only (or use the local stack)",
                    component=name,
                )


def _require_docker() -> None:
    """Fail with what to install or start, rather than with a failed compose command."""
    checks = (
        (["docker", "info", "--format", "{{.ServerVersion}}"], "no Docker engine answers"),
        (["docker", "compose", "version"], "the Docker Compose plugin is missing (docker compose)"),
    )
    for command, problem in checks:
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        except FileNotFoundError:
            raise DependencyError("docker not found: install Docker Engine with its Compose plugin") from None
        except subprocess.TimeoutExpired:
            raise DependencyError(f"{problem}: `{' '.join(command)}` did not return within 30s") from None
        if result.returncode != 0:
            raise DependencyError(f"{problem}: {result.stderr.strip() or result.stdout.strip()}")


def _last_lines(text: str) -> str:
    return "\n".join(text.splitlines()[-LOG_LINES:])
