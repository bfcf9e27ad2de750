"""The typed exceptions of the project.

Every error the tool raises on purpose is a :class:`CdcError`. Each carries the context a user needs
to find the failing thing (component, table, topic, partition, offset, Delta version, ...) and an
exit code; the CLI prints ``str(error)`` as one line and exits with that code.
"""

from __future__ import annotations

from typing import Any


class CdcError(Exception):
    """Base of every error the tool raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = {key: value for key, value in context.items() if value is not None}

    def __str__(self) -> str:
        if not self.context:
            return self.message
        details = ", ".join(f"{key}={value}" for key, value in self.context.items())
        return f"{self.message} ({details})"


class ConfigError(CdcError):
    """A setting is missing or invalid: names the key and the reason."""

    exit_code = 2


class DependencyError(CdcError):
    """Something the tool needs is not installed or cannot be fetched (java, postgres, jars)."""

    exit_code = 3


class StackError(CdcError):
    """A component of the local stack failed to start, answer or stop.

    ``log_tail`` holds the last lines of the component's log, shown under the one-line message.
    """

    exit_code = 4

    def __init__(self, message: str, *, component: str, log_tail: str = "", **context: Any) -> None:
        super().__init__(message, component=component, **context)
        self.component = component
        self.log_tail = log_tail

    def __str__(self) -> str:
        line = super().__str__()
        if self.log_tail:
            return f"{line}\n--- last lines of the {self.component} log ---\n{self.log_tail}"
        return line


class ConnectorError(CdcError):
    """Kafka Connect refused a request or a connector is not running."""

    exit_code = 5


class SourceError(CdcError):
    """Kafka cannot be read as asked: no broker answers, an unknown topic, missing offsets."""

    exit_code = 6


class OffsetGapError(SourceError):
    """Kafka no longer holds offsets a raw table has not landed yet (retention deleted them)."""

    exit_code = 7


class TableError(CdcError):
    """A Delta table or its location refuses what was asked (not a raw table, protected, unwritable)."""

    exit_code = 8


class StreamError(CdcError):
    """A streaming job stopped on an error inside Spark."""

    exit_code = 9


class ExpectationError(CdcError):
    """Rows broke an expectation whose action is ``fail``: names the table, the expectation and an offending key."""

    exit_code = 10
