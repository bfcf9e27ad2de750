"""The configuration of one raw landing run (`cdc raw`), validated before anything starts."""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from cdc.core.config import TOPIC_NAME, Continuous, KafkaConnection, Trigger, _kafka_topic_name, _Strict
from cdc.core.storage import normalize_location


class TopicList(_Strict):
    """Land exactly these topics."""

    kind: Literal["topics"] = "topics"
    topics: list[Annotated[str, Field(pattern=TOPIC_NAME), AfterValidator(_kafka_topic_name)]] = Field(
        min_length=1, description="Topic names."
    )


class TopicPattern(_Strict):
    """Land every topic whose whole name matches a regular expression (internal ``__`` topics excluded)."""

    kind: Literal["pattern"] = "pattern"
    pattern: str = Field(description="Python regular expression, matched against the whole topic name.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"not a valid regular expression: {error}") from None
        return pattern


TopicSelection = Annotated[TopicList | TopicPattern, Field(discriminator="kind")]


class GapPolicy(str, Enum):
    """What to do when Kafka has deleted offsets the raw table has not landed yet."""

    FAIL = "fail"  # stop with an error naming topic, partition and the missing offsets
    RECORD = "record"  # go on, recording each gap in <warehouse>/_cdc/raw_gaps


class RawJobConfig(_Strict):
    """One `cdc raw` run: which topics, where their tables go, and how to read Kafka.

    Example::

        from cdc import RawJobConfig
        from cdc import run_raw_job

        config = RawJobConfig(
            topics={"kind": "pattern", "pattern": r"demo\\.shop\\..*"},
            warehouse="/data/warehouse",
            trigger={"kind": "available_now"},
        )
        run_raw_job(spark, config)
    """

    topics: TopicSelection = Field(description="The topics to land, by name or by pattern.")
    warehouse: str = Field(description="Root of the tables: a local path or an object-store URI.")
    trigger: Trigger = Field(default_factory=Continuous, description="Run once over what is there, or continuously.")
    kafka: KafkaConnection = Field(default_factory=KafkaConnection, description="How to reach Kafka.")
    on_gap: GapPolicy = Field(default=GapPolicy.FAIL, description="Stop on an offset gap, or record it and go on.")
    max_offsets_per_trigger: int | None = Field(
        default=None, ge=1, description="At most this many records per micro-batch (all partitions together)."
    )
    reset: bool = Field(
        default=False,
        description="Delete the table and its checkpoint and land the topic again from the earliest offset.",
    )
    force_destroy_raw_data: bool = Field(
        default=False, description="Allow `reset` on a raw table, whose data may exist nowhere else."
    )

    @field_validator("warehouse")
    @classmethod
    def _location(cls, warehouse: str) -> str:
        return normalize_location(warehouse)

    @model_validator(mode="after")
    def _force_needs_reset(self) -> RawJobConfig:
        if self.force_destroy_raw_data and not self.reset:
            raise ValueError("force_destroy_raw_data only applies together with reset")
        return self
