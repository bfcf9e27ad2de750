"""Source schema changes (ALTER TABLE at Postgres, mid-stream) followed by the refined, history, child and
keyless tables: refined after every step, and all at once, and rebuilt, each compared cell by cell (types
included) with Postgres read back with psycopg."""

from __future__ import annotations

import psycopg
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.core.config import validate
from cdc.core.errors import TableError
from cdc.pipeline.business import BusinessTableConfig, refresh_business_table
from refine.apply.flatten import child_table_name
from refine.apply.rules import history_table_name
from refine.config import RefineJobConfig, refined_table_location
from refine.rebuild import rebuild_refined_table
from refine.tables_loop import RefineLoop

SOURCE_ZONE = "Europe/Berlin"
COLUMNS = "qty smallint, price numeric(8,2), name varchar(20), born date, score real, gone text, old_name text"


def _create(conn: psycopg.Connection, table: str) -> None:
    conn.execute(f"CREATE TABLE shop.{table} (id int PRIMARY KEY, {COLUMNS}, tags text[])")
    conn.execute(f"CREATE TABLE shop.{table}_log (id int, {COLUMNS})")
    conn.execute(f"ALTER TABLE shop.{table}_log REPLICA IDENTITY FULL")
    for name in (table, f"{table}_log"):
        conn.execute(
            f"INSERT INTO shop.{name} (id, qty, price, name, born, score, gone, old_name) "
            "SELECT i, i, i + 0.25, 'n' || i, date '2020-01-01' + i, i + 0.1, 'g' || i, 'o' || i "
            "FROM generate_series(1, 10) AS i"
        )
    conn.execute(f"UPDATE shop.{table} SET tags = ARRAY['a' || id, 'b'] WHERE id <= 5")
    conn.execute(f"INSERT INTO shop.{table}_log SELECT * FROM shop.{table}_log WHERE id = 10")  # two equal rows


KEY_WIDENING = [
    "ALTER TABLE {t} ALTER COLUMN id TYPE bigint",
    "INSERT INTO {t} (id, qty, price, name) VALUES (5000000001, 7, 1.5, 'big key')",
]
# Each step: an ALTER applied to both tables, then writes that need the new shape.
STEPS = [
    ["ALTER TABLE {t} ALTER COLUMN qty TYPE integer", "UPDATE {t} SET qty = 40000 WHERE id = 1"],
    ["ALTER TABLE {t} ALTER COLUMN qty TYPE bigint", "UPDATE {t} SET qty = 5000000000 WHERE id = 2"],
    KEY_WIDENING,
    [
        "ALTER TABLE {t} ALTER COLUMN price TYPE numeric(14,3)",
        "UPDATE {t} SET price = 12345678.125 WHERE id = 3",
        "UPDATE {t} SET name = 'x4' WHERE id = 4",  # its price of the old scale, written again in the new
    ],
    ["ALTER TABLE {t} ALTER COLUMN name TYPE text", "UPDATE {t} SET name = repeat('y', 50) WHERE id = 5"],
    ["ALTER TABLE {t} ALTER COLUMN score TYPE double precision", "UPDATE {t} SET score = 0.1234567890123 WHERE id = 6"],
    ["ALTER TABLE {t} ALTER COLUMN born TYPE timestamp", "UPDATE {t} SET born = '2020-01-01 10:11:12' WHERE id = 7"],
    [
        f"ALTER TABLE {{t}} ALTER COLUMN born TYPE timestamptz USING born AT TIME ZONE '{SOURCE_ZONE}'",
        "UPDATE {t} SET born = '2021-06-01 12:00:00+00' WHERE id = 8",
    ],
    ["ALTER TABLE {t} DROP COLUMN gone", "UPDATE {t} SET qty = 9 WHERE id = 9"],
    ["ALTER TABLE {t} RENAME COLUMN old_name TO new_name", "UPDATE {t} SET new_name = 'renamed' WHERE id = 4"],
    ["ALTER TABLE {t} ADD COLUMN note text", "UPDATE {t} SET note = 'noted' WHERE id = 5"],
    ["DELETE FROM {t} WHERE id = 1", "DELETE FROM {t} WHERE ctid = (SELECT min(ctid) FROM {t} WHERE id = 10)"],
]
ONE_OF_EQUAL_ROWS = "ctid"  # a statement of the keyless table alone (the keyed one has no equal rows)

# Postgres' types as the refined table holds them.
SPARK_TYPES = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "text": "string",
    "date": "date",
    "timestamp without time zone": "timestamp_ntz",
    "timestamp with time zone": "timestamp",
    "text[]": "array<string>",
}


def _spark_type(postgres_type: str) -> str:
    if postgres_type.startswith("numeric("):
        return "decimal" + postgres_type.removeprefix("numeric")
    if postgres_type.startswith("character varying"):
        return "string"
    return SPARK_TYPES[postgres_type]


@pytest.fixture
def items(stack, stack_config, unique_name):
    """A keyed table and a keyless one (``<name>_log``) in the shop schema, made before the test's connector
    starts (its publication holds the tables there then); dropped afterwards."""
    table = f"items_{unique_name}"
    with psycopg.connect(stack_config.postgres.dsn()) as conn:
        _create(conn, table)
    yield table
    with psycopg.connect(stack_config.postgres.dsn()) as conn:
        for name in (table, f"{table}_log"):
            conn.execute(f"DROP TABLE IF EXISTS shop.{name}")


def _postgres(spark, dsn: str, table: str, only: tuple[str, ...] = ()):
    """Postgres' rows of ``shop.<table>`` (its columns ``only``, or all) with its columns' types as Spark types."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        columns = [
            (name, kind)
            for name, kind in conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (f"shop.{table}",),
            ).fetchall()
            if not only or name in only
        ]
        rows = conn.execute(f"SELECT {', '.join(name for name, _ in columns)} FROM shop.{table}").fetchall()
    schema = ", ".join(f"`{name}` {_spark_type(kind)}" for name, kind in columns)
    return spark.createDataFrame(rows, schema)


def _assert_equal(refined, expected) -> None:
    """Every cell of Postgres' columns, exactly (no float tolerance), types included."""
    actual = refined.select(*expected.columns)
    assert actual.schema.simpleString() == expected.schema.simpleString()
    assertDataFrameEqual(actual, expected, rtol=0, atol=0)


def _compare(spark, dsn: str, warehouse: str, prefix: str, table: str) -> None:
    topic = f"{prefix}.shop.{table}"
    keyed = _postgres(spark, dsn, table)
    read = spark.read.format("delta").load
    _assert_equal(read(refined_table_location(warehouse, topic)), keyed)
    history = read(refined_table_location(warehouse, history_table_name(topic)))
    _assert_equal(history.where("_cdc_is_current"), keyed)
    tags = _postgres(spark, dsn, table, ("id", "tags"))
    children = read(refined_table_location(warehouse, child_table_name(topic, "tags")))
    expected_children = tags.select("id", F.posexplode("tags").alias("pos", "value"))
    assertDataFrameEqual(children.select("id", "pos", "value"), expected_children)
    _assert_equal(read(refined_table_location(warehouse, f"{topic}_log")), _postgres(spark, dsn, f"{table}_log"))


def _settings(**more) -> dict:
    return {"renames": {"old_name": "new_name"}, "source_time_zone": SOURCE_ZONE, **more}


def _apply(dsn: str, items: str, steps: list[list[str]]) -> None:
    """Each step's statements at both tables (the keyless one has no key to widen, nor does the keyed one
    hold equal rows)."""
    with psycopg.connect(dsn) as conn:
        for statements in steps:
            for table in (items, f"{items}_log"):
                if table.endswith("_log") and statements is KEY_WIDENING:
                    continue
                for statement in statements:
                    if ONE_OF_EQUAL_ROWS not in statement or table.endswith("_log"):
                        conn.execute(statement.format(t=f"shop.{table}"))


class _Steps:
    """The test's two topics, landed and refined into a warehouse after waiting for a step's marker."""

    def __init__(self, kafka, dsn: str, prefix: str, items: str, land, refine):
        self.kafka, self.dsn, self.items, self.land, self.refine = kafka, dsn, items, land, refine
        self.keyed, self.keyless = f"{prefix}.shop.{items}", f"{prefix}.shop.{items}_log"

    def marked(self, step: int) -> None:
        """Wait until both topics hold the step's marker (the last write of each step)."""
        with psycopg.connect(self.dsn) as conn:
            for table in (self.items, f"{self.items}_log"):
                conn.execute(f"UPDATE shop.{table} SET name = 'mark-{step}' WHERE id = 10")
        for topic in (self.keyed, self.keyless):
            self.kafka.wait_for_last_value(topic, lambda value: value is not None and f"mark-{step}".encode() in value)

    def settings(self) -> list[tuple[str, dict]]:
        return [(self.keyed, _settings(history=True, explode=["tags"])), (self.keyless, _settings())]

    def refine_both(self, warehouse: str) -> None:
        self.land(warehouse, self.keyed, self.keyless)
        for topic, settings in self.settings():
            self.refine(warehouse, topic, **settings)


@pytest.mark.parametrize(
    "first", [1, 5, 9], ids=["steps 1-4", "steps 5-8, after 1-4 in one batch", "steps 9-12, after 1-8 in one batch"]
)
def test_every_alter_mid_stream_refines_equal_to_postgres_after_each_step(
    spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine, first
):
    """A third of the steps per test (each well within the time a test has): a later third's table takes the
    earlier steps' changes in one batch, then goes step by step."""
    _every_alter_step_by_step(spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine, first)


def test_every_alter_refines_equal_to_postgres_through_the_refine_loop(
    spark, kafka, stack_config, items, postgres_connector, tmp_path, land
):
    """A whole database's tables are refined by one loop (refine/tables_loop.py), not a query each: the last
    third of the steps, after the others in one batch, through it."""

    def refine_in_loop(warehouse: str, topic: str, **settings) -> None:
        document = {"table": topic, "warehouse": warehouse, "trigger": {"kind": "available_now"}, **settings}
        config = validate(RefineJobConfig, document, "refine job")
        loop = RefineLoop(spark, config.trigger, lambda line: None)
        loop.add(config)
        loop.run()

    _every_alter_step_by_step(spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine_in_loop, 9)


def _every_alter_step_by_step(spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine, first):
    dsn, prefix = stack_config.postgres.dsn(), postgres_connector.topic_prefix
    steps, warehouse = _Steps(kafka, dsn, prefix, items, land, refine), str(tmp_path)
    last = first + len(STEPS) // 3 - 1
    steps.marked(0)  # the connector's snapshot is over: an ALTER that rewrites the table hides its rows from it
    if first > 1:
        _apply(dsn, items, STEPS[: first - 1])
        steps.marked(first - 1)
    steps.refine_both(warehouse)
    _compare(spark, dsn, warehouse, prefix, items)
    for step, statements in enumerate(STEPS[first - 1 : last], start=first):
        _apply(dsn, items, [statements])
        steps.marked(step)
        steps.refine_both(warehouse)
        _compare(spark, dsn, warehouse, prefix, items)
    steps.refine_both(warehouse)  # a rerun over the same input changes nothing
    _compare(spark, dsn, warehouse, prefix, items)

    if last == len(STEPS):
        # The refined table keeps what lenient keeps: the dropped column, NULL where written after the drop,
        # and the renamed one's old column.
        location = refined_table_location(warehouse, steps.keyed)
        refined = spark.read.format("delta").load(location)
        gone = {row.id: row.gone for row in refined.select("id", "gone").collect()}
        assert (gone[9], gone[10], gone[2]) == (None, None, "g2")
        # A business table reading such columns is told so at its refresh.
        business = BusinessTableConfig(
            name="names",
            query="SELECT id, gone, `old_name`, new_name, 'gone' AS label FROM items -- qty",
            location=str(tmp_path / "business" / "names"),
            views={"items": location},
        )
        assert refresh_business_table(spark, business).warnings == tuple(
            f"business names: its query reads column {column!r} of items, which the source no longer has "
            "(dropped or renamed there): rows written since hold NULL in it"
            for column in ("gone", "old_name")
        )


def test_every_alter_in_one_batch_refines_and_rebuilds_equal_to_postgres(
    spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine
):
    dsn, prefix = stack_config.postgres.dsn(), postgres_connector.topic_prefix
    steps, warehouse = _Steps(kafka, dsn, prefix, items, land, refine), str(tmp_path)
    steps.marked(0)  # the connector's snapshot is over: an ALTER that rewrites the table hides its rows from it
    _apply(dsn, items, STEPS)
    steps.marked(len(STEPS))
    steps.refine_both(warehouse)  # one batch holding every schema
    _compare(spark, dsn, warehouse, prefix, items)

    # Rebuilt from the raw tables, whose records carry every schema.
    for topic, settings in steps.settings():
        config = RefineJobConfig(table=topic, warehouse=warehouse, **settings)
        rebuild_refined_table(spark, config, say=lambda line: None)
    _compare(spark, dsn, warehouse, prefix, items)


def test_the_exception_policy_stops_naming_the_column_and_the_way_on_works(
    spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine
):
    dsn, prefix = stack_config.postgres.dsn(), postgres_connector.topic_prefix
    topic, warehouse = f"{prefix}.shop.{items}", str(tmp_path)
    _Steps(kafka, dsn, prefix, items, land, refine).marked(0)  # the snapshot is over, the topics exist
    land(warehouse, topic)
    refine(warehouse, topic, schema_changes="exception")
    with psycopg.connect(dsn) as conn:
        conn.execute(f"ALTER TABLE shop.{items} ALTER COLUMN qty TYPE integer")
        conn.execute(f"UPDATE shop.{items} SET qty = 40000, name = 'mark' WHERE id = 1")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"mark" in value)
    land(warehouse, topic)
    with pytest.raises(TableError) as stopped:
        refine(warehouse, topic, schema_changes="exception")
    assert stopped.value.context["column"] == "qty"
    assert (stopped.value.context["old_type"], stopped.value.context["new_type"]) == ("smallint", "int")
    assert "--schema-changes lenient" in str(stopped.value)
    refine(warehouse, topic, schema_changes="lenient")  # the way on it names
    refine(warehouse, topic, schema_changes="exception")  # and the table goes on under its policy
    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    _assert_equal(refined, _postgres(spark, dsn, items))


def test_the_ignore_policy_keeps_the_schema_and_quarantines_what_no_longer_fits(
    spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine
):
    dsn, prefix = stack_config.postgres.dsn(), postgres_connector.topic_prefix
    topic, warehouse = f"{prefix}.shop.{items}", str(tmp_path)
    _Steps(kafka, dsn, prefix, items, land, refine).marked(0)  # the snapshot is over, the topics exist
    land(warehouse, topic)
    refine(warehouse, topic, schema_changes="ignore")  # the table, of the schema it keeps
    with psycopg.connect(dsn) as conn:
        conn.execute(f"ALTER TABLE shop.{items} ALTER COLUMN qty TYPE integer")
        conn.execute(f"UPDATE shop.{items} SET qty = 40000 WHERE id = 1")  # no longer fits smallint
        conn.execute(f"UPDATE shop.{items} SET qty = 12, name = 'mark' WHERE id = 2")  # fits
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"mark" in value)
    land(warehouse, topic)
    refine(warehouse, topic, schema_changes="ignore")
    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    assert refined.schema["qty"].dataType.simpleString() == "smallint"
    rows = {row.id: (row.qty, row.name) for row in refined.select("id", "qty", "name").collect()}
    assert (rows[1], rows[2]) == ((1, "n1"), (12, "mark"))
    quarantined = spark.read.format("delta").load(f"{warehouse}/_cdc/quarantine").where(F.col("topic") == topic)
    reasons = [row.reason for row in quarantined.select("reason").collect()]
    assert reasons == [
        (
            "field after.qty: 40000 does not fit the refined column's type smallint (the source's is now int; "
            "the table's schema_changes policy is ignore)"
        )
    ]


def test_timestamp_to_timestamptz_without_the_source_zone_is_refused_with_what_to_set(
    spark, kafka, stack_config, items, postgres_connector, tmp_path, land, refine
):
    dsn, prefix = stack_config.postgres.dsn(), postgres_connector.topic_prefix
    topic, warehouse = f"{prefix}.shop.{items}", str(tmp_path)
    _Steps(kafka, dsn, prefix, items, land, refine).marked(0)  # the snapshot is over, the topics exist
    with psycopg.connect(dsn) as conn:
        conn.execute(f"ALTER TABLE shop.{items} ALTER COLUMN born TYPE timestamp")
        conn.execute(f"UPDATE shop.{items} SET name = 'first' WHERE id = 1")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"first" in value)
    land(warehouse, topic)
    refine(warehouse, topic)
    with psycopg.connect(dsn) as conn:
        conn.execute(f"ALTER TABLE shop.{items} ALTER COLUMN born TYPE timestamptz")
        conn.execute(f"UPDATE shop.{items} SET name = 'mark' WHERE id = 1")
    kafka.wait_for_last_value(topic, lambda value: value is not None and b"mark" in value)
    land(warehouse, topic)
    with pytest.raises(TableError, match="source_time_zone"):
        refine(warehouse, topic)


@pytest.mark.parametrize(
    ("old", "new", "held_by"),
    [
        ("smallint", "int", "int"),
        ("int", "smallint", "int"),  # a narrowing keeps the wider column
        ("int", "bigint", "bigint"),
        ("int", "decimal(12,2)", "decimal(12,2)"),
        ("bigint", "decimal(10,0)", "decimal(19,0)"),
        ("decimal(8,2)", "decimal(14,3)", "decimal(14,3)"),
        ("decimal(8,2)", "decimal(6,4)", "decimal(10,4)"),
        ("decimal(38,0)", "decimal(38,10)", None),  # no decimal holds both
        ("float", "double", "double"),
        ("int", "double", "double"),
        ("bigint", "double", "double"),  # Postgres' values are doubles after the ALTER
        ("double", "int", "double"),
        ("double", "bigint", None),  # a double cannot hold 9007199254740993: a string holds both
        ("double", "decimal(20,2)", None),
        ("date", "timestamp_ntz", "timestamp_ntz"),
        ("timestamp_ntz", "timestamp", "timestamp"),
        ("string", "int", None),
        ("array<smallint>", "array<int>", "array<int>"),
    ],
)
def test_the_type_holding_both_is_the_narrowest_that_holds_every_value_of_each(spark, old, new, held_by):
    from pyspark.sql.types import _parse_datatype_string

    from refine.apply.schema_changes import widened_type

    held = widened_type(_parse_datatype_string(old), _parse_datatype_string(new))
    assert (held.simpleString() if held is not None else None) == held_by


def test_a_plan_widens_adds_renames_and_drops_only_as_the_rules_say(spark):
    from pyspark.sql.types import StructType

    from refine.apply.schema_changes import SchemaChangePolicy, SchemaChangeRules, plan_schema_change

    stored = StructType.fromDDL("id int, qty smallint, name string, gone string, old_name string, _cdc_lsn bigint")
    arriving = StructType.fromDDL("id int, qty int, name int, new_name string, _cdc_lsn bigint")
    lenient = plan_schema_change("t", stored, arriving, SchemaChangeRules(renames={"old_name": "new_name"}))
    assert [(c.column, c.becomes.simpleString()) for c in lenient.retyped] == [("qty", "int")]  # name stays string
    assert [(f.name, f.dataType.simpleString()) for f in lenient.added] == [("new_name", "string")]
    assert (lenient.renamed, lenient.dropped, lenient.absent) == ({"old_name": "new_name"}, [], ["gone", "old_name"])
    evolve = plan_schema_change("t", stored, arriving, SchemaChangeRules(policy=SchemaChangePolicy.EVOLVE))
    assert evolve.dropped == ["gone", "old_name"]  # never a _cdc_ column
    ignore = plan_schema_change("t", stored, arriving, SchemaChangeRules(policy=SchemaChangePolicy.IGNORE))
    assert ignore == ([], [], [], {}, [], [])
    with pytest.raises(TableError, match="policy is exception") as stopped:
        plan_schema_change("t", stored, arriving, SchemaChangeRules(policy=SchemaChangePolicy.EXCEPTION))
    assert stopped.value.context["column"] == "qty"
    wall_clock, instant = StructType.fromDDL("born timestamp_ntz"), StructType.fromDDL("born timestamp")
    for policy in SchemaChangePolicy:  # a wall-clock time becomes an instant only in the source's zone
        for stored, arriving in ((wall_clock, instant), (instant, wall_clock)):  # stored ones, or arriving ones
            with pytest.raises(TableError, match="source's time zone, which is not declared"):
                plan_schema_change("t", stored, arriving, SchemaChangeRules(policy=policy))
    renamed = StructType.fromDDL("seen timestamp")  # renamed from born, and made an instant
    with pytest.raises(TableError, match="renamed from born are wall-clock times"):
        plan_schema_change("t", wall_clock, renamed, SchemaChangeRules(renames={"born": "seen"}))
    zoned = SchemaChangeRules(source_time_zone="Europe/Berlin")
    assert [c.becomes.simpleString() for c in plan_schema_change("t", wall_clock, instant, zoned).retyped] == [
        "timestamp"
    ]


def test_a_column_dropped_then_added_again_holds_none_of_its_earlier_values(spark, tmp_path):
    """Postgres' column added again is a new column (NULL in existing rows): the kept one's earlier values are
    cleared, of a type holding them and the new ones; a history keeps them in its earlier versions."""
    from pyspark.sql.types import StructType

    from refine.apply.merge import TableSettings, ensure_refined_table

    for history in (False, True):
        location = str(tmp_path / f"items{history}")
        stored = StructType.fromDDL("id int, gone string" + (", _cdc_is_current boolean" if history else ""))
        rows = [(1, "g1", True), (1, "g0", False)] if history else [(1, "g1")]
        spark.createDataFrame(rows, stored).write.format("delta").save(location)
        source = StructType.fromDDL("id int")
        settings = TableSettings()
        ensure_refined_table(spark, location, settings, source, source_columns=True)  # dropped: kept, marked
        back = StructType.fromDDL("id int, gone int")
        ensure_refined_table(spark, location, settings, back, source_columns=True)  # added again
        table = spark.read.format("delta").load(location)
        assert table.schema["gone"].dataType.simpleString() == "string"  # holds "g0" and the new ints
        assert sorted(row.gone or "" for row in table.collect()) == (["", "g0"] if history else [""])


def test_wall_clock_times_a_column_of_instants_takes_are_read_in_the_sources_zone(spark):
    """After ``timestamptz -> timestamp`` the refined column of instants stays; the source's later wall-clock
    times are instants of its zone (10:00 in Berlin's winter is 09:00 UTC), never of the session's."""
    from datetime import datetime

    from pyspark.sql.types import StructType

    from refine.apply.schema_changes import conformed

    rows = spark.createDataFrame([(datetime(2020, 1, 1, 10, 0),)], "born timestamp_ntz")
    table = StructType.fromDDL("born timestamp")
    (row,) = conformed(rows, table, time_zone="Europe/Berlin").select(F.date_format("born", "HH:mm")).collect()
    assert row[0] == "09:00"  # the session's zone is UTC
