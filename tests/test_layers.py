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
import re
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


# refine's stages, bottom up: each module imports refine modules of its own stage or the ones before it.
REFINE_STAGES = ("refine.records", "refine.quality", "refine.apply", "refine.mongo", "refine")


def refine_stage(module: str) -> int:
    """The position in :data:`REFINE_STAGES` of the stage holding ``module`` (a module of ``refine`` itself
    is in the last)."""
    stages = [i for i, stage in enumerate(REFINE_STAGES) if module == stage or module.startswith(stage + ".")]
    return stages[0]


def test_refine_is_stages_that_import_only_downwards():
    refine = {module: targets for module, targets in import_graph().items() if layer_of(module) == "refine"}
    for stage in REFINE_STAGES[:-1]:  # each stage is a package with modules of its own
        assert any(module.startswith(stage + ".") for module in refine), f"{stage} holds no module"
    wrong = [
        f"{module} ({REFINE_STAGES[refine_stage(module)]}) imports {target} ({REFINE_STAGES[refine_stage(target)]})"
        for module, targets in sorted(refine.items())
        for target in sorted(targets)
        if target.startswith("refine") and refine_stage(target) > refine_stage(module)
    ]
    assert not wrong, "imports against refine's stages:\n" + "\n".join(wrong)


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


def test_paths_the_code_cites_exist():
    """A module or test moved leaves no comment, docstring, setting or document naming it where it was."""
    cited = re.compile(
        r"(?<![/\w.-])(?:cdc|refine|tests|bench|docs|examples|connectors)/[\w/.-]*\.(?:py|md|java|yaml|json|sql)\b"
    )  # not inside a URL
    files = [ROOT / "pyproject.toml", ROOT / "dev", ROOT / "docker" / "compose.yml", ROOT / "README.md"]
    files += [ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")]
    files += [path for folder in ("cdc", "refine", "tests", "bench") for path in (ROOT / folder).rglob("*.py")]
    missing = [
        f"{path.relative_to(ROOT)} cites {name}"
        for path in files
        for name in cited.findall(path.read_text(encoding="utf-8"))
        if not (ROOT / name).exists() and not (path.parent / name).exists()  # from the root, or the file's folder
    ]
    assert not missing, "\n".join(missing)
