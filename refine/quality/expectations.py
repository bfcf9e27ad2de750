"""Expectations: named SQL boolean constraints on a table's rows, each with an action.

A row passes an expectation when its condition is true; false or null fails it (write
``x IS NULL OR x > 0`` to let nulls through). On failure the action decides:

- ``warn``: the row is kept and counted;
- ``drop``: the row goes to the quarantine table (:mod:`refine.quality.quarantine`) with the reason
  ``failed expectations: <names>``, by its Kafka partition and offset, and the job goes on;
- ``fail``: nothing of the batch is written; the job stops with :class:`cdc.core.errors.ExpectationError`
  naming the table, the expectation and the key of an offending row.

Every condition is analysed against the table's schema before any row is read: unknown columns,
bad syntax, aggregates or a non-boolean result are a ConfigError naming the expectation.

Counts per expectation per batch land in ``<warehouse>/_cdc/expectations`` (table, expectation,
action, batch, passed, failed, recorded_at; one row per table, expectation and batch, so a replayed
batch is counted once); ``cdc status`` shows the totals.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import Enum

from pydantic import Field, field_validator
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType, TimestampType

from cdc.core.config import _Strict
from cdc.core.errors import ConfigError, ExpectationError
from cdc.core.shared_tables import merge_into_shared_table
from cdc.core.tables import is_delta_table
from refine.quality.quarantine import quarantine, quarantine_location

FAILED = "_cdc_failed_expectations"  # on violations: the names of the expectations a row failed
COUNTS_SCHEMA = StructType(
    [
        StructField("table", StringType(), nullable=False),
        StructField("expectation", StringType(), nullable=False),
        StructField("action", StringType(), nullable=False),
        StructField("batch", LongType(), nullable=False),
        StructField("passed", LongType(), nullable=False),
        StructField("failed", LongType(), nullable=False),
        StructField("recorded_at", TimestampType(), nullable=False),
    ]
)


class ExpectationAction(str, Enum):
    """What happens to a row that fails an expectation."""

    WARN = "warn"  # kept, counted
    DROP = "drop"  # quarantined with the expectation's name
    FAIL = "fail"  # the job stops


class Expectation(_Strict):
    """One named constraint."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,100}$", description="Names the expectation in counts, reasons, errors."
    )
    condition: str = Field(min_length=1, description="A SQL boolean expression over the table's columns; true passes.")
    action: ExpectationAction = Field(default=ExpectationAction.WARN, description="warn, drop or fail.")


class ExpectationsConfig(_Strict):
    """The expectations of one table, and how its rows are named in errors and the quarantine."""

    table: str = Field(description="The guarded table (its name or location) in counts, errors and the quarantine.")
    key_columns: list[str] = Field(min_length=1, description="The columns naming an offending row in a fail error.")
    expectations: list[Expectation] = Field(min_length=1, description="The constraints, each with its action.")
    topic: str = Field(description="The topic the rows came from (quarantine).")
    partition_column: str = Field(default="kafka_partition", description="The rows' Kafka partition (quarantine).")
    offset_column: str = Field(default="kafka_offset", description="The rows' Kafka offset (quarantine).")

    @field_validator("expectations")
    @classmethod
    def _unique_names(cls, expectations: list[Expectation]) -> list[Expectation]:
        names = [expectation.name for expectation in expectations]
        if duplicated := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"expectation names must be unique: {', '.join(duplicated)} repeated")
        return expectations


def expectation_failures_since(spark: SparkSession, warehouse: str, table: str, since: datetime) -> int:
    """Rows of ``table`` that failed an expectation in the batches recorded at ``since`` or later."""
    location = expectations_location(warehouse)
    if not is_delta_table(spark, location):
        return 0
    counts = spark.read.format("delta").load(location)
    recent = counts.where((F.col("table") == table) & (F.col("recorded_at") >= F.lit(since)))
    return int(recent.agg(F.coalesce(F.sum("failed"), F.lit(0))).collect()[0][0])  # one row


def expectations_location(warehouse: str) -> str:
    return f"{warehouse}/_cdc/expectations"


def check_expectations(spark: SparkSession, schema: StructType, config: ExpectationsConfig) -> None:
    """Analyse every condition against ``schema`` (no data read): ConfigError naming the expectation."""
    empty = spark.createDataFrame([], schema)
    for expectation in config.expectations:
        try:
            result = empty.select("*", F.expr(expectation.condition).alias("_result")).schema["_result"].dataType
        except AnalysisException as error:  # also ParseException
            reason = str(error).strip().splitlines()[0]
            raise ConfigError(
                f"expectation {expectation.name!r} is not valid SQL over the table: {reason}",
                table=config.table,
                condition=expectation.condition,
            ) from None
        if not isinstance(result, BooleanType):
            raise ConfigError(
                f"expectation {expectation.name!r} is not a boolean condition (it gives {result.simpleString()})",
                table=config.table,
                condition=expectation.condition,
            )
    needed = [*config.key_columns]
    if any(expectation.action is ExpectationAction.DROP for expectation in config.expectations):
        needed += [config.partition_column, config.offset_column]
    if missing := [column for column in needed if column not in schema.names]:
        raise ConfigError(f"the table has no column {missing[0]!r} the expectations need", table=config.table)


def _passed(index: int) -> str:
    return f"_cdc_expectation_{index}"


def evaluate(rows: DataFrame, expectations: list[Expectation]) -> DataFrame:
    """``rows`` with one boolean column per expectation (true: passed), each condition evaluated once."""
    return rows.withColumns(
        {
            _passed(i): F.coalesce(F.expr(expectation.condition), F.lit(False))
            for i, expectation in enumerate(expectations)
        }
    )


def split(checked: DataFrame, expectations: list[Expectation]) -> tuple[DataFrame, DataFrame]:
    """(passing rows, violations) of evaluated rows. Passing: no drop or fail expectation failed (warn
    failures stay). Violations: every row that failed any expectation, with ``_cdc_failed_expectations``."""
    passed = [F.col(_passed(i)) for i in range(len(expectations))]
    blocking = [p for p, e in zip(passed, expectations, strict=True) if e.action is not ExpectationAction.WARN]
    failed_names = F.array_compact(
        F.array(*[F.when(~p, F.lit(e.name)) for p, e in zip(passed, expectations, strict=True)])
    )
    helpers = [_passed(i) for i in range(len(expectations))]
    keep = functools.reduce(operator.and_, blocking, F.lit(True))
    passing = checked.where(keep).drop(*helpers)
    violations = checked.withColumn(FAILED, failed_names).where(F.size(FAILED) > 0).drop(*helpers)
    return passing, violations


def split_by_expectations(rows: DataFrame, expectations: list[Expectation]) -> tuple[DataFrame, DataFrame]:
    """(passing rows, violations with the failed expectations' names), from one evaluation per row."""
    return split(evaluate(rows, expectations), expectations)


@contextmanager
def enforce_expectations(
    spark: SparkSession,
    rows: DataFrame,
    config: ExpectationsConfig,
    warehouse: str,
    batch: int,
    quarantined: Callable[[DataFrame], DataFrame] | None = None,
) -> Iterator[DataFrame]:
    """Check ``rows`` (one batch, numbered ``batch``: a micro-batch id or a Delta version), record the
    counts, quarantine the rows a ``drop`` expectation failed (as ``quarantined`` makes them: masked
    columns masked), raise on a ``fail`` expectation; yield the rows to write (cached for the block's
    duration)::

        with enforce_expectations(spark, rows, config, warehouse, batch_id) as passing:
            merge(passing)
    """
    check_expectations(spark, rows.schema, config)
    checked = evaluate(rows, config.expectations).persist()
    try:
        failed = _record_counts(spark, checked, config, warehouse, batch)
        for i, expectation in enumerate(config.expectations):
            if expectation.action is ExpectationAction.FAIL and failed[expectation.name]:
                example = checked.where(~F.col(_passed(i))).select(*config.key_columns).head(1)[0]  # failed > 0
                raise ExpectationError(
                    f"{failed[expectation.name]:,} rows broke a fail expectation",
                    table=config.table,
                    expectation=expectation.name,
                    key=example.asDict(),
                )
        passing, violations = split(checked, config.expectations)
        dropped = violations.where(
            F.exists(
                FAILED,
                lambda name: name.isin([e.name for e in config.expectations if e.action is ExpectationAction.DROP]),
            )
        )
        if any(failed[e.name] for e in config.expectations if e.action is ExpectationAction.DROP):
            if quarantined is not None:
                dropped = quarantined(dropped)
            quarantine(
                spark,
                quarantine_location(warehouse),
                config.table,
                config.topic,
                dropped.select(
                    F.col(config.partition_column).alias("kafka_partition"),
                    F.col(config.offset_column).alias("kafka_offset"),
                    F.to_json(F.struct(*[F.col(f"`{c}`") for c in rows.columns])).alias("raw_value"),
                    F.concat(F.lit("failed expectations: "), F.array_join(FAILED, ", ")).alias("problem"),
                ),
            )
        yield passing
    finally:
        checked.unpersist()


def _record_counts(
    spark: SparkSession, checked: DataFrame, config: ExpectationsConfig, warehouse: str, batch: int
) -> dict[str, int]:
    """Count failures per expectation (one aggregation), record them; return them by name."""
    totals = checked.agg(
        F.count("*").alias("rows"),
        *[F.count_if(~F.col(_passed(i))).alias(f"failed_{i}") for i in range(len(config.expectations))],
    ).collect()[0]
    failed = {e.name: totals[f"failed_{i}"] for i, e in enumerate(config.expectations)}
    counts = spark.createDataFrame(
        [
            (config.table, e.name, e.action.value, batch, totals["rows"] - failed[e.name], failed[e.name])
            for e in config.expectations
        ],
        "table string, expectation string, action string, batch long, passed long, failed long",
    ).withColumn("recorded_at", F.current_timestamp())
    location = expectations_location(warehouse)
    same = " AND ".join(f"c.`{k}` = n.`{k}`" for k in ("table", "expectation", "batch"))
    merge_into_shared_table(
        spark,
        location,
        COUNTS_SCHEMA,
        lambda table: table.alias("c").merge(counts.alias("n"), same).whenMatchedUpdateAll().whenNotMatchedInsertAll(),
    )
    return failed
