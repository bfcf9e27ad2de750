"""The pipeline's DAG, topics -> raw -> refined (+ child tables) -> business, drawn as SVG.

`cdc graph FILE -o OUT.svg` writes the SVG; `-o OUT.html` a self-contained page around it (inline
SVG and styles, nothing fetched), which any browser opens. Each node is an SVG group with
``id`` (``<kind>:<name>``) and ``data-kind``; each edge a path with ``data-from`` and ``data-to``,
so the drawing can also be read by programs. A node may carry status lines and a level
(``cdc status --html`` draws them: :mod:`cdc.status_page`), shown under its name, the level as the
colour of its border and its ``data-level``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from cdc.core.errors import ConfigError
from cdc.pipeline.checks import table_names
from cdc.pipeline.config import Pipeline
from cdc.pipeline.sql_text import sql_tables
from refine.apply.flatten import child_table_name

KINDS = ("topic", "raw", "refined", "child", "business")
COLOURS = {"topic": "#fde68a", "raw": "#e5e7eb", "refined": "#bfdbfe", "child": "#ddd6fe", "business": "#bbf7d0"}
LEVELS = {"ok": ("#4b5563", 1), "warn": ("#d97706", 3), "error": ("#dc2626", 3)}  # border colour, width
NODE_W, NODE_H, LINE_H, GAP_X, GAP_Y, MARGIN = 220, 46, 15, 70, 18, 20


@dataclass(frozen=True)
class Node:
    kind: str
    name: str
    detail: str = ""
    lines: tuple[str, ...] = ()  # status lines under the detail
    level: str = "ok"  # one of LEVELS

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass
class Graph:
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)

    def add(self, node: Node, after: Node | None = None) -> Node:
        node = self.nodes.setdefault(node.id, node)
        if after is not None and (after.id, node.id) not in self.edges:
            self.edges.append((after.id, node.id))
        return node


def pipeline_graph(pipeline: Pipeline) -> Graph:
    graph = Graph()
    raw_of: dict[str, Node] = {}
    for name, source in pipeline.sources.items():
        detail = source.kind + (f", {source.format}" if hasattr(source, "format") else "")
        topics = source.topic or f"/{getattr(source, 'pattern', '')}/"  # a pattern: every topic it matches
        topic = graph.add(Node("topic", topics, f"source {name}: {detail}"))
        raw_of[name] = graph.add(Node("raw", topics, f"raw/{topics}"), after=topic)
    expectations: dict[str, list[str]] = {}
    for name, expectation in pipeline.expectations.items():
        expectations.setdefault(expectation.table, []).append(f"{name} ({expectation.action.value})")
    by_name: dict[str, Node] = {}
    for name, table in pipeline.refined.items():
        detail = ", ".join(
            filter(
                None,
                [
                    f"keys {', '.join(table.keys)}" if table.keys else "",
                    f"one table per {table.split_by}" if table.split_by else "",
                    f"SCD {table.scd.value}",
                    f"expects {', '.join(expectations[name])}" if name in expectations else "",
                ],
            )
        )
        refined = by_name[name] = graph.add(Node("refined", name, detail), after=raw_of.get(table.source))
        for path in table.explode:
            child = child_table_name(name, path)
            by_name[child] = graph.add(Node("child", child, f"{path}[pos]"), after=refined)
    for name in pipeline.business:
        by_name[name] = graph.add(Node("business", name, f"every {pipeline.business[name].trigger_interval_s:g} s"))
    known = table_names(pipeline)
    for name, business in pipeline.business.items():
        for reference in sorted(sql_tables(business.sql) & known.keys()):
            graph.add(by_name[name], after=by_name[reference])
    return graph


def _columns(graph: Graph) -> list[list[Node]]:
    """Nodes by column: a node one column right of everything it reads (business after business)."""
    depth: dict[str, int] = {}
    incoming: dict[str, list[str]] = {node: [] for node in graph.nodes}
    for source, target in graph.edges:
        incoming[target].append(source)

    def column(node_id: str, visiting: frozenset[str] = frozenset()) -> int:
        if node_id not in depth:
            base = KINDS.index(graph.nodes[node_id].kind) if graph.nodes[node_id].kind != "child" else 2
            parents = [p for p in incoming[node_id] if p not in visiting]
            depth[node_id] = max([base, *[column(p, visiting | {node_id}) + 1 for p in parents]])
        return depth[node_id]

    columns: list[list[Node]] = [[] for _ in range(max(map(column, graph.nodes), default=0) + 1)]
    for node_id, node in graph.nodes.items():
        columns[depth[node_id]].append(node)
    return [nodes for nodes in columns if nodes]


def render_svg(graph: Graph) -> str:
    positions: dict[str, tuple[int, int]] = {}
    columns = _columns(graph)
    node_h = NODE_H + LINE_H * max((len(node.lines) for node in graph.nodes.values()), default=0)
    for x, nodes in enumerate(columns):
        for y, node in enumerate(nodes):
            positions[node.id] = (MARGIN + x * (NODE_W + GAP_X), MARGIN + 24 + y * (node_h + GAP_Y))
    width = MARGIN * 2 + len(columns) * (NODE_W + GAP_X) - GAP_X
    height = MARGIN * 2 + 24 + max((len(nodes) for nodes in columns), default=0) * (node_h + GAP_Y)
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            'font-family="sans-serif" font-size="12">'
        ),
        (
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#6b7280"/></marker></defs>'
        ),
    ]
    for x, nodes in enumerate(columns):
        kinds = sorted({node.kind for node in nodes}, key=KINDS.index)
        parts.append(
            f'<text x="{MARGIN + x * (NODE_W + GAP_X)}" y="{MARGIN + 10}" font-weight="bold" '
            f'fill="#374151">{escape(" + ".join(kinds))}</text>'
        )
    for source, target in graph.edges:
        (x1, y1), (x2, y2) = positions[source], positions[target]
        x1, y1, y2 = x1 + NODE_W, y1 + node_h // 2, y2 + node_h // 2
        middle = (x1 + x2) // 2
        parts.append(
            f'<path class="edge" data-from={quoteattr(source)} data-to={quoteattr(target)} fill="none" '
            f'stroke="#6b7280" stroke-width="1.5" marker-end="url(#arrow)" '
            f'd="M {x1} {y1} C {middle} {y1}, {middle} {y2}, {x2} {y2}"/>'
        )
    for node in graph.nodes.values():
        x, y = positions[node.id]
        stroke, stroke_width = LEVELS[node.level]
        tip = "\n".join([f"{node.kind} {node.name}" + (f": {node.detail}" if node.detail else ""), *node.lines])
        lines = "".join(
            f'<text class="status" x="{x + 8}" y="{y + 36 + LINE_H * (number + 1)}" fill="#111827">'
            f"{escape(_cut(line, 34))}</text>"
            for number, line in enumerate(node.lines)
        )
        parts.append(
            f'<g class="node" id={quoteattr(node.id)} data-kind="{node.kind}" data-name={quoteattr(node.name)} '
            f'data-level="{node.level}"><title>{escape(tip)}</title>'
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{node_h}" rx="6" fill="{COLOURS[node.kind]}" '
            f'stroke="{stroke}" stroke-width="{stroke_width}"/>'
            f'<text x="{x + 8}" y="{y + 19}" font-weight="bold">{escape(_cut(node.name, 30))}</text>'
            f'<text x="{x + 8}" y="{y + 36}" fill="#4b5563">{escape(_cut(node.detail, 36))}</text>{lines}</g>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _cut(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def render_html(graph: Graph, title: str, intro: str = "") -> str:
    """A self-contained page of the graph: ``title``, the legend, ``intro`` (HTML) and the drawing."""
    legend = " ".join(
        f'<span style="background:{COLOURS[kind]};border:1px solid #4b5563;'
        f'padding:2px 8px;margin-right:6px">{kind}</span>'
        for kind in KINDS
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title></head>\n'
        f'<body style="font-family:sans-serif;margin:24px"><h1>{escape(title)}</h1>\n'
        f"<p>{legend}</p>\n{intro}<p>Hover a node for its details.</p>\n{render_svg(graph)}\n</body></html>\n"
    )


def write_graph(pipeline: Pipeline, output: Path) -> Path:
    """Write the pipeline's DAG to ``output``: ``.svg`` an image, ``.html`` a page."""
    graph = pipeline_graph(pipeline)
    match output.suffix.lower():
        case ".svg":
            output.write_text(render_svg(graph))
        case ".html" | ".htm":
            output.write_text(render_html(graph, f"pipeline {pipeline.name}"))
        case _:
            raise ConfigError("the output must end with .svg or .html", output=str(output))
    return output
