"""`cdc optimize` and `cdc vacuum` on real Delta tables."""

import subprocess
import sys
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from cdc.cli import main
from cdc.raw.table import create_raw_table


def small_files_table(spark, location: str, appends: int = 5) -> None:
    for i in range(appends):
        spark.range(i * 100, (i + 1) * 100).selectExpr("id", "id % 7 AS bucket").coalesce(1).write.format("delta").mode(
            "append"
        ).save(location)


def data_files_on_disk(location: str) -> int:
    return sum(1 for path in Path(location).rglob("*.parquet") if "_delta_log" not in path.parts)


def test_optimize_compacts_small_files(spark, tmp_path, capsys):
    location = str(tmp_path / "refined" / "events")
    small_files_table(spark, location)
    assert len(spark.read.format("delta").load(location).inputFiles()) == 5
    assert (
        main(["optimize", "--table", "refined/events", "--warehouse", str(tmp_path)]) == 0
    )  # a name under the warehouse
    assert len(spark.read.format("delta").load(location).inputFiles()) == 1
    assert f"optimized {location}: 5 files compacted into 1" in capsys.readouterr().out
    assert spark.read.format("delta").load(location).count() == 500
    assert main(["optimize", "--table", location]) == 0  # one file: nothing to do, and it says so
    assert f"optimized {location}: already compact, no file rewritten" in capsys.readouterr().out


def test_optimize_z_orders_by_the_given_columns(spark, tmp_path, capsys):
    location = str(tmp_path / "events")
    small_files_table(spark, location)
    assert main(["optimize", "--table", location, "--zorder-by", "bucket,id"]) == 0
    [operation] = DeltaTable.forPath(spark, location).history(1).collect()
    assert operation.operation == "OPTIMIZE"
    assert operation.operationParameters["zOrderBy"] == '["bucket","id"]'

    assert main(["optimize", "--table", location, "--zorder-by", "nope"]) == 2
    assert "cannot Z-order by 'nope': it is not a column (columns: id, bucket)" in capsys.readouterr().err


def test_vacuum_refuses_a_retention_below_the_safe_minimum(spark, tmp_path, capsys):
    location = str(tmp_path / "events")
    small_files_table(spark, location, appends=1)
    assert main(["vacuum", "--table", location, "--retain-hours", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "refusing a retention below the safe minimum of 168 hours" in err
    assert "--i-know-vacuum-below-retention-loses-time-travel allows it" in err


def test_vacuum_with_the_override_removes_unreferenced_files(spark, tmp_path, capsys):
    location = str(tmp_path / "events")
    small_files_table(spark, location, appends=3)
    spark.range(10).selectExpr("id", "id AS bucket").coalesce(1).write.format("delta").mode("overwrite").save(location)
    assert data_files_on_disk(location) == 4
    assert (
        main(
            ["vacuum", "--table", location, "--retain-hours", "0", "--i-know-vacuum-below-retention-loses-time-travel"]
        )
        == 0
    )
    assert data_files_on_disk(location) == len(spark.read.format("delta").load(location).inputFiles()) == 1
    with pytest.raises(Exception, match=r"FileNotFound|does not exist|FAILED_READ_FILE"):
        spark.read.format("delta").option("versionAsOf", 0).load(location).collect()
    assert spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled") == "true"  # restored
    assert main(["vacuum", "--table", location]) == 0  # the default retention needs no override


def test_vacuum_prints_its_own_line_with_the_count_delta_printed(spark, tmp_path):
    """Delta's VACUUM prints its summary to the JVM's standard output: `cdc vacuum` prints its own line
    only, with the count from Delta's."""
    location = str(tmp_path / "events")
    small_files_table(spark, location, appends=3)
    spark.range(10).selectExpr("id", "id AS bucket").coalesce(1).write.format("delta").mode("overwrite").save(location)
    override = ["--retain-hours", "0", "--i-know-vacuum-below-retention-loses-time-travel"]
    vacuum = [sys.executable, "-m", "cdc.cli", "vacuum", "--table", location, *override]
    result = subprocess.run(vacuum, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"vacuumed {location}: 3 files and directories deleted (retained 0 hours)"]


def test_vacuum_never_goes_below_the_minimum_on_raw_tables(spark, tmp_path, capsys):
    location = str(tmp_path / "raw" / "topic")
    create_raw_table(spark, location, "topic")
    assert (
        main(
            ["vacuum", "--table", location, "--retain-hours", "0", "--i-know-vacuum-below-retention-loses-time-travel"]
        )
        == 2
    )
    assert "refusing to vacuum a raw table with a retention below 168 hours" in capsys.readouterr().err


def test_an_unknown_table_is_named(tmp_path, capsys):
    assert main(["optimize", "--table", "refined/none", "--warehouse", str(tmp_path)]) == 8
    assert (
        "no Delta table at this path, under the warehouse or by this name (table=refined/none"
        in capsys.readouterr().err
    )
