"""What the demo tests share: every Delta table a demo wrote, read by delta-rs and by Spark."""

from pathlib import Path

import pytest
from deltalake.exceptions import DeltaError
from pyspark.errors import PySparkException
from pyspark.testing import assertDataFrameEqual


@pytest.fixture
def delta_rs_mismatches(spark, read_with_delta_rs):
    """Every Delta table under a warehouse, by its path there: those delta-rs (pandas' and Polars'
    read_delta) cannot read or reads with other rows than Spark, each with the first line of why."""

    def mismatches(warehouse: Path) -> tuple[list[str], dict[str, str]]:
        tables = sorted(str(log.parent.relative_to(warehouse)) for log in warehouse.rglob("_delta_log"))
        failed = {}
        for table in tables:
            location = str(warehouse / table)
            try:
                assertDataFrameEqual(read_with_delta_rs(location), spark.read.format("delta").load(location))
            except (DeltaError, PySparkException) as error:  # every table's outcome, not only the first's
                failed[table] = str(error).splitlines()[0]
        return tables, failed

    return mismatches
