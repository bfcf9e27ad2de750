import os
import subprocess
from pathlib import Path

from cdc.core import class_archive, jars
from cdc.core.config import ProvidedJars, SparkConfig
from cdc.core.session import _cache_dir, _jar_paths, spark_conf


def test_archive_is_named_by_the_jdk_and_the_jars(tmp_path):
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"one")
    java = jars.java_executable()
    first = class_archive.archive_path(tmp_path, java, [str(jar)])
    assert first == class_archive.archive_path(tmp_path, java, [str(jar)])
    assert first != class_archive.archive_path(tmp_path, java, [])
    jar.write_bytes(b"other")  # a jar rebuilt in place names another archive
    assert first != class_archive.archive_path(tmp_path, java, [str(jar)])


def test_another_pyspark_install_of_the_same_jars_names_another_archive(tmp_path, monkeypatch):
    """The JVM checks the class path an archive was written with: a second virtualenv (another
    checkout) must not find the first one's archive under its name, or it would run without any."""
    import pyspark

    java = jars.java_executable()
    first = class_archive.archive_path(tmp_path, java, [])
    other = tmp_path / "other-venv" / "pyspark"
    (other / "jars").mkdir(parents=True)
    for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar"):  # the same files, seen at another path
        (other / "jars" / jar.name).symlink_to(jar)
    monkeypatch.setattr(pyspark, "__file__", str(other / "__init__.py"))
    assert class_archive.archive_path(tmp_path, java, []) != first


def test_sessions_map_the_archive_only_when_it_exists(tmp_path):
    java = jars.java_executable()
    assert class_archive.java_options(tmp_path, java, []) == []
    archive = class_archive.archive_path(tmp_path, java, [])
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    assert class_archive.java_options(tmp_path, java, [])[0] == f"-XX:SharedArchiveFile={archive}"


def test_a_jvm_given_an_archive_that_does_not_fit_runs_without_it_and_says_nothing(tmp_path):
    archive = tmp_path / "garbage.jsa"
    archive.write_bytes(os.urandom(4096))
    options = class_archive.java_options(tmp_path, jars.java_executable(), [])  # no archive of these: []
    assert options == []
    result = subprocess.run(
        [jars.java_executable(), f"-XX:SharedArchiveFile={archive}", *class_archive._QUIET, "-version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cds" not in (result.stdout + result.stderr).lower()


def test_archive_options_come_before_the_users_and_only_for_a_local_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_JARS_CACHE", str(tmp_path))
    config = SparkConfig(
        jars=ProvidedJars(), conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}, log_dir=None
    )
    archive = class_archive.archive_path(tmp_path, jars.java_executable(), [])
    assert spark_conf(config)["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"  # none built yet
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    options = spark_conf(config)["spark.driver.extraJavaOptions"].split()
    assert options[0] == f"-XX:SharedArchiveFile={archive}"
    assert options[-1] == "-XX:TieredStopAtLevel=1"
    assert "spark.driver.extraJavaOptions" not in spark_conf(
        config.model_copy(update={"conf": {}, "class_archive": False})
    )
    cluster = config.model_copy(update={"master": "spark://cluster:7077"})
    assert spark_conf(cluster)["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"


def test_the_test_sessions_jvm_maps_the_archive_cdc_jars_fetch_built(spark):
    """`./dev test` runs `cdc jars fetch`, whose training run builds the archive: this session's JVM
    (built from the default settings' jars) must have it mapped."""
    config = SparkConfig()
    archive = class_archive.archive_path(_cache_dir(config), jars.java_executable(), _jar_paths(config))
    assert archive.exists(), f"no class archive at {archive}: `cdc jars fetch` builds it (see its output)"
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert str(archive) in maps, "the driver JVM was started without the class archive"
