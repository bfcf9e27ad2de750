"""`cdc status --html PAGE`: the warehouse's status drawn as its DAG, topics -> raw -> refined (and, given
a pipeline, its child and business tables), with the numbers of ``cdc status`` on each node.

A self-contained page (inline SVG and styles, nothing fetched; :mod:`cdc.pipeline.graph` draws it).
Each node shows what is known of its table and a level, drawn as the colour of its border:

- topic: Kafka's end offsets (``warn`` when Kafka did not answer);
- raw: Delta version, rows, lag behind the topic, quarantined records and recorded gaps (``warn``
  when records are quarantined or offsets were lost);
- refined: the last batch, the raw version refined up to, the changes behind its raw table, the
  expectation failures (``warn`` when behind or rows failed an expectation) and the last error
  (``error``; the whole message in the node's tooltip).

The page is a picture of one moment (its time is in the heading); write it again to refresh it.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from xml.sax.saxutils import escape

from cdc.core.errors import ConfigError
from cdc.pipeline.config import Pipeline
from cdc.pipeline.database import expanded
from cdc.pipeline.graph import Graph, Node, pipeline_graph, render_html
from cdc.status import WarehouseStatus


def status_graph(status: WarehouseStatus, pipeline: Pipeline | None = None) -> Graph:
    """The DAG of ``pipeline`` (else of the tables ``status`` found), each node annotated with its status.

    Example::

        graph = status_graph(Lakehouse("/data/warehouse").status())
        troubled = [node.name for node in graph.nodes.values() if node.level != "ok"]
    """
    if pipeline is not None:  # a source's `pattern` stands for the tables of the topics landed
        with contextlib.suppress(ConfigError):  # names that collide: the job says so; the page draws the file
            pipeline = expanded(pipeline, [raw.topic for raw in status.raw_tables])
    graph = pipeline_graph(pipeline) if pipeline is not None else Graph()
    topic_of_raw: dict[str, str] = {}
    for raw in status.raw_tables:
        topic_of_raw[raw.table] = raw.topic
        ends = [p.end for p in raw.partitions]
        known = status.kafka_error is None and None not in ends
        topic_node = graph.add(Node("topic", raw.topic, "Kafka topic"))
        _annotate(
            graph,
            topic_node,
            [f"end offsets {sum(e or 0 for e in ends):,}" if known else "end offsets unknown"],
            "ok" if known else "warn",
        )
        lags = [p.lag for p in raw.partitions]
        lag = f"lag {sum(x or 0 for x in lags):,}" if known else "lag unknown (Kafka did not answer)"
        troubles = [f"{raw.quarantined:,} quarantined"] if raw.quarantined else []
        troubles += [f"{raw.recorded_gaps:,} gaps (offsets lost)"] if raw.recorded_gaps else []
        node = graph.add(Node("raw", raw.topic, f"raw/{raw.topic}"), after=topic_node)
        lines = [f"version {raw.version} · {raw.rows:,} rows", lag, *([", ".join(troubles)] if troubles else [])]
        _annotate(graph, node, lines, "warn" if troubles or not known else "ok")
    failed: dict[str, int] = {}
    for total in status.expectations:
        failed[total.table] = failed.get(total.table, 0) + total.failed
    for refined in status.refined_tables:
        topic = topic_of_raw.get(refined.raw)
        raw_node = graph.nodes.get(f"raw:{topic}") if topic else None
        node = graph.add(Node("refined", refined.name, f"refined/{refined.name}"), after=raw_node)
        lines = [
            "no batch yet"
            if refined.last_batch is None
            else f"batch {refined.last_batch} · raw version {refined.raw_version}",
            "behind: unknown" if refined.behind is None else f"behind {refined.behind:,} changes",
        ]
        level = "warn" if refined.behind else "ok"
        if failed.get(refined.name):
            lines.append(f"{failed[refined.name]:,} rows failed expectations")
            level = "warn"
        if refined.last_error is not None:
            lines.append(f"error: {refined.last_error.error}")
            level = "error"
        _annotate(graph, node, lines, level)
    return graph


def render_status_page(status: WarehouseStatus, pipeline: Pipeline | None = None, title: str = "") -> str:
    """The status page's HTML (see :func:`status_graph`).

    Example::

        html = render_status_page(Lakehouse("/data/warehouse").status(), title="shop")
    """
    at = datetime.now(UTC).isoformat(timespec="seconds")
    heading = title or (f"pipeline {pipeline.name}" if pipeline is not None else "warehouse")
    intro = (
        f'<p class="warning">Kafka did not answer: {escape(status.kafka_error)}</p>\n'
        if status.kafka_error is not None
        else ""
    )
    return render_html(status_graph(status, pipeline), f"status of {heading} at {at}", intro)


def write_status_page(status: WarehouseStatus, output: Path, pipeline: Pipeline | None = None) -> Path:
    """Write the status page to ``output`` (an ``.html`` file); return its path.

    Example::

        write_status_page(Lakehouse("/data/warehouse").status(), Path("status.html"))
    """
    output.write_text(render_status_page(status, pipeline))
    return output


def _annotate(graph: Graph, node: Node, lines: list[str], level: str) -> None:
    graph.nodes[node.id] = replace(graph.nodes[node.id], lines=tuple(lines), level=level)
