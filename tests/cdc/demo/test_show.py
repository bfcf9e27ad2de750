"""Tables shown in a terminal: a few rows, cells cut, the columns that do not fit named."""

from datetime import datetime
from decimal import Decimal

from cdc.demo.show import CELL, preview


def test_preview_fits_the_terminal_and_names_the_columns_left_out(spark, monkeypatch):
    monkeypatch.setenv("COLUMNS", "54")
    table = spark.createDataFrame(
        [
            (2, "b" * 50, Decimal("1.500000000000000000"), datetime(2026, 1, 2, 3, 4, 5, 678), b"\x01", "x"),
            (1, "short", None, None, None, "y"),
        ],
        "id long, note string, ratio decimal(38,18), at timestamp_ntz, raw binary, last string",
    )
    lines = preview(table, order_by=["id"], indent="")
    assert [line.split() for line in lines[:3]] == [
        ["id", "note", "ratio"],
        ["1", "short", "null"],
        ["2", "b" * (CELL - 1) + "…", "1.5"],
    ]
    assert lines[3:] == ["(+3 more columns: at, raw, last)"]
    assert all(len(line) <= 54 for line in lines)

    [_, row] = preview(table.where("id = 2").select("at", "raw"), indent="")
    assert row.split() == ["2026-01-02", "03:04:05", "0x01"]
