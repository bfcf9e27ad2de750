"""`cdc raw --pipeline` and `cdc refine --pipeline`: what a file declares becomes the jobs' settings;
what is declared but not run yet is refused up front, naming the key."""

import json

import pytest
import yaml
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.cli import main
from cdc.core.config import AvailableNow
from cdc.core.errors import ConfigError, ExpectationError
from cdc.core.tables import is_delta_table, raw_table_location
from cdc.pipeline.config import Pipeline
from cdc.pipeline.events.job import EventsRefineJobConfig
from cdc.pipeline.run import PipelineRefineConfig, business_tables, raw_job_config, refine_jobs
from cdc.raw.config import GapPolicy
from cdc.stack.workload import run_workload
from refine.apply.merge import METADATA_COLUMNS
from refine.config import RefineJobConfig, refined_table_location
from refine.quality.expectations import expectations_location
from refine.quality.quarantine import quarantine_location

SHOP = {
    "name": "shop",
    "sources": {
        "orders": {"kind": "debezium_postgres", "topic": "demo.shop.orders"},
        "clicks": {"kind": "events", "format": "json", "topic": "clicks", "schema": "user string, at timestamp"},
    },
    "raw": {"on_gap": "record", "max_offsets_per_trigger": 500},
    "refined": {
        "shop_orders": {"source": "orders"},
        "clicks": {"source": "clicks", "keys": ["user"], "ordering": "at"},
    },
}


def test_raw_lands_every_source_with_the_file_settings_unless_overridden(tmp_path):
    pipeline = Pipeline.model_validate(SHOP)
    config = raw_job_config(pipeline, warehouse=str(tmp_path), trigger=AvailableNow())
    assert (config.topics.topics, config.on_gap, config.max_offsets_per_trigger) == (
        ["demo.shop.orders", "clicks"],
        GapPolicy.RECORD,
        500,
    )
    overridden = raw_job_config(pipeline, warehouse=str(tmp_path), trigger=AvailableNow(), max_offsets_per_trigger=10)
    assert overridden.max_offsets_per_trigger == 10


def test_refine_builds_one_job_per_refined_table(tmp_path):
    jobs = refine_jobs(Pipeline.model_validate(SHOP), PipelineRefineConfig(warehouse=str(tmp_path)))
    orders, clicks = jobs
    assert isinstance(orders, RefineJobConfig)
    assert (orders.table, orders.target) == ("demo.shop.orders", "shop_orders")
    assert isinstance(clicks, EventsRefineJobConfig)
    assert (clicks.topic, clicks.schema_ddl) == (
        "clicks",
        "user string, at timestamp",
    )


def test_an_avro_source_is_refined_as_events_with_its_wire_schema(tmp_path):
    document = {
        **SHOP,
        "sources": {
            **SHOP["sources"],
            "scores": {
                "kind": "events",
                "format": "avro",
                "topic": "scores",
                "schema": {"kind": "registry", "url": "http://r:8081"},
            },
        },
        "refined": {"scores": {"source": "scores", "keys": ["player"], "ordering": "at"}},
    }
    config = PipelineRefineConfig(warehouse=str(tmp_path), reinfer_schema=True)  # applies to JSON sources only
    [scores] = refine_jobs(Pipeline.model_validate(document), config)
    assert isinstance(scores, EventsRefineJobConfig)
    assert (scores.format, scores.wire_schema.url, scores.schema_ddl, scores.reinfer_schema) == (
        "avro",
        "http://r:8081",
        None,
        False,
    )


def test_a_protobuf_source_is_refined_as_events_with_its_wire_schema_and_message(tmp_path):
    document = {
        **SHOP,
        "sources": {
            **SHOP["sources"],
            "scores": {
                "kind": "events",
                "format": "protobuf",
                "topic": "scores",
                "message": "game.Score",
                "schema": {"kind": "registry", "url": "http://r:8081"},
            },
        },
        "refined": {"scores": {"source": "scores", "keys": ["player"], "ordering": "at"}},
    }
    [scores] = refine_jobs(Pipeline.model_validate(document), PipelineRefineConfig(warehouse=str(tmp_path)))
    assert isinstance(scores, EventsRefineJobConfig)
    assert (scores.format, scores.wire_schema.url, scores.message, scores.schema_ddl) == (
        "protobuf",
        "http://r:8081",
        "game.Score",
        None,
    )


def test_what_is_not_run_yet_is_refused_naming_the_key(tmp_path):
    document = {
        **SHOP,
        "sources": {**SHOP["sources"], "people": {"kind": "debezium_mongodb", "topic": "m.db.people"}},
        "refined": {
            "shop_orders": {"source": "orders", "explode": ["items"], "scd": 2},
            "people": {"source": "people", "explode": ["tags"], "scd": 2},
            "clicks": {"source": "clicks", "scd": 2},
        },
        "expectations": {"named": {"table": "people", "constraint": "name IS NOT NULL"}},
    }
    with pytest.raises(ConfigError) as refused:
        refine_jobs(Pipeline.model_validate(document), PipelineRefineConfig(warehouse=str(tmp_path)))
    assert refused.value.message == (
        "the pipeline declares what `cdc refine` does not run yet: "
        "refined.clicks.scd: SCD type 2 needs `keys` (without keys every event is kept anyway)"
    )


def test_debezium_tables_get_their_explode_and_history_settings(tmp_path):
    document = {**SHOP, "refined": {"shop_orders": {"source": "orders", "explode": ["items"], "scd": 2}}}
    (orders,) = refine_jobs(Pipeline.model_validate(document), PipelineRefineConfig(warehouse=str(tmp_path)))
    assert (orders.explode, orders.history, orders.rules.history) == (["items"], True, None)


def test_each_table_gets_its_features_else_the_pipelines_and_a_feed_where_a_business_table_reads_it(tmp_path):
    document = {
        **SHOP,
        "sources": {**SHOP["sources"], "refunds": {"kind": "debezium_postgres", "topic": "demo.shop.refunds"}},
        "features": {"deletion_vectors": True},
        "refined": {
            "shop_orders": {"source": "orders", "explode": ["items"]},
            "clicks": {"source": "clicks", "features": {"deletion_vectors": False, "change_data_feed": True}},
            "refunds": {"source": "refunds", "features": {"change_data_feed": False}},
        },
        # Read through a child table: its parent's feed is on (children and history share its features).
        "business": {"items_sold": {"sql": "SELECT value, count(*) AS n FROM Shop_Orders__items GROUP BY value"}},
    }
    jobs = refine_jobs(Pipeline.model_validate(document), PipelineRefineConfig(warehouse=str(tmp_path)))
    assert {job.target: (job.features.deletion_vectors, job.features.change_data_feed) for job in jobs} == {
        "shop_orders": (True, True),
        "clicks": (False, True),
        "refunds": (True, False),
    }
    # Nothing declared: neither feature is set (a new table gets neither; an existing one keeps its own).
    plain = refine_jobs(Pipeline.model_validate(SHOP), PipelineRefineConfig(warehouse=str(tmp_path)))
    assert {(job.features.deletion_vectors, job.features.change_data_feed) for job in plain} == {(None, None)}


def test_an_invalid_pipeline_stops_the_commands_before_spark_starts(tmp_path, capsys):
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump({"name": "x", "sources": {}}))
    assert main(["refine", "--pipeline", str(file), "--warehouse", str(tmp_path)]) == 2
    assert main(["raw", "--pipeline", str(file), "--warehouse", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.splitlines()
        == [
            (
                "cdc: error: invalid pipeline: sources: Dictionary should have at least 1 item "
                f"after validation, not 0 (file={file})"
            )
        ]
        * 2
    )
    assert main(["refine", "--table", "t", "--reinfer-schema", "--warehouse", str(tmp_path)]) == 2
    assert "--reinfer-schema applies to the event sources of a --pipeline" in capsys.readouterr().err


def test_a_debezium_table_through_the_pipeline_equals_cdc_refine_table(
    spark, kafka, stack_config, postgres_connector, tmp_path, monkeypatch
):
    run_workload(stack_config.postgres.dsn(), customers=3, seed=21)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    file = tmp_path / "shop.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "name": "shop",
                "sources": {"orders": {"kind": "debezium_postgres", "topic": topic}},
                "refined": {"shop_orders": {"source": "orders"}},
            }
        )
    )
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    warehouse = ["--warehouse", str(tmp_path / "warehouse")]
    assert main(["raw", "--pipeline", str(file), *warehouse, "--available-now"]) == 0
    assert main(["refine", "--table", topic, *warehouse, "--available-now"]) == 0
    by_topic = spark.read.format("delta").load(refined_table_location(str(tmp_path / "warehouse"), topic))
    for _ in range(2):  # a rerun changes nothing
        assert main(["refine", "--pipeline", str(file), *warehouse, "--available-now"]) == 0
        by_name = spark.read.format("delta").load(refined_table_location(str(tmp_path / "warehouse"), "shop_orders"))
        assert by_name.count() > 0
        assertDataFrameEqual(by_name.drop(*METADATA_COLUMNS), by_topic.drop(*METADATA_COLUMNS))


# --- expectations, SCD type 2 history and business tables, on the real stack --------------------


def produce_scores(kafka, topic: str, events: list[tuple]) -> None:
    """(player, time, score) events, keyed by player, into partition 0."""
    kafka.produce(
        topic,
        [
            (player.encode(), json.dumps({"player": player, "time": time, "score": score}).encode())
            for player, time, score in events
        ],
        partition=0,
    )


def scores_pipeline(topic: str, expectations: dict) -> dict:
    return {
        "name": "scores",
        "sources": {
            "game": {
                "kind": "events",
                "format": "json",
                "topic": topic,
                "schema": "player string, time timestamp, score int",
            }
        },
        "refined": {
            "scores": {"source": "game"},  # every event
            "players": {"source": "game", "keys": ["player"], "ordering": "time", "scd": 2},
        },
        "business": {"activity": {"sql": ACTIVITY}},
        "expectations": expectations,
    }


ACTIVITY = (
    "SELECT player, count(*) AS events, min(time) AS first_time, max(time) AS last_time FROM scores GROUP BY player"
)
T = "2026-01-01T10:0{}:00Z".format


def test_expectations_history_and_business_tables_of_an_events_pipeline(
    spark, kafka, pipeline_run, unique_name, capsys
):
    topic = kafka.create_topic(f"{unique_name}.scores")
    pipeline = scores_pipeline(
        topic,
        {
            "score_known": {"table": "scores", "constraint": "score IS NOT NULL", "action": "warn"},
            "no_test_players": {"table": "players", "constraint": "player <> 'test'", "action": "drop"},
        },
    )
    produce_scores(
        kafka, topic, [("ann", T(1), 10), ("bob", T(1), 5), ("ann", T(2), None), ("ann", T(4), 40), ("test", T(1), 1)]
    )
    history_columns = ["player", "score", "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]

    def history(rows: list[tuple]):
        return spark.createDataFrame(
            rows, "player string, score int, valid_from string, valid_to string, is_current boolean, is_deleted boolean"
        ).select(
            "player",
            "score",
            F.to_timestamp("valid_from").alias("_cdc_valid_from"),
            F.to_timestamp("valid_to").alias("_cdc_valid_to"),
            F.col("is_current").alias("_cdc_is_current"),
            F.col("is_deleted").alias("_cdc_is_deleted"),
        )

    for attempt in range(2):  # a rerun changes nothing
        capsys.readouterr()
        assert pipeline_run(pipeline) == 0
        # The run's summary: per table, its changes, failed expectations and what is left to refine.
        summary = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines() if " changes -> " in line}
        if attempt == 0:
            assert "; 1 rows failed expectations" in summary["refine scores"]
            assert "; 1 records quarantined" in summary["refine players"]
            assert "; 1 rows failed expectations" in summary["refine players"]
        else:
            assert not [line for line in summary.values() if "failed expectations" in line]
        assert all(line.endswith("; 0 raw changes not refined yet") for line in summary.values()), summary
        players = pipeline_run.table("players").select("player", "score")
        assertDataFrameEqual(players, spark.createDataFrame([("ann", 40), ("bob", 5)], players.schema))
        assertDataFrameEqual(
            pipeline_run.table("players__history").select(*history_columns),
            history(
                [
                    ("ann", 10, T(1), T(2), False, False),
                    ("ann", None, T(2), T(4), False, False),
                    ("ann", 40, T(4), None, True, False),
                    ("bob", 5, T(1), None, True, False),
                ]
            ),
        )
        assert pipeline_run.table("scores").count() == 5  # the warned row is kept
        assertDataFrameEqual(
            pipeline_run.table("activity", "business"),
            spark.sql(ACTIVITY.replace("FROM scores", f"FROM delta.`{pipeline_run.warehouse}/refined/scores`")),
        )

    quarantined = spark.read.format("delta").load(quarantine_location(pipeline_run.warehouse))
    assert [(row.source_table, row.offset, row.reason) for row in quarantined.collect()] == [
        ("players", 4, "failed expectations: no_test_players")
    ]
    counts = spark.read.format("delta").load(expectations_location(pipeline_run.warehouse))
    totals = counts.groupBy("table", "expectation").agg(
        F.sum("passed").alias("passed"), F.sum("failed").alias("failed")
    )
    assertDataFrameEqual(
        totals,
        spark.createDataFrame([("scores", "score_known", 4, 1), ("players", "no_test_players", 4, 1)], totals.schema),
    )

    # A second batch: a late event lands in its place in the history; the business table follows.
    produce_scores(kafka, topic, [("ann", T(3), 30), ("carl", T(5), 7), ("ann", T(6), 60)])
    for _ in range(2):
        assert pipeline_run(pipeline) == 0
        assertDataFrameEqual(
            pipeline_run.table("players__history").select(*history_columns),
            history(
                [
                    ("ann", 10, T(1), T(2), False, False),
                    ("ann", None, T(2), T(3), False, False),
                    ("ann", 30, T(3), T(4), False, False),
                    ("ann", 40, T(4), T(6), False, False),
                    ("ann", 60, T(6), None, True, False),
                    ("bob", 5, T(1), None, True, False),
                    ("carl", 7, T(5), None, True, False),
                ]
            ),
        )
        activity = pipeline_run.table("activity", "business")
        assert activity.count() == 4  # ann, bob, carl, test (scores keeps every event)
        assertDataFrameEqual(
            activity,
            spark.sql(ACTIVITY.replace("FROM scores", f"FROM delta.`{pipeline_run.warehouse}/refined/scores`")),
        )


def test_a_continuous_pipeline_refreshes_business_tables_on_their_interval(
    spark, kafka, pipeline_run, unique_name, wait_for
):
    import threading

    from cdc.core.config import Continuous
    from cdc.pipeline.run import run_pipeline_refine

    topic = kafka.create_topic(f"{unique_name}.scores")
    document = {
        "name": "live",
        "sources": {
            "game": {
                "kind": "events",
                "format": "json",
                "topic": topic,
                "schema": "player string, time timestamp, score int",
            }
        },
        "refined": {"scores": {"source": "game"}},
        "business": {"activity": {"sql": ACTIVITY, "trigger_interval_s": 0.5}},
    }
    pipeline_run.file.write_text(yaml.safe_dump(document))
    land = ["raw", "--pipeline", str(pipeline_run.file), "--warehouse", pipeline_run.warehouse, "--available-now"]
    produce_scores(kafka, topic, [("ann", T(1), 10), ("bob", T(2), 5)])
    assert main(land) == 0

    def events_of(player: str) -> int | None:
        if not is_delta_table(spark, f"{pipeline_run.warehouse}/business/activity"):
            return None
        rows = pipeline_run.table("activity", "business").where(F.col("player") == player).collect()
        return rows[0].events if rows else None

    stop, failures, lines = threading.Event(), [], []
    config = PipelineRefineConfig(warehouse=pipeline_run.warehouse, trigger=Continuous(interval_s=0.5))

    def run() -> None:
        try:
            run_pipeline_refine(spark, Pipeline.model_validate(document), config, lines.append, stop)
        except BaseException as error:  # noqa: BLE001 - raised in the test below
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: failures or events_of("bob") == 1, 180, "the first events in the business table", 0.5)
        produce_scores(kafka, topic, [("ann", T(3), 30), ("bob", T(4), 7), ("bob", T(5), 9)])
        assert main(land) == 0  # the running refine stream picks the new raw rows up
        wait_for(lambda: failures or events_of("bob") == 3, 180, "the later events in the business table", 0.5)
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()
    assert not failures, failures
    assertDataFrameEqual(
        pipeline_run.table("activity", "business"),
        spark.sql(ACTIVITY.replace("FROM scores", f"FROM delta.`{pipeline_run.warehouse}/refined/scores`")),
    )


def test_a_bad_or_failed_expectation_stops_the_refine_naming_it(spark, kafka, pipeline_run, unique_name, capsys):
    topic = kafka.create_topic(f"{unique_name}.scores")
    produce_scores(kafka, topic, [("ann", T(1), 10), ("bob", T(2), -5)])
    bad = scores_pipeline(topic, {"typo": {"table": "scores", "constraint": "scroe >= 0", "action": "fail"}})
    assert pipeline_run(bad) == 2
    assert "expectation 'typo' is not valid SQL over the table" in capsys.readouterr().err
    assert not is_delta_table(spark, f"{pipeline_run.warehouse}/refined/scores")  # stopped before any row was read

    failing = scores_pipeline(topic, {"no_negative": {"table": "scores", "constraint": "score >= 0", "action": "fail"}})
    for _ in range(2):  # the batch is not committed: a rerun fails the same way
        assert pipeline_run(failing) == ExpectationError.exit_code
        error = capsys.readouterr().err
        assert "rows broke a fail expectation" in error, error
        assert "expectation=no_negative" in error, error
        assert not is_delta_table(spark, f"{pipeline_run.warehouse}/refined/scores")


def test_business_tables_read_pipeline_tables_as_views_in_dependency_order(tmp_path):
    document = {
        **SHOP,
        "sources": {**SHOP["sources"], "game": {"kind": "events", "format": "json", "topic": "game"}},
        "refined": {**SHOP["refined"], "events": {"source": "game", "split_by": "game", "explode": ["items"]}},
        "business": {
            "top": {"sql": "SELECT * FROM per_user ORDER BY n DESC LIMIT 3"},
            "per_user": {"sql": "SELECT user, count(*) AS n FROM clicks JOIN shop_orders ON true GROUP BY user"},
            "items": {"sql": "SELECT * FROM events__items JOIN events USING (pos)"},
        },
    }
    warehouse = str(tmp_path)
    tables = {table.name: table for table in business_tables(Pipeline.model_validate(document), warehouse)}
    assert list(tables) == ["per_user", "top", "items"]  # per_user before top, which reads it
    assert (tables["per_user"].views, tables["per_user"].split_views) == (
        {"clicks": f"{warehouse}/refined/clicks", "shop_orders": f"{warehouse}/refined/shop_orders"},
        {},
    )
    assert tables["top"].views == {"per_user": f"{warehouse}/business/per_user"}
    assert (tables["items"].views, tables["items"].split_views) == (
        {},
        {"events": f"{warehouse}/refined/events", "events__items": f"{warehouse}/refined/events__items"},
    )
    assert tables["items"].location == f"{warehouse}/business/items"


def test_an_expectation_on_a_debezium_table_drops_its_rows_but_never_its_deletes(
    spark, kafka, stack_config, postgres_connector, pipeline_run
):
    run_workload(stack_config.postgres.dsn(), customers=3, seed=22)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    pipeline = {
        "name": "shop",
        "sources": {"orders": {"kind": "debezium_postgres", "topic": topic}},
        # The quarantine keeps a dropped row with its masked columns masked.
        "refined": {"shop_orders": {"source": "orders", "mask": {"status": "redact", "customer_id": "sha256"}}},
        # False for every row (order_no is NOT NULL), whatever rows other tests left in shop.orders: the Spark
        # cluster's test leaves its marker order -1, which `order_no < 0` let through.
        "expectations": {"no_orders": {"table": "shop_orders", "constraint": "order_no IS NULL", "action": "drop"}},
    }
    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        left = pipeline_run.table("shop_orders").collect()  # every row dropped; deletes of absent keys add none
        assert not left, f"rows left: {left}; their keys' changes: {_changes_of(spark, pipeline_run, topic, left)}"
        quarantined = spark.read.format("delta").load(quarantine_location(pipeline_run.warehouse))
        dropped = quarantined.where("source_table = 'shop_orders'")
        assert {row.reason for row in dropped.collect()} == {"failed expectations: no_orders"}
        rows = [json.loads(row.raw_value) for row in dropped.collect()]
        assert {row["status"] for row in rows} == {"[redacted]"}
        assert all(len(row["customer_id"]) == 64 for row in rows)  # a hex SHA-256, not the id
        counts = spark.read.format("delta").load(expectations_location(pipeline_run.warehouse)).collect()
        assert dropped.count() == sum(row.failed for row in counts) > 0
        assert sum(row.passed for row in counts) == 0


def _changes_of(spark, pipeline_run, topic: str, rows: list) -> list:
    """The raw changes (offset, op, source LSN, the value's first 300 characters) of the ``rows``' keys."""
    keys = {(row.customer_id, row.order_no) for row in rows}
    raw = spark.read.format("delta").load(raw_table_location(pipeline_run.warehouse, topic))
    found = []
    for record in raw.orderBy("offset").collect():
        text = record.value or ""
        if any(f'"customer_id":{c},"order_no":{n}' in text for c, n in keys):
            found.append((record.offset, text[:300]))
    return found


# --- a Debezium table with its history (SCD type 2) and an exploded array, on the real stack ------

CUSTOMER_COLUMNS = ["id", "email", "full_name", "balance", "tags", "notes"]
HISTORY_FLAGS = ["_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]


def customers_round_one(dsn: str, rng) -> tuple[int, int, int]:
    """Customers A (tags changed, then TOASTed-notes updates), B (deleted) and C (primary key changed)."""
    import psycopg

    from cdc.stack.workload import _insert_customer

    with psycopg.connect(dsn, autocommit=True) as conn:
        a = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM shop.customers WHERE id < 1000000").fetchone()[0]
        for customer in (a, a + 1, a + 2):
            _insert_customer(conn, rng, customer)
        conn.execute("UPDATE shop.customers SET tags = ARRAY['a', 'b', 'c'] WHERE id = %s", (a,))
        conn.execute("UPDATE shop.customers SET tags = ARRAY['a'] WHERE id = %s", (a,))  # shrinks; notes TOASTed
        conn.execute("UPDATE shop.customers SET balance = balance + 1 WHERE id = %s", (a,))
        conn.execute("DELETE FROM shop.customers WHERE id = %s", (a + 1,))
        conn.execute("UPDATE shop.customers SET id = id + 1000000 WHERE id = %s", (a + 2,))
        conn.execute("UPDATE shop.customers SET full_name = 'round one' WHERE id = %s", (a,))
    return a, a + 1, a + 2


def test_a_debezium_table_with_history_and_an_exploded_array(
    spark, kafka, stack_config, postgres_connector, postgres_table, pipeline_run
):
    import random

    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    a, b, c = customers_round_one(stack_config.postgres.dsn(), random.Random(5))
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"round one"' in value)
    pipeline = {
        "name": "crm",
        "sources": {"customers": {"kind": "debezium_postgres", "topic": topic}},
        "refined": {"customers": {"source": "customers", "explode": ["tags"], "scd": 2}},
    }

    def check_tables() -> None:
        source = postgres_table("customers")
        assertDataFrameEqual(
            pipeline_run.table("customers").select(*CUSTOMER_COLUMNS), source.select(*CUSTOMER_COLUMNS)
        )
        tags = source.select("id", F.posexplode("tags").alias("pos", "value"))
        assertDataFrameEqual(pipeline_run.table("customers__tags").select("id", "pos", "value"), tags)
        history = pipeline_run.table("customers__history")
        assertDataFrameEqual(
            history.where("_cdc_is_current").select(*CUSTOMER_COLUMNS), source.select(*CUSTOMER_COLUMNS)
        )
        assert history.where("_cdc_is_deleted AND _cdc_is_current").isEmpty()

    for _ in range(2):  # a rerun changes nothing
        assert pipeline_run(pipeline) == 0
        check_tables()
    history = pipeline_run.table("customers__history")
    versions = {
        key: history.where(F.col("id") == key).orderBy("_cdc_lsn", "_cdc_offset").collect() for key in (a, b, c)
    }
    notes = versions[a][0].notes
    assert [row.tags for row in versions[a]][1:] == [["a", "b", "c"], ["a"], ["a"], ["a"]]
    assert {row.notes for row in versions[a]} == {notes}
    assert len(notes) > 2000
    assert [(row._cdc_is_current, row._cdc_is_deleted) for row in versions[a]] == [(False, False)] * 4 + [(True, False)]
    assert all(
        row._cdc_valid_to == after._cdc_valid_from for row, after in zip(versions[a], versions[a][1:], strict=False)
    )
    assert [(row._cdc_op, row._cdc_is_current, row._cdc_is_deleted) for row in versions[b]] == [
        ("c", False, False),
        ("d", False, True),
    ]
    assert versions[b][0]._cdc_valid_to == versions[b][1]._cdc_valid_from == versions[b][1]._cdc_valid_to
    assert [(row._cdc_op, row._cdc_is_deleted) for row in versions[c]] == [("c", False), ("d", True)]
    (moved,) = history.where(F.col("id") == c + 1000000).collect()
    assert (moved.notes, moved.tags, moved._cdc_is_current) == (versions[c][0].notes, versions[c][0].tags, True)

    # Round two: A's array emptied, C's set to NULL; their child rows go.
    import psycopg

    with psycopg.connect(stack_config.postgres.dsn(), autocommit=True) as conn:
        conn.execute("UPDATE shop.customers SET tags = '{}', full_name = 'round two' WHERE id = %s", (a,))
        conn.execute("UPDATE shop.customers SET tags = NULL WHERE id = %s", (c + 1000000,))
    kafka.wait_for_last_value(topic, lambda value: value is not None and b'"tags":null' in value)
    for _ in range(2):
        assert pipeline_run(pipeline) == 0
        check_tables()
    children = pipeline_run.table("customers__tags")
    assert children.where(F.col("id").isin(a, c + 1000000)).isEmpty()
