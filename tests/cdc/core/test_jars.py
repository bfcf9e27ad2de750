import tomllib
import xml.etree.ElementTree as ET
import zipfile
from importlib.metadata import version
from pathlib import Path

import pyspark
import pytest

from cdc.core import jars
from cdc.core.errors import DependencyError


def test_second_resolution_reads_the_manifest_without_a_jvm(monkeypatch):
    first = jars.resolve(jars.SPARK_BUNDLE)
    # With no java to run, only the cached manifest can answer.
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jars.resolve(jars.SPARK_BUNDLE) == first
    assert all(path.exists() for path in first)


def test_a_missing_jar_invalidates_the_cache(tmp_path):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "a.jar").write_bytes(b"")
    (target / jars.MANIFEST).write_text("a.jar\nb.jar\n")
    assert jars._read_manifest(target) is None
    (target / "b.jar").write_bytes(b"")
    assert jars._read_manifest(target) == [target / "a.jar", target / "b.jar"]


def test_digest_follows_the_coordinates():
    one = jars.Bundle("x", ("g:a:1",))
    assert one.digest == jars.Bundle("x", ("g:a:1",)).digest
    assert one.digest != jars.Bundle("x", ("g:a:2",)).digest
    assert one.digest != jars.Bundle("x", ("g:a:1",), excludes=("org.slf4j",)).digest


def test_ivy_module_lists_dependencies_and_excludes():
    module = ET.fromstring(jars._ivy_module(jars.DEBEZIUM_POSTGRES_BUNDLE))
    dependency = module.find("dependencies/dependency")
    assert (dependency.get("org"), dependency.get("name"), dependency.get("rev")) == (
        "io.debezium",
        "debezium-connector-postgres",
        jars.DEBEZIUM_VERSION,
    )
    excluded = {rule.get("org") or rule.get("type") for rule in module.findall("dependencies/exclude")}
    assert excluded == {"org.apache.kafka", "org.slf4j", "test-jar"}


def test_pyspark_artifacts_are_named_without_versions():
    provided = jars._pyspark_artifacts()
    assert {"scala-library", "spark-core_2.13", "hadoop-client-api"} <= provided


def test_helpers_are_compiled_once_then_read_from_the_cache(tmp_path, monkeypatch):
    jar = jars.helpers_jar(tmp_path)
    assert "cdc/jvm/IsUtf8.class" in zipfile.ZipFile(jar).namelist()
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jars.helpers_jar(tmp_path) == jar  # no javac needed now
    with pytest.raises(DependencyError, match="javac not found: install a JDK 17 or newer"):
        jars.helpers_jar(tmp_path / "elsewhere")


def test_the_wheels_and_the_jars_are_of_one_engine():
    """pyproject.toml pins pyspark and delta-spark; jars.py the Maven artifacts built for them: one version each."""
    pins = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"pyspark[sql]=={jars.SPARK_VERSION}" in pins
    assert f"delta-spark=={jars.DELTA_VERSION}" in pins
    assert version("pyspark") == jars.SPARK_VERSION
    assert version("delta-spark") == jars.DELTA_VERSION
    hadoop = {path.name for path in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")}
    assert hadoop == {f"hadoop-client-api-{jars.HADOOP_VERSION}.jar"}, "hadoop-aws must match pyspark's Hadoop"
    spark_minor = ".".join(version("pyspark").split(".")[:2])
    # Delta's jar names the Spark minor it is built for (from Delta 4.1 on).
    assert f"io.delta:delta-spark_{spark_minor}_2.13:{jars.DELTA_VERSION}" in jars.SPARK_BUNDLE.coordinates
