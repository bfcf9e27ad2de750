"""The game-events demo on the real stack: examples/pipelines/game_events.yaml over generated events,
a refined table per game with the generated rows, child tables, the latest event per player despite
out-of-order delivery, and exactly the malformed records quarantined; a rerun changes nothing."""

from pyspark.sql import functions as F

from cdc.core.config import Settings
from cdc.demo import PIPELINES
from cdc.demo.games import games_demo
from cdc.pipeline.load import load_pipeline
from cdc.stack.game_events import generate_game_events
from refine.config import refined_table_location
from refine.quality.quarantine import quarantine_location


def test_the_game_events_pipeline_gives_a_table_per_game(spark, kafka, stack_config, tmp_path, delta_rs_mismatches):
    warehouse = str(tmp_path / "warehouse")
    settings = Settings(stack=stack_config, warehouse=warehouse)
    pipeline = load_pipeline(PIPELINES["games"])
    events = generate_game_events(seed=3, players=5, sessions=2, malformed=4)
    assert events.out_of_order() > 0

    def table(name: str):
        return spark.read.format("delta").load(refined_table_location(warehouse, name))

    for run in range(2):  # the rerun produces nothing and refines nothing twice
        said: list[str] = []
        games_demo(spark, settings, pipeline, tmp_path / "out", said.append, events=events)
        assert any(line.startswith("topic game-events holds ") for line in said) == (run == 1)
        per_game, items = events.events_per_game(), events.items_per_game()
        games = sorted(path.name for path in (tmp_path / "warehouse" / "refined" / "events").iterdir())
        assert games == sorted(per_game)
        assert {game: table(f"events/{game}").count() for game in per_game} == dict(per_game)
        assert {game: table(f"events__items/{game}").count() for game in per_game} == dict(items)

        latest = events.latest_per_player()
        players = {row.player: (row.time, row.event_id) for row in table("players").collect()}
        assert players == {player: (event["time"], event["event_id"]) for player, event in latest.items()}
        assert table("players__items").count() == sum(len(event.get("items") or ()) for event in latest.values())

        malformed = {record.value for record in events.malformed}
        bad_offsets = {
            (partition, offset)
            for _, partition, offset, _, value, _ in kafka.records("game-events")
            if value in malformed
        }
        quarantined = spark.read.format("delta").load(quarantine_location(warehouse))
        quarantined = quarantined.where(F.col("topic") == "game-events")
        assert {(row.partition, row.offset) for row in quarantined.collect()} == bad_offsets
        assert len(bad_offsets) == len(malformed) == 4
    # Every table it wrote (raw, a refined table per game and their child tables, the quarantine)
    # opens in delta-rs with the rows Spark reads.
    tables, mismatches = delta_rs_mismatches(tmp_path / "warehouse")
    assert {"raw/game-events", "refined/players", "refined/events__items/" + sorted(per_game)[0]} <= set(tables)
    assert not mismatches
