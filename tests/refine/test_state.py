"""What a refine job knows of its tables lives in objects the job owns (refine/state.py), never in a
module: one process refines many tables, each with its own settings."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from cdc.core.tables import TableFeatures, delta_properties, raw_table_location
from cdc.raw.rows import raw_rows
from cdc.raw.table import create_raw_table
from cdc.stack.envelopes import postgres_envelope
from refine.config import RefineJobConfig, refined_table_location
from refine.job import run_refine_job

ROOT = Path(__file__).resolve().parents[2]
# Module state that is allowed, and why: shared by every table, keyed by its inputs, bounded.
ALLOWED = {
    # Parsers by the schema texts they parse (tables of one schema share one), least recently used dropped.
    ("refine/records/parse.py", "_PARSERS"),
}
MUTATORS = {"add", "append", "clear", "discard", "extend", "insert", "pop", "popitem", "remove", "setdefault", "update"}


def module_state_changed_by_functions(path: Path) -> set[str]:
    """The module-level names that code inside a function of ``path`` changes: assigns an item of,
    calls a mutating method of, or rebinds with ``global``."""
    tree = ast.parse(path.read_text())
    module_names = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    changed = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                changed |= set(node.names)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
                if isinstance(node.value, ast.Name):
                    changed.add(node.value.id)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
                and isinstance(node.func.value, ast.Name)
            ):
                changed.add(node.func.value.id)
    return changed & module_names


def test_no_refine_module_keeps_state_between_calls():
    kept = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "refine").rglob("*.py")
        for name in module_state_changed_by_functions(path)
        if (str(path.relative_to(ROOT)), name) not in ALLOWED
    )
    assert kept == [], "module-level state (keep it in refine/state.py's TableState, which the job owns):\n" + (
        "\n".join(kept)
    )


def test_the_state_finder_finds_module_state_changed_in_a_function(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "SEEN = {}\nMARKS = set()\nLIMIT = 3\nCONSTANT = {'a': 1}\n"
        "def remember(key):\n    SEEN[key] = True\n    MARKS.add(key)\n    return CONSTANT[key], LIMIT\n"
    )
    assert module_state_changed_by_functions(module) == {"SEEN", "MARKS"}


COLUMNS = {"id": "bigint", "name": "string"}


def _raw_table_of_two_creates(spark, warehouse: str, topic: str) -> None:
    location = raw_table_location(warehouse, topic)
    create_raw_table(spark, location, topic)
    records = [
        (json.dumps({"id": i}).encode(), json.dumps(postgres_envelope("c", 100 + i, after={"id": i, "name": f"n{i}"})))
        for i in (1, 2)
    ]
    kafka_records = spark.createDataFrame(
        [(key, value.encode(), topic, 0, offset) for offset, (key, value) in enumerate(records)],
        "key binary, value binary, topic string, partition int, offset long",
    ).selectExpr(
        "*",
        "current_timestamp() AS timestamp",
        "0 AS timestampType",
        "CAST(NULL AS array<struct<key:string,value:binary>>) AS headers",
    )
    raw_rows(kafka_records, 0).write.format("delta").mode("append").save(location)


def test_tables_whose_names_share_a_prefix_keep_their_own_features_in_one_process(spark, tmp_path):
    """`orders` and `orders__old` refined one after the other in one process, with different Delta features:
    each table has its own. (Settings looked up by location prefix gave the second the first's.)"""
    warehouse = str(tmp_path)
    expected = {"demo.shop.orders": "true", "demo.shop.orders__old": "false"}
    for topic, change_data_feed in expected.items():
        _raw_table_of_two_creates(spark, warehouse, topic)
        features = TableFeatures(change_data_feed=change_data_feed == "true", deletion_vectors=False)
        config = RefineJobConfig(
            table=topic,
            warehouse=warehouse,
            trigger={"kind": "available_now"},
            columns=COLUMNS,
            key=["id"],
            features=features,
        )
        assert run_refine_job(spark, config, say=lambda line: None) == 2
    found = {
        topic: delta_properties(spark, refined_table_location(warehouse, topic)).get("delta.enableChangeDataFeed")
        for topic in expected
    }
    assert found == expected
