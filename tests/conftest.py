"""Shared fixtures: one Spark session and one real CDC stack for the whole test run.

The stack runs on ports of its own (5433x, 5909x, 5808x) so that tests never touch a demo stack on
the default ports. With CDC_TEST_STACK=docker it is started from docker/compose.yml through
testcontainers instead (where a Docker engine exists). A component that is missing makes the tests
that need it fail with the reason; nothing is skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from cdc.config import ConnectConfig, KafkaConfig, PostgresConfig, SparkConfig, StackConfig
from cdc.stack.base import Stack

TEST_STACK_PORTS = {"postgres": 55432, "kafka": 59092, "controller": 59093, "connect": 58083}


@pytest.fixture(scope="session")
def spark():
    from cdc.spark import build_spark_session

    session = build_spark_session(SparkConfig(app_name="cdc-tests", shuffle_partitions=2, driver_memory="2g"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def stack_config(tmp_path_factory: pytest.TempPathFactory) -> StackConfig:
    if os.environ.get("CDC_TEST_STACK", "local") == "docker":
        return StackConfig(state_dir=tmp_path_factory.mktemp("stack"))
    return StackConfig(
        state_dir=tmp_path_factory.mktemp("stack"),
        postgres=PostgresConfig(port=TEST_STACK_PORTS["postgres"]),
        kafka=KafkaConfig(port=TEST_STACK_PORTS["kafka"], controller_port=TEST_STACK_PORTS["controller"]),
        connect=ConnectConfig(port=TEST_STACK_PORTS["connect"]),
    )


@pytest.fixture(scope="session")
def stack(stack_config: StackConfig) -> Iterator[Stack]:
    """The running stack; stopped at the end, and then checked to have left no process behind."""
    if os.environ.get("CDC_TEST_STACK", "local") == "docker":
        from cdc.stack.docker import DockerComposeStack

        running: Stack = DockerComposeStack(stack_config)
    else:
        from cdc.stack.local import LocalStack

        running = LocalStack(stack_config)
    try:
        running.up()
        yield running
    finally:
        running.down()
    left = [status for status in running.status() if status.up or status.pid]
    assert not left, f"`down` left components running: {left}"


@pytest.fixture
def unique_name() -> str:
    """A name no other test uses (topics, tables, connectors, replication slots)."""
    return f"t{uuid.uuid4().hex[:10]}"
