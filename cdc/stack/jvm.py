"""Running a Java main class of the local stack on a classpath resolved by :mod:`cdc.core.jars`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from cdc.core import jars


def properties_text(settings: dict[str, object]) -> str:
    """A Java .properties file's text for ``settings``."""
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def java_command(main_class: str, *args: str, heap: str, home: Path) -> list[str]:
    """``java`` running ``main_class`` of the Kafka bundle, logging to stdout, with heap ``heap``."""
    log_config = home / "log4j2.properties"
    log_config.write_text(resources.files("cdc.stack").joinpath("templates/log4j2.properties").read_text())
    classpath = ":".join(str(path) for path in jars.resolve(jars.KAFKA_BUNDLE))
    return [
        jars.java_executable(),
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        classpath,
        main_class,
        *args,
    ]
