"""cdc-lakehouse: Debezium change topics landed from Kafka in Delta Lake and refined with Spark.

The Python API is :class:`Lakehouse` (:mod:`cdc.api`); the names below are re-exported here, each
imported on first use, so that ``import cdc`` starts no Spark and importing a part of the library
(``cdc.core.config``) does not import all of it::

    from cdc import Lakehouse

    lake = Lakehouse("/tmp/warehouse", kafka={"bootstrap_servers": "127.0.0.1:9092"})
    lake.sync(["shop.public.customers"])

The lower-level job functions (``run_raw_job`` with a :class:`RawJobConfig`, ``run_refine_job`` with
a :class:`RefineJobConfig`) are what :class:`Lakehouse` calls, for callers that build configs themselves.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS = {
    "Lakehouse": "cdc.api",
    "Settings": "cdc.core.config",
    "SparkConfig": "cdc.core.config",
    "KafkaConnection": "cdc.core.config",
    "load_settings": "cdc.core.config",
    "build_spark_session": "cdc.core.session",
    "CdcError": "cdc.core.errors",
    "ConfigError": "cdc.core.errors",
    "DependencyError": "cdc.core.errors",
    "StackError": "cdc.core.errors",
    "ConnectorError": "cdc.core.errors",
    "SourceError": "cdc.core.errors",
    "OffsetGapError": "cdc.core.errors",
    "TableError": "cdc.core.errors",
    "StreamError": "cdc.core.errors",
    "ExpectationError": "cdc.core.errors",
    "QuarantineError": "cdc.core.errors",
    "RawJobConfig": "cdc.raw.config",
    "TopicSummary": "cdc.raw.job",
    "run_raw_job": "cdc.raw.job",
    "RefineJobConfig": "refine.job",
    "Connector": "refine.config",
    "SchemaChangePolicy": "refine.apply.schema_changes",
    "run_refine_job": "refine.job",
    "RebuiltTable": "refine.rebuild",
    "Pipeline": "cdc.pipeline.config",
    "load_pipeline": "cdc.pipeline.load",
    "WarehouseStatus": "cdc.status",
    "OptimizeResult": "cdc.maintenance",
    "VacuumResult": "cdc.maintenance",
}

__all__ = [
    "CdcError",
    "ConfigError",
    "Connector",
    "ConnectorError",
    "DependencyError",
    "ExpectationError",
    "KafkaConnection",
    "Lakehouse",
    "OffsetGapError",
    "OptimizeResult",
    "Pipeline",
    "QuarantineError",
    "RawJobConfig",
    "RebuiltTable",
    "RefineJobConfig",
    "SchemaChangePolicy",
    "Settings",
    "SourceError",
    "SparkConfig",
    "StackError",
    "StreamError",
    "TableError",
    "TopicSummary",
    "VacuumResult",
    "WarehouseStatus",
    "build_spark_session",
    "load_pipeline",
    "load_settings",
    "run_raw_job",
    "run_refine_job",
]

if TYPE_CHECKING:
    from cdc.api import Lakehouse
    from cdc.core.config import KafkaConnection, Settings, SparkConfig, load_settings
    from cdc.core.errors import (
        CdcError,
        ConfigError,
        ConnectorError,
        DependencyError,
        ExpectationError,
        OffsetGapError,
        QuarantineError,
        SourceError,
        StackError,
        StreamError,
        TableError,
    )
    from cdc.core.session import build_spark_session
    from cdc.maintenance import OptimizeResult, VacuumResult
    from cdc.pipeline.config import Pipeline
    from cdc.pipeline.load import load_pipeline
    from cdc.raw.config import RawJobConfig
    from cdc.raw.job import TopicSummary, run_raw_job
    from cdc.status import WarehouseStatus
    from refine.apply.schema_changes import SchemaChangePolicy
    from refine.config import Connector
    from refine.job import RefineJobConfig, run_refine_job
    from refine.rebuild import RebuiltTable


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cdc' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
