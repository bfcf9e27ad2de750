"""`cdc refine --rebuild`: refined, history and child tables made again from the raw table's current
contents, after the raw table's Change Data Feed history is gone; the refinement goes on after it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import validate
from cdc.core.errors import TableError
from cdc.core.tables import delta_properties
from cdc.stack.envelopes import postgres_envelope
from refine.config import RefineJobConfig, refined_table_location
from refine.quality.quarantine import quarantine_location
from refine.rebuild import raw_chunks, rebuild_refined_table

COLUMNS = {"id": "bigint", "name": "string", "tags": "array<string>"}


def row(row_id: int, name: str, tags: list[str]) -> dict:
    return {"id": row_id, "name": name, "tags": tags}


def produced(changes: list[tuple[dict, dict | str | None]]) -> list[tuple[bytes, bytes | None]]:
    return [
        (
            json.dumps(key).encode(),
            None if value is None else (value if isinstance(value, str) else json.dumps(value)).encode(),
        )
        for key, value in changes
    ]


FIRST = [
    ({"id": 1}, postgres_envelope("c", 100, after=row(1, "a", ["x", "y"]))),
    ({"id": 2}, postgres_envelope("c", 200, after=row(2, "b", ["z"]))),
    ({"id": 1}, postgres_envelope("u", 300, before=row(1, "a", ["x", "y"]), after=row(1, "a2", ["y"]))),
    ({"id": 2}, postgres_envelope("d", 400, before={"id": 2, "name": None, "tags": None})),
    ({"id": 2}, None),
]
SECOND = [
    ({"id": 3}, postgres_envelope("c", 500, after=row(3, "c", ["w"]))),
    ({"id": 9}, '{"op": "c", "after": {"id": 9'),  # truncated JSON: quarantined, in the rebuild too (once)
]
LATER = [({"id": 3}, postgres_envelope("u", 600, before=row(3, "c", ["w"]), after=row(3, "c2", ["v", "w"])))]


def contents(spark, location: str):
    """A table's rows without the time each was written."""
    table = spark.read.format("delta").load(location)
    return table.drop(*[c for c in table.columns if c == "_cdc_refined_at"])


def test_a_rebuild_replaces_wrong_tables_from_the_raw_tables_current_files(
    spark, kafka, land, refine, unique_name, tmp_path
):
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    settings = {"columns": COLUMNS, "key": ["id"], "history": True, "explode": ["tags"]}
    refined = refined_table_location(warehouse, topic)
    tables = [refined, f"{refined}__history", f"{refined}__tags"]

    kafka.produce(topic, produced(FIRST))
    land(warehouse, topic)
    refine(warehouse, topic, **settings)
    kafka.produce(topic, produced(SECOND))
    land(warehouse, topic)  # a second raw commit: the rebuild reads both
    refine(warehouse, topic, **settings)
    right = {location: contents(spark, location).collect() for location in tables}
    assert sorted((r.id, r.name, r.tags) for r in right[refined]) == [(1, "a2", ["y"]), (3, "c", ["w"])]

    # What a refinement with a bug leaves: wrong values no later change corrects.
    spark.sql(f"UPDATE delta.`{refined}` SET name = '__debezium_unavailable_value' WHERE id = 1")
    spark.sql(f"UPDATE delta.`{refined}__history` SET name = 'wrong'")
    spark.sql(f"DELETE FROM delta.`{refined}__tags` WHERE id = 3")
    # A Change Data Feed turned on by hand (the job's features leave it unset): a rebuild keeps it.
    spark.sql(f"ALTER TABLE delta.`{refined}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    wrong_version = DeltaTable.forPath(spark, refined).history(1).first().version
    # The raw table compacted and vacuumed: its Change Data Feed from the first version is gone.
    raw = f"{warehouse}/raw/{topic}"
    DeltaTable.forPath(spark, raw).optimize().executeCompaction()
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        DeltaTable.forPath(spark, raw).vacuum(0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    with pytest.raises(Exception):  # noqa: B017, PT011 - any failure to read: the files are gone
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(raw).collect()

    config = validate(
        RefineJobConfig,
        {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}, **settings},
        "refine job",
    )
    for _attempt in range(2):  # a rebuild run again gives the same tables
        replaced = rebuild_refined_table(spark, config, say=lambda line: None)
        assert {table.location for table in replaced} >= set(tables)
        for location in tables:
            assertDataFrameEqual(contents(spark, location), right[location])
        assert delta_properties(spark, refined)["delta.enableChangeDataFeed"] == "true"
    # The wrong version stays for time travel.
    old = spark.read.format("delta").option("versionAsOf", wrong_version).load(refined)
    assert old.where("id = 1").first().name == "__debezium_unavailable_value"
    quarantined = spark.read.format("delta").load(quarantine_location(warehouse)).where(F.col("topic") == topic)
    assert quarantined.count() == 1

    # The refinement goes on after the raw version rebuilt from: later changes apply, nothing twice.
    kafka.produce(topic, produced(LATER))
    land(warehouse, topic)
    for _attempt in range(2):
        refine(warehouse, topic, **settings)
        assert sorted((r.id, r.name, r.tags) for r in contents(spark, refined).collect()) == [
            (1, "a2", ["y"]),
            (3, "c2", ["v", "w"]),
        ]
        children = contents(spark, f"{refined}__tags").where("id = 3").orderBy("pos").collect()
        assert [r.value for r in children] == ["v", "w"]
        history = contents(spark, f"{refined}__history").where("id = 3").orderBy("_cdc_lsn").collect()
        assert [(r.name, r._cdc_is_current) for r in history] == [("c", False), ("c2", True)]
    assert spark.read.format("delta").load(quarantine_location(warehouse)).where(F.col("topic") == topic).count() == 1


def test_raw_chunks_are_whole_raw_batches_in_landing_order(spark):
    records = spark.createDataFrame(
        [(batch, offset) for batch in range(10) for offset in range(batch * 5, batch * 5 + 5)],
        "batch_id long, offset long",
    )
    chunks = raw_chunks(records, 12)
    batches = [sorted({r.batch_id for r in chunk.collect()}) for chunk in chunks]
    assert [b for chunk in batches for b in chunk] == list(range(10))  # each batch once, in order
    assert len(chunks) >= 3
    assert raw_chunks(records, 50) == [records]


def _module(path: str):
    """A test module at ``path`` under this one's folder (tests are no package: pytest imports them by path)."""
    spec = importlib.util.spec_from_file_location(f"_{Path(path).stem}", Path(__file__).parent / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pipeline_rebuild_remakes_a_mongo_collections_tables_and_refreshes_its_business_table(
    spark, kafka, pipeline_run, unique_name
):
    mongo = _module("mongo/test_mongo.py")  # the MongoDB connector's records, as its tests write them
    first_batch, second_batch = mongo.first_batch, mongo.second_batch

    topic = kafka.create_topic(f"{unique_name}.shop.people")
    kafka.produce(topic, first_batch(topic))
    pipeline = {
        "name": "people",
        "sources": {"people": {"kind": "debezium_mongodb", "topic": topic}},
        "refined": {"people": {"source": "people", "scd": 2, "explode": ["orders"]}},
        "business": {"names": {"sql": "SELECT count(DISTINCT name) AS names FROM people"}},
        "expectations": {"not_big": {"table": "people", "constraint": "name <> 'Big'", "action": "drop"}},
    }
    assert pipeline_run(pipeline) == 0
    kafka.produce(topic, second_batch(topic))
    assert pipeline_run(pipeline) == 0
    names = ["people", "people__history", "people__orders"]
    locations = [refined_table_location(pipeline_run.warehouse, name) for name in names]
    right = {location: contents(spark, location).collect() for location in locations}
    business = pipeline_run.table("names", "business").collect()
    counts = spark.read.format("delta").load(f"{pipeline_run.warehouse}/_cdc/expectations").collect()

    spark.sql(f"UPDATE delta.`{locations[0]}` SET name = 'wrong'")
    spark.sql(f"DELETE FROM delta.`{locations[2]}`")
    for _attempt in range(2):
        assert pipeline_run(pipeline, "--rebuild") == 0
        for location in locations:
            assertDataFrameEqual(contents(spark, location), right[location])
        assertDataFrameEqual(pipeline_run.table("names", "business"), business)
        # The rebuild's expectation counts are not added to the job's.
        assertDataFrameEqual(spark.read.format("delta").load(f"{pipeline_run.warehouse}/_cdc/expectations"), counts)


def test_a_rebuilt_keyless_table_goes_on_counting_its_batches(
    kafka, stack_config, postgres_connector, tmp_path, land_and_refine, postgres_table, refined_table, spark
):
    """A keyless table's MERGEs are Delta transactions numbered by its batches: after a rebuild (fewer
    batches) the next ones must not be taken by Delta for ones it has."""
    from cdc.stack.workload import run_workload

    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.page_views"

    def change(seed: int) -> None:
        """The workload's changes of the table, and a last row to wait for."""
        import psycopg

        run_workload(dsn, customers=2, seed=seed)
        with psycopg.connect(dsn) as conn:
            conn.execute("INSERT INTO shop.page_views VALUES (%s, %s, '2026-02-01Z')", (seed, f"/mark{seed}"))
        kafka.wait_for_last_value(topic, lambda value: value is not None and f"/mark{seed}".encode() in value)

    for seed in (61, 62, 63):  # three batches
        change(seed)
        land_and_refine(warehouse, topic)
    config = validate(
        RefineJobConfig, {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}}, "refine job"
    )
    rebuild_refined_table(spark, config, say=lambda line: None)
    assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))
    change(64)
    for _ in range(2):
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("page_views"))


def test_a_rebuild_stops_when_a_refinement_commits_to_the_table_meanwhile(
    spark, kafka, land, refine, unique_name, tmp_path
):
    """A refinement committing while the rebuild stages would be overwritten with its checkpoint past
    its changes: the rebuild stops before replacing anything, and run again it includes them."""
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    settings = {"columns": COLUMNS, "key": ["id"], "history": True, "explode": ["tags"]}
    refined = refined_table_location(warehouse, topic)
    kafka.produce(topic, produced(FIRST))
    land(warehouse, topic)
    refine(warehouse, topic, **settings)
    kafka.produce(topic, produced(SECOND))
    land(warehouse, topic)
    config = validate(
        RefineJobConfig,
        {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}, **settings},
        "refine job",
    )

    def refine_meanwhile(line: str) -> None:
        if "raw batches" in line:  # staged, not swapped yet: the table's refinement runs now
            refine(warehouse, topic, **settings)

    with pytest.raises(TableError, match="another writer committed to this table while the rebuild ran"):
        rebuild_refined_table(spark, config, say=refine_meanwhile)
    refined_by_the_stream = contents(spark, refined).collect()
    assert sorted((r.id, r.name) for r in refined_by_the_stream) == [(1, "a2"), (3, "c")]
    assert not any(line.operation == "WRITE" for line in DeltaTable.forPath(spark, refined).history(1).collect())

    rebuild_refined_table(spark, config, say=lambda line: None)
    assertDataFrameEqual(contents(spark, refined), refined_by_the_stream)
    kafka.produce(topic, produced(LATER))
    land(warehouse, topic)
    refine(warehouse, topic, **settings)
    assert sorted((r.id, r.name) for r in contents(spark, refined).collect()) == [(1, "a2"), (3, "c2")]
