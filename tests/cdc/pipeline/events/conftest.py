"""Fixtures of the event topic tests: raw rows as `cdc raw` lands them, decoded events by offset, and a
schema registry of the test's own."""

from __future__ import annotations

import pytest


@pytest.fixture
def raw_records(spark):
    """``raw_records(values)``: raw rows as `cdc raw` lands them (partition 0, offsets 0, 1, ...): text in
    ``value`` (a str, or bytes that are UTF-8), other bytes in ``value_bytes``, None for a null record."""

    def columns(value: str | bytes | None) -> tuple[str | None, bytes | None]:
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8"), None
            except UnicodeDecodeError:
                return None, value
        return value, None

    def rows(values: list):
        records = [(*columns(value), 0, offset) for offset, value in enumerate(values)]
        return spark.createDataFrame(records, "value string, value_bytes binary, partition int, offset long")

    return rows


def problems_and_events(decoded) -> tuple[list, list]:
    """A decoded batch's problems and good events (as dicts; None where there is a problem), by offset."""
    rows = decoded.orderBy("kafka_offset").collect()
    return [row.problem for row in rows], [
        row.event.asDict(recursive=True) if row.problem is None else None for row in rows
    ]


@pytest.fixture(name="problems_and_events")
def problems_and_events_fixture():
    return problems_and_events


class FakeSchemaRegistry:
    """The two reads of a Confluent-compatible schema registry that refine jobs make, served from this
    process on 127.0.0.1: ``GET /subjects/<subject>/versions/latest`` and ``GET /schemas/ids/<id>``.

    A stand-in, not the real thing: Confluent's Schema Registry is on neither Maven Central nor PyPI,
    so it cannot be installed here. Registered schemas get ids from 1 up, as the real one gives them.
    """

    def __init__(self) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        self.schemas: dict[int, tuple[str, str]] = {}  # id -> (schema text, schema type)
        self.subjects: dict[str, list[int]] = {}  # subject -> its versions' ids, oldest first
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake schema registry", daemon=True)
        self.thread.start()

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """Add ``schema`` as the latest version of ``subject``; return its id."""
        schema_id = len(self.schemas) + 1
        self.schemas[schema_id] = (schema, schema_type)
        self.subjects.setdefault(subject, []).append(schema_id)
        return schema_id

    def _answer(self, path: str) -> tuple[int, dict]:
        import re
        from urllib.parse import unquote

        if match := re.fullmatch(r"/subjects/([^/]+)/versions/latest", path):
            subject = unquote(match.group(1))
            if subject not in self.subjects:
                return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
            schema_id = self.subjects[subject][-1]
            return 200, {
                "subject": subject,
                "version": len(self.subjects[subject]),
                "id": schema_id,
                **self._schema(schema_id),
            }
        if (match := re.fullmatch(r"/schemas/ids/(\d+)", path)) and int(match.group(1)) in self.schemas:
            return 200, self._schema(int(match.group(1)))
        if match:
            return 404, {"error_code": 40403, "message": "Schema not found"}
        return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}

    def _schema(self, schema_id: int) -> dict:
        text, schema_type = self.schemas[schema_id]
        # As the real registry does, Avro (the default type) goes without a schemaType.
        return {"schema": text} if schema_type == "AVRO" else {"schema": text, "schemaType": schema_type}

    def _handler(self):
        import json
        from http.server import BaseHTTPRequestHandler

        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for the GET handler
                status, document = registry._answer(self.path)
                body = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # quiet test output
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def schema_registry():
    """A :class:`FakeSchemaRegistry` of this test's own, stopped afterwards."""
    registry = FakeSchemaRegistry()
    yield registry
    registry.close()
