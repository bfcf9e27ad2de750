import pytest

from cdc.config import KafkaConnection
from cdc.errors import ConfigError
from cdc.source import load_secrets_file, redact

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
