"""A small client for Kafka Connect's REST API: register, list, check and remove connectors."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from cdc.core.errors import ConnectorError
from connectors.definitions import ConnectorDefinition


class ConnectClient:
    """Talks to one Kafka Connect worker at ``url`` (``http://127.0.0.1:8083``)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: object | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except ValueError:
                pass
            raise ConnectorError(
                f"Kafka Connect refused {method} {path}: {detail}", status=error.code, url=self.url
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise ConnectorError(f"Kafka Connect does not answer: {error}", url=self.url) from None
        return json.loads(text) if text else None

    def has_plugin(self, connector_class: str) -> bool:
        """True when the worker answers and has loaded ``connector_class``."""
        try:
            plugins = self._request("GET", "/connector-plugins")
        except ConnectorError:
            return False
        return any(plugin["class"] == connector_class for plugin in plugins)

    def connectors(self) -> list[str]:
        return sorted(self._request("GET", "/connectors"))

    def register(self, connector: ConnectorDefinition) -> None:
        """Create the connector, or update its configuration when it exists (idempotent)."""
        self._request("PUT", f"/connectors/{connector.name}/config", connector.config)

    def status(self, name: str) -> dict[str, Any]:
        return self._request("GET", f"/connectors/{name}/status")

    def delete(self, name: str) -> None:
        self._request("DELETE", f"/connectors/{name}")

    def wait_running(self, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Poll until the connector and all its tasks run; fail at once when one has failed."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                status = self.status(name)
            except ConnectorError as error:
                if error.context.get("status") != 404:  # not yet created by the herder
                    raise
                time.sleep(0.25)
                continue
            states = [status["connector"], *status.get("tasks", [])]
            failed = [state for state in states if state["state"] == "FAILED"]
            if failed:
                trace = failed[0].get("trace", "").splitlines()
                raise ConnectorError(f"connector {name} failed: {trace[0] if trace else 'no trace'}", connector=name)
            if status.get("tasks") and all(state["state"] == "RUNNING" for state in states):
                return status
            time.sleep(0.25)
        raise ConnectorError(f"connector {name} not running after {timeout_s:.0f} s: {status}", connector=name)
