from pathlib import Path

import pytest

from cdc.core.config import GarbageCollector, LocalJars, MavenJars, ProvidedJars, SparkConfig, load_settings
from cdc.core.errors import ConfigError


def test_defaults_describe_the_local_stack():
    settings = load_settings()
    assert settings.spark.master == "local[*]"
    assert isinstance(settings.spark.jars, MavenJars)
    assert settings.stack.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.stack.connect.url == "http://127.0.0.1:8083"
    assert settings.stack.state_dir.is_absolute()


def test_environment_sets_nested_keys(monkeypatch):
    monkeypatch.setenv("CDC_SPARK__MASTER", "spark://cluster:7077")
    monkeypatch.setenv("CDC_SPARK__GARBAGE_COLLECTOR", "parallel")
    monkeypatch.setenv("CDC_STACK__POSTGRES__PORT", "5433")
    settings = load_settings()
    assert settings.spark.master == "spark://cluster:7077"
    assert settings.spark.garbage_collector is GarbageCollector.PARALLEL
    assert not settings.spark.is_local
    assert settings.stack.postgres.port == 5433
    assert "port=5433" in settings.stack.postgres.dsn()


def test_overrides_win_over_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CDC_STACK__STATE_DIR", "/elsewhere")
    settings = load_settings({"stack": {"state_dir": tmp_path}})
    assert settings.stack.state_dir == tmp_path
    assert settings.stack.postgres.port == 5432  # untouched siblings keep their values


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("CDC_STACK__KAFKA__PORT", "70000", "less than 65536"),
        ("CDC_SPARK__GARBAGE_COLLECTOR", "zgc", "'g1' or 'parallel'"),
    ],
)
def test_invalid_value_names_the_key_and_reason(monkeypatch, variable, value, reason):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert variable in str(raised.value)
    assert reason in str(raised.value)


def test_jars_source_is_a_discriminated_union(tmp_path: Path):
    (tmp_path / "delta.jar").write_bytes(b"")
    assert isinstance(SparkConfig.model_validate({"jars": {"kind": "local", "folder": tmp_path}}).jars, LocalJars)
    assert isinstance(SparkConfig.model_validate({"jars": {"kind": "provided"}}).jars, ProvidedJars)


def test_local_jars_folder_without_jars_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError) as raised:
        load_settings({"spark": {"jars": {"kind": "local", "folder": str(tmp_path)}}})
    assert "CDC_SPARK__JARS__LOCAL__FOLDER" in str(raised.value)
    assert "not a folder holding .jar files" in str(raised.value)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="CDC_SPARK__MASTRE: Extra inputs are not permitted"):
        load_settings({"spark": {"mastre": "local[2]"}})
