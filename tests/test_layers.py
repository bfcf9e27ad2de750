"""The import contracts: layers with one direction, and no import cycle.

From the bottom up: the core (``cdc.core``: configuration, errors, storage, Delta helpers, the Spark
session and its JVM helpers); raw landing (``cdc.raw``) and refinement (``refine``), which never import
each other; orchestration (pipelines, event topics, business tables, sync, status, maintenance); the
Python API (``cdc.api``, re-exported by ``cdc``); the CLI on top. The local stack, the demos and the
connector definitions sit beside: they may use the library, and nothing in the library imports them.

Every import counts, the ones inside functions too: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cdc", "refine", "connectors")

ORCHESTRATION = ("cdc.pipeline", "cdc.sync", "cdc.status", "cdc.status_page", "cdc.maintenance", "cdc.class_training")
BESIDE = ("cdc.stack", "cdc.demo", "connectors")
# layer -> the module prefixes in it, and the layers it may import
LAYERS: dict[str, tuple[tuple[str, ...], set[str]]] = {
    "core": (("cdc.core",), {"core"}),
    "raw": (("cdc.raw",), {"core", "raw"}),
    "refine": (("refine",), {"core", "refine"}),
    "orchestration": (ORCHESTRATION, {"core", "raw", "refine", "orchestration"}),
    "api": (("cdc.api", "cdc"), {"core", "raw", "refine", "orchestration", "api"}),
    "cli": (("cdc.cli",), {"core", "raw", "refine", "orchestration", "api", "cli", "beside"}),
    "beside": (BESIDE, {"core", "raw", "refine", "orchestration", "api", "beside"}),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (``from cdc.core import jars`` is ``cdc.core.jars``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def layer_of(module: str) -> str:
    """The layer of the longest prefix that names ``module`` (``cdc`` alone is the API's package)."""
    best, length = None, -1
    for layer, (prefixes, _) in LAYERS.items():
        for prefix in prefixes:
            matches = module == prefix or (module.startswith(prefix + ".") and prefix != "cdc")
            if matches and len(prefix) > length:
                best, length = layer, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py's LAYERS")
    return best


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}


def test_every_module_is_in_a_layer():
    for module in project_modules():
        layer_of(module)


def test_imports_go_down_the_layers_only():
    wrong = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer_of(target) not in LAYERS[layer_of(module)][1]
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle():
    assert import_cycles(import_graph()) == []


@pytest.mark.parametrize(
    ("graph", "cycles"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(graph, cycles):
    assert import_cycles(graph) == cycles
