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


def postgres_named(name: str, **settings: str) -> ConnectorDefinition:
    """The shipped Postgres connector as a connector of its own named ``name``: its topic prefix, replication
    slot and publication named after it, ``settings`` (Connect's keys, ``.`` written ``_``) over the shipped ones.

    Example::

        postgres_named("bench1", schema_include_list="bench")  # topics bench1.bench.<table>
    """
    shipped = load("postgres")
    own = {"topic.prefix": name, "slot.name": name, "publication.name": name}
    return ConnectorDefinition(
        name, {**shipped.config, **own, **{key.replace("_", "."): value for key, value in settings.items()}}
    )


def available() -> list[str]:
    return sorted(
        entry.name.removesuffix(".json")
        for entry in resources.files("connectors").iterdir()
        if entry.name.endswith(".json")
    )


POSTGRES_CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
