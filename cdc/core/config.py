"""Configuration models, validated up front.

Settings come from (highest first) command-line options, environment variables prefixed ``CDC_``
(nested keys joined by ``__``: ``CDC_SPARK__MASTER=spark://host:7077``,
``CDC_STACK__POSTGRES__PORT=5433``), then the defaults documented on each field. An invalid value
raises :class:`cdc.core.errors.ConfigError` naming the key and the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cdc.core.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class MavenJars(_Strict):
    """Fetch the Delta and Kafka connector jars from Maven Central once, then reuse the cached copy."""

    kind: Literal["maven"] = "maven"
    cache_dir: Path | None = Field(
        default=None,
        description="Where resolved jars are kept; default $CDC_JARS_CACHE or ~/.cache/cdc-lakehouse/jars.",
    )


class LocalJars(_Strict):
    """Use the jars of a local folder as they are (air-gapped machines, pre-baked cluster images)."""

    kind: Literal["local"] = "local"
    folder: Path = Field(description="Folder holding delta-spark, spark-sql-kafka and their dependencies.")

    @field_validator("folder")
    @classmethod
    def _has_jars(cls, folder: Path) -> Path:
        if not folder.is_dir() or not any(folder.glob("*.jar")):
            raise ValueError(f"{folder} is not a folder holding .jar files")
        return folder


class ProvidedJars(_Strict):
    """The cluster already puts Delta and the Kafka source on the classpath: add nothing."""

    kind: Literal["provided"] = "provided"


JarsSource = Annotated[MavenJars | LocalJars | ProvidedJars, Field(discriminator="kind")]


class GarbageCollector(str, Enum):
    """The local driver JVM's garbage collector."""

    G1 = "g1"  # the JVM's default: short pauses, for jobs that refine
    PARALLEL = "parallel"  # less CPU per record, with stop-the-world collections: for landing

    @property
    def jvm_option(self) -> str:
        return {GarbageCollector.G1: "-XX:+UseG1GC", GarbageCollector.PARALLEL: "-XX:+UseParallelGC"}[self]


class ConsoleLogLevel(str, Enum):
    """The lowest level of the JVM's log lines (Spark, Delta, Kafka's client) shown on the terminal."""

    ERROR = "error"  # the default: the project's own lines, and errors
    WARN = "warn"  # `cdc --verbose`
    INFO = "info"

    @property
    def file_level(self) -> str:
        """The lowest level the log file keeps: warnings, or everything when the terminal shows INFO."""
        return "info" if self is ConsoleLogLevel.INFO else "warn"


# The Hive metastore's own rule for schema and table names (MetaStoreUtils.validateName): word characters only.
CATALOG_IDENTIFIER = r"^[A-Za-z0-9_]{1,128}$"


class CatalogConfig(_Strict):
    """The Spark catalog the jobs register their tables in (:mod:`cdc.core.catalog`): each raw, refined
    and business table as an external Delta table at its path, ``<schema>.<name>``.

    Example::

        from cdc import SparkConfig

        SparkConfig(catalog={"enabled": True, "refined_schema": "silver"})
    """

    enabled: bool = Field(
        default=False,
        description=(
            "Register every table the jobs write in Spark's Hive catalog (the session is built with Hive support). "
            "With the embedded metastore one process at a time opens it: see metastore_uris for jobs that run side by "
            "side."
        ),
    )
    raw_schema: str = Field(default="raw", pattern=CATALOG_IDENTIFIER, description="The schema of the raw tables.")
    refined_schema: str = Field(
        default="refined",
        pattern=CATALOG_IDENTIFIER,
        description="The schema of the refined tables and of the child and history tables beside them.",
    )
    business_schema: str = Field(
        default="business", pattern=CATALOG_IDENTIFIER, description="The schema of the business tables."
    )
    metastore_dir: Path | None = Field(
        default=None,
        description=(
            "The folder of the embedded (Derby) metastore and of the schemas' own folders. None: "
            "<warehouse>/_cdc/metastore for a local warehouse, else .cdc/metastore."
        ),
    )
    metastore_uris: str | None = Field(
        default=None,
        description=(
            "thrift://host:port[,...] of an external Hive metastore (hive.metastore.uris) instead of the embedded one: "
            "any number of processes at once."
        ),
    )


class SparkConfig(_Strict):
    """How the SparkSession is built (see :func:`cdc.core.session.build_spark_session`).

    Example::

        from cdc import SparkConfig
        from cdc import build_spark_session

        spark = build_spark_session(SparkConfig(master="local[2]", driver_memory="4g"))
    """

    master: str = Field(
        default="local[*]",
        description="Spark master URL; any master works (local[N], spark://, yarn, k8s://).",
    )
    app_name: str = Field(default="cdc-lakehouse", description="Application name shown in the Spark UI.")
    shuffle_partitions: int = Field(
        default=4,
        ge=1,
        description="spark.sql.shuffle.partitions: a few per core; the default suits a 2-core machine.",
    )
    driver_memory: str = Field(
        default="4g",
        pattern=r"^\d+[kmgt]$",
        description="spark.driver.memory, applied when this process starts the JVM (e.g. 4g).",
    )
    ui_enabled: bool = Field(default=False, description="Start the Spark web UI (on 127.0.0.1 locally).")
    jars: JarsSource = Field(default_factory=MavenJars, description="Where the Delta and Kafka jars come from.")
    class_archive: bool = Field(
        default=True,
        description=(
            "With a local master, start the driver's JVM from the class archive `cdc jars fetch` built for this JDK "
            "and these jars, when there is one (cdc/core/class_archive.py): seconds less of every fresh JVM's start."
        ),
    )
    garbage_collector: GarbageCollector | None = Field(
        default=None,
        description=(
            "With a local master, the driver JVM's garbage collector, applied when this process starts the JVM. "
            "None: the job's choice (parallel, except for a continuous `cdc refine` or `cdc sync` and the other "
            "commands, which keep the JVM's default, G1)."
        ),
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings, applied last (object-store credentials, cluster tuning).",
    )
    object_store_jars: bool = Field(
        default=False,
        description=(
            "Add hadoop-aws and the AWS SDK's S3 modules (with maven jars): the jobs set it when the warehouse "
            "is s3a://."
        ),
    )
    log_dir: Path | None = Field(
        default=Path(".cdc/logs"),
        description=(
            "The folder of the log files, one per process that starts a driver JVM (on any master: the driver runs "
            "in this process), holding the JVM's warnings (and errors) that the terminal does not show. None: "
            "Spark's own logging to the terminal."
        ),
    )
    console_log_level: ConsoleLogLevel = Field(
        default=ConsoleLogLevel.ERROR,
        description="With a log_dir: the lowest level of the driver JVM's log lines shown on the terminal.",
    )

    catalog: CatalogConfig = Field(
        default_factory=CatalogConfig, description="The catalog the tables are registered in (off by default)."
    )

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")


class PostgresConfig(_Strict):
    """The local stack's PostgreSQL server."""

    port: int = Field(default=5432, gt=0, lt=65536, description="TCP port on 127.0.0.1.")
    user: str = Field(default="postgres", description="Superuser created by initdb; Debezium connects as it.")
    password: str = Field(default="postgres", description="Password of that user (a local demo secret).")
    database: str = Field(default="demo", description="Database holding the sample schema.")

    def dsn(self, database: str | None = None) -> str:
        """A libpq connection string to ``database`` (default: the demo database) on 127.0.0.1."""
        return (
            f"host=127.0.0.1 port={self.port} user={self.user} password={self.password} "
            f"dbname={database or self.database}"
        )


class KafkaConfig(_Strict):
    """The local stack's single-node KRaft Kafka."""

    port: int = Field(default=9092, gt=0, lt=65536, description="Client listener on 127.0.0.1.")
    controller_port: int = Field(default=9093, gt=0, lt=65536, description="KRaft controller listener.")
    heap: str = Field(default="768m", pattern=r"^\d+[kmg]$", description="JVM heap (-Xmx) of the broker.")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


class ConnectConfig(_Strict):
    """The local stack's Kafka Connect worker (distributed mode) with Debezium's connectors."""

    port: int = Field(default=8083, gt=0, lt=65536, description="REST API port on 127.0.0.1.")
    heap: str = Field(default="768m", pattern=r"^\d+[kmg]$", description="JVM heap (-Xmx) of the worker.")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class SparkClusterConfig(_Strict):
    """A standalone Spark master and its workers on 127.0.0.1 (pyspark's own ``spark-class``), which
    `cdc stack up --spark-cluster` starts beside the stack: jobs run on it with ``CDC_SPARK__MASTER`` set
    to its :attr:`master_url`, executors in JVMs of their own."""

    enabled: bool = Field(default=False, description="`cdc stack up` starts the cluster too (`--spark-cluster`).")
    master_port: int = Field(default=7077, gt=0, lt=65536, description="The master's port (spark://127.0.0.1:PORT).")
    master_ui_port: int = Field(default=8080, gt=0, lt=65536, description="The master's web UI and JSON status.")
    worker_ports_from: int = Field(
        default=7078,
        gt=0,
        lt=65500,
        description="Worker N (from 0) listens on this port + 2N and serves its web UI on the next one.",
    )
    workers: int = Field(default=2, ge=1, le=16, description="How many workers.")
    worker_cores: int = Field(default=1, ge=1, description="Cores each worker offers to executors.")
    worker_memory: str = Field(
        default="1g",
        pattern=r"^\d+[mg]$",
        description="Memory each worker offers to executors (spark.executor.memory fits in it).",
    )
    daemon_memory: str = Field(
        default="256m", pattern=r"^\d+[mg]$", description="JVM heap of the master and of each worker process itself."
    )

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"


class ObjectStoreConfig(_Strict):
    """The local stack's S3-compatible object store: s3proxy keeping the objects in files under the stack's folder."""

    port: int = Field(default=9000, gt=0, lt=65536, description="S3 API port on 127.0.0.1.")
    bucket: str = Field(
        default="warehouse",
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        description="Bucket created at start (s3a://BUCKET/...).",
    )
    access_key_id: str = Field(default="cdc", description="Access key the server accepts (a local demo secret).")
    secret_access_key: str = Field(default="cdc-local-secret", description="Its secret key (a local demo secret).")
    heap: str = Field(default="256m", pattern=r"^\d+[kmg]$", description="JVM heap (-Xmx) of the server.")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class SecurityProtocol(str, Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(str, Enum):
    """Username/password mechanisms: Confluent Cloud and Event Hubs use PLAIN, MSK uses SCRAM-SHA-512."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


_JAAS_MODULES = {
    SaslMechanism.PLAIN: "org.apache.kafka.common.security.plain.PlainLoginModule",
    SaslMechanism.SCRAM_SHA_256: "org.apache.kafka.common.security.scram.ScramLoginModule",
    SaslMechanism.SCRAM_SHA_512: "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaConnection(_Strict):
    """How to reach the Kafka cluster. Environment: ``CDC_KAFKA__<FIELD>``; or a secrets file.

    Example::

        from cdc import KafkaConnection
        from cdc import Lakehouse

        kafka = KafkaConnection(
            bootstrap_servers="broker:9093",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="user",
            sasl_password="secret",
        )
        lake = Lakehouse("s3a://bucket/warehouse", kafka=kafka)
    """

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="host:port[,host:port...]")
    security_protocol: SecurityProtocol = Field(
        default=SecurityProtocol.PLAINTEXT, description="Kafka security.protocol."
    )
    sasl_mechanism: SaslMechanism | None = Field(default=None, description="Required with SASL_* protocols.")
    sasl_username: str | None = Field(default=None, description="SASL user (Event Hubs: $ConnectionString).")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password or API secret.")
    ssl_ca_location: Path | None = Field(default=None, description="PEM file of CA certificates (SSL, SASL_SSL).")

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaConnection:
        uses_sasl = self.security_protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)
        if uses_sasl and not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
            raise ValueError(f"{self.security_protocol.value} needs sasl_mechanism, sasl_username and sasl_password")
        return self

    def secrets(self) -> list[str]:
        return [self.sasl_password.get_secret_value()] if self.sasl_password else []

    def spark_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source (``kafka.``-prefixed client settings)."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "kafka.security.protocol": self.security_protocol.value,
        }
        if self.sasl_mechanism:
            assert self.sasl_password is not None
            username = json.dumps(self.sasl_username)  # JAAS values are double-quoted strings
            password = json.dumps(self.sasl_password.get_secret_value())
            options["kafka.sasl.mechanism"] = self.sasl_mechanism.value
            options["kafka.sasl.jaas.config"] = (
                f"{_JAAS_MODULES[self.sasl_mechanism]} required username={username} password={password};"
            )
        if self.ssl_ca_location:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = str(self.ssl_ca_location)
        return options

    def client_options(self) -> dict[str, Any]:
        """The same settings for kafka-python (topic metadata and offsets on the driver)."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol.value,
        }
        if self.sasl_mechanism:
            assert self.sasl_password is not None
            options |= {
                "sasl_mechanism": self.sasl_mechanism.value,
                "sasl_plain_username": self.sasl_username,
                "sasl_plain_password": self.sasl_password.get_secret_value(),
            }
        if self.ssl_ca_location:
            options["ssl_cafile"] = str(self.ssl_ca_location)
        return options


class S3Connection(_Strict):
    """How Spark reaches an S3-compatible object store through ``s3a://`` (hadoop-aws). Environment:
    ``CDC_S3__<FIELD>``; or a secrets file (``CDC_S3_SECRETS_FILE``). Without keys, hadoop-aws's own chain
    finds credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, the AWS profile, the instance role).

    Example::

        from cdc import Lakehouse, Settings

        settings = Settings(
            warehouse="s3a://lake/warehouse",
            s3={
                "endpoint": "http://127.0.0.1:9000",
                "path_style_access": True,
                "access_key_id": "cdc",
                "secret_access_key": "secret",
            },
        )
        lake = Lakehouse(settings=settings)
    """

    endpoint: str | None = Field(
        default=None,
        description="URL of the S3 service (http://127.0.0.1:9000 for the local stack's); none: AWS S3 itself.",
    )
    region: str | None = Field(default=None, description="The bucket's region; none: found by hadoop-aws.")
    path_style_access: bool = Field(
        default=False,
        description="Address buckets as ENDPOINT/BUCKET instead of BUCKET.ENDPOINT (most S3-compatible servers).",
    )
    access_key_id: str | None = Field(default=None, description="Access key; none: hadoop-aws's credential chain.")
    secret_access_key: SecretStr | None = Field(default=None, description="Secret key of that access key.")

    @model_validator(mode="after")
    def _keys_paired(self) -> S3Connection:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together")
        return self

    def secrets(self) -> list[str]:
        return [self.secret_access_key.get_secret_value()] if self.secret_access_key else []

    def hadoop_conf(self) -> dict[str, str]:
        """The Spark settings (``spark.hadoop.fs.s3a.*``) that configure hadoop-aws, on the driver and executors."""
        conf = {"fs.s3a.path.style.access": str(self.path_style_access).lower()}
        if self.endpoint:
            conf["fs.s3a.endpoint"] = self.endpoint
            conf["fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https://")).lower()
        if self.region:
            conf["fs.s3a.endpoint.region"] = self.region
        if self.access_key_id and self.secret_access_key:
            conf |= {
                "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                "fs.s3a.access.key": self.access_key_id,
                "fs.s3a.secret.key": self.secret_access_key.get_secret_value(),
            }
        return {f"spark.hadoop.{key}": value for key, value in conf.items()}


class StackBackend(str, Enum):
    """Which engine runs the stack: local processes, or docker/compose.yml where Docker exists."""

    LOCAL = "local"
    DOCKER = "docker"


class StackConfig(_Strict):
    """The local CDC stack: every component a real process on 127.0.0.1, state under one folder."""

    state_dir: Path = Field(
        default=Path(".cdc/stack"),
        description="Data, configuration, pid files and logs of every component.",
    )
    postgres: PostgresConfig = Field(default_factory=PostgresConfig)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    connect: ConnectConfig = Field(default_factory=ConnectConfig)
    spark_cluster: SparkClusterConfig = Field(default_factory=SparkClusterConfig)
    object_store: ObjectStoreConfig = Field(default_factory=ObjectStoreConfig)
    start_timeout_s: float = Field(default=180.0, gt=0, description="How long `up` waits for each component.")

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, state_dir: Path) -> Path:
        return state_dir.expanduser().absolute()


class Settings(BaseSettings):
    """Everything the CLI reads from the environment (``CDC_`` prefix, ``__`` between nested keys).

    Example::

        from cdc import Lakehouse
        from cdc import Settings

        settings = Settings(warehouse="/data/warehouse", kafka={"bootstrap_servers": "broker:9092"})
        lake = Lakehouse(settings=settings)
    """

    model_config = SettingsConfigDict(env_prefix="CDC_", env_nested_delimiter="__", extra="ignore", frozen=True)

    spark: SparkConfig = Field(default_factory=SparkConfig)
    stack: StackConfig = Field(default_factory=StackConfig)
    kafka: KafkaConnection = Field(default_factory=KafkaConnection)
    warehouse: str = Field(default="warehouse", description="Root of the Delta tables: a path or an object-store URI.")
    kafka_secrets_file: Path | None = Field(
        default=None, description="YAML/JSON file of Kafka settings (SASL credentials...) read over CDC_KAFKA__*."
    )
    s3: S3Connection = Field(default_factory=S3Connection)
    s3_secrets_file: Path | None = Field(
        default=None, description="YAML/JSON file of S3 settings (access and secret keys...) read over CDC_S3__*."
    )
    metrics_file: Path | None = Field(
        default=None,
        description="A file the refine jobs rewrite with their metrics in Prometheus's text format every few seconds "
        "(per table: batches, changes read, quarantined, Spark jobs, batch seconds, last batch time, lag): point a "
        "node exporter's textfile collector at its folder. Default none.",
    )


def load_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """Read :class:`Settings` from the environment, apply nested ``overrides`` (command-line options).

    Invalid values raise ConfigError naming each key as an environment variable.

    Example::

        from cdc import load_settings

        settings = load_settings({"warehouse": "/data/warehouse"})  # CDC_* variables, then this
    """
    try:
        settings = Settings()
        if overrides:
            settings = Settings.model_validate(_merge(settings.model_dump(), overrides))
        return settings
    except ValidationError as error:
        raise config_error(error, prefix="CDC_") from None


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def validate(model: type[ModelT], document: dict[str, Any], what: str) -> ModelT:
    """``model`` from ``document``, or a ConfigError naming each invalid key (dotted) and the reason."""
    with checked(what):
        return model.model_validate(document)


@contextmanager
def checked(what: str) -> Iterator[None]:
    """Configuration models built inside raise the ConfigError :func:`validate` does, naming each invalid
    field (dotted) and the reason, instead of pydantic's ValidationError.

    Example::

        with checked("refine job settings"):
            config = RefineJobConfig(table=topic, warehouse=warehouse, trigger=AvailableNow())
    """
    try:
        yield
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or what}: {item['msg']}" for item in error.errors()
        )
        raise ConfigError(f"invalid {what}: {problems}") from None


def config_error(error: ValidationError, prefix: str = "") -> ConfigError:
    """One ConfigError listing each invalid key (as the user would write it) with the reason."""
    problems = []
    for item in error.errors():
        key = "__".join(str(part) for part in item["loc"]).upper() if prefix else ".".join(map(str, item["loc"]))
        problems.append(f"{prefix}{key}: {item['msg']}")
    return ConfigError("invalid configuration: " + "; ".join(problems))


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


# Kafka's own rule for topic names (it also refuses "." and "..").
TOPIC_NAME = r"^[A-Za-z0-9._-]{1,249}$"


def _kafka_topic_name(topic: str) -> str:
    if topic in (".", ".."):
        raise ValueError(f"{topic!r} is not a valid topic name")
    return topic


class AvailableNow(_Strict):
    """Land what is in Kafka now, then stop (for scheduled runs)."""

    kind: Literal["available_now"] = "available_now"


class Continuous(_Strict):
    """Run until stopped, starting a micro-batch every ``interval_s`` seconds when there is data."""

    kind: Literal["continuous"] = "continuous"
    interval_s: float = Field(default=2.0, gt=0, description="Seconds between micro-batches.")


Trigger = Annotated[AvailableNow | Continuous, Field(discriminator="kind")]
