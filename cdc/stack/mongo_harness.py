"""The MongoDB part of the test stack: the records Debezium's MongoDB connector writes, without a
MongoDB server (none installs on these machines).

Change-stream documents (as a 6.0+ replica set sends them; :mod:`cdc.stack.mongo_model` writes
them from a reference model of the collections) go through ``cdc/stack/mongo/MongoChangeEvents.java``:
the MongoDB driver's own ``ChangeStreamDocument`` codec decodes them, the connector's own classes
(``MongoDbConnectorConfig``, ``MongoDbSchema``/``MongoDbCollectionSchema``, ``MongoDbOffsetContext``/
``SourceInfo``, ``MongoDbChangeRecordEmitter``) build each record as the connector's streaming source
does, its ``EventDispatcher`` sends it (with its ``__debezium.context.*`` headers, and a delete's
tombstone) to the queue the task drains, and Kafka Connect's ``JsonConverter`` serialises key and
value, with and without schemas. What
is not proven is only what a real server would have sent. Snapshot reads (:meth:`Collection.snapshot
<cdc.stack.mongo_model.Collection.snapshot>`) go through the connector's ``MongoDbSnapshotRecordEmitter``
with the offset context in snapshot mode, as its snapshot source drives them, through the
dispatcher's snapshot receiver (which marks the last read ``last``). Settings named ``unwrap.*`` run
the connector's own ExtractNewDocumentState on each record, as Kafka Connect runs a transform.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from cdc.core import jars
from cdc.core.errors import DependencyError

SOURCES = Path(__file__).parent / "mongo"
MAIN_CLASS = "cdc.stack.mongo.MongoChangeEvents"


def _connector_jars(cache_dir: Path | None) -> list[Path]:
    # Kafka's Jackson serves JsonConverter (it needs the Blackbird module of its own version).
    mongo = [
        jar
        for jar in jars.resolve(jars.DEBEZIUM_MONGODB_BUNDLE, cache_dir)
        if not jar.parent.name.startswith("jackson")
    ]
    return mongo + jars.resolve(jars.KAFKA_BUNDLE, cache_dir)


def harness_classpath(cache_dir: Path | None = None) -> list[Path]:
    """The harness's classes (compiled with ``javac`` once per version of its sources, cached beside
    the jar bundles) and the connector's jars."""
    cache_dir = Path(cache_dir or jars.default_cache_dir())
    connector = _connector_jars(cache_dir)
    sources = sorted(SOURCES.glob("*.java"))
    text = "\n".join([jars.DEBEZIUM_MONGODB_VERSION, jars.KAFKA_VERSION, *(s.read_text() for s in sources)])
    target = cache_dir / f"mongo-harness-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    classes = target / "classes"

    def compile_sources() -> Path:
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        command = [
            jars._jdk_tool("javac"),
            "--release",
            "17",
            "-nowarn",
            "-cp",
            ":".join(map(str, connector)),
            "-d",
            str(staging / "classes"),
            *map(str, sources),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise DependencyError(
                f"could not compile the MongoDB harness:\n{result.stderr.strip()}", sources=str(SOURCES)
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        return classes

    return [jars.built_once(cache_dir, lambda: classes if classes.exists() else None, compile_sources), *connector]


def connector_records(events: list[dict], settings: dict[str, str]) -> list[dict]:
    """The connector's records for change-stream ``events`` (canonical Extended JSON documents) under
    connector ``settings`` (``topic.prefix``, ``capture.mode``, ...), in order: dicts of ``topic``,
    ``key``/``value`` (JsonConverter, schemas.enable=true) and ``key_bare``/``value_bare``
    (schemas.enable=false) as text; ``value`` None for a tombstone; ``headers``, [name, value] pairs (the
    values as Kafka Connect's SimpleHeaderConverter writes strings). Settings ``unwrap.NAME`` configure
    ExtractNewDocumentState (``NAME``), whose record each dict adds: ``unwrapped`` (false when the
    transform drops the record) and ``unwrapped_key``, ``unwrapped_value``, ``unwrapped_key_bare``,
    ``unwrapped_value_bare``."""
    command = [
        jars.java_executable(),
        # A JVM per call, for a second or two: C1 alone and the serial collector cost ~40% less CPU.
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-cp",
        ":".join(map(str, harness_classpath())),
        MAIN_CLASS,
        *(f"{key}={value}" for key, value in settings.items()),
    ]
    lines = "".join(json.dumps(event) + "\n" for event in events)
    result = subprocess.run(command, input=lines, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the MongoDB harness failed:\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def kafka_record(record: dict, schemas: bool = True, unwrapped: bool = False) -> tuple[bytes, bytes | None, list]:
    """A record of :func:`connector_records` as Kafka holds it: (key, value, headers), with or without
    ``schemas``, as the connector writes it or ExtractNewDocumentState (``unwrapped``) leaves it."""
    names = ("key", "value") if schemas else ("key_bare", "value_bare")
    key, value = (f"unwrapped_{name}" for name in names) if unwrapped else names
    headers = [(name, None if text is None else text.encode()) for name, text in record["headers"]]
    return record[key].encode(), None if record[value] is None else record[value].encode(), headers
