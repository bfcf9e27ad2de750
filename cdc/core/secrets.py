"""Secrets files: settings kept out of the environment and the command line (Kafka's, the object store's),
read from YAML or JSON and reported by key, never by value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cdc.core.errors import ConfigError


def read_secrets_file(path: Path, what: str) -> dict[str, Any]:
    """The mapping of settings in the ``what`` (e.g. "Kafka") secrets file at ``path``."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read the {what} secrets file: {error.strerror}", file=str(path)) from None
    except yaml.YAMLError:
        raise ConfigError(f"the {what} secrets file is not YAML or JSON", file=str(path)) from None
    if not isinstance(document, dict):
        raise ConfigError(f"the {what} secrets file must hold a mapping of settings", file=str(path))
    return document


def invalid_secrets(path: Path, what: str, error: ValidationError) -> ConfigError:
    """The error of a secrets file whose settings do not validate, naming each key and the kind of its
    problem only: pydantic's own message could quote a secret's value."""
    problems = "; ".join(f"{'.'.join(map(str, item['loc'])) or 'settings'}: {item['type']}" for item in error.errors())
    return ConfigError(f"invalid {what} secrets file {path}: {problems}")
