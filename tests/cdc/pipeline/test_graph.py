"""`cdc graph`: the DAG as SVG and as a self-contained HTML page, read back as XML."""

import xml.etree.ElementTree as ET
from pathlib import Path

from cdc.cli import main

EXAMPLES = Path(__file__).parents[3] / "examples" / "pipelines"
SVG = "{http://www.w3.org/2000/svg}"


def nodes_and_edges(svg: ET.Element) -> tuple[dict[str, str], set[tuple[str, str]]]:
    nodes = {group.get("id"): group.get("data-kind") for group in svg.iter(f"{SVG}g") if group.get("class") == "node"}
    edges = {
        (path.get("data-from"), path.get("data-to")) for path in svg.iter(f"{SVG}path") if path.get("class") == "edge"
    }
    return nodes, edges


def test_the_game_events_graph_as_svg(tmp_path, capsys):
    output = tmp_path / "games.svg"
    assert main(["graph", str(EXAMPLES / "game_events.yaml"), "-o", str(output)]) == 0
    assert capsys.readouterr().out == f"wrote {output}\n"
    nodes, edges = nodes_and_edges(ET.parse(output).getroot())
    assert nodes == {
        "topic:game-events": "topic",
        "raw:game-events": "raw",
        "refined:events": "refined",
        "refined:players": "refined",
        "child:events__items": "child",
        "child:players__items": "child",
        "business:player_sessions": "business",
    }
    assert edges == {
        ("topic:game-events", "raw:game-events"),
        ("raw:game-events", "refined:events"),
        ("raw:game-events", "refined:players"),
        ("refined:events", "child:events__items"),
        ("refined:players", "child:players__items"),
        ("refined:events", "business:player_sessions"),
    }
    positions = {
        g.get("id"): float(g.find(f"{SVG}rect").get("x"))
        for g in ET.parse(output).getroot().iter(f"{SVG}g")
        if g.get("class") == "node"
    }
    for source, target in edges:  # every edge points right: a layered DAG
        assert positions[source] < positions[target]


def test_the_shop_graph_as_an_html_page(tmp_path):
    output = tmp_path / "shop.html"
    assert main(["graph", str(EXAMPLES / "shop.yaml"), "-o", str(output)]) == 0
    html = output.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from the network
    svg = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + len("</svg>")])
    nodes, edges = nodes_and_edges(svg)
    assert {node for node, kind in nodes.items() if kind == "business"} == {
        "business:customer_order_totals",
        "business:customers_per_tag",
    }
    assert ("child:customers__tags", "business:customers_per_tag") in edges
    assert ("refined:customers", "business:customer_order_totals") in edges
    assert ("refined:orders", "business:customer_order_totals") in edges
    assert "raw:demo.shop.page_views" in nodes
    titles = " ".join(title.text for title in svg.iter(f"{SVG}title"))
    assert "order_amount_not_negative (drop)" in titles


def test_business_tables_reading_business_tables_go_further_right(tmp_path):
    file = tmp_path / "p.yaml"
    file.write_text("""
name: chain
sources: {s: {kind: events, format: json, topic: t}}
refined: {r: {source: s}}
business:
  b2: {sql: "SELECT * FROM b1"}
  b1: {sql: "SELECT * FROM r"}
""")
    output = tmp_path / "chain.svg"
    assert main(["graph", str(file), "-o", str(output)]) == 0
    root = ET.parse(output).getroot()
    x = {g.get("id"): float(g.find(f"{SVG}rect").get("x")) for g in root.iter(f"{SVG}g") if g.get("class") == "node"}
    assert x["topic:t"] < x["raw:t"] < x["refined:r"] < x["business:b1"] < x["business:b2"]


def test_an_unknown_output_type_is_refused(tmp_path, capsys):
    assert main(["graph", str(EXAMPLES / "shop.yaml"), "-o", str(tmp_path / "g.png")]) == 2
    assert "the output must end with .svg or .html" in capsys.readouterr().err
