"""Column functions shared by raw landing and refinement: the project's JVM helpers (cdc/core/jvm, registered
in each session the project builds) with Spark's own functions as the fallback, and the raw table's
(text, bytes) column pairs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.errors import AnalysisException
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType

# The project's JVM functions (cdc/core/jvm, built by cdc.core.jars.helpers_jar): SQL name -> (class, return type).
IS_UTF8_FUNCTION = "cdc_is_utf8"
DEBEZIUM_DECIMAL_FUNCTION = "cdc_debezium_decimal"
_HELPER_FUNCTIONS = {
    IS_UTF8_FUNCTION: ("cdc.jvm.IsUtf8", BooleanType()),
    DEBEZIUM_DECIMAL_FUNCTION: ("cdc.jvm.DebeziumDecimal", StringType()),
}
# Those registered in this process's session: callers use them, else Spark's own functions.
registered_helpers: set[str] = set()


def helpers_available() -> bool:
    """Whether this process's session has the helpers jar (its classes, such as ``cdc.jvm.MightContain``)."""
    return bool(registered_helpers)


def register_helpers(spark: SparkSession) -> None:
    """Register the helper functions whose classes are on the classpath. Without the helpers jar (a
    folder of jars that lacks it) callers fall back to Spark's own, slower, functions."""
    for name, (class_name, return_type) in _HELPER_FUNCTIONS.items():
        try:
            spark.udf.registerJavaFunction(name, class_name, return_type)
        except AnalysisException as error:
            if (error.getMessageParameters() or {}).get("className") != class_name:  # not "cannot load the class"
                raise
            registered_helpers.discard(name)
        else:
            registered_helpers.add(name)


def is_utf8(binary: Column) -> Column:
    """Whether a binary column holds valid UTF-8: the project's JVM function when the session has
    it (landing 1M records of ~1 KB: ~0.1 task CPU s against ~0.8 for Spark's), else Spark's own."""
    if IS_UTF8_FUNCTION in registered_helpers:
        return F.call_function(IS_UTF8_FUNCTION, binary)
    return F.is_valid_utf8(binary.cast("string"))


def original_bytes(text: str, raw: str) -> Column:
    """The bytes as received in Kafka, from a (text, bytes) column pair such as key/key_bytes."""
    return F.coalesce(F.col(raw), F.encode(F.col(text), "UTF-8"))


@contextmanager
def captured_console(spark: SparkSession) -> Iterator[list[str]]:
    """Within the block, what the driver JVM's Scala code prints on this thread (Delta's VACUUM prints
    its summary with ``println``) is caught instead of reaching standard output; the list yields its
    lines at the block's end. Nothing is caught without the helpers jar."""
    lines: list[str] = []
    capture = spark._jvm.cdc.jvm.ConsoleCapture() if helpers_available() and spark._jvm is not None else None
    if capture is not None:
        capture.start()
    try:
        yield lines
    finally:
        if capture is not None:
            lines.extend(capture.stop().splitlines())


def quiet_console_logs() -> None:
    """Take the terminal's log appender off the driver JVM's loggers (the log file keeps everything):
    a job stopping on a signal interrupts the batch it is writing, whose cut-short work Spark logs at
    ERROR. Nothing without the helpers jar or a running JVM."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None or context._jvm is None or not helpers_available():
        return
    context._jvm.cdc.jvm.QuietShutdown().run()


def quiet_console_logs_on_shutdown(spark: SparkSession) -> None:
    """:func:`quiet_console_logs` when the driver JVM starts to shut down (a signal reaches it too), before
    Spark's own shutdown stops the batch it runs. Nothing without the helpers jar."""
    if helpers_available() and spark._jvm is not None:
        spark._jvm.cdc.jvm.QuietShutdown.install()
