"""Plain event topics: parsing with reasons (pure), then Kafka -> `cdc raw` -> `cdc refine` through a
pipeline file on the real stack: a given schema, an inferred one, split tables, child tables,
the quarantine, and reruns."""

import json

from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.pipeline.config import RefinedTable
from cdc.pipeline.events.job import parse_events
from refine.quality.quarantine import quarantine_location
from refine.records.schemas import schema_location

FITNESS = "device_id string, time timestamp, model string, heart_rate int, position struct<lat: double, lon: double>"


def test_each_bad_event_gets_a_reason_naming_the_field(spark, raw_records):
    from pyspark.sql.types import StructType

    values = [
        '{"device_id": "w1", "time": "2026-01-01T10:00:00Z", "model": "fenix", "heart_rate": 72}',
        "{not json",
        "[1, 2]",
        '{"device_id": "w1", "time": "2026-01-01T10:00:00Z", "heart_rate": "fast"}',
        '{"time": "2026-01-01T10:00:00Z"}',
        '{"device_id": "w/1", "time": "2026-01-01T10:00:00Z"}',
        None,
        b"\xff\xfe",
    ]
    table = RefinedTable(source="s", keys=["device_id"], ordering="time", split_by="device_id")
    parsed = parse_events(raw_records(values), StructType.fromDDL(FITNESS), table)
    assert [row.problem for row in parsed.orderBy("kafka_offset").collect()] == [
        None,
        "the value is not valid JSON",
        "the value is not a JSON object",
        'field heart_rate: cannot read "fast" as int',
        "key device_id is null",
        "split_by column device_id: w/1 is not usable as a table name (letters, digits, '.', '_', '-')",
        "no value (a null record)",
        "the value is not UTF-8 text",
    ]
    good = parsed.where("problem IS NULL").select("event.*")
    assert good.collect()[0].asDict() == {
        "device_id": "w1",
        "time": good.collect()[0].time,
        "model": "fenix",
        "heart_rate": 72,
        "position": None,
    }


# --- on the real stack ---------------------------------------------------------------------------


def event(**fields) -> tuple[bytes, bytes]:
    return (str(fields.get("device_id") or fields.get("player")).encode(), json.dumps(fields).encode())


def test_fitness_events_with_a_given_schema(spark, kafka, pipeline_run, unique_name):
    topic = kafka.create_topic(f"{unique_name}.fitness", partitions=2)
    pipeline = {
        "name": "fitness",
        "sources": {"tracker": {"kind": "events", "format": "json", "topic": topic, "schema": FITNESS}},
        "refined": {
            "readings": {"source": "tracker"},  # every event, appended
            "devices": {"source": "tracker", "keys": ["device_id"], "ordering": "time"},  # the latest per device
        },
    }
    kafka.produce(
        topic,
        [
            event(
                device_id="w1",
                time="2026-01-01T10:00:00Z",
                model="fenix",
                heart_rate=72,
                position={"lat": 1.5, "lon": 2},
            ),
            event(device_id="w1", time="2026-01-01T10:05:00Z", model="fenix", heart_rate=95),
            event(device_id="w1", time="2026-01-01T10:01:00Z", model="fenix", heart_rate=80),  # late: older than 10:05
            event(device_id="w2", time="2026-01-01T09:00:00Z", model="forerunner", heart_rate=60),
            (b"w3", b'{"device_id": "w3", "time": "2026-01-01T09:00:00Z", "heart_rate": 7'),  # malformed JSON
            (b"w3", b'{"device_id": "w3", "time": "2026-01-01T09:00:00Z", "heart_rate": "fast"}'),
        ],
        partition=0,
    )
    readings_schema = (
        "device_id string, time timestamp, model string, heart_rate int, position_lat double, "
        "position_lon double, _cdc_partition int, _cdc_offset long"
    )
    expected_readings = spark.createDataFrame(
        [
            ("w1", "2026-01-01 10:00:00", "fenix", 72, 1.5, 2.0, 0, 0),
            ("w1", "2026-01-01 10:05:00", "fenix", 95, None, None, 0, 1),
            ("w1", "2026-01-01 10:01:00", "fenix", 80, None, None, 0, 2),
            ("w2", "2026-01-01 09:00:00", "forerunner", 60, None, None, 0, 3),
        ],
        readings_schema.replace("time timestamp", "time string"),
    ).withColumn("time", F.to_timestamp("time"))
    expected_readings = expected_readings.select(*[c.split()[0] for c in readings_schema.split(", ")])
    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        assertDataFrameEqual(pipeline_run.table("readings").drop("_cdc_refined_at"), expected_readings)
        devices = pipeline_run.table("devices").select("device_id", "heart_rate", "_cdc_offset")
        assertDataFrameEqual(devices, spark.createDataFrame([("w1", 95, 1), ("w2", 60, 3)], devices.schema))

    quarantined = spark.read.format("delta").load(quarantine_location(pipeline_run.warehouse))
    assert sorted((row.offset, row.reason) for row in quarantined.collect()) == [
        (4, "the value is not valid JSON"),
        (5, 'field heart_rate: cannot read "fast" as int'),
    ]

    # Later batches: an event older than the stored state never overwrites it, a newer one does.
    kafka.produce(
        topic,
        [
            event(device_id="w1", time="2026-01-01T10:02:00Z", model="fenix", heart_rate=99),
            event(device_id="w2", time="2026-01-01T09:30:00Z", model="forerunner", heart_rate=65),
        ],
        partition=1,
    )
    assert pipeline_run(pipeline) == 0
    devices = pipeline_run.table("devices").select("device_id", "heart_rate", "_cdc_partition", "_cdc_offset")
    assertDataFrameEqual(devices, spark.createDataFrame([("w1", 95, 0, 1), ("w2", 65, 1, 1)], devices.schema))
    assert pipeline_run.table("readings").count() == 6


GAME_EVENTS = [
    {
        "player": "ann",
        "game": "chess",
        "event_type": "session_start",
        "time": "2026-01-01T10:00:00Z",
        "device": {"os": "ios", "model": "iPhone 15"},
        "items": [{"item_id": "clock", "qty": 1}, {"item_id": "pawn", "qty": 8}],
    },
    {
        "player": "bob",
        "game": "go",
        "event_type": "session_start",
        "time": "2026-01-01T10:00:01Z",
        "device": {"os": "android", "model": "Pixel 9"},
        "items": [{"item_id": "stone", "qty": 181}],
    },
    {
        "player": "ann",
        "game": "chess",
        "event_type": "move",
        "time": "2026-01-01T10:01:00Z",
        "device": {"os": "ios", "model": "iPhone 15"},
        "items": [{"item_id": "clock", "qty": 1}, {"item_id": "pawn", "qty": 7}, {"item_id": "queen", "qty": 1}],
    },
]


def test_game_events_with_an_inferred_schema_split_by_game(spark, kafka, pipeline_run, unique_name):
    topic = kafka.create_topic(f"{unique_name}.game-events")
    pipeline = {
        "name": "games",
        "sources": {"game_events": {"kind": "events", "format": "json", "topic": topic}},  # schema inferred
        "refined": {
            "events": {"source": "game_events", "split_by": "game", "explode": ["items"]},
            "players": {"source": "game_events", "keys": ["player"], "ordering": "time", "explode": ["items"]},
        },
    }
    kafka.produce(topic, [event(**fields) for fields in GAME_EVENTS])
    for _ in range(2):
        assert pipeline_run(pipeline) == 0
        chess = pipeline_run.table("events/chess")
        assert chess.columns[:7] == [
            "device_model",
            "device_os",
            "event_type",
            "game",
            "player",
            "time",
            "_cdc_partition",
        ]
        assert sorted(row.event_type for row in chess.collect()) == ["move", "session_start"]
        assert [row.player for row in pipeline_run.table("events/go").collect()] == ["bob"]
        assert pipeline_run.table("events__items/chess").count() == 5
        items = pipeline_run.table("players__items").select("player", "pos", "item_id", "qty")
        assertDataFrameEqual(
            items,
            spark.createDataFrame(
                [("ann", 0, "clock", 1), ("ann", 1, "pawn", 7), ("ann", 2, "queen", 1), ("bob", 0, "stone", 181)],
                items.schema,
            ),
        )
    kept = spark.read.text(schema_location(pipeline_run.warehouse, topic), wholetext=True).head()[0]
    assert json.loads(kept)["fields"][0]["name"] == "device"

    # A new game appears (a new table, no restart of anything); ann's items shrink; an older event is ignored.
    kafka.produce(
        topic,
        [
            event(
                player="cy",
                game="poker",
                event_type="session_start",
                time="2026-01-01T11:00:00Z",
                device={"os": "web", "model": "firefox"},
                items=[],
            ),
            event(
                player="ann",
                game="chess",
                event_type="move",
                time="2026-01-01T10:02:00Z",
                device={"os": "ios", "model": "iPhone 15"},
                items=[{"item_id": "clock", "qty": 1}],
            ),
            event(
                player="bob",
                game="go",
                event_type="move",
                time="2026-01-01T09:00:00Z",
                device={"os": "android", "model": "Pixel 9"},
                items=[],
            ),
        ],
    )
    assert pipeline_run(pipeline) == 0
    assert [row.player for row in pipeline_run.table("events/poker").collect()] == ["cy"]
    items = pipeline_run.table("players__items").select("player", "pos", "item_id", "qty")
    assertDataFrameEqual(items, spark.createDataFrame([("ann", 0, "clock", 1), ("bob", 0, "stone", 181)], items.schema))
    players = pipeline_run.table("players").select("player", "game", "event_type")
    assertDataFrameEqual(
        players,
        spark.createDataFrame(
            [("ann", "chess", "move"), ("bob", "go", "session_start"), ("cy", "poker", "session_start")], players.schema
        ),
    )

    # A field that appears later is picked up when the schema is inferred again (on request).
    kafka.produce(
        topic,
        [
            event(
                player="dee",
                game="go",
                event_type="session_start",
                time="2026-01-01T12:00:00Z",
                device={"os": "ios", "model": "iPad"},
                items=[],
                score=3,
            )
        ],
    )
    assert pipeline_run(pipeline, "--reinfer-schema") == 0
    dee = pipeline_run.table("events/go").where("player = 'dee'").select("score").collect()
    assert [row.score for row in dee] == [3]
