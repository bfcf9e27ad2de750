"""Expectations: warn, drop (to the quarantine) and fail; counts per batch; invalid SQL found up front."""

import json

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import ConfigError, ExpectationError
from refine.quality.expectations import (
    FAILED,
    ExpectationsConfig,
    enforce_expectations,
    expectations_location,
    split_by_expectations,
)
from refine.quality.quarantine import quarantine_location

ROWS = "id long, amount int, email string, kafka_partition int, kafka_offset long"
BATCH = [
    (1, 10, "a@x", 0, 100),
    (2, -5, "b@x", 0, 101),  # drop: negative amount
    (3, 7, None, 0, 102),  # warn: no email
    (4, None, None, 0, 103),  # drop (null fails) and warn
]


def config(**actions: str) -> ExpectationsConfig:
    conditions = {"positive_amount": "amount > 0", "has_email": "email IS NOT NULL", "small_id": "id < 4"}
    return ExpectationsConfig(
        table="refined/shop.orders",
        key_columns=["id"],
        topic="shop.orders",
        expectations=[
            {"name": name, "condition": conditions[name], "action": action} for name, action in actions.items()
        ],
    )


def test_split_gives_passing_rows_and_violations_with_names(spark):
    rows = spark.createDataFrame(BATCH, ROWS)
    passing, violations = split_by_expectations(rows, config(positive_amount="drop", has_email="warn").expectations)
    assertDataFrameEqual(passing, spark.createDataFrame([BATCH[0], BATCH[2]], ROWS))
    assertDataFrameEqual(
        violations.select("id", FAILED),
        spark.createDataFrame(
            [(2, ["positive_amount"]), (3, ["has_email"]), (4, ["positive_amount", "has_email"])],
            "id long, _cdc_failed_expectations array<string>",
        ),
    )


def test_drop_quarantines_warn_keeps_and_counts_are_recorded_once_per_batch(spark, tmp_path):
    warehouse = str(tmp_path)
    rows = spark.createDataFrame(BATCH, ROWS)
    for _ in range(2):  # a replayed batch is counted and quarantined once
        with enforce_expectations(
            spark, rows, config(positive_amount="drop", has_email="warn"), warehouse, 7
        ) as passing:
            assertDataFrameEqual(passing, spark.createDataFrame([BATCH[0], BATCH[2]], ROWS))

    quarantined = spark.read.format("delta").load(quarantine_location(warehouse))
    assertDataFrameEqual(
        quarantined.select("source_table", "topic", "partition", "offset", "reason"),
        spark.createDataFrame(
            [
                ("refined/shop.orders", "shop.orders", 0, 101, "failed expectations: positive_amount"),
                ("refined/shop.orders", "shop.orders", 0, 103, "failed expectations: positive_amount, has_email"),
            ],
            "source_table string, topic string, partition int, offset long, reason string",
        ),
    )
    assert json.loads(quarantined.where("offset = 101").head().raw_value)["amount"] == -5
    counts = spark.read.format("delta").load(expectations_location(warehouse))
    assertDataFrameEqual(
        counts.drop("recorded_at"),
        spark.createDataFrame(
            [
                ("refined/shop.orders", "positive_amount", "drop", 7, 2, 2),
                ("refined/shop.orders", "has_email", "warn", 7, 2, 2),
            ],
            "table string, expectation string, action string, batch long, passed long, failed long",
        ),
    )


def test_fail_stops_naming_table_expectation_and_a_key(spark, tmp_path):
    rows = spark.createDataFrame(BATCH, ROWS)
    written = []
    with (
        pytest.raises(ExpectationError) as raised,
        enforce_expectations(spark, rows, config(small_id="fail", positive_amount="drop"), str(tmp_path), 1) as passing,
    ):
        written.append(passing)
    assert not written
    assert raised.value.context == {"table": "refined/shop.orders", "expectation": "small_id", "key": {"id": 4}}
    assert raised.value.exit_code == 10
    failed = spark.read.format("delta").load(expectations_location(str(tmp_path))).where("expectation = 'small_id'")
    assert failed.select("failed").head()[0] == 1


@pytest.mark.parametrize(
    ("condition", "reason"),
    [
        ("amout > 0", "UNRESOLVED_COLUMN"),
        ("amount >", "PARSE_SYNTAX_ERROR"),
        ("amount + 1", "not a boolean condition (it gives int)"),
        ("count(*) > 0", "MISSING_GROUP_BY"),
    ],
)
def test_invalid_sql_is_a_config_error_before_any_row_is_read(spark, tmp_path, condition, reason):
    rows = spark.createDataFrame(BATCH, ROWS).withColumn("boom", F.raise_error(F.lit("a row was read")))
    bad = ExpectationsConfig(
        table="t",
        key_columns=["id"],
        topic="t",
        expectations=[{"name": "bad_one", "condition": condition, "action": "drop"}],
    )
    with (
        pytest.raises(ConfigError, match="expectation 'bad_one'") as raised,
        enforce_expectations(spark, rows, bad, str(tmp_path), 1),
    ):
        pass
    assert reason in str(raised.value)


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="positive_amount repeated"):
        ExpectationsConfig(
            table="t",
            key_columns=["id"],
            topic="t",
            expectations=[
                {"name": "positive_amount", "condition": "amount > 0"},
                {"name": "positive_amount", "condition": "true"},
            ],
        )


def test_status_shows_totals_per_expectation(spark, tmp_path, capsys):
    from cdc.cli import main

    warehouse = str(tmp_path)
    for batch in (1, 2):
        with enforce_expectations(
            spark, spark.createDataFrame(BATCH, ROWS), config(has_email="warn"), warehouse, batch
        ):
            pass
    capsys.readouterr()
    assert main(["status", "--warehouse", warehouse, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["expectations"] == [
        {
            "table": "refined/shop.orders",
            "expectation": "has_email",
            "action": "warn",
            "batches": 2,
            "passed": 4,
            "failed": 4,
        }
    ]
    assert main(["status", "--warehouse", warehouse]) == 0
    assert "has_email" in capsys.readouterr().out
