"""Flatten and explode (pure DataFrame functions), and child tables kept consistent by MERGE."""

import pytest
from pyspark.testing import assertDataFrameEqual

from cdc.core.errors import ConfigError
from refine.apply.flatten import child_rows, child_table_name, flat_columns, flatten
from refine.apply.merge import TableSettings, replace_children

EVENT = (
    "player string, time timestamp, device struct<os: string, screen: struct<w: int, h: int>>, "
    "items array<struct<item_id: string, qty: int>>, tags array<string>"
)


@pytest.fixture
def events(spark):
    return spark.createDataFrame(
        [("p1", None, ("ios", (1170, 2532)), [("sword", 1), ("shield", 2)], ["a"]), ("p2", None, None, [], None)],
        EVENT,
    )


def test_nested_structs_become_columns_named_by_their_path(spark, events):
    expected = spark.createDataFrame(
        [
            ("p1", None, "ios", 1170, 2532, [("sword", 1), ("shield", 2)], ["a"]),
            ("p2", None, None, None, None, [], None),
        ],
        "player string, time timestamp, device_os string, device_screen_w int, device_screen_h int, "
        "items array<struct<item_id: string, qty: int>>, tags array<string>",
    )
    assertDataFrameEqual(flatten(events), expected)


def test_exploded_arrays_are_left_out_and_kept_structs_stay_whole(spark, events):
    flat = flatten(events, exclude=("items", "tags"), keep=("device.screen",))
    assert flat.columns == ["player", "time", "device_os", "device_screen"]
    assert flat.schema["device_screen"].dataType.simpleString() == "struct<w:int,h:int>"


def test_two_paths_with_one_name_are_an_error_naming_both(spark):
    schema = spark.createDataFrame([], "device struct<os: string>, device_os string").schema
    with pytest.raises(ConfigError, match=r"two columns named 'device_os': 'device.os' and 'device_os'"):
        flat_columns(schema)


def test_arrays_become_child_rows_keyed_by_parent_key_and_position(spark, events):
    expected = spark.createDataFrame(
        [("p1", 0, "sword", 1), ("p1", 1, "shield", 2)], "player string, pos int, item_id string, qty int"
    )
    assertDataFrameEqual(child_rows(events, ["player"], "items"), expected)
    scalars = spark.createDataFrame([("p1", 0, "a")], "player string, pos int, value string")
    assertDataFrameEqual(child_rows(events, ["player"], "tags"), scalars)
    assert child_table_name("events", "device.sensors") == "events__device_sensors"


def test_a_non_array_cannot_be_exploded(events):
    with pytest.raises(ConfigError, match=r"column 'device' is a struct<.*not an array: it cannot be exploded"):
        child_rows(events, ["player"], "device")
    with pytest.raises(ConfigError, match=r"unknown column path 'device.nope': no field 'nope'"):
        child_rows(events, ["player"], "device.nope")


CHILD = "player string, pos int, item_id string, qty int"


def apply(spark, location, parents: list[str], items: dict[str, list[tuple]]) -> None:
    """Replace the children of ``parents`` by ``items`` (a parent missing from ``items`` has none)."""
    rows = [(player, pos, *item) for player, elements in items.items() for pos, item in enumerate(elements)]
    children = spark.createDataFrame(rows, CHILD)
    parent_rows = spark.createDataFrame([(p,) for p in parents], "player string")
    replace_children(spark, location, TableSettings(), children, parent_rows, ["player"])


def stored(spark, location):
    return spark.read.format("delta").load(location)


def test_child_rows_follow_their_parent(spark, tmp_path):
    location = str(tmp_path / "players__items")
    apply(spark, location, ["p1", "p2"], {"p1": [("sword", 1), ("shield", 2), ("bow", 1)], "p2": [("axe", 1)]})
    apply(spark, location, ["p1", "p2"], {"p1": [("sword", 1), ("shield", 2), ("bow", 1)], "p2": [("axe", 1)]})
    assertDataFrameEqual(
        stored(spark, location),
        spark.createDataFrame(
            [("p1", 0, "sword", 1), ("p1", 1, "shield", 2), ("p1", 2, "bow", 1), ("p2", 0, "axe", 1)], CHILD
        ),
    )

    # 1. a parent updated: its children are replaced (and the other parent's are untouched)
    apply(spark, location, ["p1"], {"p1": [("sword", 5), ("spear", 1), ("bow", 1)]})
    assertDataFrameEqual(
        stored(spark, location),
        spark.createDataFrame(
            [("p1", 0, "sword", 5), ("p1", 1, "spear", 1), ("p1", 2, "bow", 1), ("p2", 0, "axe", 1)], CHILD
        ),
    )

    # 2. its array shrinks: the trailing children go
    apply(spark, location, ["p1"], {"p1": [("sword", 5)]})
    assertDataFrameEqual(
        stored(spark, location), spark.createDataFrame([("p1", 0, "sword", 5), ("p2", 0, "axe", 1)], CHILD)
    )

    # 3. a parent deleted (or left with no array): its children disappear
    apply(spark, location, ["p2"], {})
    assertDataFrameEqual(stored(spark, location), spark.createDataFrame([("p1", 0, "sword", 5)], CHILD))
    history = [row.operation for row in spark.sql(f"DESCRIBE HISTORY delta.`{location}`").collect()]
    assert history.count("MERGE") == 5  # one atomic MERGE per batch
