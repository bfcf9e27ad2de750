"""The game-events demo: generated events of several games on one topic, then the pipeline
examples/pipelines/game_events.yaml landed, refined and shown (a table per game, child tables of
the items, the latest event per player, the quarantined records).

The events are produced once, when the topic holds none yet: the generator is deterministic, so a
rerun would only duplicate them; a rerun lands and refines nothing new.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc.core.config import KafkaConnection, Settings
from cdc.core.errors import ConfigError
from cdc.core.source import KafkaTopics
from cdc.core.storage import Storage, normalize_location
from cdc.core.tables import is_delta_table
from cdc.demo.show import Say, land_and_refine, preview, show_business_tables, write_pipeline_graph
from cdc.pipeline.config import JsonEvents, Pipeline
from cdc.stack.game_events import GameEvents, generate_game_events, produce_game_events
from refine.apply.flatten import child_table_name
from refine.apply.merge import OFFSET, PARTITION, REFINED_AT
from refine.config import refined_table_location
from refine.quality.quarantine import quarantine_location


def games_demo(
    spark: SparkSession,
    settings: Settings,
    pipeline: Pipeline,
    output_dir: Path,
    say: Say = print,
    events: GameEvents | None = None,
) -> GameEvents:
    """Produce ``events`` (default: the seed-0 set) to the pipeline's event topic unless it holds
    records already; land, refine and show the pipeline's tables; write its graph."""
    events = events or generate_game_events()
    topics = [source.topic for source in pipeline.sources.values() if isinstance(source, JsonEvents)]
    if len(topics) != 1:
        raise ConfigError("the game-events demo needs a pipeline with one JSON event source", pipeline=pipeline.name)
    topic = topics[0]
    produce_once(settings.stack.kafka.bootstrap_servers, topic, events, say)
    land_and_refine(spark, settings, pipeline, say)
    warehouse = normalize_location(settings.warehouse)
    for name, table in pipeline.refined.items():
        if table.split_by:
            show_split_tables(spark, warehouse, name, table.explode, events, say)
        else:
            show_player_tables(spark, warehouse, name, table.explode, events, say)
    quarantined = spark.read.format("delta").load(quarantine_location(warehouse)).where(F.col("topic") == topic)
    say(
        f"quarantine: {quarantined.count()} records of {topic} (malformed produced: {len(events.malformed)})  "
        f"{quarantine_location(warehouse)}"
    )
    for line in preview(quarantined.groupBy("reason").count(), rows=10, order_by=["reason"], cell=100):
        say(line)
    show_business_tables(spark, warehouse, pipeline.business, say)
    write_pipeline_graph(pipeline, output_dir, say)
    return events


def produce_once(bootstrap_servers: str, topic: str, events: GameEvents, say: Say) -> None:
    """Produce ``events`` to ``topic`` unless it holds records already (a rerun would duplicate them)."""
    kafka = KafkaTopics(KafkaConnection(bootstrap_servers=bootstrap_servers))
    held = sum(o.end - o.earliest for o in kafka.offsets([topic]).values()) if topic in kafka.names() else 0
    if held:
        say(f"topic {topic} holds {held} records already: not producing the events again")
        return
    produce_game_events(bootstrap_servers, topic, events)
    say(
        f"produced {len(events.records)} records to {topic}: {len(events.events)} events of "
        f"{len(events.events_per_game())} games by {len(events.latest_per_player())} players "
        f"({events.out_of_order()} out of order by time), {len(events.malformed)} malformed"
    )


def _read(spark: SparkSession, location: str):
    return spark.read.format("delta").load(location)


# Shown first: what says whose event it is; the inferred schema orders columns by name.
FIRST_COLUMNS = ("player", "game", "event_type", "time", "pos", "item_id", "qty")


def _shown(spark: SparkSession, location: str):
    columns = _read(spark, location).drop(REFINED_AT).columns  # the Kafka position stays: it keys appended events
    return _read(spark, location).select(
        *[c for c in FIRST_COLUMNS if c in columns], *[c for c in columns if c not in FIRST_COLUMNS]
    )


def show_split_tables(
    spark: SparkSession, warehouse: str, name: str, arrays: list[str], events: GameEvents, say: Say
) -> None:
    """The table of each split value (a game) and its child tables, with the generated counts."""
    location = refined_table_location(warehouse, name)
    storage = Storage(spark)
    games = [game for game in storage.list_names(location) if is_delta_table(spark, f"{location}/{game}")]
    expected, items = events.events_per_game(), events.items_per_game()
    say(f"refined {name}: one table per game under {location}")
    if not games:
        return
    for game in games:
        say(f"  {name}/{game}: {_read(spark, f'{location}/{game}').count()} rows (generated: {expected[game]})")
        for path in arrays:
            child = f"{refined_table_location(warehouse, child_table_name(name, path))}/{game}"
            rows = _read(spark, child).count()
            say(f"  {child_table_name(name, path)}/{game}: {rows} rows (generated: {items[game]})")
    for line in preview(_shown(spark, f"{location}/{games[0]}"), order_by=["time"]):
        say(line)
    for path in arrays:
        child = f"{refined_table_location(warehouse, child_table_name(name, path))}/{games[0]}"
        say(f"  {child_table_name(name, path)}/{games[0]}:")
        for line in preview(_shown(spark, child), order_by=[PARTITION, OFFSET, "pos"]):
            say(line)


def show_player_tables(
    spark: SparkSession, warehouse: str, name: str, arrays: list[str], events: GameEvents, say: Say
) -> None:
    """A keyed table (the latest event per player) and its child tables, with the generated counts."""
    latest = events.latest_per_player()
    location = refined_table_location(warehouse, name)
    say(
        f"refined {name}: {_read(spark, location).count()} rows, the latest event per player by time "
        f"(players: {len(latest)})  {location}"
    )
    for line in preview(_shown(spark, location), order_by=["player"]):
        say(line)
    for path in arrays:
        child = refined_table_location(warehouse, child_table_name(name, path))
        generated = sum(len(event.get(path) or ()) for event in latest.values())
        say(f"  {child_table_name(name, path)}: {_read(spark, child).count()} rows (in the latest events: {generated})")
        for line in preview(_shown(spark, child), order_by=["player", "pos"]):
            say(line)
