"""A deterministic stream of game events for the game-events pipeline (examples/pipelines/game_events.yaml).

Several games share one topic. Each player plays sessions of one game at a time from their device
(a nested struct): ``session_start``, the game's own events (chess moves, racing laps, puzzle
levels, poker hands, each with fields of its own), purchases carrying an ``items`` array, and a
``session_end`` with the items earned. As with real clients, some sessions are delivered late (a
phone that was offline sends them after the player's next session: out of order by ``time``) and a
few records are malformed: truncated JSON, a JSON array, an event with neither player nor game, and
bytes that are not UTF-8. The same seed gives the same records; :class:`GameEvents` says what a
correct refinement of them holds.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

Event = dict[str, Any]

# The game-specific fields of each game's own events.
GAME_MOVES: dict[str, tuple[str, Callable[[random.Random], Event]]] = {
    "chess": ("move", lambda rng: {"move": rng.choice(["e4", "d4", "Nf3", "c4", "O-O", "Qxd7", "exd5"])}),
    "racing": ("lap", lambda rng: {"lap_ms": rng.randint(61_000, 95_000), "track": rng.choice(["monza", "spa"])}),
    "puzzle": ("level_up", lambda rng: {"level": rng.randint(2, 60), "score": rng.randint(100, 9_000)}),
    "poker": ("hand", lambda rng: {"pot": rng.randint(10, 5_000), "won": rng.random() < 0.4}),
}
DEVICES = [
    {"os": "ios", "model": "iPhone 15"},
    {"os": "android", "model": "Pixel 9"},
    {"os": "android", "model": "Galaxy S24"},
    {"os": "web", "model": "firefox"},
]
ITEMS = {"gem_pack": 499, "extra_life": 99, "skin_gold": 1_299, "hint": 0, "booster": 199}
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class GameRecord:
    """One Kafka record: its key and value bytes, and the event it carries when it is well-formed."""

    key: bytes | None
    value: bytes
    event: Event | None


@dataclass(frozen=True)
class GameEvents:
    """The records in the order they are produced, and what refining them must give."""

    records: list[GameRecord]

    @property
    def events(self) -> list[Event]:
        return [record.event for record in self.records if record.event is not None]

    @property
    def malformed(self) -> list[GameRecord]:
        return [record for record in self.records if record.event is None]

    def events_per_game(self) -> Counter[str]:
        return Counter(event["game"] for event in self.events)

    def items_per_game(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for event in self.events:
            counts[event["game"]] += len(event.get("items") or ())
        return counts

    def latest_per_player(self) -> dict[str, Event]:
        """Each player's event with the greatest time (times are unique per player)."""
        latest: dict[str, Event] = {}
        for event in self.events:
            if event["player"] not in latest or event["time"] > latest[event["player"]]["time"]:
                latest[event["player"]] = event
        return latest

    def out_of_order(self) -> int:
        """Events produced after a later event (by time) of the same player."""
        newest: dict[str, str] = {}
        late = 0
        for event in self.events:
            late += event["time"] < newest.get(event["player"], "")
            newest[event["player"]] = max(event["time"], newest.get(event["player"], ""))
        return late


def _time(moment: datetime) -> str:
    # Always milliseconds and Z: the text orders as the times do (the pipeline orders by it).
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _items(rng: random.Random, most: int) -> list[Event]:
    names = rng.sample(sorted(ITEMS), rng.randint(1, most))
    return [{"item_id": name, "qty": rng.randint(1, 3), "price_cents": ITEMS[name]} for name in names]


def _session(rng: random.Random, player: str, device: Event, number: int, start: datetime) -> list[Event]:
    game = rng.choice(sorted(GAME_MOVES))
    move_type, move_fields = GAME_MOVES[game]
    common: Event = {"player": player, "game": game, "session_id": f"{player}-s{number}", "device": device}
    moment = start
    events: list[Event] = [{"event_type": "session_start"}]
    for _ in range(rng.randint(2, 5)):
        events.append({"event_type": move_type, **move_fields(rng)})
        if rng.random() < 0.3:
            events.append({"event_type": "purchase", "items": _items(rng, 3)})
    events.append({"event_type": "session_end", "items": _items(rng, 2) if rng.random() < 0.7 else []})
    timed = []
    for event in events:
        moment += timedelta(seconds=rng.randint(5, 90), milliseconds=rng.randint(0, 999))
        timed.append({"event_id": str(uuid.UUID(int=rng.getrandbits(128))), **common, **event, "time": _time(moment)})
    return timed


def _malformed(rng: random.Random, kind: int, sample: Event) -> bytes:
    text = json.dumps(sample)
    return [
        text[: len(text) // 2].encode(),  # cut off mid-way
        json.dumps([sample["player"], sample["event_type"]]).encode(),  # not an object
        json.dumps({"event_type": "heartbeat", "time": sample["time"]}).encode(),  # neither player nor game
        b"\xff\xfe" + rng.randbytes(6),  # not UTF-8 text
    ][kind % 4]


def generate_game_events(seed: int = 0, players: int = 8, sessions: int = 3, malformed: int = 4) -> GameEvents:
    """``players`` players with ``sessions`` sessions each, about a quarter of sessions delivered late
    (the first player's first session always), and ``malformed`` bad records spread among them."""
    rng = random.Random(seed)
    produced: list[tuple[datetime, Event]] = []
    for index in range(players):
        player = f"player_{index + 1:02d}"
        device = {**rng.choice(DEVICES), "app_version": f"3.{rng.randint(0, 4)}.{rng.randint(0, 9)}"}
        start = START + timedelta(minutes=rng.randint(0, 240))
        online: list[Event] = []
        offline: list[Event] = []
        for number in range(1, sessions + 1):
            events = _session(rng, player, device, number, start)
            late = (index == 0 and number == 1) or rng.random() < 0.25
            (offline if late else online).extend(events)
            start = datetime.fromisoformat(events[-1]["time"]) + timedelta(hours=rng.randint(1, 20))
        produced += [(datetime.fromisoformat(event["time"]), event) for event in online]
        # An offline session reaches Kafka once the player is online again, after their last session.
        produced += [(start + timedelta(seconds=i), event) for i, event in enumerate(offline)]
    produced.sort(key=lambda pair: pair[0])
    records = [GameRecord(e["player"].encode(), json.dumps(e).encode(), e) for _, e in produced]
    for kind in range(malformed):
        bad = _malformed(rng, kind, rng.choice(produced)[1])
        records.insert(rng.randrange(len(records) + 1), GameRecord(None, bad, None))
    return GameEvents(records)


def produce_game_events(bootstrap_servers: str, topic: str, events: GameEvents, partitions: int = 3) -> None:
    """Create ``topic`` (when absent) and send the records in order, keyed by player (a player's
    events stay in one partition, in order); wait until all are written."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=5, acks="all")
    try:
        for record in events.records:
            producer.send(topic, key=record.key, value=record.value)
        producer.flush()
    finally:
        producer.close()
