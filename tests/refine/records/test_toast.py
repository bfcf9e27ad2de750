"""TOAST placeholders: found in a batch, filled from the key's earlier changes, and (with the stack) kept
through a real connector's updates in every shape it sends them."""

from __future__ import annotations

import base64
import json

import psycopg
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.stack.postgres import add_to_publication
from refine.apply.batch_facts import batch_facts
from refine.apply.latest import latest_per_key
from refine.records.toast import TOAST_PLACEHOLDER, TOAST_PLACEHOLDER_HSTORE, TOAST_PLACEHOLDER_UUID, has_placeholder

CHANGES = (
    "op string, key struct<id:bigint>, after struct<id:bigint, note:string, blob:binary, tags:array<string>, n:int, "
    "scores:array<int>, counts:array<bigint>, blobs:array<binary>, attrs:map<string,string>>, "
    "source_lsn bigint, kafka_offset bigint, kafka_headers array<struct<key:string, value:binary>>, problem string, "
    "source_snapshot_start boolean, source_snapshot_end boolean, kafka_partition int"
)
PLACEHOLDER_BYTES = list(TOAST_PLACEHOLDER.encode())


def change(
    lsn: int,
    note=None,
    blob=None,
    tags=None,
    op: str = "u",
    key: int = 1,
    scores=None,
    counts=None,
    blobs=None,
    attrs=None,
) -> tuple:
    after = (key, note, blob, tags, 7, scores, counts, blobs, attrs)
    return (op, (key,), None if op == "d" else after, lsn, lsn, None, None, False, False, 0)


def test_placeholders_are_found_in_every_shape_debezium_sends_them(spark):
    placeholders = [
        change(2, note=TOAST_PLACEHOLDER),  # text, varchar, json, jsonb
        change(3, blob=TOAST_PLACEHOLDER.encode()),  # bytea
        change(4, tags=[TOAST_PLACEHOLDER]),  # text[]
        change(5, note=TOAST_PLACEHOLDER_HSTORE),  # hstore as JSON
        change(6, tags=[TOAST_PLACEHOLDER_UUID]),  # uuid[]
        change(7, scores=PLACEHOLDER_BYTES),  # int2[], int4[]: the placeholder's bytes as numbers
        change(8, counts=PLACEHOLDER_BYTES),  # int8[]
        change(9, blobs=[TOAST_PLACEHOLDER.encode()]),  # bytea[]
        change(10, attrs={TOAST_PLACEHOLDER: TOAST_PLACEHOLDER}),  # hstore as a map
    ]
    values = [
        change(1, note="plain"),
        change(11, tags=["a", TOAST_PLACEHOLDER]),  # an array holding the text is no placeholder
        change(12, scores=PLACEHOLDER_BYTES[:-1]),
        change(13, attrs={TOAST_PLACEHOLDER: TOAST_PLACEHOLDER, "b": "c"}),
        change(14, attrs={"a": TOAST_PLACEHOLDER}),
        change(15, note='{"__debezium_unavailable_value": "__debezium_unavailable_value"}'),  # jsonb's own text
        change(16, op="d"),
    ]
    changes = spark.createDataFrame(placeholders + values, CHANGES)
    found = changes.select(
        "source_lsn", has_placeholder(F.col("after"), changes.schema["after"].dataType).alias("found")
    )
    assertDataFrameEqual(found, [(row[3], True) for row in placeholders] + [(row[3], False) for row in values])
    assert batch_facts(changes).placeholders
    assert not batch_facts(changes.where(f"source_lsn IN {tuple(row[3] for row in values)}")).placeholders


def test_placeholders_of_every_shape_are_filled_from_the_keys_earlier_change(spark):
    first = {
        "note": "n",
        "blob": b"b",
        "tags": ["t"],
        "scores": [1, 2],
        "counts": [3],
        "blobs": [b"x"],
        "attrs": {"k": "v"},
    }
    unchanged = {
        "note": TOAST_PLACEHOLDER,
        "blob": TOAST_PLACEHOLDER.encode(),
        "tags": [TOAST_PLACEHOLDER_UUID],
        "scores": PLACEHOLDER_BYTES,
        "counts": PLACEHOLDER_BYTES,
        "blobs": [TOAST_PLACEHOLDER.encode()],
        "attrs": {TOAST_PLACEHOLDER: TOAST_PLACEHOLDER},
    }
    changes = spark.createDataFrame([change(1, **first), change(2, **unchanged)], CHANGES)
    latest = latest_per_key(changes, ["id"], None).select("source_lsn", *[f"after.{name}" for name in first])
    assertDataFrameEqual(latest, [(2, *first.values())])


def test_the_last_change_per_key_takes_placeholders_from_earlier_changes_only_when_told_they_may_be_there(spark):
    changes = spark.createDataFrame(
        [
            change(1, note="first", key=1),
            change(2, note=TOAST_PLACEHOLDER, key=1),
            change(3, note="other", key=2),
        ],
        CHANGES,
    )

    def notes(placeholders: bool):
        return latest_per_key(changes, ["id"], None, placeholders).select("key.id", "after.note")

    assertDataFrameEqual(notes(True), [(1, "first"), (2, "other")])
    # A batch without placeholders (batch_facts) skips the window: nothing there to fill.
    assertDataFrameEqual(notes(False), [(1, TOAST_PLACEHOLDER), (2, "other")])


SHAPES_TABLE = """
CREATE EXTENSION IF NOT EXISTS hstore;
DROP TABLE IF EXISTS shop.toast_shapes;
CREATE TABLE shop.toast_shapes (id int PRIMARY KEY, n int, note text, doc jsonb, blob bytea, tags text[],
                                scores int[], counts bigint[], ids uuid[], attrs hstore);
"""
# Out of line and uncompressed, so that ~4 KB values are TOASTed whatever their content.
EXTERNAL = ", ".join(
    f"ALTER COLUMN {c} SET STORAGE EXTERNAL"
    for c in ("note", "doc", "blob", "tags", "scores", "counts", "ids", "attrs")
)
BIG_ROW = """
INSERT INTO shop.toast_shapes SELECT 1, 0, repeat('n', 4000), jsonb_build_object('k', repeat('j', 4000)),
    decode(repeat('ab', 4000), 'hex'), ARRAY(SELECT repeat('t', 40) FROM generate_series(1, 100)),
    ARRAY(SELECT g FROM generate_series(1, 1000) g), ARRAY(SELECT g::bigint * 3 FROM generate_series(1, 600) g),
    ARRAY(SELECT md5(g::text)::uuid FROM generate_series(1, 200) g),
    hstore(
        ARRAY(SELECT 'k' || g FROM generate_series(1, 200) g),
        ARRAY(SELECT repeat('v', 20) FROM generate_series(1, 200))
    )
"""
SOURCE_COLUMNS = "id, n, note, doc::text, blob, tags, scores, counts, ids::text[], hstore_to_json(attrs)::text"
REFINED_TYPES = (
    "id int, n int, note string, doc string, blob binary, tags array<string>, scores array<int>, "
    "counts array<bigint>, ids array<string>, attrs string"
)


def comparable(rows):
    """hstore arrives as JSON text, its entries in no set order: compared as sorted entries."""
    return rows.withColumn("attrs", F.array_sort(F.map_entries(F.from_json("attrs", "map<string,string>"))))


def source_rows(spark, dsn: str):
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT {SOURCE_COLUMNS} FROM shop.toast_shapes").fetchall()
    return comparable(spark.createDataFrame(rows, REFINED_TYPES))


def test_every_toasted_shape_debezium_sends_keeps_the_rows_value(
    spark, kafka, stack_config, postgres_connector, tmp_path, land_and_refine, refined_table
):
    """A real connector's updates of a row whose TOASTed columns stay unchanged: each column carries the
    placeholder in its own shape, and the refined row keeps the values, whether the row's values are
    in the same batch (the insert) or only in the refined table."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.toast_shapes"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SHAPES_TABLE)
        conn.execute(f"ALTER TABLE shop.toast_shapes {EXTERNAL}")
        add_to_publication(conn, postgres_connector.name, "shop.toast_shapes")
        conn.execute(BIG_ROW)
        conn.execute("UPDATE shop.toast_shapes SET n = 1")
    try:
        records = kafka.wait_for_last_value(topic, lambda value: value is not None and b'"n":1' in value)
        envelope = json.loads(records[-1][4])
        after = envelope.get("payload", envelope)["after"]
        placeholder_bytes = list(TOAST_PLACEHOLDER.encode())
        assert after["note"] == TOAST_PLACEHOLDER
        assert after["scores"] == placeholder_bytes
        assert after["counts"] == placeholder_bytes
        assert after["ids"] == [TOAST_PLACEHOLDER_UUID]
        assert after["attrs"] == TOAST_PLACEHOLDER_HSTORE
        assert after["tags"] == [TOAST_PLACEHOLDER]
        assert after["doc"] == TOAST_PLACEHOLDER
        assert base64.b64decode(after["blob"]) == TOAST_PLACEHOLDER.encode()
        land_and_refine(warehouse, topic)  # the insert and the update in one batch
        assertDataFrameEqual(comparable(refined_table(warehouse, topic)), source_rows(spark, dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE shop.toast_shapes SET n = 2")
        kafka.wait_for_last_value(topic, lambda value: value is not None and b'"n":2' in value)
        for _ in range(2):  # the values now only in the refined table; and a rerun changes nothing
            land_and_refine(warehouse, topic)
            assertDataFrameEqual(comparable(refined_table(warehouse, topic)), source_rows(spark, dsn))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE shop.toast_shapes")
