import pytest

from cdc.core.config import AvailableNow, Continuous, validate
from cdc.core.errors import ConfigError
from cdc.raw.config import GapPolicy, RawJobConfig, TopicPattern


def config(**fields):
    return validate(
        RawJobConfig, {"topics": {"kind": "topics", "topics": ["a.b"]}, "warehouse": "wh", **fields}, "raw job settings"
    )


def test_defaults():
    job = config()
    assert isinstance(job.trigger, Continuous)
    assert job.trigger.interval_s == 2.0
    assert job.on_gap is GapPolicy.FAIL
    assert job.warehouse.startswith("/")
    assert job.warehouse.endswith("/wh")


def test_object_store_uri_is_kept():
    assert config(warehouse="s3a://bucket/lake/").warehouse == "s3a://bucket/lake"


def test_variants_by_kind():
    job = config(topics={"kind": "pattern", "pattern": r"demo\..*"}, trigger={"kind": "available_now"})
    assert isinstance(job.topics, TopicPattern)
    assert isinstance(job.trigger, AvailableNow)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topics": {"kind": "topics", "topics": ["bad topic"]}}, "topics.topics.0: String should match pattern"),
        ({"topics": {"kind": "topics", "topics": [".."]}}, "'..' is not a valid topic name"),
        ({"topics": {"kind": "topics", "topics": []}}, "topics.topics: List should have at least 1 item"),
        (
            {"topics": {"kind": "pattern", "pattern": "demo.("}},
            "topics.pattern.pattern: Value error, not a valid regular expression",
        ),
        (
            {"trigger": {"kind": "continuous", "interval_s": 0}},
            "trigger.continuous.interval_s: Input should be greater than 0",
        ),
        ({"force_destroy_raw_data": True}, "force_destroy_raw_data only applies together with reset"),
        (
            {"kafka": {"security_protocol": "SASL_SSL"}},
            "SASL_SSL needs sasl_mechanism, sasl_username and sasl_password",
        ),
    ],
)
def test_invalid_settings_name_key_and_reason(fields, message):
    with pytest.raises(ConfigError) as raised:
        config(**fields)
    assert message in str(raised.value)
