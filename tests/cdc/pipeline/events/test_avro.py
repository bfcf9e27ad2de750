"""Avro event topics: decoding plain and Confluent-framed values with reasons (pure, on DataFrames
built here), the events' Spark schema, then Kafka -> `cdc raw` -> `cdc refine` through a pipeline
file on the real stack, with a schema file and with a schema registry (an in-process stand-in)."""

import io
import json
import struct
from datetime import UTC, datetime

import fastavro
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import ConfigError
from cdc.pipeline.config import SchemaRegistry
from cdc.pipeline.events.avro import AvroDecoder, AvroDecoding, avro_event_schema, decode_avro, with_end_marker
from refine.quality.quarantine import quarantine_location

READING = {
    "type": "record",
    "name": "Reading",
    "namespace": "fitness",
    "fields": [
        {"name": "device_id", "type": "string"},
        {"name": "time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "heart_rate", "type": ["null", "int"], "default": None},
        {
            "name": "position",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Position",
                    "fields": [{"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}],
                },
            ],
            "default": None,
        },
    ],
}
# Version 2 adds a field with a default: records written with version 1 read as version 2 take it.
READING_V2 = {**READING, "fields": [*READING["fields"], {"name": "model", "type": "string", "default": "unknown"}]}


def avro(schema: dict, record: dict) -> bytes:
    """``record`` in Avro's binary encoding, plain."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def framed(schema_id: int, schema: dict, record: dict) -> bytes:
    """``record`` in Confluent's wire format: magic byte 0, the schema id (4 bytes, big-endian), the record."""
    return b"\x00" + struct.pack(">i", schema_id) + avro(schema, record)


def at(minute: int) -> datetime:
    return datetime(2026, 1, 1, 10, minute, tzinfo=UTC)


def test_plain_values_of_a_schema_file_decode_exactly_or_get_a_reason(spark, raw_records, problems_and_events):
    good = avro(READING, {"device_id": "w1", "time": at(0), "heart_rate": 72, "position": {"lat": 1.5, "lon": 2.0}})
    text = avro(READING, {"device_id": "w2", "time": at(1), "heart_rate": None, "position": None})
    values = [
        good,
        text,  # valid UTF-8: `cdc raw` lands it in `value`
        good[:-3],  # truncated
        good + b"\x01",  # a trailing byte
        b"\xff" * 12,  # garbage
        None,
        framed(7, READING, {"device_id": "w1", "time": at(0)}),  # Confluent's framing, read as plain Avro
    ]
    decoded = decode_avro(raw_records(values), AvroDecoding(reader=json.dumps(READING), framed=False))
    problems, events = problems_and_events(decoded)
    not_avro = "the value is not Avro of the schema"
    framing_hint = " (it starts like Confluent's wire format, which a registry schema reads)"
    assert problems == [None, None, not_avro, not_avro, not_avro, "no value (a null record)", not_avro + framing_hint]
    assert events[:2] == [
        {"device_id": "w1", "time": at(0).replace(tzinfo=None), "heart_rate": 72, "position": {"lat": 1.5, "lon": 2.0}},
        {"device_id": "w2", "time": at(1).replace(tzinfo=None), "heart_rate": None, "position": None},
    ]
    assert decoded.orderBy("kafka_offset").first().raw_value == good.hex().upper()


def test_framed_values_are_read_with_their_writer_schema_as_the_latest(spark, raw_records, problems_and_events):
    v1, v2 = json.dumps(READING), json.dumps(READING_V2)
    values = [
        framed(1, READING, {"device_id": "w1", "time": at(0), "heart_rate": 70}),
        framed(2, READING_V2, {"device_id": "w2", "time": at(1), "model": "fenix"}),
        framed(3, READING, {"device_id": "w3", "time": at(2)}),  # an id the registry does not hold
        b"\x01" + framed(2, READING_V2, {"device_id": "w4", "time": at(3)})[1:],  # not the magic byte
        b"\x00\x00\x00",
        framed(2, READING_V2, {"device_id": "w5", "time": at(4)})[:9],  # truncated
        framed(1, READING_V2, {"device_id": "w6", "time": at(5), "model": "x"}),  # written with v2, claims v1
        None,
    ]
    decoding = AvroDecoding(reader=v2, framed=True, reader_id=2, writers={1: v1, 2: v2, 3: None})
    problems, events = problems_and_events(decode_avro(raw_records(values), decoding))
    assert problems == [
        None,
        None,
        "schema id 3 is not an Avro schema of the schema registry",
        "the value starts with byte 0x01, not the magic byte 0x00 of Confluent's wire format",
        "the value is 3 bytes: shorter than the header of Confluent's wire format (magic byte 0, 4-byte schema id)",
        "the value is not Avro of its schema (id 2)",
        "the value is not Avro of its schema (id 1), or it does not resolve to the latest schema (id 2)",
        "no value (a null record)",
    ]
    assert [(event["device_id"], event["heart_rate"], event["model"]) for event in events[:2]] == [
        ("w1", 70, "unknown"),
        ("w2", None, "fenix"),
    ]


def test_the_events_spark_schema_comes_from_the_avro_schema(spark):
    schema = avro_event_schema(spark, json.dumps(READING_V2))
    assert schema == StructType.fromDDL(
        "device_id string, time timestamp, heart_rate int, position struct<lat: double, lon: double>, model string"
    )
    with pytest.raises(ConfigError, match="the Avro schema of events must be a record"):
        avro_event_schema(spark, '"string"')
    with pytest.raises(ConfigError, match=r"^Spark cannot read events with this Avro schema: .*Undefined schema: "):
        avro_event_schema(spark, json.dumps({**READING, "fields": [{"name": "a", "type": "no_such_type"}]}))
    with pytest.raises(ConfigError, match=r"^the Avro schema is not JSON: "):
        with_end_marker("{fields")


def test_a_registry_decoder_fetches_each_writer_schema_its_batches_hold(
    spark, schema_registry, raw_records, problems_and_events
):
    v1 = schema_registry.register("fitness-value", json.dumps(READING))
    v2 = schema_registry.register("fitness-value", json.dumps(READING_V2))
    schema_registry.register("other-value", 'syntax = "proto3"; message M {}', "PROTOBUF")
    decoder = AvroDecoder(spark, SchemaRegistry(kind="registry", url=schema_registry.url), "fitness")
    assert (decoder.reader_id, decoder.event_schema.fieldNames()[-1]) == (v2, "model")
    batch = raw_records(
        [
            framed(v1, READING, {"device_id": "w1", "time": at(0)}),
            framed(3, READING, {"device_id": "w2", "time": at(1)}),
        ]
    )
    problems, _ = problems_and_events(decoder.decode(batch))
    assert problems == [None, "schema id 3 is not an Avro schema of the schema registry"]  # a Protobuf schema
    assert sorted(decoder.writers) == [v1, v2]  # kept for the next batches; id 3 is asked for again

    schema_registry.register("scores-value", 'syntax = "proto3"; message M {}', "PROTOBUF")
    with pytest.raises(ConfigError, match="holds a PROTOBUF schema for subject scores-value, not an Avro one"):
        AvroDecoder(spark, SchemaRegistry(kind="registry", url=schema_registry.url, subject="scores-value"), "t")


# --- on the real stack ---------------------------------------------------------------------------


def test_avro_events_with_a_schema_file_and_with_a_registry(
    spark, kafka, pipeline_run, unique_name, schema_registry, tmp_path
):
    plain, registered = kafka.create_topic(f"{unique_name}.readings"), kafka.create_topic(f"{unique_name}.devices")
    (tmp_path / "reading.avsc").write_text(json.dumps(READING))  # beside the pipeline file, which names it relatively
    v1 = schema_registry.register(f"{registered}-value", json.dumps(READING))
    v2 = schema_registry.register(f"{registered}-value", json.dumps(READING_V2))
    pipeline = {
        "name": "fitness_avro",
        "sources": {
            "plain": {
                "kind": "events",
                "format": "avro",
                "topic": plain,
                "schema": {"kind": "file", "path": "reading.avsc"},
            },
            "registered": {
                "kind": "events",
                "format": "avro",
                "topic": registered,
                "schema": {"kind": "registry", "url": schema_registry.url},
            },  # subject <topic>-value
        },
        "refined": {
            "readings": {"source": "plain"},  # every event, appended, position flattened
            "devices": {"source": "registered", "keys": ["device_id"], "ordering": "time"},  # the latest per device
        },
        "expectations": {"plausible": {"table": "devices", "constraint": "heart_rate < 250", "action": "drop"}},
    }
    kafka.produce(
        plain,
        [
            (
                b"w1",
                avro(
                    READING, {"device_id": "w1", "time": at(0), "heart_rate": 72, "position": {"lat": 1.5, "lon": 2.0}}
                ),
            ),
            (b"w1", avro(READING, {"device_id": "w1", "time": at(5), "heart_rate": 95})),
            (b"w1", avro(READING, {"device_id": "w1", "time": at(6), "heart_rate": 96})[:-1]),  # truncated
            (b"w2", avro(READING, {"device_id": "w2", "time": at(1)})),
        ],
    )
    kafka.produce(
        registered,
        [
            (
                b"w1",
                framed(v1, READING, {"device_id": "w1", "time": at(0), "heart_rate": 70}),
            ),  # read as v2: model unknown
            (b"w1", framed(v2, READING_V2, {"device_id": "w1", "time": at(5), "heart_rate": 90, "model": "fenix"})),
            (
                b"w1",
                framed(v2, READING_V2, {"device_id": "w1", "time": at(2), "heart_rate": 80}),
            ),  # late: older than 10:05
            (
                b"w2",
                framed(v2, READING_V2, {"device_id": "w2", "time": at(1), "heart_rate": 300}),
            ),  # breaks `plausible`
            (b"w3", b"\x01" + framed(v2, READING_V2, {"device_id": "w3", "time": at(3)})[1:]),  # not the magic byte
            (b"w4", framed(v1, READING, {"device_id": "w4", "time": at(3), "heart_rate": 60})),
        ],
    )
    readings_schema = (
        "device_id string, time string, heart_rate int, position_lat double, position_lon double, "
        "_cdc_partition int, _cdc_offset long"
    )
    expected_readings = spark.createDataFrame(
        [
            ("w1", "2026-01-01 10:00:00", 72, 1.5, 2.0, 0, 0),
            ("w1", "2026-01-01 10:05:00", 95, None, None, 0, 1),
            ("w2", "2026-01-01 10:01:00", None, None, None, 0, 3),
        ],
        readings_schema,
    ).withColumn("time", F.to_timestamp("time"))
    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        assertDataFrameEqual(pipeline_run.table("readings").drop("_cdc_refined_at"), expected_readings)
        devices = pipeline_run.table("devices").select("device_id", "heart_rate", "model", "_cdc_offset")
        assertDataFrameEqual(
            devices, spark.createDataFrame([("w1", 90, "fenix", 1), ("w4", 60, "unknown", 5)], devices.schema)
        )
        quarantined = spark.read.format("delta").load(quarantine_location(pipeline_run.warehouse))
        assert sorted((row.topic, row.offset, row.reason) for row in quarantined.collect()) == sorted(
            [
                (plain, 2, "the value is not Avro of the schema"),
                (registered, 3, "failed expectations: plausible"),
                (registered, 4, "the value starts with byte 0x01, not the magic byte 0x00 of Confluent's wire format"),
            ]
        )
