"""`cdc raw` and `cdc status` from the command line: one clear line and an exit code per bad condition."""

import json

import pytest

from cdc.cli import main
from cdc.core.tables import raw_table_location


@pytest.fixture
def cli(kafka, monkeypatch, capsys):
    """Run `cdc ...` in this process (sharing its Spark session); return (exit code, stdout, stderr)."""
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_unknown_topic(cli, tmp_path):
    code, _, err = cli("raw", "--topic", "no.such.topic", "--warehouse", str(tmp_path), "--available-now")
    assert code == 6
    assert err.startswith("cdc: error: unknown topic (topic=no.such.topic, bootstrap_servers=127.0.0.1:")
    assert err.count("\n") == 1


def test_unreachable_broker(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    code, _, err = cli("raw", "--topic", "t", "--warehouse", str(tmp_path), "--available-now")
    assert (code, err) == (6, "cdc: error: no Kafka broker answers (bootstrap_servers=127.0.0.1:1)\n")


def test_unwritable_warehouse(cli, kafka, tmp_path, unique_name):
    topic = kafka.create_topic(unique_name)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = cli("raw", "--topic", topic, "--warehouse", str(blocker / "warehouse"), "--available-now")
    assert code == 8
    assert err.startswith("cdc: error: the warehouse is not writable")
    assert f"location={blocker}/warehouse" in err


def test_a_table_that_is_not_a_raw_table(cli, spark, kafka, tmp_path, unique_name):
    topic = kafka.create_topic(unique_name)
    spark.range(1).write.format("delta").save(raw_table_location(str(tmp_path), topic))
    code, _, err = cli("raw", "--topic", topic, "--warehouse", str(tmp_path), "--available-now")
    assert code == 8
    assert "a Delta table exists there but it is not a raw table" in err


def test_invalid_option_names_the_setting(cli, tmp_path):
    code, _, err = cli("raw", "--topic", "bad topic!", "--warehouse", str(tmp_path), "--available-now")
    assert code == 2
    assert "invalid raw job settings: topics.0: String should match pattern" in err


def test_secrets_are_never_echoed(cli, tmp_path, monkeypatch):
    secrets = tmp_path / "kafka.yaml"
    secrets.write_text(
        "bootstrap_servers: 127.0.0.1:1\nsecurity_protocol: SASL_SSL\nsasl_mechanism: PLAIN\n"
        "sasl_username: user\nsasl_password: hunter2-secret\n"
    )
    code, out, err = cli(
        "--debug",
        "raw",
        "--topic",
        "t",
        "--warehouse",
        str(tmp_path),
        "--kafka-secrets-file",
        str(secrets),
        "--available-now",
    )
    assert code == 6
    assert "hunter2-secret" not in out + err


def test_status_reports_versions_rows_and_lag(cli, kafka, tmp_path, unique_name):
    topic = kafka.create_topic(unique_name, partitions=2)
    kafka.produce(topic, [(b"k", b"v")] * 5, partition=0)
    assert cli("raw", "--topic", topic, "--warehouse", str(tmp_path), "--available-now")[0] == 0
    kafka.produce(topic, [(b"k", b"v")] * 3, partition=1)  # not landed yet: lag 3

    code, out, _ = cli("status", "--warehouse", str(tmp_path), "--json")
    assert code == 0
    [table] = json.loads(out)["raw_tables"]
    assert (table["topic"], table["rows"], table["recorded_gaps"], table["quarantined"]) == (topic, 5, 0, 0)
    assert table["version"] >= 1
    assert [(p["partition"], p["consumed"], p["end"], p["lag"]) for p in table["partitions"]] == [
        (0, 5, 5, 0),
        (1, 0, 3, 3),
    ]
