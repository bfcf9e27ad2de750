"""What a pipeline file adds to a refined table's micro-batches: expectations and SCD type 2 history.

- **Expectations** (:mod:`refine.quality.expectations`) run on the batch's rows before they are written:
  ``warn`` counts, ``drop`` quarantines the row (reason ``failed expectations: <names>``), ``fail``
  stops the job before anything of the batch is written. Deletes are not checked: a delete carries
  no row image to check (Debezium sends the key only), and refusing it would keep a deleted row.
- **History** (:mod:`refine.apply.history`): every version the batch brings, MERGEd into
  ``<warehouse>/refined/<name>__history`` next to the refined table, which stays the current state.

The jobs call one method each; without rules the batch passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from pydantic import Field
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.core.config import _Strict
from cdc.core.errors import ConfigError
from refine.apply.history import ChangeOp, HistorySpec, apply_history
from refine.apply.merge import OFFSET, OP, PARTITION, TableSettings, refined_rows
from refine.quality.expectations import (
    Expectation,
    ExpectationsConfig,
    check_expectations,
    enforce_expectations,
    split_by_expectations,
)
from refine.records.envelope import Op

HISTORY_SUFFIX = "__history"


def history_table_name(name: str) -> str:
    """The history table of refined table ``name`` (``__`` keeps it apart from pipeline names)."""
    return f"{name}{HISTORY_SUFFIX}"


class TableRules(_Strict):
    """The expectations and the history of one refined table."""

    table: str = Field(description="The refined table's name (counts, errors, quarantine).")
    topic: str = Field(description="The topic its rows come from (quarantine).")
    warehouse: str = Field(description="Where the counts and the quarantine are.")
    expectations: list[Expectation] = Field(default_factory=list, description="Checked on every batch's rows.")
    history: HistorySpec | None = Field(default=None, description="Keep every version (SCD type 2); None: no history.")

    def expectations_config(self, key_columns: list[str]) -> ExpectationsConfig:
        return ExpectationsConfig(
            table=self.table,
            key_columns=key_columns,
            expectations=self.expectations,
            topic=self.topic,
            partition_column=PARTITION,
            offset_column=OFFSET,
        )

    def check(self, spark: SparkSession, rows: DataFrame, key_columns: list[str]) -> None:
        """ConfigError naming an expectation that is not a boolean condition over ``rows`` (no data read)."""
        if self.expectations:
            check_expectations(spark, rows.schema, self.expectations_config(key_columns))

    def refuse_unchecked(self, what: str) -> None:
        """ConfigError when the table has expectations but its rows (``what``) are not checked yet."""
        if self.expectations:
            raise ConfigError(f"expectations are not run on {what} yet", table=self.table)

    @contextmanager
    def enforced(
        self,
        spark: SparkSession,
        rows: DataFrame,
        key_columns: list[str],
        batch: int,
        deleted: Column | None = None,
        quarantined: Callable[[DataFrame], DataFrame] | None = None,
    ) -> Iterator[DataFrame]:
        """The rows to write: those no ``drop`` expectation failed (counts recorded, raising on a
        ``fail`` one), plus the ``deleted`` rows unchecked. ``rows`` carry ``_cdc_partition`` and
        ``_cdc_offset`` (where the row came from, for the quarantine); ``quarantined`` makes the dropped
        rows the quarantine keeps (masked, say)."""
        if not self.expectations:
            yield rows
            return
        checked = rows if deleted is None else rows.where(~deleted)
        with enforce_expectations(
            spark, checked, self.expectations_config(key_columns), self.warehouse, batch, quarantined
        ) as passing:
            yield passing if deleted is None else passing.unionByName(rows.where(deleted))

    @contextmanager
    def enforced_changes(
        self,
        spark: SparkSession,
        latest: DataFrame,
        columns: list[str],
        key_columns: list[str],
        batch: int,
        quarantined: Callable[[DataFrame], DataFrame] | None = None,
    ) -> Iterator[DataFrame]:
        """The refined rows of a Debezium batch's latest changes (:func:`refine.apply.merge.refined_rows`)
        that pass the expectations; deletes pass unchecked (``quarantined``: as :meth:`enforced`)."""
        if not self.expectations:
            yield refined_rows(latest, columns)
            return
        # The Kafka partition rides in the row images (the refined rows carry none), for the quarantine.
        images = {image: F.col(image).withField(PARTITION, F.col("kafka_partition")) for image in ("before", "after")}
        rows = refined_rows(latest.withColumns(images), [*columns, PARTITION])
        deleted = F.col(OP) == Op.DELETE.value
        with self.enforced(spark, rows, key_columns, batch, deleted, quarantined) as passing:
            yield passing.drop(PARTITION)

    def passing_events(self, spark: SparkSession, events: DataFrame, rows: DataFrame, keys: list[str], batch: int):
        """Context: the ``events`` whose ``rows`` (the same events flattened; both carry
        ``_cdc_partition`` and ``_cdc_offset``) passed the expectations."""
        if not self.expectations:
            return nullcontext(events)
        return _semi_joined(self.enforced(spark, rows, keys, batch), events)

    def passing_versions(self, versions: DataFrame, deleted: Column) -> DataFrame:
        """The ``versions`` (every change of a batch, as rows) that no ``drop`` or ``fail`` expectation
        fails, and the ``deleted`` ones unchecked: what a history keeps. Counts and the quarantine
        come from :meth:`enforced`, over the rows the refined table gets."""
        if not self.expectations:
            return versions
        passing, _ = split_by_expectations(versions.where(~deleted), self.expectations)
        return passing.unionByName(versions.where(deleted))

    def record_history(
        self,
        spark: SparkSession,
        location: str,
        settings: TableSettings,
        versions: DataFrame,
        op: Column | None = None,
    ) -> None:
        """MERGE the batch's ``versions`` (one row per change; ``op`` its :class:`ChangeOp`, default
        upsert) into the history table (of the refined table's ``settings``)."""
        if self.history is not None:
            op = F.lit(ChangeOp.UPSERT.value) if op is None else op
            apply_history(spark, location, settings, versions.withColumn(self.history.op_column, op), self.history)


@contextmanager
def _semi_joined(passing_rows, events: DataFrame) -> Iterator[DataFrame]:
    with passing_rows as passing:
        yield events.join(passing.select(PARTITION, OFFSET), [PARTITION, OFFSET], "left_semi")
