"""The schema registry client, against an in-process stand-in of a Confluent-compatible registry
(``schema_registry``: Confluent's own cannot be installed here)."""

import socket

import pytest

from cdc.core.errors import ConfigError
from cdc.pipeline.events.registry import RegisteredSchema, SchemaRegistryClient


def test_the_latest_version_of_a_subject_and_a_schema_by_id(schema_registry):
    first = schema_registry.register("scores-value", '{"type": "string"}')
    latest = schema_registry.register("scores-value", '{"type": "long"}')
    proto = schema_registry.register("other", 'syntax = "proto3";', "PROTOBUF")
    client = SchemaRegistryClient(schema_registry.url + "/")
    assert client.latest("scores-value") == RegisteredSchema(id=latest, text='{"type": "long"}', schema_type="AVRO")
    assert client.by_id(first) == RegisteredSchema(id=first, text='{"type": "string"}', schema_type="AVRO")
    assert client.by_id(proto).schema_type == "PROTOBUF"
    assert client.by_id(99) is None  # a record of another registry: its own problem, not the job's


def test_an_unknown_subject_is_a_config_error_naming_it(schema_registry):
    with pytest.raises(ConfigError) as refused:
        SchemaRegistryClient(schema_registry.url).latest("a/b-value")
    assert refused.value.message == f"the schema registry at {schema_registry.url} has no subject 'a/b-value'"
    assert refused.value.context == {"subject": "a/b-value"}


def test_an_unreachable_registry_is_a_config_error_naming_the_url():
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
    with pytest.raises(ConfigError) as refused:
        SchemaRegistryClient(url, timeout_s=2).latest("scores-value")
    assert refused.value.message.startswith(f"cannot reach the schema registry at {url}: ")
    assert refused.value.context == {"subject": "scores-value"}
