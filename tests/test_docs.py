"""The user documents stay true to the code (no Spark, no stack).

- docs/reference/cli.md names every subcommand and every option of the `cdc` parser;
- docs/reference/configuration.md names every key of the environment settings, the raw and refine job
  configurations and the pipeline file, walking nested models;
- docs/reference/errors.md gives every CdcError subclass with its exit code;
- docs/reference/tables.md names every column of the raw table;
- docs/python-api.md gives every public method of `cdc.Lakehouse` with the code's signature, and each
  class a method returns is exported by `cdc`;
- every relative link of README.md, bench/README.md and docs/**/*.md points at a file that exists, and
  at a heading of it when it names one;
- the CHANGELOG keeps Keep a Changelog's form.
"""

from __future__ import annotations

import argparse
import inspect
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

# Everything the documents describe, imported here only, so that a module moving is fixed in one place.
import cdc
from cdc.api import Lakehouse
from cdc.cli import build_parser
from cdc.core.config import Settings
from cdc.core.errors import CdcError
from cdc.pipeline.config import Pipeline
from cdc.raw.config import RawJobConfig
from cdc.raw.table import RAW_SCHEMA
from refine.job import RefineJobConfig

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def _text(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


# --- the CLI -------------------------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of the parser and of every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _commands(command, (*path, name))


def _cli_terms() -> list[str]:
    terms = []
    for path, parser in _commands(build_parser()):
        if path:
            terms.append(f"`cdc {' '.join(path)}`")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.option_strings:
                terms += [f"`{option}" for option in action.option_strings]
            else:
                terms.append(f"`{action.metavar or action.dest}`")
    return sorted(set(terms))


def test_cli_reference_names_every_subcommand_and_option():
    assert len(_cli_terms()) > 40  # the walk reached the subcommands
    text = _text("cli.md")
    missing = [term for term in _cli_terms() if term not in text]
    assert not missing, f"docs/reference/cli.md lacks: {', '.join(missing)}"


# --- configuration -------------------------------------------------------------------------------


def _models(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models inside a field's annotation (through Annotated, unions, lists, dicts)."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [model for argument in typing.get_args(annotation) for model in _models(argument)]


def _keys(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Every key (as written: aliases win) of ``model`` and of the models nested in it."""
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(field.alias or name)
        for nested in _models(field.annotation):
            keys |= _keys(nested, seen)
    return keys


def test_model_walk_reaches_nested_models():
    keys = _keys(Pipeline)
    # sources -> events -> schema registry; refined -> flatten
    assert {"sources", "format", "subject", "url", "keep", "split_by", "trigger_interval_s"} <= keys
    assert {"interval_s", "sasl_mechanism", "pattern"} <= _keys(RawJobConfig)
    assert {"position_columns", "condition"} <= _keys(RefineJobConfig)


@pytest.mark.parametrize("model", [Settings, RawJobConfig, RefineJobConfig, Pipeline], ids=lambda m: m.__name__)
def test_configuration_reference_names_every_key(model: type[BaseModel]):
    text = _text("configuration.md")
    missing = sorted(key for key in _keys(model) if f"`{key}`" not in text)
    assert not missing, f"docs/reference/configuration.md lacks keys of {model.__name__}: {', '.join(missing)}"


# --- errors and tables ---------------------------------------------------------------------------


def _subclasses(base: type) -> list[type]:
    return [cls for sub in base.__subclasses__() for cls in (sub, *_subclasses(sub))]


def test_errors_reference_gives_every_error_and_its_exit_code():
    errors = [CdcError, *_subclasses(CdcError)]
    assert len(errors) >= 10
    lines = _text("errors.md").splitlines()
    missing = [
        f"{error.__name__} (exit {error.exit_code})"
        for error in errors
        if not any(f"`{error.__name__}`" in line and re.search(rf"\b{error.exit_code}\b", line) for line in lines)
    ]
    assert not missing, f"docs/reference/errors.md lacks, on one line, the name and exit code of: {', '.join(missing)}"


def test_tables_reference_names_every_raw_column():
    text = _text("tables.md")
    missing = [field.name for field in RAW_SCHEMA.fields if f"`{field.name}`" not in text]
    assert not missing, f"docs/reference/tables.md lacks raw table columns: {', '.join(missing)}"


# --- links ---------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    return {_anchor(match) for match in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def _links(document: Path) -> list[str]:
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_link_check_reads_links_and_anchors():
    assert "rebuilding-a-refined-table---rebuild" in _anchors(ROOT / "docs" / "concepts" / "refine.md")
    assert "docs/reference/cli.md" in _links(ROOT / "README.md")


@pytest.mark.parametrize("document", _documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings_that_exist(document: Path):
    broken = []
    for target in _links(document):
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{document.relative_to(ROOT)}: broken links: {', '.join(broken)}"


# --- the CHANGELOG -------------------------------------------------------------------------------

CHANGE_KINDS = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]  # Keep a Changelog's order
CITED_DOCUMENT = re.compile(r"`((?:docs|bench|examples)/[\w./-]+\.\w+)`")


def test_the_changelog_keeps_a_changelogs_form_and_cites_documents_that_exist():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    assert releases[1] == "[Unreleased]", "the first release section is [Unreleased]"
    for name, body in zip(releases[1::2], releases[2::2], strict=True):
        kinds = re.findall(r"^### (.+)$", body, flags=re.MULTILINE)
        assert kinds == [kind for kind in CHANGE_KINDS if kind in kinds], (
            f"{name}: sections {kinds}, each once, in order"
        )
    missing = [path for path in CITED_DOCUMENT.findall(text) if not (ROOT / path).exists()]
    assert not missing, f"CHANGELOG.md cites documents that do not exist: {', '.join(missing)}"


# --- the Python API ------------------------------------------------------------------------------


def _signature(name: str, function) -> str:
    """``name(a, b=None, *, c="x")`` as docs/python-api.md writes it (``self`` left out)."""
    parts, keyword_only = [], False
    for parameter in list(inspect.signature(function).parameters.values())[1:]:
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        default = parameter.default
        if default is parameter.empty:
            parts.append(parameter.name)
        else:
            shown = f'"{default}"' if isinstance(default, str) else getattr(default, "__name__", None) or repr(default)
            parts.append(f"{parameter.name}={shown}")
    return f"{name}({', '.join(parts)})"


def test_the_python_api_page_gives_every_method_with_the_codes_signature():
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    assert f"## `{_signature('Lakehouse', Lakehouse.__init__)}`" in text
    method_row = re.compile(r"^\| `((\w+)\(.*?\))` \|[^|]*\| ([^|]*) \|$", re.MULTILINE)
    rows = {name: (signature, returns) for signature, name, returns in method_row.findall(text)}
    methods = sorted(name for name, member in vars(Lakehouse).items() if not name.startswith("_") and callable(member))
    assert sorted(rows) == methods, "docs/python-api.md's table of methods"
    for name in methods:
        method = getattr(Lakehouse, name)
        signature, returns = rows[name]
        assert signature == _signature(name, method)
        # Each class the method returns (by its annotation) is named in the row and exported by `cdc`.
        annotation = str(inspect.signature(method).return_annotation)
        for returned in re.findall(r"\b[A-Z]\w+", annotation):
            if returned not in {"Path", "DeltaTable", "SparkSession"}:  # pathlib's, Delta's and Spark's own
                assert returned in cdc.__all__, f"{name} returns {returned}, which `cdc` does not export"
                assert re.search(rf"`[^`]*\b{returned}\b[^`]*`", returns), (
                    f"docs/python-api.md: {name} returns {returned}"
                )
