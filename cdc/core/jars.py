"""JVM dependencies: resolved once from Maven Central with Ivy, cached, then used as plain jar lists.

A :class:`Bundle` is a named set of Maven coordinates. :func:`resolve` runs Apache Ivy (the copy that
ships inside pyspark, the same resolver ``spark.jars.packages`` uses) to fetch a bundle with its
transitive dependencies into ``<cache>/<bundle>-<digest>/`` and writes a manifest last; later calls
read the manifest and start no JVM, so only the first run waits for resolution. Air-gapped users
point the Spark session at a folder of jars instead (``SparkConfig.jars``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from xml.sax.saxutils import quoteattr

from cdc.core.errors import DependencyError

# The engine's versions, stated once (docs/concepts/engine.md says why each is pinned). pyproject.toml pins
# the same pyspark and delta-spark wheels; tests/cdc/core/test_jars.py checks that the two agree.
SPARK_VERSION = "4.2.0"
SCALA_BINARY = "2.13"
DELTA_VERSION = "4.4.0"
# From Delta 4.1 on, Delta's artifacts carry the Spark minor they are built for in their name.
DELTA_ARTIFACT = f"delta-spark_{SPARK_VERSION.rsplit('.', 1)[0]}_{SCALA_BINARY}"
KAFKA_VERSION = "4.3.1"
DEBEZIUM_VERSION = "3.6.3.Final"
LOG4J_VERSION = "2.25.4"
# hadoop-aws must be the version of pyspark's own Hadoop client (hadoop-client-api-3.5.0.jar).
HADOOP_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"
S3PROXY_VERSION = "4.1.0"

MANIFEST = "manifest.txt"
T = TypeVar("T")


@dataclass(frozen=True)
class Bundle:
    """A named set of Maven coordinates (``group:artifact:version``) resolved together.

    ``excludes`` are Maven groups (``group``) or modules (``group:artifact``) left out of the transitive
    closure (e.g. the Kafka Connect API, which the Connect worker provides to its plugins). With
    ``provided_by_pyspark`` the artifacts that pyspark already ships (Scala, Hadoop, ...) are left out so
    that one version of each is loaded.
    """

    name: str
    coordinates: tuple[str, ...]
    excludes: tuple[str, ...] = field(default=())
    provided_by_pyspark: bool = False

    @property
    def digest(self) -> str:
        text = "\n".join(self.coordinates) + "\n--\n" + "\n".join(self.excludes)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


# Spark 4.2.0 with the Delta built for it (docs/concepts/engine.md says why this pair).
# spark-avro decodes Avro event topics (from_avro; Avro itself ships with pyspark). spark-protobuf,
# which would decode Protobuf ones, is not on Maven Central as this project's machines reach it:
# they are decoded in Python instead (cdc/pipeline/events/protobuf.py).
SPARK_BUNDLE = Bundle(
    "spark",
    (
        f"io.delta:{DELTA_ARTIFACT}:{DELTA_VERSION}",
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{SPARK_VERSION}",
        f"org.apache.spark:spark-avro_{SCALA_BINARY}:{SPARK_VERSION}",
    ),
    provided_by_pyspark=True,
)

# One classpath serves both the KRaft broker and the Connect worker.
KAFKA_BUNDLE = Bundle(
    "kafka",
    (
        f"org.apache.kafka:kafka_{SCALA_BINARY}:{KAFKA_VERSION}",
        f"org.apache.kafka:connect-runtime:{KAFKA_VERSION}",
        f"org.apache.kafka:connect-json:{KAFKA_VERSION}",
        f"org.apache.kafka:connect-transforms:{KAFKA_VERSION}",
        f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
        f"org.apache.logging.log4j:log4j-slf4j2-impl:{LOG4J_VERSION}",
    ),
)

# A Connect plugin: the worker supplies Kafka's classes and the logging API, so they stay out.
DEBEZIUM_POSTGRES_BUNDLE = Bundle(
    "debezium-connector-postgres",
    (f"io.debezium:debezium-connector-postgres:{DEBEZIUM_VERSION}",),
    excludes=("org.apache.kafka", "org.slf4j"),
)

# Debezium's MongoDB connector with the MongoDB Java driver (bson, driver-core): not a plugin of the
# test stack's worker (no MongoDB server installs here) but the classes the MongoDB harness drives
# (cdc/stack/mongo_harness.py) to write the connector's records for scripted change-stream events.
# 3.6.1.Final: the newest release of the MongoDB connector on Maven Central as these machines reach it.
DEBEZIUM_MONGODB_VERSION = "3.6.1.Final"
DEBEZIUM_MONGODB_BUNDLE = Bundle(
    "debezium-connector-mongodb",
    (f"io.debezium:debezium-connector-mongodb:{DEBEZIUM_MONGODB_VERSION}",),
    excludes=("org.apache.kafka", "org.slf4j"),
)


# S3A, Hadoop's connector for s3a:// URIs, with the few AWS SDK v2 modules it loads instead of the SDK's
# shaded `bundle` (~500 MB, every AWS service): these jars are ~13 MB. The SDK is hadoop-aws 3.5.0's own
# (hadoop-project's aws-java-sdk-v2.version).
# Added to the session only when the warehouse is s3a:// (cdc.core.object_store).
S3A_BUNDLE = Bundle(
    "hadoop-aws",
    (
        f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
        f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
        f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
    ),
    excludes=("software.amazon.awssdk:bundle",),
    provided_by_pyspark=True,
)

# The local stack's object store (cdc/stack/object_store.py): S3Proxy serving a folder as S3 buckets.
S3PROXY_BUNDLE = Bundle("s3proxy", (f"org.gaul:s3proxy:{S3PROXY_VERSION}",))


def default_cache_dir() -> Path:
    """``$CDC_JARS_CACHE``, else ``$XDG_CACHE_HOME/cdc-lakehouse/jars``, else ``~/.cache/...``."""
    if os.environ.get("CDC_JARS_CACHE"):
        return Path(os.environ["CDC_JARS_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cdc-lakehouse" / "jars"


def java_executable() -> str:
    """The ``java`` of ``$JAVA_HOME``, else the one on ``PATH``."""
    return _jdk_tool("java")


def _jdk_tool(name: str) -> str:
    if os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if not found:
        raise DependencyError(
            f"{name} not found: install a JDK 17 or newer (Debian: apt-get install openjdk-17-jdk-headless) "
            "or set JAVA_HOME"
        )
    return found


def ivy_jar() -> Path:
    """The Ivy jar that ships inside the installed pyspark."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not jars:
        raise DependencyError("no Ivy jar inside the installed pyspark: reinstall pyspark", package="pyspark")
    return jars[-1]


def resolve(bundle: Bundle, cache_dir: Path | None = None) -> list[Path]:
    """Return the jars of ``bundle`` with their dependencies, fetching them on the first call only."""
    cache_dir = Path(cache_dir or default_cache_dir())
    target = cache_dir / f"{bundle.name}-{bundle.digest}"
    return built_once(
        cache_dir, lambda: _read_manifest(target), lambda: _fetch(bundle, target, cache_dir / "ivy-cache")
    )


def built_once(cache_dir: Path, cached: Callable[[], T | None], build: Callable[[], T]) -> T:
    """What ``cached`` finds in the cache, else what ``build`` puts there, under the cache's lock:
    two processes building at once (tests, a job and the stack) must not half-write one folder."""
    if (found := cached()) is not None:
        return found
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return found if (found := cached()) is not None else build()


HELPERS_SOURCES = Path(__file__).parent / "jvm"
HELPERS_JAR = "cdc-helpers.jar"


def helpers_jar(cache_dir: Path | None = None) -> Path:
    """The jar of the project's own JVM code (``cdc/core/jvm/*.java``: Spark functions Spark lacks),
    compiled with ``javac`` against pyspark's jars on the first call for these sources and this
    Spark version, then cached beside the bundles."""
    cache_dir = Path(cache_dir or default_cache_dir())
    sources = sorted(HELPERS_SOURCES.glob("*.java"))
    digest = hashlib.sha256("\n".join([SPARK_VERSION, *(source.read_text() for source in sources)]).encode())
    target = cache_dir / f"helpers-{digest.hexdigest()[:12]}"
    jar = target / HELPERS_JAR
    return built_once(cache_dir, lambda: jar if jar.exists() else None, lambda: _compile_helpers(sources, target))


def _compile_helpers(sources: list[Path], target: Path) -> Path:
    import pyspark

    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    classpath = [Path(pyspark.__file__).parent / "jars" / "*"]
    compile_jar(sources, staging / HELPERS_JAR, classpath, "the project's JVM helpers")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target / HELPERS_JAR


def compile_jar(sources: list[Path], jar: Path, classpath: list[Path], what: str) -> Path:
    """Compile ``sources`` with ``javac --release 17`` against ``classpath`` into ``jar`` (its folder gets a
    ``classes`` folder while compiling); :class:`DependencyError` naming ``what`` with javac's message."""
    classes = jar.parent / "classes"
    command = [
        _jdk_tool("javac"),
        "--release",
        "17",
        "-nowarn",
        "-cp",
        os.pathsep.join(map(str, classpath)),
        "-d",
        str(classes),
        *(str(source) for source in sources),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DependencyError(f"could not compile {what}:\n{result.stderr.strip()}", sources=str(sources[0].parent))
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as archive:  # a jar is a zip
        for path in sorted(classes.rglob("*.class")):
            archive.write(path, path.relative_to(classes).as_posix())
    shutil.rmtree(classes)
    return jar


def _read_manifest(target: Path) -> list[Path] | None:
    manifest = target / MANIFEST
    if not manifest.exists():
        return None
    jars = [target / name for name in manifest.read_text().split()]
    if not all(jar.exists() for jar in jars):
        return None
    return jars


def _fetch(bundle: Bundle, target: Path, ivy_cache: Path) -> list[Path]:
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    descriptor = staging / "ivy.xml"
    descriptor.write_text(_ivy_module(bundle))
    command = [
        java_executable(),
        "-jar",
        str(ivy_jar()),
        "-ivy",
        str(descriptor),
        "-cache",
        str(ivy_cache),
        "-confs",
        "default",
        "-retrieve",
        str(staging / "[artifact]" / "[artifact]-[revision](-[classifier]).[ext]"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise DependencyError(
            f"could not resolve the {bundle.name} jars from Maven Central "
            f"(set CDC_JARS_CACHE to a folder that holds them for offline use):\n{tail}",
            bundle=bundle.name,
        )
    descriptor.unlink()
    provided = _pyspark_artifacts() if bundle.provided_by_pyspark else set()
    for folder in [path for path in staging.iterdir() if path.is_dir() and path.name in provided]:
        shutil.rmtree(folder)
    jars = sorted(str(path.relative_to(staging)) for path in staging.glob("*/*.jar"))
    (staging / MANIFEST).write_text("\n".join(jars) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return [target / name for name in jars]


def _pyspark_artifacts() -> set[str]:
    """Artifact names of the jars inside pyspark (``scala-library-2.13.16.jar`` -> ``scala-library``)."""
    import pyspark

    names = (path.name for path in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    return {match.group(1) for name in names if (match := re.match(r"^(.+?)-\d", name))}


def _ivy_module(bundle: Bundle) -> str:
    dependencies = []
    for coordinate in bundle.coordinates:
        group, artifact, version = coordinate.split(":")
        dependencies.append(
            f"    <dependency org={quoteattr(group)} name={quoteattr(artifact)} rev={quoteattr(version)} "
            'conf="default->default"/>'
        )
    excludes = [
        f"    <exclude org={quoteattr(group)} module={quoteattr(artifact)}/>"
        if artifact
        else f"    <exclude org={quoteattr(group)}/>"
        for group, _, artifact in (exclude.partition(":") for exclude in bundle.excludes)
    ]
    # Ivy merges a pom's test-scoped test-jar dependency into the module's runtime artifacts
    # (Spark's kafka connector has one that Maven Central does not hold): keep test jars out.
    excludes.append('    <exclude type="test-jar"/>')
    return "\n".join(
        [
            '<ivy-module version="2.0">',
            f'  <info organisation="cdc-lakehouse" module={quoteattr(bundle.name)}/>',
            "  <dependencies>",
            *dependencies,
            *excludes,
            "  </dependencies>",
            "</ivy-module>",
            "",
        ]
    )
