"""The Python API (:class:`cdc.Lakehouse` and the names ``cdc`` re-exports): on the caller's own
SparkSession, against the real stack; settings refused before Spark starts; documented names."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from pyspark.testing import assertDataFrameEqual

import cdc
from cdc import ConfigError, Lakehouse
from cdc.stack.workload import run_workload
from refine.apply.merge import METADATA_COLUMNS


def test_importing_cdc_starts_no_spark_and_every_public_name_resolves():
    code = "import sys, cdc; assert 'pyspark' not in sys.modules, 'pyspark imported'; print(len(cdc.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for name in cdc.__all__:
        assert getattr(cdc, name) is not None
    assert set(cdc.__all__) <= set(dir(cdc))


@pytest.mark.parametrize("name", cdc.__all__)
def test_every_public_name_has_a_docstring_with_an_example(name):
    documented = getattr(cdc, name)
    assert "Example" in (inspect.getdoc(documented) or ""), f"cdc.{name} has no example in its docstring"


@pytest.mark.parametrize(
    "method", [name for name, _ in inspect.getmembers(Lakehouse, inspect.isfunction) if not name.startswith("_")]
)
def test_every_lakehouse_method_has_an_example(method):
    assert "Example::" in (inspect.getdoc(getattr(Lakehouse, method)) or "")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda lake: lake.land(["a.b"], pattern="a.*"), "exactly one of topics, pattern and pipeline"),
        (lambda lake: lake.land(["bad topic"]), "raw job settings"),
        (lambda lake: lake.refine(), "exactly one of table and pipeline"),
        (lambda lake: lake.refine("a.b", reinfer_schema=True), "reinfer_schema applies"),
        (lambda lake: lake.refine("a.b", key=["id"]), "refine job settings"),
        (lambda lake: lake.sync(), "exactly one of topics, pattern and pipeline"),
        (lambda lake: lake.refine(pipeline="no/such/pipeline.yaml"), "no/such/pipeline.yaml"),
    ],
)
def test_settings_are_refused_before_spark_starts(monkeypatch, tmp_path, call, message):
    def no_session(config):
        raise AssertionError("a session was built before the settings were checked")

    monkeypatch.setattr("cdc.api.build_spark_session", no_session)
    with pytest.raises(ConfigError) as refused:
        call(Lakehouse(str(tmp_path)))
    assert message in str(refused.value)


def test_land_refine_rebuild_and_status_on_the_callers_session(
    spark, kafka, stack_config, postgres_connector, postgres_table, tmp_path
):
    run_workload(stack_config.postgres.dsn(), customers=3, seed=41)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    said: list[str] = []
    lake = Lakehouse(str(tmp_path), spark=spark, kafka={"bootstrap_servers": kafka.bootstrap_servers}, say=said.append)
    assert lake.spark() is spark

    landed = lake.land([topic])
    assert [(summary.topic, summary.rows > 0) for summary in landed] == [(topic, True)]
    assert lake.refine(topic) > 0
    expected = postgres_table("orders")
    assertDataFrameEqual(lake.refined_table(topic).toDF().drop(*METADATA_COLUMNS), expected)

    # Run again: nothing new lands, nothing is refined twice.
    assert [summary.rows for summary in lake.land([topic])] == [0]
    assert lake.refine(topic) == 0
    assertDataFrameEqual(lake.refined_table(topic).toDF().drop(*METADATA_COLUMNS), expected)

    rebuilt = lake.rebuild(topic)
    assert rebuilt
    assert all(table.version_after > (table.version_before or -1) for table in rebuilt)
    assertDataFrameEqual(lake.refined_table(topic).toDF().drop(*METADATA_COLUMNS), expected)

    (table,) = lake.status().raw_tables
    assert table.topic == topic
    assert table.rows == sum(summary.rows for summary in landed)
    assert [partition.lag for partition in table.partitions] == [0]
    assert any(line.startswith(f"refine {topic}: ") for line in said)


def test_the_embedded_metastore_is_kept_under_a_local_warehouse_unless_a_folder_is_set(tmp_path):
    from cdc.api import with_metastore_under
    from cdc.core.config import SparkConfig

    on = SparkConfig(catalog={"enabled": True})
    assert with_metastore_under(on, str(tmp_path)).catalog.metastore_dir == tmp_path / "_cdc" / "metastore"
    assert with_metastore_under(on, "s3a://bucket/warehouse").catalog.metastore_dir is None  # Derby needs a disk
    chosen = SparkConfig(catalog={"enabled": True, "metastore_dir": str(tmp_path / "m")})
    assert with_metastore_under(chosen, "/w").catalog.metastore_dir == tmp_path / "m"
    assert with_metastore_under(SparkConfig(), "/w").catalog.metastore_dir is None  # no catalog, no metastore


def test_settings_reach_the_jobs_as_config_models_not_dicts():
    """Between the API and the jobs, every setting travels in a config model: no function of the API or of
    the orchestration that builds job configs takes or returns an untyped ``dict[str, Any]``."""
    import ast
    from pathlib import Path

    root = Path(cdc.__file__).parent
    untyped = []
    for module in ("api.py", "sync.py", "pipeline/run.py"):
        functions = [
            node for node in ast.walk(ast.parse((root / module).read_text())) if isinstance(node, ast.FunctionDef)
        ]
        untyped += [
            f"cdc/{module}: {function.name}"
            for function in functions
            for annotation in [
                *(a.annotation for a in [*function.args.args, *function.args.kwonlyargs]),
                function.returns,
            ]
            if annotation is not None and ast.unparse(annotation) == "dict[str, Any]"
        ]
    assert untyped == []


def test_an_invalid_trigger_interval_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^invalid trigger: interval_s: Input should be greater than 0"):
        Lakehouse(str(tmp_path)).refine("demo.shop.orders", continuous=True, interval_s=0)
