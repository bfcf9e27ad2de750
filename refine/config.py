"""The settings of a `cdc refine` job (:class:`RefineJobConfig`), and where its refined tables are."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from cdc.core.config import TOPIC_NAME, Continuous, Trigger, _Strict
from cdc.core.storage import normalize_location
from cdc.core.tables import TableFeatures
from refine.apply.rules import TableRules
from refine.apply.schema_changes import SchemaChangePolicy, SchemaChangeRules, TimeZoneName
from refine.apply.shaping import TableShape
from refine.records.columns import connect_type


def _readable_type(spark_type: str) -> str:
    connect_type(spark_type)  # ValueError naming the type and the supported ones
    return spark_type


ColumnType = Annotated[str, AfterValidator(_readable_type)]


class Connector(str, Enum):
    """The Debezium connector that wrote a topic, which decides how rows flattened by a transform are read.

    Example::

        from cdc import Connector, RefineJobConfig

        RefineJobConfig(table="demo.shop.parts", warehouse="/lake", connector=Connector.MONGODB)
    """

    AUTO = "auto"  # told by the records (see RefineJobConfig.connector)
    POSTGRES = "postgres"  # flattened rows are a table's rows (ExtractNewRecordState)
    MONGODB = "mongodb"  # flattened rows are documents (ExtractNewDocumentState)


class RefineRun(_Strict):
    """Where the tables are and when to run: what every refine job's settings hold."""

    warehouse: str = Field(description="Root of the tables: a local path or an object-store URI.")
    trigger: Trigger = Field(default_factory=Continuous, description="Run once over what is there, or continuously.")
    fail_on_quarantine: bool = Field(
        default=False,
        description=(
            "End the run with QuarantineError (exit 11) when it sent records to the quarantine; every other "
            "change is applied all the same."
        ),
    )

    @field_validator("warehouse")
    @classmethod
    def _location(cls, warehouse: str) -> str:
        return normalize_location(warehouse)


class RefineJobConfig(RefineRun):
    """One `cdc refine` run of a Debezium topic.

    Example::

        from cdc import RefineJobConfig
        from cdc import run_refine_job

        config = RefineJobConfig(
            table="demo.shop.orders", warehouse="/data/warehouse", trigger={"kind": "available_now"}
        )
        run_refine_job(spark, config)
    """

    table: str = Field(pattern=TOPIC_NAME, description="The raw table to refine, named by its topic.")
    name: str | None = Field(
        default=None,
        pattern=TOPIC_NAME,
        description="The refined table's name, <warehouse>/refined/<name> (and its checkpoint's); default the topic.",
    )
    columns: dict[str, ColumnType] | None = Field(
        default=None,
        description=(
            "Column types in Spark SQL (bigint, decimal(12,2), timestamp...; timestamp_ntz(p) and time(p) take the "
            "Postgres precision, which picks Debezium's encoding: milliseconds up to 3). For values written without a "
            "schema (schemas.enable=false) they are the row's schema, and `key` is required; with a schema they "
            "override decoded types (e.g. a decimal.handling.mode=string column declared decimal(12,2)). "
            "See refine/records/columns.py."
        ),
    )
    rules: TableRules | None = Field(default=None, description="Expectations checked before the MERGE (pipelines).")
    key: list[str] | None = Field(
        default=None,
        min_length=1,
        description=("The primary-key columns of a topic written without a schema (each one of `columns`)."),
    )
    explode: list[str] = Field(
        default_factory=list,
        description=(
            "Array columns (paths through nested documents for MongoDB) that become child tables "
            "<warehouse>/refined/<name>__<column>, one row per element keyed by the primary key and `pos`."
        ),
    )
    history: bool = Field(
        default=False,
        description=(
            "Keep every version of each row in <warehouse>/refined/<name>__history "
            "(SCD type 2, refine/apply/history.py)."
        ),
    )
    features: TableFeatures = Field(
        default_factory=TableFeatures,
        description="The Delta features of the refined table and the tables beside it (deletion vectors, Change Data "
        "Feed); default neither on a new table, and an existing table keeps what it has.",
    )

    connector: Connector = Field(
        default=Connector.AUTO,
        description=(
            "The Debezium connector that wrote the topic. Envelopes name it themselves; rows flattened by a "
            "transform do not. `auto`: a flattened row is a MongoDB document (ExtractNewDocumentState) when its "
            "key is `{id}` alone and equals the row's `_id` but not its `id`, and the topic's rows are documents "
            "once one is; else they are a table's rows (ExtractNewRecordState). Set `mongodb` for a collection "
            "whose documents hold an `id` equal to their `_id`; `postgres` skips looking."
        ),
    )

    schema_changes: SchemaChangePolicy = Field(
        default=SchemaChangePolicy.LENIENT,
        description=(
            "What the refined table (and its history, child and side tables) does when a source column changes "
            "type, is dropped or renamed: evolve (every change applied, drops included), lenient (widenings "
            "applied, nothing dropped or narrowed, an incompatible change widens the column to string), exception "
            "(stop, naming the column and the way on), ignore (the schema stays; values that no longer fit go to "
            "the quarantine). See docs/concepts/refine.md#schema-changes."
        ),
    )
    renames: dict[str, str] = Field(
        default_factory=dict,
        description="Source column renames, old name to new: the new column takes the old one's values.",
    )
    drop_columns: bool = Field(
        default=False,
        description="Remove a column the source dropped (default: keep it, NULL in rows written after the drop).",
    )
    source_time_zone: TimeZoneName | None = Field(
        default=None,
        description="The source database's time zone (an IANA name): needed to follow a timestamp -> timestamptz "
        "ALTER, whose stored wall-clock times are read in it.",
    )
    shape: TableShape = Field(
        default_factory=TableShape,
        description="How the refined table (and its history and child tables) is shaped: kept and computed columns, "
        "`where`, masks, soft deletes, ignored NULL updates, clustering (refine/apply/shaping.py). Postgres tables "
        "with a primary key.",
    )

    @property
    def target(self) -> str:
        return self.name or self.table

    @property
    def schema_rules(self) -> SchemaChangeRules:
        """How the refined table follows its source's schema changes."""
        return SchemaChangeRules(
            policy=self.schema_changes,
            renames=self.renames,
            drop_columns=self.drop_columns,
            source_time_zone=self.source_time_zone,
        )

    @model_validator(mode="after")
    def _renames_distinct(self) -> RefineJobConfig:
        clashing = sorted(set(self.renames) & set(self.renames.values()))
        if clashing:
            raise ValueError(f"renames: {', '.join(clashing)} both renamed and a rename's new name")
        return self

    @model_validator(mode="after")
    def _key_in_columns(self) -> RefineJobConfig:
        if self.key is not None:
            missing = [name for name in self.key if name not in (self.columns or {})]
            if missing:
                raise ValueError(f"key: {', '.join(missing)} not among the declared columns")
        return self


def refined_table_location(warehouse: str, topic: str) -> str:
    return f"{warehouse}/refined/{topic}"
