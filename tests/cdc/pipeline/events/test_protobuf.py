"""Protobuf event topics: the events' Spark schema from a message's descriptor, Confluent's message
indexes, decoding plain and framed values with reasons (on DataFrames built here), then Kafka ->
`cdc raw` -> `cdc refine` through a pipeline file on the real stack, with a schema file and with a
schema registry (an in-process stand-in).

The messages are encoded by the ``protobuf`` package with classes built from tests/fixtures/fitness.proto,
compiled here by grpc_tools' protoc (independently of the code under test)."""

import importlib.resources
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import ConfigError
from cdc.pipeline.config import SchemaFile, SchemaRegistry
from cdc.pipeline.events.protobuf import (
    ProtobufDecoder,
    ProtobufDecoding,
    Unfit,
    compile_schema_file,
    decode_protobuf,
    framing_header,
    indexed_messages,
    message_converter,
    message_descriptor,
    message_indexes,
    protobuf_event_schema,
    schema_file,
)
from refine.quality.quarantine import quarantine_location

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "fitness.proto"
READING_DDL = (
    "device_id string, time timestamp, heart_rate int, position struct<lat: double, lon: double>, "
    "tags array<string>, counters map<string, bigint>, activity string, model string, steps decimal(20,0), "
    "laps array<struct<number: bigint, seconds: float>>"
)


def message_classes(folder: Path, file_name: str) -> SimpleNamespace:
    """The messages of ``folder/file_name`` as classes, by their names (protoc run in this process)."""
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    out = folder / f"{file_name}.pb"
    code = protoc.main(
        [
            "protoc",
            f"-I{folder}",
            f"-I{include}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            str(folder / file_name),
        ]
    )
    assert code == 0, f"protoc could not compile {folder / file_name} for the test"
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(file)
    own = pool.FindFileByName(file_name)
    return SimpleNamespace(
        **{name: message_factory.GetMessageClass(message) for name, message in own.message_types_by_name.items()}
    )


@pytest.fixture(scope="module")
def fitness(tmp_path_factory):
    folder = tmp_path_factory.mktemp("proto")
    (folder / "fitness.proto").write_text(FIXTURE.read_text())
    return message_classes(folder, "fitness.proto")


def at(minute: int) -> datetime:
    return datetime(2026, 1, 1, 10, minute, tzinfo=UTC)


def reading(fitness, device_id: str, minute: int, **fields) -> bytes:
    """A serialized fitness.Reading at 10:<minute>."""
    message = fitness.Reading(device_id=device_id, **fields)
    message.time.FromDatetime(at(minute))
    return message.SerializeToString()


def decoding(message: str = "fitness.Reading", framed: bool = False, writers=None) -> ProtobufDecoding:
    schema = compile_schema_file(FIXTURE)
    return ProtobufDecoding(
        schema=schema,
        message=message,
        framed=framed,
        writers=writers or {},
        event_schema=protobuf_event_schema(message_descriptor(schema, message)),
    )


# --- the events' Spark schema ------------------------------------------------------------------


def test_the_events_spark_schema_comes_from_the_message(spark, tmp_path):
    schema = compile_schema_file(FIXTURE)
    assert protobuf_event_schema(message_descriptor(schema, None)) == StructType.fromDDL(READING_DDL)  # the first
    assert protobuf_event_schema(message_descriptor(schema, "fitness.Reading.Lap")) == StructType.fromDDL(
        "number bigint, seconds float"
    )
    (tmp_path / "scalars.proto").write_text("""
        syntax = "proto3";
        import "google/protobuf/wrappers.proto";
        import "google/protobuf/struct.proto";
        message Scalars {
          int32 a = 1; sint32 b = 2; sfixed32 c = 3; int64 d = 4; sint64 e = 5; sfixed64 f = 6;
          uint32 g = 7; fixed32 h = 8; uint64 i = 9; fixed64 j = 10; float k = 11; double l = 12;
          bool m = 13; string n = 14; bytes o = 15;
          google.protobuf.Int64Value p = 16; google.protobuf.BytesValue q = 17; google.protobuf.Struct r = 18;
          map<int32, Scalars2> s = 19;
        }
        message Scalars2 { repeated google.protobuf.DoubleValue t = 1; }
    """)
    assert protobuf_event_schema(message_descriptor(compile_schema_file(tmp_path / "scalars.proto"), None)) == (
        StructType.fromDDL(
            "a int, b int, c int, d bigint, e bigint, f bigint, g bigint, h bigint, i decimal(20,0), "
            "j decimal(20,0), k float, l double, m boolean, n string, o binary, p bigint, q binary, r string, "
            "s map<int, struct<t: array<double>>>"
        )
    )


def test_a_recursive_message_is_refused_naming_the_field(tmp_path):
    (tmp_path / "tree.proto").write_text("""
        syntax = "proto3";
        package org;
        message Team { string name = 1; Person lead = 2; }
        message Person { string name = 1; repeated Person reports = 2; }
    """)
    schema = compile_schema_file(tmp_path / "tree.proto")
    with pytest.raises(ConfigError) as refused:
        protobuf_event_schema(message_descriptor(schema, "org.Team"))
    assert refused.value.message == (
        "field lead.reports: message org.Person contains itself; recursive Protobuf messages are not supported "
        "(no Spark schema can hold them)"
    )


def test_a_schema_that_does_not_compile_or_lacks_the_message_is_a_config_error(tmp_path):
    broken = tmp_path / "broken.proto"
    broken.write_text('syntax = "proto3";\nmessage A { strin x = 1; }\n')
    with pytest.raises(ConfigError) as refused:
        compile_schema_file(broken)
    assert refused.value.message == (
        f'the Protobuf schema file {broken} does not compile: broken.proto:2:13: "strin" is not defined.'
    )
    with pytest.raises(ConfigError, match=f"^cannot read the Protobuf schema file {tmp_path}/none.proto: no such"):
        compile_schema_file(tmp_path / "none.proto")
    with pytest.raises(ConfigError) as refused:
        message_descriptor(compile_schema_file(FIXTURE), "Reading")
    assert refused.value.message == (
        "message: the Protobuf schema has no message 'Reading' (it has fitness.Reading, fitness.Reading.Lap, "
        "fitness.Position, fitness.Device; give the fully qualified name)"
    )


def test_a_value_spark_cannot_hold_is_named_by_its_field_path(tmp_path):
    (tmp_path / "outer.proto").write_text("""
        syntax = "proto3";
        import "google/protobuf/timestamp.proto";
        message Outer { string name = 1; repeated Inner inner = 2; }
        message Inner { google.protobuf.Timestamp at = 1; }
    """)
    descriptor = message_descriptor(compile_schema_file(tmp_path / "outer.proto"), "Outer")
    outer = message_factory.GetMessageClass(descriptor)(name="o", inner=[{"at": {"seconds": 1}}])
    convert = message_converter(descriptor)
    assert convert(outer) == {"name": "o", "inner": [{"at": 1_000_000}]}  # microseconds, as Arrow takes them
    outer.inner.add().at.seconds = -62_135_596_801  # a second before the year 1
    with pytest.raises(Unfit) as unfit:
        convert(outer)
    assert str(unfit.value) == "field inner.at: Timestamp -62135596801s 0ns is outside years 1 to 9999"


# --- Confluent's message indexes ---------------------------------------------------------------


def test_message_indexes_name_messages_by_their_path():
    assert indexed_messages(schema_file(compile_schema_file(FIXTURE))) == {
        (0,): "fitness.Reading",
        (0, 0): "fitness.Reading.Lap",
        (1,): "fitness.Position",
        (2,): "fitness.Device",
    }
    assert message_indexes(b"\x00rest", 0) == ((0,), 1)  # the first message: a single 0
    assert message_indexes(b"\x02\x00", 0) == ((0,), 2)  # the same, spelt out
    assert message_indexes(b"\x04\x00\x00", 0) == ((0, 0), 3)
    assert message_indexes(b"\x02\x96\x01", 0) == ((75,), 3)  # zigzag 150 is 75
    assert framing_header((2,), 7) == b"\x00\x00\x00\x00\x07\x02\x04"
    assert framing_header((0,), 7) == b"\x00\x00\x00\x00\x07\x00"
    for cut, reason in (
        (b"\x04\x00", "a count of 2 message indexes"),  # an index missing
        (b"\x80", "the value ends inside a varint"),
        (b"\x01", "a count of -1 message indexes"),
    ):
        with pytest.raises(ValueError, match=reason):
            message_indexes(cut, 0)


# --- decoding ----------------------------------------------------------------------------------


def test_plain_values_of_a_schema_file_decode_or_get_a_reason(spark, fitness, raw_records, problems_and_events):
    full = fitness.Reading(
        device_id="w1",
        heart_rate=72,
        tags=["left", "wrist"],
        activity=fitness.Reading.DESCRIPTOR.fields_by_name["activity"].enum_type.values_by_name["RUN"].number,
        steps=2**64 - 1,
    )
    full.time.FromDatetime(at(0))
    full.position.lat, full.position.lon = 1.5, 2.0
    full.counters["km"] = 12
    full.model.value = "fenix"
    full.laps.add(number=1, seconds=92.5)
    good = full.SerializeToString()
    values = [
        good,
        reading(fitness, "w2", 1),  # only two fields: the others unset (valid UTF-8: landed in `value`)
        good[:-3],  # truncated inside a lap
        b"\xff" * 12,  # garbage
        None,
        b"\x00\x00\x00\x00\x07\x00" + good,  # Confluent's framing, read as a plain message
    ]
    problems, events = problems_and_events(decode_protobuf(raw_records(values), decoding()))
    corrupt = "the value is not a Protobuf fitness.Reading message: Wire format was corrupt"
    assert problems == [
        None,
        None,
        corrupt,
        corrupt,
        "no value (a null record)",
        corrupt + " (it starts like Confluent's wire format, which a registry schema reads)",
    ]
    assert events[:2] == [
        {
            "device_id": "w1",
            "time": at(0).replace(tzinfo=None),
            "heart_rate": 72,
            "position": {"lat": 1.5, "lon": 2.0},
            "tags": ["left", "wrist"],
            "counters": {"km": 12},
            "activity": "RUN",
            "model": "fenix",
            "steps": Decimal(2**64 - 1),
            "laps": [{"number": 1, "seconds": 92.5}],
        },
        # unset: proto3 scalars read as their defaults, fields with presence (optional, messages) as null
        {
            "device_id": "w2",
            "time": at(1).replace(tzinfo=None),
            "heart_rate": None,
            "position": None,
            "tags": [],
            "counters": {},
            "activity": "ACTIVITY_UNSPECIFIED",
            "model": None,
            "steps": Decimal(0),
            "laps": [],
        },
    ]
    decoded = decode_protobuf(raw_records(values), decoding())
    assert decoded.orderBy("kafka_offset").first().raw_value == good.hex().upper()
    assert decoded.count() == len(values)  # nothing lost


def test_a_proto2_string_that_is_not_utf8_is_a_problem_of_its_own_record(
    spark, tmp_path, raw_records, problems_and_events
):
    (tmp_path / "legacy.proto").write_text("""
        syntax = "proto2";
        message Legacy { required string name = 1; optional int32 size = 2 [default = 7]; }
    """)
    schema = compile_schema_file(tmp_path / "legacy.proto")
    event_schema = protobuf_event_schema(message_descriptor(schema, None))
    values = [b"\x0a\x02ok", b"\x0a\x02\xff\xfe", b"\x10\x03"]  # the parser checks neither UTF-8 nor `required`
    decoded = decode_protobuf(
        raw_records(values), ProtobufDecoding(schema=schema, message="Legacy", event_schema=event_schema, framed=False)
    )
    problems, events = problems_and_events(decoded)
    assert problems == [
        None,
        (
            "the Legacy message does not fit the events' schema: Could not convert b'\\xff\\xfe' "
            "with type bytes: was not a utf8 string"
        ),
        None,
    ]
    # Fields with presence (proto2: all of them) are null when unset: neither `required` nor defaults apply.
    assert [events[0], events[2]] == [{"name": "ok", "size": None}, {"name": None, "size": 3}]


def test_framed_values_are_read_by_their_schema_id_and_message_indexes(
    spark, fitness, raw_records, problems_and_events
):
    messages = indexed_messages(schema_file(compile_schema_file(FIXTURE)))
    device = fitness.Device(device_id="w9", active=True).SerializeToString()
    late = fitness.Reading(device_id="w3", time={"seconds": 253_402_300_800})  # the year 10000
    values = [
        framing_header((0,), 1) + reading(fitness, "w1", 0, heart_rate=70),
        b"\x00\x00\x00\x00\x01\x02\x00" + reading(fitness, "w2", 1),  # the indexes [0] spelt out
        framing_header((2,), 1) + device,  # another message of the schema
        framing_header((5,), 1) + device,  # indexes naming no message
        framing_header((0,), 9) + reading(fitness, "w3", 2),  # an id the registry does not hold
        framing_header((0,), 4) + reading(fitness, "w3", 2),  # an Avro schema's id
        b"\x01" + (framing_header((0,), 1) + reading(fitness, "w4", 3))[1:],  # not the magic byte
        b"\x00\x00\x00",
        (framing_header((0,), 1) + reading(fitness, "w5", 4))[:-2],  # truncated
        b"\x00\x00\x00\x00\x01\x80",  # the indexes cut short
        framing_header((0,), 1) + late.SerializeToString(),  # a Timestamp Spark cannot hold
        None,
    ]
    writers = {
        1: messages,
        9: "is not a Protobuf schema of the schema registry",
        4: "is not a Protobuf schema of the schema registry",
    }
    decoded = decode_protobuf(raw_records(values), decoding(framed=True, writers=writers))
    problems, events = problems_and_events(decoded)
    assert problems == [
        None,
        None,
        "the value is a fitness.Device message (schema id 1), not fitness.Reading",
        "message indexes [5] name no message of schema id 1",
        "schema id 9 is not a Protobuf schema of the schema registry",
        "schema id 4 is not a Protobuf schema of the schema registry",
        "the value starts with byte 0x01, not the magic byte 0x00 of Confluent's wire format",
        "the value is 3 bytes: shorter than the header of Confluent's wire format (magic byte 0, 4-byte schema id)",
        "the value is not a Protobuf fitness.Reading message (schema id 1): Wire format was corrupt",
        "the message indexes after schema id 1 are not readable: the value ends inside a varint",
        (
            "the fitness.Reading message (schema id 1) does not fit the events' schema: field time: Timestamp "
            "253402300800s 0ns is outside years 1 to 9999"
        ),
        "no value (a null record)",
    ]
    assert [(event["device_id"], event["time"], event["heart_rate"]) for event in events[:2]] == [
        ("w1", at(0).replace(tzinfo=None), 70),
        ("w2", at(1).replace(tzinfo=None), None),
    ]


V2 = """
syntax = "proto3";
package fitness;
import "google/protobuf/timestamp.proto";
message Device { string device_id = 1; }
message Reading {
  string device_id = 1;
  google.protobuf.Timestamp time = 2;
  optional int32 heart_rate = 3;
  string model = 11;
}
"""


def test_a_registry_decoder_reads_each_writers_message_as_the_latest(
    spark, fitness, schema_registry, raw_records, problems_and_events
):
    v1 = schema_registry.register("fitness-value", FIXTURE.read_text(), "PROTOBUF")
    avro = schema_registry.register("other-value", '{"type": "string"}')
    v2 = schema_registry.register("fitness-value", V2, "PROTOBUF")  # Reading is now the second message
    registry = SchemaRegistry(kind="registry", url=schema_registry.url)
    decoder = ProtobufDecoder(registry, "fitness", "fitness.Reading")
    assert (decoder.message, decoder.event_schema.simpleString()) == (
        "fitness.Reading",
        "struct<device_id:string,time:timestamp,heart_rate:int,model:string>",
    )
    newer = fitness.Reading(device_id="w2")
    newer.time.FromDatetime(at(1))
    newer = newer.SerializeToString() + b"\x5a\x05fenix"  # field 11, which v1 does not have
    batch = raw_records(
        [
            framing_header((0,), v1) + reading(fitness, "w1", 0, heart_rate=70, tags=["a"]),  # tags: not in v2
            framing_header((1,), v2) + newer,
            framing_header((0,), v2) + reading(fitness, "w3", 2),  # a Device in v2
            framing_header((0,), avro) + reading(fitness, "w4", 3),
        ]
    )
    problems, events = problems_and_events(decoder.decode(batch))
    assert problems == [
        None,
        None,
        f"the value is a fitness.Device message (schema id {v2}), not fitness.Reading",
        f"schema id {avro} is not a Protobuf schema of the schema registry",
    ]
    assert events[:2] == [
        {"device_id": "w1", "time": at(0).replace(tzinfo=None), "heart_rate": 70, "model": ""},
        {"device_id": "w2", "time": at(1).replace(tzinfo=None), "heart_rate": None, "model": "fenix"},
    ]
    assert sorted(decoder.writers) == [v1, v2]  # kept for the next batches

    assert ProtobufDecoder(registry, "fitness").message == "fitness.Device"  # default: the latest's first message
    with pytest.raises(ConfigError, match="holds a AVRO schema for subject other-value, not a Protobuf one"):
        ProtobufDecoder(SchemaRegistry(kind="registry", url=schema_registry.url, subject="other-value"), "t")
    broken = schema_registry.register("broken-value", 'syntax = "proto3"; message A { strin x = 1; }', "PROTOBUF")
    with pytest.raises(ConfigError) as refused:
        ProtobufDecoder(SchemaRegistry(kind="registry", url=schema_registry.url), "broken")
    assert refused.value.message == (
        f"the Protobuf schema of subject broken-value (id {broken}) at the schema registry {schema_registry.url} "
        'does not compile: registered.proto:1:32: "strin" is not defined.'
    )
    with pytest.raises(ConfigError, match=r"^message: the Protobuf schema has no message 'fitness.Nope'"):
        ProtobufDecoder(SchemaFile(kind="file", path=FIXTURE), "fitness", "fitness.Nope")


# --- on the real stack ---------------------------------------------------------------------------


def test_protobuf_events_with_a_schema_file_and_with_a_registry(
    spark, fitness, kafka, pipeline_run, unique_name, schema_registry, tmp_path
):
    plain, registered = kafka.create_topic(f"{unique_name}.readings"), kafka.create_topic(f"{unique_name}.devices")
    (tmp_path / "fitness.proto").write_text(FIXTURE.read_text())  # beside the pipeline file, which names it relatively
    schema_id = schema_registry.register(f"{registered}-value", FIXTURE.read_text(), "PROTOBUF")
    pipeline = {
        "name": "fitness_protobuf",
        "sources": {
            "plain": {
                "kind": "events",
                "format": "protobuf",
                "topic": plain,
                "schema": {"kind": "file", "path": "fitness.proto"},
            },  # message: the first, fitness.Reading
            "registered": {
                "kind": "events",
                "format": "protobuf",
                "topic": registered,
                "message": "fitness.Reading",
                "schema": {"kind": "registry", "url": schema_registry.url},
            },  # subject <topic>-value
        },
        "refined": {
            "readings": {"source": "plain", "explode": ["laps"]},  # every event, appended, position flattened
            "devices": {"source": "registered", "keys": ["device_id"], "ordering": "time"},  # the latest per device
        },
        "expectations": {"plausible": {"table": "devices", "constraint": "heart_rate < 250", "action": "drop"}},
    }

    def framed(message: bytes) -> bytes:
        return framing_header((0,), schema_id) + message

    kafka.produce(
        plain,
        [
            (
                b"w1",
                reading(
                    fitness,
                    "w1",
                    0,
                    heart_rate=72,
                    position={"lat": 1.5, "lon": 2.0},
                    laps=[{"number": 1, "seconds": 90.0}, {"number": 2, "seconds": 95.5}],
                ),
            ),
            (b"w1", reading(fitness, "w1", 5, heart_rate=95)),
            (b"w1", reading(fitness, "w1", 6, heart_rate=96, model={"value": "fenix"})[:-3]),  # truncated
            (b"w2", reading(fitness, "w2", 1, tags=["swim"])),
        ],
    )
    kafka.produce(
        registered,
        [
            (b"w1", framed(reading(fitness, "w1", 0, heart_rate=70))),
            (b"w1", framed(reading(fitness, "w1", 5, heart_rate=90, model={"value": "fenix"}))),
            (b"w1", framed(reading(fitness, "w1", 2, heart_rate=80))),  # late: older than 10:05
            (b"w2", framed(reading(fitness, "w2", 1, heart_rate=300))),  # breaks `plausible`
            (b"w3", b"\x01" + framed(reading(fitness, "w3", 3))[1:]),  # not the magic byte
            (b"w4", framed(reading(fitness, "w4", 3, heart_rate=60, counters={"km": 3}))),
        ],
    )
    readings_schema = (
        "device_id string, time string, heart_rate int, position_lat double, position_lon double, "
        "tags array<string>, activity string, _cdc_partition int, _cdc_offset long"
    )
    expected_readings = spark.createDataFrame(
        [
            ("w1", "2026-01-01 10:00:00", 72, 1.5, 2.0, [], "ACTIVITY_UNSPECIFIED", 0, 0),
            ("w1", "2026-01-01 10:05:00", 95, None, None, [], "ACTIVITY_UNSPECIFIED", 0, 1),
            ("w2", "2026-01-01 10:01:00", None, None, None, ["swim"], "ACTIVITY_UNSPECIFIED", 0, 3),
        ],
        readings_schema,
    ).withColumn("time", F.to_timestamp("time"))
    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        readings = pipeline_run.table("readings").select(*expected_readings.columns)
        assertDataFrameEqual(readings, expected_readings)
        laps = pipeline_run.table("readings__laps").select("_cdc_offset", "pos", "number", "seconds")
        assertDataFrameEqual(laps, spark.createDataFrame([(0, 0, 1, 90.0), (0, 1, 2, 95.5)], laps.schema))
        devices = pipeline_run.table("devices").select("device_id", "heart_rate", "model", "counters", "_cdc_offset")
        assertDataFrameEqual(
            devices, spark.createDataFrame([("w1", 90, "fenix", {}, 1), ("w4", 60, None, {"km": 3}, 5)], devices.schema)
        )
        quarantined = spark.read.format("delta").load(quarantine_location(pipeline_run.warehouse))
        assert sorted((row.topic, row.offset, row.reason) for row in quarantined.collect()) == sorted(
            [
                (plain, 2, "the value is not a Protobuf fitness.Reading message: Wire format was corrupt"),
                (registered, 3, "failed expectations: plausible"),
                (registered, 4, "the value starts with byte 0x01, not the magic byte 0x00 of Confluent's wire format"),
            ]
        )
