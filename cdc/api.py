"""The Python API: one :class:`Lakehouse` per warehouse, whose methods run what the ``cdc`` commands run.

The CLI builds a :class:`Lakehouse` from its options and calls it; a notebook or a scheduled job calls it
the same way, on the SparkSession it already has::

    from cdc import Lakehouse

    lake = Lakehouse("s3a://bucket/warehouse", spark=spark, kafka={"bootstrap_servers": "broker:9092"})
    lake.land(["shop.public.customers"])  # `cdc raw --topic shop.public.customers --available-now`
    lake.refine("shop.public.customers")  # `cdc refine --table shop.public.customers --available-now`
    lake.refined_table("shop.public.customers").toDF().show()

Every method validates its settings before Spark does anything and raises a
:class:`~cdc.core.errors.CdcError` (with the exit code the CLI would use) for what it refuses. Jobs run
once over what is there (``available_now``) unless ``continuous=True``; a continuous job runs until
``stop`` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from cdc.core.catalog import folder_under, registered_location
from cdc.core.config import (
    AvailableNow,
    Continuous,
    KafkaConnection,
    Settings,
    SparkConfig,
    Trigger,
    checked,
    load_settings,
    validate,
)
from cdc.core.errors import ConfigError, TableError
from cdc.core.object_store import load_s3_connection, object_store_spark_config
from cdc.core.session import build_spark_session, job_spark_config
from cdc.core.source import load_secrets_file
from cdc.core.storage import normalize_location
from cdc.core.tables import is_delta_table, raw_table_location
from cdc.maintenance import OptimizeResult, VacuumResult, optimize_table, resolve_table, vacuum_table
from cdc.pipeline.config import Pipeline
from cdc.pipeline.database import tables_of_pattern
from cdc.pipeline.load import load_pipeline
from cdc.pipeline.run import PipelineRefineConfig, raw_job_config, run_pipeline_refine
from cdc.raw.config import GapPolicy, RawJobConfig, TopicList, TopicPattern
from cdc.raw.job import TopicSummary, run_raw_job
from cdc.status import WarehouseStatus, warehouse_status
from cdc.status_page import write_status_page
from cdc.sync import EACH_TOPIC, PipelineRefinement, SyncJobConfig, TopicsRefinement, run_sync_job
from refine.config import RefineJobConfig, refined_table_location
from refine.event_log import EventLog
from refine.job import run_refine_job
from refine.rebuild import RebuiltTable, rebuild_refined_table

Say = Callable[[str], None]
PipelineSource = Pipeline | str | Path


class Lakehouse:
    """The tables of one warehouse, and the jobs that fill them.

    ``warehouse``: the root of the Delta tables, a path or an object-store URI (default: ``CDC_WAREHOUSE``,
    else ``./warehouse``). ``spark``: the session to run on (a notebook's, a Databricks job's); without one,
    the first job builds the project's own (local by default; ``CDC_SPARK__*`` settings). ``kafka``: the
    Kafka connection's fields (:class:`~cdc.core.config.KafkaConnection`) over ``CDC_KAFKA__*`` and the
    secrets file. ``settings``: all of these at once, instead of the environment. ``say``: where progress
    lines go (``print``; pass ``lambda line: None`` for silence).

    Example::

        lake = Lakehouse("/tmp/warehouse", kafka={"bootstrap_servers": "127.0.0.1:9092"})
        lake.sync(["shop.public.orders"])  # land and refine in one go
    """

    def __init__(
        self,
        warehouse: str | None = None,
        *,
        spark: SparkSession | None = None,
        kafka: Mapping[str, Any] | KafkaConnection | None = None,
        settings: Settings | None = None,
        say: Say = print,
    ) -> None:
        self.settings = settings or load_settings()
        self.warehouse = normalize_location(warehouse or self.settings.warehouse)
        self._kafka = kafka
        self._spark = spark
        self.say = say
        if self.settings.metrics_file is not None:
            EventLog.of(self.warehouse).metrics_file = self.settings.metrics_file

    @property
    def kafka(self) -> KafkaConnection:
        """The Kafka connection: ``CDC_KAFKA__*``, the secrets file's settings over them, ``kafka`` over both."""
        document = self.settings.kafka.model_dump()
        if self.settings.kafka_secrets_file:
            document |= load_secrets_file(self.settings.kafka_secrets_file)
        given = self._kafka.model_dump() if isinstance(self._kafka, KafkaConnection) else dict(self._kafka or {})
        return validate(KafkaConnection, document | given, "Kafka settings")

    def spark(self, *, refines_continuously: bool = False) -> SparkSession:
        """The session jobs run on: the one given, else the project's own, built on the first call.

        Example::

            Lakehouse("/tmp/warehouse").spark().read.format("delta").load("/tmp/warehouse/raw/t").count()
        """
        if self._spark is None:
            config = job_spark_config(self.settings.spark, refines_continuously=refines_continuously)
            s3 = load_s3_connection(self.settings.s3, self.settings.s3_secrets_file)
            self._spark = build_spark_session(
                object_store_spark_config(with_metastore_under(config, self.warehouse), s3, [self.warehouse])
            )
        return self._spark

    def land(
        self,
        topics: Sequence[str] | None = None,
        *,
        pattern: str | None = None,
        pipeline: PipelineSource | None = None,
        continuous: bool = False,
        interval_s: float = 2.0,
        max_offsets_per_trigger: int | None = None,
        allow_gaps: bool = False,
        reset: bool = False,
        force_destroy_raw_data: bool = False,
        stop: threading.Event | None = None,
    ) -> list[TopicSummary]:
        """Land Kafka topics as-is in raw Delta tables, exactly once (``cdc raw``).

        Name the topics, a ``pattern`` (a regular expression matched against whole topic names) or a
        ``pipeline`` (a file, or a loaded :class:`~cdc.pipeline.config.Pipeline`) whose sources name them.
        ``allow_gaps``: go on when Kafka deleted offsets not landed yet, recording the gap (else stop).
        ``reset``: delete the table and checkpoint and land from the start (raw tables only with
        ``force_destroy_raw_data``). Returns what each topic's table received.

        Example::

            for summary in lake.land(pattern=r"shop\\.public\\..*"):
                print(summary.topic, summary.rows)
        """
        if sum(choice is not None for choice in (topics, pattern, pipeline)) != 1:
            raise ConfigError("land needs exactly one of topics, pattern and pipeline")
        on_gap = GapPolicy.RECORD if allow_gaps else None
        if pipeline is not None:
            config = raw_job_config(
                _pipeline(pipeline),
                warehouse=self.warehouse,
                trigger=_trigger(continuous, interval_s),
                kafka=self.kafka,
                on_gap=on_gap,
                max_offsets_per_trigger=max_offsets_per_trigger,
                reset=reset,
                force_destroy_raw_data=force_destroy_raw_data,
            )
        else:
            with checked("raw job settings"):
                config = RawJobConfig(
                    topics=TopicList(topics=list(topics)) if topics else TopicPattern(pattern=pattern or ""),
                    warehouse=self.warehouse,
                    trigger=_trigger(continuous, interval_s),
                    kafka=self.kafka,
                    on_gap=on_gap or GapPolicy.FAIL,
                    max_offsets_per_trigger=max_offsets_per_trigger,
                    reset=reset,
                    force_destroy_raw_data=force_destroy_raw_data,
                )
        return run_raw_job(self.spark(), config, say=self.say, stop=stop)

    def refine(
        self,
        table: str | None = None,
        *,
        pipeline: PipelineSource | None = None,
        columns: Mapping[str, str] | None = None,
        key: Sequence[str] | None = None,
        connector: str = "auto",
        continuous: bool = False,
        interval_s: float = 2.0,
        rebuild: bool = False,
        reinfer_schema: bool = False,
        fail_on_quarantine: bool = False,
        schema_changes: str | None = None,
        stop: threading.Event | None = None,
    ) -> int | dict[str, int]:
        """Decode a raw table and MERGE it into its refined table (``cdc refine``): the raw table of topic
        ``table`` (or of the refined table whose catalog name it is), or every refined table of a ``pipeline``
        with its business tables.

        ``columns`` (name -> Spark type) and ``key`` describe a topic written without schemas, or
        override decoded types. ``connector`` (``auto``, ``postgres``, ``mongodb``): the connector that
        wrote the topic, which tells rows flattened by a transform apart (``RefineJobConfig.connector``).
        ``rebuild``: first make the refined table(s) again from the raw table's current contents
        (:meth:`rebuild`). ``reinfer_schema``: infer the kept schemas of a pipeline's
        event sources again. ``fail_on_quarantine``: raise :class:`~cdc.core.errors.QuarantineError` after a
        run that sent records to the quarantine (every other change is applied). ``schema_changes``
        (``evolve``, ``lenient``, ``exception``, ``ignore``): what the table does when a source column changes
        type, is dropped or renamed, over the pipeline's and table's settings (default ``lenient``). Returns
        the changes read: a count, or a count per table for a pipeline.

        Example::

            changes = lake.refine("shop.public.customers")
            lake.refine(pipeline="examples/pipelines/shop.yaml")
        """
        if (table is None) == (pipeline is None):
            raise ConfigError("refine needs exactly one of table and pipeline")
        trigger = _trigger(continuous, interval_s)
        # Every setting is checked before Spark starts.
        if pipeline is not None:
            loaded = _pipeline(pipeline)
            with checked("refine job settings"):
                config = PipelineRefineConfig(
                    warehouse=self.warehouse,
                    trigger=trigger,
                    reinfer_schema=reinfer_schema,
                    rebuild=rebuild,
                    fail_on_quarantine=fail_on_quarantine,
                    schema_changes=schema_changes,
                )
            spark = self.spark(refines_continuously=continuous)
            return run_pipeline_refine(spark, loaded, config, say=self.say, stop=stop)
        if reinfer_schema:
            raise ConfigError("reinfer_schema applies to the event sources of a pipeline")
        assert table is not None  # one of the two, checked above
        job = self._refine_config(table, columns, key, trigger, fail_on_quarantine, connector, schema_changes)
        spark = self.spark(refines_continuously=continuous)
        job = job.model_copy(update={"table": self._topic(spark, table)})
        if rebuild:
            rebuild_refined_table(spark, job, say=self.say)
        return run_refine_job(spark, job, say=self.say, stop=stop)

    def rebuild(
        self,
        table: str,
        *,
        columns: Mapping[str, str] | None = None,
        key: Sequence[str] | None = None,
        connector: str = "auto",
    ) -> list[RebuiltTable]:
        """Make the refined table of topic ``table`` (or the one of this catalog name), with its history and
        child tables, again from its raw table's current contents, each replaced in one commit; the old
        version stays for time travel. A refine afterwards goes on from where the rebuild stopped. Stop the
        table's running refine first.

        Example::

            for rebuilt in lake.rebuild("shop.public.customers"):
                print(rebuilt.location, rebuilt.version_before, "->", rebuilt.version_after)
        """
        config = self._refine_config(table, columns, key, _trigger(False, 2.0), connector=connector)
        spark = self.spark()
        config = config.model_copy(update={"table": self._topic(spark, table)})
        return rebuild_refined_table(spark, config, say=self.say)

    def sync(
        self,
        topics: Sequence[str] | None = None,
        *,
        pattern: str | None = None,
        pipeline: PipelineSource | None = None,
        continuous: bool = False,
        interval_s: float = 2.0,
        max_offsets_per_trigger: int | None = None,
        allow_gaps: bool = False,
        schema_changes: str | None = None,
        stop: threading.Event | None = None,
    ) -> list[TopicSummary]:
        """Land topics and refine them in one Spark application (``cdc sync``): Debezium ``topics`` by
        name, every topic a ``pattern`` matches (a whole database: each refined as it is landed, Debezium's own
        topics left out), or a ``pipeline``'s sources and tables. ``schema_changes`` as in :meth:`refine`.

        Example::

            lake.sync(pipeline="examples/pipelines/shop.yaml", continuous=True, stop=stop_event)
            lake.sync(pattern=r"demo\\.shop\\..*", continuous=True, stop=stop_event)
        """
        if sum(choice is not None for choice in (topics, pattern, pipeline)) != 1:
            raise ConfigError("sync needs exactly one of topics, pattern and pipeline")
        trigger = _trigger(continuous, interval_s)
        on_gap = GapPolicy.RECORD if allow_gaps else None
        with checked("sync job settings"):
            if pipeline is not None:
                loaded = _pipeline(pipeline)
                raw = raw_job_config(
                    loaded,
                    warehouse=self.warehouse,
                    trigger=trigger,
                    kafka=self.kafka,
                    on_gap=on_gap,
                    max_offsets_per_trigger=max_offsets_per_trigger,
                )
                run = PipelineRefineConfig(warehouse=self.warehouse, trigger=trigger, schema_changes=schema_changes)
                refinement: TopicsRefinement | PipelineRefinement = PipelineRefinement(pipeline=loaded, run=run)
            else:
                raw = RawJobConfig(
                    topics=TopicList(topics=list(topics))
                    if topics is not None
                    else TopicPattern(pattern=tables_of_pattern(pattern or "")),
                    warehouse=self.warehouse,
                    trigger=trigger,
                    kafka=self.kafka,
                    on_gap=on_gap or GapPolicy.FAIL,
                    max_offsets_per_trigger=max_offsets_per_trigger,
                )
                if topics is not None:
                    jobs = [
                        self._refine_config(topic, None, None, trigger, schema_changes=schema_changes)
                        for topic in topics
                    ]
                    refinement = TopicsRefinement(jobs=jobs)
                else:  # each topic's job as it is landed
                    each = self._refine_config(EACH_TOPIC, None, None, trigger, schema_changes=schema_changes)
                    refinement = TopicsRefinement(each=each)
            config = SyncJobConfig(raw=raw, refine=refinement)
        return run_sync_job(self.spark(refines_continuously=continuous), config, say=self.say, stop=stop)

    def status(self) -> WarehouseStatus:
        """Each raw table's Delta version, rows, recorded gaps, quarantined records and lag behind its
        topic (consumed against Kafka's end offsets), and the expectation totals (``cdc status``).

        Example::

            for table in lake.status().raw_tables:
                print(table.topic, [p.lag for p in table.partitions])
        """
        return warehouse_status(self.spark(), self.warehouse, self.kafka)

    def status_page(self, output: str | Path, *, pipeline: PipelineSource | None = None) -> Path:
        """Write the warehouse's status as a page (``cdc status --html``): the DAG of ``pipeline`` (else of
        the tables found), each node with its numbers and a level (ok, warn, error). Returns its path.

        Example::

            lake.status_page("status.html", pipeline="pipelines/shop.yaml")
        """
        return write_status_page(self.status(), Path(output), _pipeline(pipeline) if pipeline is not None else None)

    def refined_table(self, topic: str) -> DeltaTable:
        """The refined table of ``topic`` (or by its catalog name), as Delta's own :class:`~delta.tables.DeltaTable`.

        Example::

            lake.refined_table("shop.public.customers").toDF().where("id = 7").show()
        """
        spark = self.spark()
        return DeltaTable.forPath(spark, refined_table_location(self.warehouse, self._topic(spark, topic)))

    def _topic(self, spark: SparkSession, table: str) -> str:
        """The topic ``table`` names: a topic with a raw table, else the catalog name of its refined table
        (``refined.shop_public_customers``). Anything else stays as given, for the job to say what is missing."""
        if is_delta_table(spark, raw_table_location(self.warehouse, table)):
            return table
        location = registered_location(spark, table)
        if location is None:
            return table
        topic = folder_under(location, f"{self.warehouse}/refined")
        if topic is None or not is_delta_table(spark, raw_table_location(self.warehouse, topic)):
            raise TableError(
                f"the catalog name {table} is the table at {location}, not the refined table of a topic landed "
                "in this warehouse (a pipeline's tables are refined with --pipeline): give the topic",
                table=table,
                warehouse=self.warehouse,
            )
        return topic

    def optimize(self, table: str, *, zorder_by: Sequence[str] = ()) -> OptimizeResult:
        """Compact a Delta table's small files, optionally Z-ordered (``cdc optimize``). ``table``: a path
        or URI, a path under the warehouse (``refined/TOPIC``), or a catalog table's name.

        Example::

            result = lake.optimize("refined/shop.public.orders", zorder_by=["customer_id"])
        """
        location = resolve_table(self.spark(), table, self.warehouse)
        return optimize_table(self.spark(), location, list(zorder_by))

    def vacuum(
        self, table: str, *, retain_hours: float | None = None, below_safe_minimum: bool = False
    ) -> VacuumResult:
        """Delete the files older versions of a Delta table no longer need (``cdc vacuum``); returns its
        location and how many files and directories were deleted. Below 168 hours only with
        ``below_safe_minimum``, and never on raw tables.

        Example::

            lake.vacuum("refined/shop.public.orders", retain_hours=240)
        """
        location = resolve_table(self.spark(), table, self.warehouse)
        return vacuum_table(self.spark(), location, retain_hours, below_safe_minimum)

    def _refine_config(
        self,
        table: str,
        columns: Mapping[str, str] | None,
        key: Sequence[str] | None,
        trigger: Trigger,
        fail_on_quarantine: bool = False,
        connector: str = "auto",
        schema_changes: str | None = None,
    ) -> RefineJobConfig:
        with checked("refine job settings"):
            return RefineJobConfig(
                table=table,
                warehouse=self.warehouse,
                columns=dict(columns) if columns else None,
                key=list(key) if key else None,
                trigger=trigger,
                fail_on_quarantine=fail_on_quarantine,
                connector=connector,
                **({"schema_changes": schema_changes} if schema_changes is not None else {}),
            )


def with_metastore_under(config: SparkConfig, warehouse: str) -> SparkConfig:
    """``config`` with its catalog's embedded metastore kept in ``<warehouse>/_cdc/metastore`` when it names no
    folder and the warehouse is a local one (Derby's files need a local folder)."""
    catalog = config.catalog
    if not catalog.enabled or catalog.metastore_dir is not None or "://" in warehouse or warehouse.startswith("file:"):
        return config
    return config.model_copy(
        update={"catalog": catalog.model_copy(update={"metastore_dir": Path(warehouse) / "_cdc" / "metastore"})}
    )


def _trigger(continuous: bool, interval_s: float) -> Trigger:
    with checked("trigger"):
        return Continuous(interval_s=interval_s) if continuous else AvailableNow()


def _pipeline(pipeline: PipelineSource) -> Pipeline:
    return pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
