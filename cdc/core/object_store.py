"""The warehouse on an S3-compatible object store, reached through ``s3a://`` (Hadoop's S3A connector).

A job whose warehouse is ``s3a://`` gets hadoop-aws and the AWS SDK's S3 modules added to its session
(:data:`cdc.core.jars.S3A_BUNDLE`) and the connection's settings (:class:`S3Connection`: endpoint,
region, path-style access, keys) as ``spark.hadoop.fs.s3a.*``; a local warehouse pays for neither.

Delta's log on S3: Delta's S3 log store (``S3SingleDriverLogStore``) makes a table's commits safe
against each other within one driver (one process) only: S3 has no atomic put-if-absent that it uses.
The project's jobs keep to that: each refine writes its own refined tables, `cdc raw` its raw tables,
and a table's writers (a refine and `cdc optimize` of the same table) must not run in two processes at
once. Secrets are ``SecretStr`` and Spark redacts ``*.secret.key`` from what it logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from cdc.core.config import S3Connection, SparkConfig
from cdc.core.secrets import invalid_secrets, read_secrets_file

SCHEMES = ("s3a://",)
# Delta's default for s3a:// already; named so that the choice is explicit (and in the session's settings).
LOG_STORE = {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}


def on_object_store(locations: Iterable[str]) -> bool:
    """Whether any of ``locations`` is on an S3 store reached through ``s3a://``."""
    return any(location.startswith(SCHEMES) for location in locations)


def object_store_spark_config(config: SparkConfig, s3: S3Connection, locations: Iterable[str]) -> SparkConfig:
    """``config`` with the S3A jars and the connection's settings when a location is ``s3a://``, else as it is.
    The user's own ``conf`` wins over the connection's settings."""
    if not on_object_store(locations):
        return config
    return config.model_copy(
        update={"object_store_jars": True, "conf": {**LOG_STORE, **s3.hadoop_conf(), **config.conf}}
    )


def load_s3_connection(environment: S3Connection, secrets_file: Path | None) -> S3Connection:
    """The S3 connection: the ``CDC_S3__*`` settings, with those of the secrets file (YAML or JSON) over them."""
    if secrets_file is None:
        return environment
    document = read_secrets_file(secrets_file, "S3")
    merged = {
        **environment.model_dump(exclude_none=True),
        "secret_access_key": environment.secret_access_key.get_secret_value()
        if environment.secret_access_key
        else None,
        **document,
    }
    try:
        return S3Connection.model_validate(merged)
    except ValidationError as error:
        raise invalid_secrets(secrets_file, "S3", error) from None
