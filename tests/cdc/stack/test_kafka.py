"""cdc.stack.kafka without a broker: the cluster id Kafka's storage is formatted with."""

import uuid

from cdc.stack import kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch):
    # A first byte of 0xF8 encodes to "-" (base64 62): `kafka-storage format -t -...` reads it as an option.
    dashed, plain = uuid.UUID(bytes=bytes([0xF8]) + bytes(15)), uuid.UUID(int=1)
    draws = iter([dashed, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    assert kafka.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_cluster_ids_are_22_url_safe_characters():
    ids = {kafka.new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(cluster_id) == 22 and not cluster_id.startswith("-") for cluster_id in ids)
