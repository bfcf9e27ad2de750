"""A client of a Confluent-compatible schema registry: the two reads a refine job needs.

``GET /subjects/<subject>/versions/latest`` gives the schema a job reads events as (its id, text and
type); ``GET /schemas/ids/<id>`` gives the schema a record was written with, by the id its value
carries. Both run on the driver (a schema is not data); no credentials are sent.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from cdc.core.errors import ConfigError

# The registry's media type; plain JSON is accepted too.
ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema of the registry: its id, its text and its type (AVRO, PROTOBUF or JSON)."""

    id: int
    text: str
    schema_type: str


class SchemaRegistryClient:
    """Reads schemas from the registry at ``url``; every failure is a ConfigError naming the URL."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version of ``subject``; a ConfigError when the registry holds no such subject."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        document = self._get(path, subject=subject)
        if document is None:
            raise ConfigError(f"the schema registry at {self.url} has no subject {subject!r}", subject=subject)
        return _registered(document, document.get("id"), self.url + path)

    def latest_of_type(self, subject: str, schema_type: str, topic: str) -> RegisteredSchema:
        """The latest version of ``subject``; a ConfigError unless its type is ``schema_type`` (AVRO, PROTOBUF)."""
        latest = self.latest(subject)
        if latest.schema_type != schema_type:
            wanted = {"AVRO": "an Avro", "PROTOBUF": "a Protobuf"}.get(schema_type, f"a {schema_type}")
            raise ConfigError(
                f"the schema registry at {self.url} holds a {latest.schema_type} schema for subject "
                f"{subject}, not {wanted} one",
                topic=topic,
            )
        return latest

    def by_id(self, schema_id: int) -> RegisteredSchema | None:
        """The schema with id ``schema_id``; None when the registry does not hold it."""
        path = f"/schemas/ids/{schema_id}"
        document = self._get(path)
        return None if document is None else _registered(document, schema_id, self.url + path)

    def _get(self, path: str, **context: str) -> dict | None:
        """The JSON document at ``path``; None for a 404 (the one answer that is about the data asked for)."""
        request = urllib.request.Request(self.url + path, headers={"Accept": ACCEPT})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise ConfigError(
                f"the schema registry at {self.url} answered {error.code} to GET {path}: {_error_message(error)}",
                **context,
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", None) or error
            raise ConfigError(f"cannot reach the schema registry at {self.url}: {reason}", **context) from None
        except ValueError:
            raise ConfigError(
                f"the schema registry at {self.url} answered GET {path} with no JSON document", **context
            ) from None


def _registered(document: dict, schema_id: object, where: str) -> RegisteredSchema:
    if not isinstance(schema_id, int) or not isinstance(document.get("schema"), str):
        raise ConfigError(f"{where} answered without a schema id and text: not a Confluent-compatible registry")
    # The registry leaves schemaType out for Avro, its first and default type.
    return RegisteredSchema(id=schema_id, text=document["schema"], schema_type=document.get("schemaType", "AVRO"))


def _error_message(error: urllib.error.HTTPError) -> str:
    """The registry's own message (``{"error_code": ..., "message": ...}``), else the HTTP reason."""
    try:
        return json.loads(error.read()).get("message") or error.reason
    except (ValueError, AttributeError, OSError):
        return str(error.reason)
