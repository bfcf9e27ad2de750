"""The local stack's lifecycle, against the real processes started once for the test run."""

import json
import socket

import psycopg
import pytest

from cdc.cli import main
from cdc.core.config import KafkaConfig, StackConfig
from cdc.core.errors import StackError
from cdc.stack.kafka import KafkaServer
from cdc.stack.local import stack_for_a_run


def _cli_env(monkeypatch, config: StackConfig) -> None:
    monkeypatch.setenv("CDC_STACK__STATE_DIR", str(config.state_dir))
    monkeypatch.setenv("CDC_STACK__POSTGRES__PORT", str(config.postgres.port))
    monkeypatch.setenv("CDC_STACK__KAFKA__PORT", str(config.kafka.port))
    monkeypatch.setenv("CDC_STACK__CONNECT__PORT", str(config.connect.port))
    monkeypatch.setenv("CDC_STACK__OBJECT_STORE__PORT", str(config.object_store.port))
    # The Spark cluster another test of this process may have started: its ports, or it would be looked for
    # on the default ones and reported down.
    cluster = config.spark_cluster
    monkeypatch.setenv("CDC_STACK__SPARK_CLUSTER__MASTER_PORT", str(cluster.master_port))
    monkeypatch.setenv("CDC_STACK__SPARK_CLUSTER__MASTER_UI_PORT", str(cluster.master_ui_port))
    monkeypatch.setenv("CDC_STACK__SPARK_CLUSTER__WORKER_PORTS_FROM", str(cluster.worker_ports_from))
    monkeypatch.setenv("CDC_STACK__SPARK_CLUSTER__WORKERS", str(cluster.workers))


def test_status_json_reports_every_component_up(stack, stack_config, monkeypatch, capsys):
    _cli_env(monkeypatch, stack_config)
    assert main(["stack", "status", "--json"]) == 0
    # The first four: a Spark cluster another test of this process started is listed after them.
    components = json.loads(capsys.readouterr().out)["components"][:4]
    assert [(c["name"], c["up"]) for c in components] == [
        ("postgres", True),
        ("kafka", True),
        ("connect", True),
        ("s3", True),
    ]
    assert [c["address"] for c in components] == [
        f"127.0.0.1:{stack_config.postgres.port}",
        f"127.0.0.1:{stack_config.kafka.port}",
        f"127.0.0.1:{stack_config.connect.port}",
        f"127.0.0.1:{stack_config.object_store.port}",
    ]


def test_up_again_keeps_the_running_processes(stack):
    before = {status.name: status.pid for status in stack.status()}
    after = {status.name: status.pid for status in stack.up()}
    assert after == before
    assert all(after.values())


def test_postgres_is_ready_for_debezium(stack, stack_config):
    with psycopg.connect(stack_config.postgres.dsn()) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        tables = conn.execute(
            "SELECT relname, relreplident FROM pg_class JOIN pg_namespace n ON n.oid = relnamespace "
            "WHERE nspname = 'shop' AND relkind = 'r' ORDER BY relname"
        ).fetchall()
    # 'd': default replica identity (the key); 'f': full rows, for the keyless table.
    assert tables == [("customers", "d"), ("orders", "d"), ("page_views", "f")]


def test_each_component_logs_to_its_own_file(stack, stack_config):
    logs = stack_config.state_dir / "logs"
    assert "Kafka Server started" in (logs / "kafka.log").read_text()
    assert "Added plugin 'io.debezium.connector.postgresql.PostgresConnector'" in (logs / "connect.log").read_text()
    assert "database system is ready to accept connections" in (logs / "postgres.log").read_text()


def test_a_run_on_the_stack_leaves_a_stack_that_was_running_before_running(stack, stack_config):
    before = {status.name: status.pid for status in stack.status()}
    with stack_for_a_run(stack_config) as borrowed:
        assert {status.name: status.pid for status in borrowed.status()} == before
    assert {status.name: status.pid for status in stack.status()} == before
    assert all(status.up for status in stack.status())


def test_a_taken_port_is_named_and_nothing_starts(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        kafka = KafkaServer(StackConfig(state_dir=tmp_path, kafka=KafkaConfig(port=port)))
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is taken") as raised:
            kafka.start()
    assert raised.value.component == "kafka"
    assert kafka.process.pid() is None
    # A port-0 listener's port comes from the kernel's ephemeral range: the error says why it was taken.
    assert "ephemeral range" in str(raised.value)
