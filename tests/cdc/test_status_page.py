"""`cdc status --html`: the warehouse's DAG with each table's numbers, looked at in headless Chromium
(Debian's package, driven by Playwright) as a user would: what is drawn, where, and in which colour."""

from __future__ import annotations

import json
import shutil

import pytest

from cdc import Lakehouse, StreamError
from cdc.cli import main

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium's own background connections are refused on a closed network: keep it from trying.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def change(op: str, lsn: int, after: dict | None) -> tuple[bytes, bytes]:
    envelope = {
        "before": None,
        "after": after,
        "op": op,
        "ts_ms": 1_763_700_000_000 + lsn,
        "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "t", "lsn": lsn},
    }
    return json.dumps({"id": (after or {}).get("id", 0)}).encode(), json.dumps(envelope).encode()


def test_the_status_page_draws_each_tables_numbers_on_its_node(spark, kafka, unique_name, tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    healthy, troubled, failing = (kafka.create_topic(f"{unique_name}.{name}") for name in ("ok", "bad", "fails"))
    warehouse = str(tmp_path / "warehouse")
    lake = Lakehouse(warehouse, spark=spark, kafka={"bootstrap_servers": kafka.bootstrap_servers}, say=lambda _: None)
    columns = {"id": "bigint", "name": "string"}
    good = [change("c", 10, {"id": 1, "name": "a"}), change("c", 20, {"id": 2, "name": "b"})]
    for topic in (healthy, failing):
        kafka.produce(topic, good)
    kafka.produce(troubled, [good[0], (b'{"id": 2}', b'{"op": "c", "after": {')])  # truncated: quarantined
    lake.land([healthy, troubled, failing])
    for topic in (healthy, troubled):
        assert lake.refine(topic, columns=columns, key=["id"]) == 2
    kafka.produce(healthy, [change("c", 30, {"id": 3, "name": "c"})])  # in Kafka, not landed: lag 1
    (tmp_path / "warehouse" / "refined" / failing).write_text("not a table")  # its first batch fails
    with pytest.raises(StreamError):
        lake.refine(failing, columns=columns, key=["id"])

    page = tmp_path / "status.html"
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    for _run in range(2):  # written again, the page is replaced
        assert main(["status", "--warehouse", warehouse, "--html", str(page)]) == 0

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            view = browser.new_page(viewport={"width": 1400, "height": 900})
            view.goto(page.as_uri())
            assert view.title().startswith("status of warehouse at ")

            def node(kind: str, name: str):
                found = view.locator(f'g.node[id="{kind}:{name}"]')
                assert found.count() == 1, f"no {kind} node {name}"
                assert found.is_visible()
                return found

            def lines(kind: str, name: str) -> list[str]:
                return node(kind, name).locator("text.status").all_text_contents()

            def border(kind: str, name: str) -> str:
                return node(kind, name).locator("rect").evaluate("rect => getComputedStyle(rect).stroke")

            assert lines("topic", healthy) == ["end offsets 3"]
            assert lines("raw", healthy)[1:] == ["lag 1"]
            assert lines("refined", healthy)[1] == "behind 0 changes"
            assert node("refined", healthy).get_attribute("data-level") == "ok"
            assert border("refined", healthy) == "rgb(75, 85, 99)"

            assert lines("raw", troubled)[2] == "1 quarantined"
            assert node("raw", troubled).get_attribute("data-level") == "warn"
            assert border("raw", troubled) == "rgb(217, 119, 6)"

            assert node("refined", failing).get_attribute("data-level") == "error"
            assert border("refined", failing) == "rgb(220, 38, 38)"
            assert lines("refined", failing)[:2] == ["no batch yet", "behind 2 changes"]
            assert lines("refined", failing)[2].startswith("error: ")
            assert "a refine batch failed" in node("refined", failing).locator("title").text_content() or ""

            # Each raw node is drawn left of its refined node, joined by an arrow.
            for topic in (healthy, troubled, failing):
                raw_box, refined_box = node("raw", topic).bounding_box(), node("refined", topic).bounding_box()
                assert raw_box
                assert refined_box
                assert raw_box["x"] + raw_box["width"] < refined_box["x"]
                edge = view.locator(f'path.edge[data-from="raw:{topic}"][data-to="refined:{topic}"]')
                assert edge.count() == 1
            view.screenshot(path=str(tmp_path / "status.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "status.png").stat().st_size > 10_000


def test_a_whole_database_pipeline_is_drawn_with_a_node_per_landed_table():
    from cdc.pipeline.config import Pipeline
    from cdc.status import RawTableStatus, WarehouseStatus
    from cdc.status_page import status_graph

    pipeline = Pipeline.model_validate(
        {
            "name": "db",
            "sources": {"shop": {"kind": "debezium_postgres", "pattern": r"demo\.shop\..*"}},
            "refined": {"shop": {"source": "shop", "name_prefix": "pg_"}},
        }
    )
    raw = [RawTableStatus(topic, f"/w/raw/{topic}", 1, 3, 0, 0) for topic in ("demo.shop.a", "demo.shop.b")]
    graph = status_graph(WarehouseStatus(raw_tables=raw, expectations=[]), pipeline)
    refined = sorted(node.name for node in graph.nodes.values() if node.kind == "refined")
    assert refined == ["pg_a", "pg_b"]
