"""The game-events generator: deterministic, with late sessions and malformed records."""

import json

from cdc.stack.game_events import generate_game_events


def test_the_same_seed_gives_the_same_records():
    assert generate_game_events(seed=5) == generate_game_events(seed=5)
    assert generate_game_events(seed=5) != generate_game_events(seed=6)


def test_events_are_nested_some_late_and_some_malformed():
    events = generate_game_events(seed=1, players=6, sessions=3, malformed=4)
    assert len(events.malformed) == 4
    assert events.out_of_order() > 0  # the first player's first session always arrives late
    assert len(events.events_per_game()) >= 3
    for record in events.records:
        if record.event is not None:
            assert json.loads(record.value) == record.event
            assert record.key == record.event["player"].encode()
            assert set(record.event["device"]) == {"os", "model", "app_version"}
    for record in events.malformed:  # none of them is a JSON object with a player and a game
        try:
            value = json.loads(record.value)
        except ValueError:
            continue
        assert not isinstance(value, dict) or not {"player", "game"} & value.keys()
    assert sum(events.items_per_game().values()) > 0
