"""The connector configurations shipped in this folder (``<name>.json``, Kafka Connect's own form).

Connection settings are ``${env:NAME}`` placeholders resolved by the Connect worker's env config
provider, so one file serves the local stack and docker/compose.yml alike, and no secret is stored
in Connect's config topic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from cdc.core.errors import ConfigError


@dataclass(frozen=True)
class ConnectorDefinition:
    """A connector as Kafka Connect takes it: its name and its configuration."""

    name: str
    config: dict[str, str]

    @property
    def topic_prefix(self) -> str:
        return self.config["topic.prefix"]


def load(kind: str) -> ConnectorDefinition:
    """The shipped connector definition ``connectors/<kind>.json`` (``postgres`` or ``mongodb``)."""
    resource = resources.files("connectors").joinpath(f"{kind}.json")
    if not resource.is_file():
        raise ConfigError(f"no connector definition named {kind!r}; known: {', '.join(available())}")
    document = json.loads(resource.read_text())
    return ConnectorDefinition(document["name"], document["config"])


def available() -> list[str]:
    return sorted(
        entry.name.removesuffix(".json")
        for entry in resources.files("connectors").iterdir()
        if entry.name.endswith(".json")
    )


POSTGRES_CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
