"""`cdc status`: each raw table's rows and lag, and a warning with a non-zero exit when the lag is unknown."""

from __future__ import annotations

import json
import socket

from cdc.cli import main


def test_status_reports_the_lag_and_says_when_kafka_does_not_answer(kafka, unique_name, tmp_path, monkeypatch, capsys):
    topic = kafka.create_topic(unique_name)
    kafka.produce(topic, [(b"k1", b"v1"), (b"k2", b"v2"), (b"k3", b"v3")])
    warehouse = str(tmp_path)
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    assert main(["raw", "--topic", topic, "--warehouse", warehouse, "--available-now"]) == 0
    kafka.produce(topic, [(b"k4", b"v4")])  # one record behind
    capsys.readouterr()

    assert main(["status", "--warehouse", warehouse, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    [table] = found["raw_tables"]
    assert (table["topic"], table["rows"], [p["lag"] for p in table["partitions"]]) == (topic, 3, [1])
    assert found["kafka_error"] is None

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", f"127.0.0.1:{port}")
    assert main(["status", "--warehouse", warehouse]) == 6
    out, err = capsys.readouterr()
    assert f"{topic}" in out
    assert "lag ?" in out
    assert err.startswith("cdc: warning: the lag is unknown, Kafka's end offsets could not be read: no Kafka broker")
    assert main(["status", "--warehouse", warehouse, "--json"]) == 6
    assert "no Kafka broker answers" in json.loads(capsys.readouterr().out)["kafka_error"]
