"""Kafka Connect in distributed mode with Debezium's Postgres connector as a plugin."""

from __future__ import annotations

import shutil

from cdc.core import jars
from cdc.core.config import StackConfig
from cdc.stack.base import CONNECT
from cdc.stack.component import Component
from cdc.stack.jvm import java_command, properties_text
from connectors.client import ConnectClient
from connectors.definitions import POSTGRES_CONNECTOR_CLASS

GROUP_ID = "cdc-connect"
CONFIG_TOPIC = "_cdc_connect_configs"
OFFSET_TOPIC = "_cdc_connect_offsets"
STATUS_TOPIC = "_cdc_connect_status"
PLUGINS = (jars.DEBEZIUM_POSTGRES_BUNDLE,)


class ConnectWorker(Component):
    name = CONNECT

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config, config.connect.port)
        self.settings = config.connect
        self.plugin_dir = self.home / "plugins"
        self.properties_file = self.home / "connect-distributed.properties"
        self.client = ConnectClient(config.connect.url)

    def worker_properties(self) -> dict[str, object]:
        return {
            "bootstrap.servers": self.config.kafka.bootstrap_servers,
            "group.id": GROUP_ID,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "config.storage.topic": CONFIG_TOPIC,
            "offset.storage.topic": OFFSET_TOPIC,
            "status.storage.topic": STATUS_TOPIC,
            "config.storage.replication.factor": 1,
            "offset.storage.replication.factor": 1,
            "status.storage.replication.factor": 1,
            # Source offsets are committed every second, so a restart replays little.
            "offset.flush.interval.ms": 1000,
            "listeners": f"http://{self.address}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": self.port,
            "plugin.path": self.plugin_dir,
            # Connector configs name secrets as ${env:NAME}: the same JSON serves here and in Docker.
            "config.providers": "env",
            "config.providers.env.class": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
        }

    def env(self) -> dict[str, str]:
        postgres = self.config.postgres
        return {
            "CDC_POSTGRES_HOST": "127.0.0.1",
            "CDC_POSTGRES_PORT": str(postgres.port),
            "CDC_POSTGRES_USER": postgres.user,
            "CDC_POSTGRES_PASSWORD": postgres.password,
        }

    def command(self) -> list[str]:
        return java_command(
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(self.properties_file),
            heap=self.settings.heap,
            home=self.home,
        )

    def is_up(self) -> bool:
        return self.client.has_plugin(POSTGRES_CONNECTOR_CLASS)

    def prepare(self) -> None:
        """Write the worker's settings and lay out each plugin as one flat folder of links to its jars."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(properties_text(self.worker_properties()))
        shutil.rmtree(self.plugin_dir, ignore_errors=True)
        for bundle in PLUGINS:
            folder = self.plugin_dir / bundle.name
            folder.mkdir(parents=True)
            for jar in jars.resolve(bundle):
                (folder / jar.name).symlink_to(jar)
