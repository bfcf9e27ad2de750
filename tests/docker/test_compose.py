"""docker/compose.yml agrees with the connector configs, the demo schema and the local stack.

Unit tests: they read the compose file with PyYAML (and run connect-init's script against a fake
Kafka Connect), so they need no Docker engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

import connectors
from cdc.core import jars
from cdc.core.config import StackConfig
from cdc.core.errors import ConfigError, DependencyError
from cdc.stack.connect import CONFIG_TOPIC, GROUP_ID, OFFSET_TOPIC, STATUS_TOPIC, ConnectWorker
from cdc.stack.docker import COMPOSE_FILE, CONNECT_INIT, DockerComposeStack, PublishedPort, published_ports
from cdc.stack.kafka import KafkaServer

REPO = Path(__file__).resolve().parents[2]
DEMO_SCHEMA = REPO / "cdc" / "stack" / "sql" / "demo_schema.sql"
CONNECTOR_FILES = sorted(Path(connectors.__file__).parent.glob("*.json"))
PLACEHOLDER = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")

# Worker settings that name addresses or paths, which differ between the two stacks by design.
CONNECT_ADDRESS_SETTINGS = {
    "bootstrap.servers",
    "listeners",
    "rest.advertised.host.name",
    "rest.advertised.port",
    "plugin.path",
}
KAFKA_ADDRESS_SETTINGS = {
    "controller.quorum.voters",
    "listeners",
    "advertised.listeners",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    "log.dirs",
}

# The short variables the debezium/connect image's docker-entrypoint.sh turns into worker
# properties; besides these, every CONNECT_A_B variable becomes property a.b.
DEBEZIUM_SHORT_VARIABLES = {
    "BOOTSTRAP_SERVERS": "bootstrap.servers",
    "GROUP_ID": "group.id",
    "CONFIG_STORAGE_TOPIC": "config.storage.topic",
    "OFFSET_STORAGE_TOPIC": "offset.storage.topic",
    "STATUS_STORAGE_TOPIC": "status.storage.topic",
    "KEY_CONVERTER": "key.converter",
    "VALUE_CONVERTER": "value.converter",
    "OFFSET_FLUSH_INTERVAL_MS": "offset.flush.interval.ms",
    "ADVERTISED_HOST_NAME": "rest.advertised.host.name",
    "ADVERTISED_PORT": "rest.advertised.port",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def ports(compose: dict) -> dict[str, list[PublishedPort]]:
    return published_ports(compose)


def environment(service: dict) -> dict[str, str]:
    """A service's environment as strings, from either the mapping or the list ("K=V") form."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def mounts(service: dict) -> dict[str, Path]:
    """Container path -> host path of each bind mount, host paths resolved from docker/."""
    result = {}
    for volume in service.get("volumes", []):
        source, target, *_mode = volume.split(":")
        result[target] = (COMPOSE_FILE.parent / source).resolve()
    return result


def debezium_worker_properties(env: dict[str, str]) -> dict[str, str]:
    """The worker properties the debezium/connect entrypoint writes for ``env``."""
    properties = {prop: env[variable] for variable, prop in DEBEZIUM_SHORT_VARIABLES.items() if variable in env}
    for variable, value in env.items():
        if variable.startswith("CONNECT_"):
            properties[variable.removeprefix("CONNECT_").lower().replace("_", ".")] = value
    return properties


def listener_addresses(listeners: str) -> dict[str, tuple[str, int]]:
    """ "NAME://host:port,..." -> {NAME: (host, port)}."""
    result = {}
    for listener in listeners.split(","):
        name, address = listener.split("://")
        host, port = address.rsplit(":", 1)
        result[name] = (host, int(port))
    return result


def postgres_settings(service: dict) -> dict[str, str]:
    """The ``-c name=value`` server settings of the postgres command."""
    command = service["command"]
    return dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "-c")


def connect_init_script(services: dict) -> str:
    command = services[CONNECT_INIT]["command"]
    assert command[:2] == ["python", "-c"]
    return command[2]


# --- the services and their ports -----------------------------------------------------------------


def test_defines_the_stack_services(compose: dict, services: dict) -> None:
    assert compose["name"] == "cdc-lakehouse"
    assert {"postgres", "kafka", "mongodb", "connect", "s3", CONNECT_INIT} <= set(services)


def test_publishes_exactly_the_stack_config_ports_on_loopback(ports: dict[str, list[PublishedPort]]) -> None:
    config = StackConfig()
    published = {name: {(port.address, port.host_port) for port in entries} for name, entries in ports.items()}
    assert published == {
        "postgres": {("127.0.0.1", config.postgres.port)},
        "kafka": {("127.0.0.1", config.kafka.port)},
        "connect": {("127.0.0.1", config.connect.port)},
        "s3": {("127.0.0.1", config.object_store.port)},
        "mongodb": {("127.0.0.1", 27017)},
    }


def test_images_match_the_pinned_versions(services: dict) -> None:
    assert services["kafka"]["image"] == f"apache/kafka:{jars.KAFKA_VERSION}"
    debezium_minor = ".".join(jars.DEBEZIUM_VERSION.split(".")[:2])
    assert services["connect"]["image"] == f"quay.io/debezium/connect:{debezium_minor}"
    assert services["s3"]["image"] == f"andrewgaul/s3proxy:{jars.S3PROXY_VERSION}"


def test_s3_matches_the_local_stack_object_store(services: dict) -> None:
    config = StackConfig().object_store
    env = services["s3"]["environment"]
    assert (env["S3PROXY_IDENTITY"], env["S3PROXY_CREDENTIAL"]) == (config.access_key_id, config.secret_access_key)
    assert env["JCLOUDS_PROVIDER"] == "filesystem-nio2"
    # The bucket is a folder of the server's base folder, made before the server starts.
    assert f"mkdir -p {env['JCLOUDS_FILESYSTEM_BASEDIR']}/{config.bucket}" in " ".join(services["s3"]["command"])


# --- Postgres -------------------------------------------------------------------------------------


def test_postgres_is_set_up_for_logical_decoding(services: dict) -> None:
    settings = postgres_settings(services["postgres"])
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 10
    assert int(settings["max_wal_senders"]) >= 10


def test_postgres_credentials_are_the_stack_config_defaults(services: dict) -> None:
    postgres = StackConfig().postgres
    env = environment(services["postgres"])
    assert (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]) == (
        postgres.user,
        postgres.password,
        postgres.database,
    )


def test_postgres_runs_the_demo_schema_at_init(services: dict) -> None:
    init_scripts = {
        target: source
        for target, source in mounts(services["postgres"]).items()
        if target.startswith("/docker-entrypoint-initdb.d/") and target.endswith(".sql")
    }
    assert list(init_scripts.values()) == [DEMO_SCHEMA]
    assert DEMO_SCHEMA.is_file()


# --- Kafka ----------------------------------------------------------------------------------------


def test_kafka_advertises_the_host_and_the_container_network(
    services: dict, ports: dict[str, list[PublishedPort]]
) -> None:
    kafka = StackConfig().kafka
    env = environment(services["kafka"])
    bound = listener_addresses(env["KAFKA_LISTENERS"])
    advertised = listener_addresses(env["KAFKA_ADVERTISED_LISTENERS"])
    host_listener = next(name for name, address in advertised.items() if address == ("127.0.0.1", kafka.port))
    assert bound[host_listener][1] == kafka.port
    assert [port.container_port for port in ports["kafka"]] == [kafka.port]

    # Connect reaches the broker by service name, on a listener of its own.
    bootstrap_host, bootstrap_port = environment(services["connect"])["BOOTSTRAP_SERVERS"].rsplit(":", 1)
    internal_listener = next(name for name, address in advertised.items() if address[0] == bootstrap_host)
    assert bootstrap_host == "kafka"
    assert bound[internal_listener][1] == int(bootstrap_port) != kafka.port
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == internal_listener

    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert bound[controller][1] == kafka.controller_port
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_kafka_broker_settings_match_the_local_stack(services: dict) -> None:
    env = environment(services["kafka"])
    # The apache/kafka image turns KAFKA_A_B into property a.b.
    properties = {
        name.removeprefix("KAFKA_").lower().replace("_", "."): value
        for name, value in env.items()
        if name.startswith("KAFKA_") and name != "KAFKA_HEAP_OPTS"
    }
    local = KafkaServer(StackConfig()).server_properties()
    expected = {key: str(value) for key, value in local.items() if key not in KAFKA_ADDRESS_SETTINGS}
    assert {key: properties.get(key) for key in expected} == expected


# --- Kafka Connect --------------------------------------------------------------------------------


def test_connect_uses_the_local_stack_group_and_topics(services: dict) -> None:
    properties = debezium_worker_properties(environment(services["connect"]))
    assert properties["group.id"] == GROUP_ID
    assert properties["config.storage.topic"] == CONFIG_TOPIC
    assert properties["offset.storage.topic"] == OFFSET_TOPIC
    assert properties["status.storage.topic"] == STATUS_TOPIC


def test_connect_worker_settings_match_the_local_stack(services: dict) -> None:
    properties = debezium_worker_properties(environment(services["connect"]))
    local = ConnectWorker(StackConfig()).worker_properties()
    expected = {key: str(value) for key, value in local.items() if key not in CONNECT_ADDRESS_SETTINGS}
    assert {key: properties.get(key) for key in expected} == expected
    assert properties["config.providers"] == "env"
    assert properties["config.providers.env.class"] == ("org.apache.kafka.common.config.provider.EnvVarConfigProvider")


def test_connect_environment_supplies_every_connector_placeholder(services: dict) -> None:
    placeholders = {name for path in CONNECTOR_FILES for name in PLACEHOLDER.findall(path.read_text())}
    assert {"CDC_POSTGRES_HOST", "CDC_MONGODB_CONNECTION_STRING"} <= placeholders
    env = environment(services["connect"])
    assert {name: bool(env.get(name)) for name in placeholders} == dict.fromkeys(placeholders, True)


def test_connect_environment_points_at_the_compose_services(
    services: dict, ports: dict[str, list[PublishedPort]]
) -> None:
    env = environment(services["connect"])
    postgres = services["postgres"]
    postgres_env = environment(postgres)
    assert env["CDC_POSTGRES_HOST"] == "postgres"
    # Container to container: the port Postgres listens on inside its container, not the host's.
    assert [int(env["CDC_POSTGRES_PORT"])] == [port.container_port for port in ports["postgres"]]
    assert (env["CDC_POSTGRES_USER"], env["CDC_POSTGRES_PASSWORD"]) == (
        postgres_env["POSTGRES_USER"],
        postgres_env["POSTGRES_PASSWORD"],
    )

    mongo_url = urlsplit(env["CDC_MONGODB_CONNECTION_STRING"])
    mongo_command = services["mongodb"]["command"]
    replica_set = mongo_command[mongo_command.index("--replSet") + 1]
    assert (mongo_url.scheme, mongo_url.netloc) == ("mongodb", "mongodb:27017")
    assert parse_qs(mongo_url.query)["replicaSet"] == [replica_set]
    assert f"_id: '{replica_set}'" in " ".join(services["mongodb"]["healthcheck"]["test"])


def test_services_start_after_what_they_need_is_healthy(services: dict) -> None:
    assert services["connect"]["depends_on"] == {
        name: {"condition": "service_healthy"} for name in ("postgres", "kafka", "mongodb")
    }
    assert services[CONNECT_INIT]["depends_on"] == {"connect": {"condition": "service_healthy"}}
    for name in ("postgres", "kafka", "mongodb", "connect"):
        assert services[name]["healthcheck"]["test"], name


# --- connect-init ---------------------------------------------------------------------------------


def test_connect_init_mounts_the_connector_files_the_tool_ships(services: dict) -> None:
    env = environment(services[CONNECT_INIT])
    assert mounts(services[CONNECT_INIT]) == {env["CONNECTORS_DIR"]: Path(connectors.__file__).parent}
    assert env["CONNECT_URL"] == "http://connect:8083"
    assert [path.name for path in CONNECTOR_FILES] == ["mongodb.json", "postgres.json"]


class FakeConnect(BaseHTTPRequestHandler):
    """Records each request; answers with the status codes queued in ``responses`` (then 200)."""

    requests: list[tuple[str, str, object]]
    responses: list[int]

    def do_PUT(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append((self.command, self.path, body))
        status = self.responses.pop(0) if self.responses else 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"message": "fake"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_connect() -> Iterator[tuple[str, type[FakeConnect]]]:
    handler = type("Handler", (FakeConnect,), {"requests": [], "responses": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()
    server.server_close()


def run_connect_init(services: dict, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONNECT_URL": url, "CONNECTORS_DIR": str(Path(connectors.__file__).parent)}
    return subprocess.run(
        [sys.executable, "-c", connect_init_script(services)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_connect_init_puts_each_inner_config_and_retries_a_rebalance(services: dict, fake_connect) -> None:
    url, handler = fake_connect
    handler.responses.append(409)  # the first request meets a rebalancing worker group
    result = run_connect_init(services, url)
    assert result.returncode == 0, result.stderr

    expected = []
    for path in CONNECTOR_FILES:
        document = json.loads(path.read_text())
        expected.append(("PUT", f"/connectors/{document['name']}/config", document["config"]))
    assert handler.requests == [expected[0], *expected]


def test_connect_init_fails_when_connect_rejects_a_config(services: dict, fake_connect) -> None:
    url, handler = fake_connect
    handler.responses.append(400)
    result = run_connect_init(services, url)
    first_name = json.loads(CONNECTOR_FILES[0].read_text())["name"]
    assert result.returncode == 1
    assert f"{first_name}: HTTP 400" in result.stderr
    assert len(handler.requests) == 1


# --- DockerComposeStack without Docker ------------------------------------------------------------


def test_docker_stack_reports_the_stack_config_addresses() -> None:
    config = StackConfig()
    statuses = DockerComposeStack(config).status()
    assert [(status.name, status.address) for status in statuses] == [
        ("postgres", f"127.0.0.1:{config.postgres.port}"),
        ("kafka", f"127.0.0.1:{config.kafka.port}"),
        ("connect", f"127.0.0.1:{config.connect.port}"),
        ("s3", f"127.0.0.1:{config.object_store.port}"),
    ]


def test_docker_stack_refuses_ports_the_compose_file_does_not_publish() -> None:
    with pytest.raises(ConfigError, match="kafka"):
        DockerComposeStack(StackConfig(kafka={"port": 19092}))


def test_docker_stack_says_when_no_docker_engine_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A docker client whose engine is unreachable, whatever this machine has.
    fake_docker = tmp_path / "docker"
    fake_docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake_docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    stack = DockerComposeStack(StackConfig())
    with pytest.raises(DependencyError, match="no Docker engine answers: Cannot connect to the Docker daemon"):
        stack.up()
    with pytest.raises(DependencyError, match="no Docker engine answers"):
        stack.down()
