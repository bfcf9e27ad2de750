"""What both demos do with a pipeline once its data is in Kafka: land and refine it through the
library functions `cdc raw --pipeline` and `cdc refine --pipeline` use, then show the tables in a
terminal and write the pipeline's graph."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from cdc.core.config import AvailableNow, KafkaConnection, Settings
from cdc.core.tables import is_delta_table
from cdc.pipeline.config import BusinessTable, Pipeline
from cdc.pipeline.graph import write_graph
from cdc.pipeline.run import PipelineRefineConfig, business_location, raw_job_config, run_pipeline_refine
from cdc.raw.job import run_raw_job

Say = Callable[[str], None]
CELL = 24  # characters a cell shows at most (an ISO time with milliseconds)


def land_and_refine(spark: SparkSession, settings: Settings, pipeline: Pipeline, say: Say) -> None:
    """`cdc raw --pipeline` then `cdc refine --pipeline`, both --available-now, on the stack's Kafka."""
    say(f"landing and refining pipeline {pipeline.name} into {settings.warehouse} (Spark) ...")
    kafka = KafkaConnection(bootstrap_servers=settings.stack.kafka.bootstrap_servers)
    raw = raw_job_config(pipeline, warehouse=settings.warehouse, trigger=AvailableNow(), kafka=kafka)
    run_raw_job(spark, raw, say=say)
    refine = PipelineRefineConfig(warehouse=raw.warehouse, trigger=AvailableNow())
    run_pipeline_refine(spark, pipeline, refine, say=say)


def write_pipeline_graph(pipeline: Pipeline, output_dir: Path, say: Say) -> Path:
    """`cdc graph` of the pipeline as an HTML page in ``output_dir``; its path is printed."""
    output_dir.mkdir(parents=True, exist_ok=True)
    page = write_graph(pipeline, output_dir.absolute() / f"{pipeline.name}.html")
    say(f"the pipeline's graph (topics -> raw -> refined -> business): open {page}")
    return page


def show_business_tables(spark: SparkSession, warehouse: str, business: Mapping[str, BusinessTable], say: Say) -> None:
    """Each business table the pipeline run refreshed (``<warehouse>/business/<name>``): rows and a preview."""
    for name in business:
        location = business_location(warehouse, name)
        if not is_delta_table(spark, location):
            say(f"business {name}: not materialised (a table it reads does not exist yet)")
            continue
        table = spark.read.format("delta").load(location)
        say(f"business {name}: {table.count()} rows  {location}")
        for line in preview(table):
            say(line)


def _cell(value: Any, most: int) -> str:
    match value:
        case None:
            text = "null"
        case bytes() | bytearray():
            text = "0x" + bytes(value).hex()
        case datetime():
            text = value.isoformat(sep=" ", timespec="seconds")
        case date():
            text = value.isoformat()
        # decimal(38,18): trailing zeros say nothing (NaN's and infinity's exponent is a letter, not a number)
        case Decimal() if isinstance(exponent := value.as_tuple().exponent, int) and exponent < -6:
            text = format(value.normalize(), "f")
        case _:
            text = str(value)
    text = " ".join(text.split())  # one line per row
    return text if len(text) <= most else text[: most - 1] + "…"


def preview(
    table: DataFrame, rows: int = 3, order_by: list[str] | None = None, indent: str = "    ", cell: int = CELL
) -> list[str]:
    """A few rows of ``table`` as aligned text lines that fit the terminal: cells cut to ``cell``
    characters, the columns that do not fit left out and named."""
    sample = (table.orderBy(*order_by) if order_by else table).limit(rows).collect()  # a handful of rows to print
    columns = [(name, [_cell(row[i], cell) for row in sample]) for i, name in enumerate(table.columns)]
    budget = shutil.get_terminal_size((120, 24)).columns - len(indent)
    shown: list[tuple[str, int, list[str]]] = []
    used = 0
    for name, cells in columns:
        width = max([len(name), *(len(text) for text in cells)])
        if used + width > budget and shown:
            break
        shown.append((name, width, cells))
        used += width + 2
    lines = ["  ".join(name.ljust(width) for name, width, _ in shown)]
    lines += ["  ".join(cells[i].ljust(width) for _, width, cells in shown) for i in range(len(sample))]
    if hidden := [name for name, _ in columns[len(shown) :]]:
        lines.append(f"(+{len(hidden)} more columns: {', '.join(hidden)})")
    return [indent + line.rstrip() for line in lines]
