"""Reading a pipeline file: YAML, then the models, then the references; every problem named by its
key path (``refined.players.explode[0]``) and the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cdc.core.errors import ConfigError
from cdc.pipeline.checks import Problem, pipeline_problems
from cdc.pipeline.config import Pipeline, SchemaFile


class PipelineError(ConfigError):
    """A pipeline file with problems; ``problems`` holds one ``key: reason`` line each."""

    def __init__(self, file: Path, problems: list[str]) -> None:
        super().__init__(f"invalid pipeline: {'; '.join(problems)}", file=str(file))
        self.problems = problems


def key_path(parts: tuple[Any, ...] | list[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _duplicate_keys(node: yaml.Node, path: list[Any]) -> list[Problem]:
    """Keys given twice in one mapping (YAML would silently keep the last)."""
    problems: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        lines: dict[Any, int] = {}
        for key, value in node.value:
            name = key.value
            if name in lines:
                problems.append(
                    (key_path([*path, name]), f"given twice (lines {lines[name]} and {key.start_mark.line + 1})")
                )
            lines.setdefault(name, key.start_mark.line + 1)
            problems += _duplicate_keys(value, [*path, name])
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += _duplicate_keys(item, [*path, i])
    return problems


def read_document(file: Path) -> dict[str, Any]:
    """The YAML document of ``file``; a PipelineError for unreadable YAML or repeated keys."""
    try:
        text = file.read_text()
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except OSError as error:
        raise PipelineError(file, [f"cannot read the file: {error.strerror}"]) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise PipelineError(file, [f"{where}not valid YAML: {getattr(error, 'problem', None) or error}"]) from None
    if node is None or not isinstance(node, yaml.MappingNode):
        raise PipelineError(file, ["the file must hold a YAML mapping (name, sources, refined, ...)"])
    if duplicates := _duplicate_keys(node, []):
        raise PipelineError(file, [f"{key}: {reason}" for key, reason in duplicates])
    return yaml.safe_load(text)


def _document_path(document: Any, loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the user's key path: union tags (not keys of the file) left out."""
    parts: list[Any] = []
    node = document
    for i, part in enumerate(loc):
        if (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and part < len(node)
        ):
            node = node[part]
        elif i < len(loc) - 1 or part == "[key]":
            continue  # a discriminated union's tag, or pydantic's marker of a dict key
        else:
            node = None
        parts.append(part)
    return key_path(parts) or "(top level)"


def load_pipeline(file: Path | str) -> Pipeline:
    """The pipeline of ``file``, fully checked; a PipelineError lists every problem.

    Example::

        from cdc import load_pipeline

        pipeline = load_pipeline("examples/pipelines/shop.yaml")  # as `cdc validate` checks it
    """
    file = Path(file)
    document = read_document(file)
    try:
        pipeline = Pipeline.model_validate(document)
    except ValidationError as error:
        raise PipelineError(
            file,
            [
                f"{_document_path(document, item['loc'])}: {item['msg'].removeprefix('Value error, ')}"
                for item in error.errors()
            ],
        ) from None
    if problems := pipeline_problems(pipeline, file.parent):
        raise PipelineError(file, [f"{key}: {reason}" for key, reason in problems])
    return _key_files_under(_schema_files_under(pipeline, file.parent), file.parent)


def _key_files_under(pipeline: Pipeline, base_dir: Path) -> Pipeline:
    """``pipeline`` with absolute ``mask_key`` file paths (relative ones are relative to the pipeline file)."""
    refined = {}
    for name, table in pipeline.refined.items():
        key = table.mask_key
        if key is not None and key.file is not None and not key.file.expanduser().is_absolute():
            key = key.model_copy(update={"file": (base_dir / key.file).absolute()})
            refined[name] = table.model_copy(update={"mask_key": key})
        else:
            refined[name] = table
    return pipeline.model_copy(update={"refined": refined})


def _schema_files_under(pipeline: Pipeline, base_dir: Path) -> Pipeline:
    """``pipeline`` with absolute schema file paths: the jobs that read them run from any folder."""
    sources = {}
    for name, source in pipeline.sources.items():
        schema = getattr(source, "schema_", None)
        if isinstance(schema, SchemaFile) and not schema.path.is_absolute():
            absolute = schema.model_copy(update={"path": (base_dir / schema.path).absolute()})
            sources[name] = source.model_copy(update={"schema_": absolute})
        else:
            sources[name] = source
    return pipeline.model_copy(update={"sources": sources})
