import pytest

from cdc.core.config import KafkaConnection
from cdc.core.errors import ConfigError
from cdc.core.source import load_secrets_file, redact

SECRET = 'p@ss"word'


def sasl() -> KafkaConnection:
    return KafkaConnection(
        bootstrap_servers="broker:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="$ConnectionString",
        sasl_password=SECRET,
    )


def test_sasl_becomes_a_quoted_jaas_config():
    options = sasl().spark_options()
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="$ConnectionString" password="p@ss\\"word";'
    )


def test_secrets_never_print():
    connection = sasl()
    assert SECRET not in repr(connection)
    assert SECRET not in str(connection.model_dump())
    assert redact(f"login failed for {SECRET}", connection.secrets()) == "login failed for **********"


def test_secrets_file(tmp_path):
    path = tmp_path / "kafka.yaml"
    path.write_text(
        f"security_protocol: SASL_SSL\nsasl_mechanism: SCRAM-SHA-512\nsasl_username: u\nsasl_password: '{SECRET}'\n"
    )
    assert load_secrets_file(path)["sasl_mechanism"] == "SCRAM-SHA-512"


def test_invalid_secrets_file_names_the_key_not_the_value(tmp_path):
    path = tmp_path / "kafka.yaml"
    path.write_text(f"sasl_password: '{SECRET}'\nsasl_mechanism: KERBEROS\n")
    with pytest.raises(ConfigError) as raised:
        load_secrets_file(path)
    assert "sasl_mechanism: enum" in str(raised.value)
    assert SECRET not in str(raised.value)
    with pytest.raises(ConfigError, match="cannot read the Kafka secrets file"):
        load_secrets_file(tmp_path / "missing.yaml")


def test_a_broker_that_answers_another_protocol_is_not_called_absent(kafka):
    """The test stack's broker speaks PLAINTEXT: a client set up for SASL gets no answer to its handshake,
    and the error says so instead of "no Kafka broker answers"; a port nothing listens on is that."""
    import socket

    from cdc.core.errors import SourceError
    from cdc.core.source import KafkaTopics

    sasl = KafkaConnection(
        bootstrap_servers=kafka.bootstrap_servers,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="user",
        sasl_password="secret",
    )
    with pytest.raises(SourceError, match=r"accepts connections at .* security_protocol=SASL_PLAINTEXT") as refused:
        KafkaTopics(sasl).names()
    assert "secret" not in str(refused.value)

    with socket.socket() as unused:  # a free port, closed again before the client tries it
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(SourceError, match="no Kafka broker answers"):
        KafkaTopics(KafkaConnection(bootstrap_servers=f"127.0.0.1:{port}")).names()
