"""The typed exceptions of the project.

Every error the tool raises on purpose is a :class:`CdcError`. Each carries the context a user needs
to find the failing thing (component, table, topic, partition, offset, Delta version, ...) and an
exit code; the CLI prints ``str(error)`` as one line and exits with that code.
"""

from __future__ import annotations

from typing import Any


class CdcError(Exception):
    """Base of every error the tool raises on purpose: ``str(error)`` is one line with its context,
    ``exit_code`` the CLI's exit code for its kind.

    Example::

        from cdc import CdcError
        from cdc import Lakehouse

        try:
            Lakehouse("/tmp/warehouse").refine("no.such.topic")
        except CdcError as error:
            print(error.exit_code, error)  # 8 no raw table for this topic: run `cdc raw` first (table=...)
    """

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
    """A setting is missing or invalid: names the key and the reason.

    Example: ``Lakehouse("/tmp/w").land(["bad topic"])`` raises ``ConfigError("invalid raw job settings:
    topics.topics.0: String should match pattern ...")`` before Spark starts.
    """

    exit_code = 2


class DependencyError(CdcError):
    """Something the tool needs is not installed or cannot be fetched (java, postgres, jars).

    Example: ``cdc jars fetch`` without network access to Maven Central exits 3 with this error.
    """

    exit_code = 3


class StackError(CdcError):
    """A component of the local stack failed to start, answer or stop.

    ``log_tail`` holds the last lines of the component's log, shown under the one-line message.

    Example: ``cdc stack up`` with Postgres's port taken exits 4, naming ``component=postgres``.
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
    """Kafka Connect refused a request or a connector is not running.

    Example: ``cdc connectors register`` when Kafka Connect does not answer exits 5.
    """

    exit_code = 5


class SourceError(CdcError):
    """Kafka cannot be read as asked: no broker answers, an unknown topic, missing offsets.

    Example: ``Lakehouse(kafka={"bootstrap_servers": "127.0.0.1:1"}).land(["t"])`` raises it.
    """

    exit_code = 6


class OffsetGapError(SourceError):
    """Kafka no longer holds offsets a raw table has not landed yet (retention deleted them).

    Example: ``except OffsetGapError as gap: print(gap.context)`` gives topic, partition and the missing
    offsets; ``land(..., allow_gaps=True)`` records the gap instead and goes on.
    """

    exit_code = 7


class TableError(CdcError):
    """A Delta table or its location refuses what was asked (not a raw table, protected, unwritable).

    Example: ``land([topic], reset=True)`` on a raw table raises it unless ``force_destroy_raw_data=True``.
    """

    exit_code = 8


class StreamError(CdcError):
    """A streaming job stopped on an error inside Spark.

    Example: ``cdc: error: a refine batch failed: <Type>: <message> (table=..., batch=N)``, exit 9.
    """

    exit_code = 9


class QuarantineError(CdcError):
    """A run asked to fail on quarantined records (``fail_on_quarantine``, ``cdc refine
    --fail-on-quarantine``) sent some to the quarantine; every other change was applied.

    Example: a scheduled ``cdc refine --table demo.shop.orders --available-now --fail-on-quarantine``
    exits 11 after a run that quarantined a malformed record, so that the scheduler alerts.
    """

    exit_code = 11


class ExpectationError(CdcError):
    """Rows broke an expectation whose action is ``fail``: names the table, the expectation and an offending key.

    Example: a pipeline's ``expectations: {amount_positive: {table: orders, constraint: "amount > 0",
    action: fail}}`` raises it for a batch with a negative amount, and the batch is not applied.
    """

    exit_code = 10
