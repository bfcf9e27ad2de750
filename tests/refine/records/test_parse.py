"""Parsing raw rows of a real Debezium topic (landed by `cdc raw` from the stack) into typed changes."""

import json

import psycopg
from pyspark.sql import functions as F

from cdc.core.config import validate
from cdc.core.tables import raw_table_location
from cdc.raw.config import RawJobConfig
from cdc.raw.job import run_raw_job
from cdc.stack.workload import run_workload
from refine.records.envelope import ConnectSchema
from refine.records.parse import TOMBSTONE, parse_changes


def test_customer_changes_parse_to_the_values_postgres_holds(spark, kafka, stack_config, postgres_connector, tmp_path):
    run_workload(stack_config.postgres.dsn(), customers=4, seed=7)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    # The workload ends with a delete and its tombstone: then every record is in Kafka.
    records = kafka.wait_for_last_value(topic, lambda value: value is None)
    ops = ["tombstone" if value is None else json.loads(value)["payload"]["op"] for *_, value, _ in records]
    config = validate(
        RawJobConfig,
        {
            "topics": {"kind": "topics", "topics": [topic]},
            "warehouse": str(tmp_path),
            "trigger": {"kind": "available_now"},
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        },
        "raw job",
    )
    run_raw_job(spark, config, say=lambda line: None)
    raw = spark.read.format("delta").load(raw_table_location(str(tmp_path), topic))
    sample = raw.where(F.col("value").isNotNull()).orderBy(F.col("offset").desc()).head()
    record, key_record = json.loads(sample.value), json.loads(sample.key)

    changes = parse_changes(
        raw, ConnectSchema.model_validate(key_record["schema"]), ConnectSchema.model_validate(record["schema"])
    ).orderBy("kafka_offset")

    assert changes.where("problem IS NOT NULL").count() == 0
    assert [row.op for row in changes.collect()] == ops
    tombstone = changes.where(F.col("op") == TOMBSTONE).head()
    assert tombstone.before is None
    assert tombstone.key.id > 0

    # The last image of each surviving customer equals the row in Postgres, column for column.
    latest = {row.key.id: row.after for row in changes.where("op IN ('c', 'u')").collect()}
    with psycopg.connect(stack_config.postgres.dsn()) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        for customer_id, after in latest.items():
            db = conn.execute(
                "SELECT balance, credit_limit, signed_up_at, birth_date, profile::text, tags, external_id::text, "
                "is_active, avatar FROM shop.customers WHERE id = %s",
                (customer_id,),
            ).fetchone()
            if db is None:
                continue  # deleted later in the workload
            assert after.balance == db[0]
            assert after.credit_limit == db[1]
            # PySpark returns timestamps as naive local datetimes: compare the instants.
            assert after.signed_up_at.timestamp() == db[2].timestamp()
            assert after.birth_date == db[3]
            assert json.loads(after.profile) == json.loads(db[4])
            assert after.tags == db[5]
            assert after.external_id == db[6]
            assert after.is_active == db[7]
            assert bytes(after.avatar) == bytes(db[8])


def test_unparseable_values_are_flagged_not_dropped(spark):
    row = {
        "type": "struct",
        "optional": True,
        "fields": [
            {"type": "int64", "field": "id"},
            {
                "type": "bytes",
                "field": "price",
                "optional": True,
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "2", "connect.decimal.precision": "4"},
            },
        ],
    }
    schema = ConnectSchema.model_validate(
        {
            "type": "struct",
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                {
                    "type": "struct",
                    "field": "source",
                    "fields": [
                        {"type": "int64", "field": "lsn"},
                        {"type": "int64", "field": "txId"},
                        {"type": "int64", "field": "ts_ms"},
                    ],
                },
                {"type": "string", "field": "op"},
            ],
        }
    )
    raw = (
        spark.createDataFrame(
            [
                ('{"payload": {"after": {"id": 1, "price": "AQ=="}, "op": "c"}}', 0, 0),
                ("not json", 0, 1),
                ('{"payload": {"op": "x"}}', 0, 2),
                (None, 0, 3),
                ('{"payload": {"after": {"id": 2, "price": "D0JA"}, "op": "u"}}', 0, 4),  # 10000.00 > decimal(4,2)
            ],
            "value string, partition int, offset long",
        )
        .withColumn("key", F.lit(None).cast("string"))
        .withColumn("headers", F.lit(None).cast("array<struct<key:string,value:binary>>"))
    )
    rows = parse_changes(raw, None, schema).orderBy("kafka_offset").collect()
    assert [(row.op, row.problem) for row in rows] == [
        ("c", None),
        (None, "value is not a Debezium JSON envelope"),
        ("x", "unknown op x"),
        (TOMBSTONE, None),
        ("u", "field after.price: cannot decode the value as decimal(4,2)"),
    ]
    assert rows[1].raw_value == "not json"


def test_wrapped_values_parse_the_same_cut_after_their_schema_as_whole(spark):
    from refine.records.parse import wrapped_schema, wrapper_schemas

    row = {
        "type": "struct",
        "optional": True,
        "fields": [{"type": "int64", "field": "id"}, {"type": "string", "optional": True, "field": "note"}],
    }
    schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "field": "source",
                "fields": [
                    {"type": "int64", "field": "lsn"},
                    {"type": "int64", "field": "txId"},
                    {"type": "int64", "field": "ts_ms"},
                ],
            },
            {"type": "string", "field": "op"},
        ],
    }
    schema_text = json.dumps(schema, separators=(",", ":"))
    payloads = [
        {"after": {"id": 1, "note": 'a "quoted" ,"payload": inside'}, "op": "c"},
        {"after": {"id": 2, "note": "}"}, "op": "u"},
        {"after": None, "op": "d"},
    ]
    values = [json.dumps({"schema": schema, "payload": p}, separators=(",", ":")) for p in payloads]
    values.append(json.dumps({"schema": schema, "payload": payloads[0]}))  # with spaces: parsed as JSON
    values.append('{"schema":' + schema_text + ',"payload":{"after":{"id":3')  # cut short: flagged
    raw = spark.createDataFrame([(v, 0, i) for i, v in enumerate(values)], "value string, partition int, offset long")
    raw = raw.withColumn("key", F.lit(None).cast("string")).withColumn(
        "headers", F.lit(None).cast("array<struct<key:string,value:binary>>")
    )

    texts = wrapper_schemas(raw, {"value": []})
    assert texts == {"value": [schema_text]}
    for schema_texts in (texts, None):  # cut after the known schema, and parsed whole
        rows = (
            parse_changes(raw, None, ConnectSchema.model_validate(schema), schema_texts=schema_texts)
            .orderBy("kafka_offset")
            .collect()
        )
        assert [
            (row.op, row.after.id if row.after else None, row.after.note if row.after else None) for row in rows
        ] == [
            ("c", 1, 'a "quoted" ,"payload": inside'),
            ("u", 2, "}"),
            ("d", None, None),
            ("c", 1, 'a "quoted" ,"payload": inside'),
            (None, None, None),
        ]
        assert rows[-1].problem == "value is not a Debezium JSON envelope"
    schemas = raw.select(wrapped_schema(F.col("value")).alias("s")).collect()
    assert [json.loads(row.s) if row.s else None for row in schemas] == [schema] * 4 + [None]


def test_wrapper_schemas_are_the_batchs_own_in_order_of_appearance(spark):
    from refine.records.parse import wrapper_schemas

    def value(name: str) -> str:
        schema = {"type": "struct", "fields": [{"type": "int64", "field": name}]}
        return json.dumps({"schema": schema, "payload": {name: 1}}, separators=(",", ":"))

    def text(name: str) -> str:
        return json.dumps({"type": "struct", "fields": [{"type": "int64", "field": name}]}, separators=(",", ":"))

    values = [value("b"), value("a"), None, value("b"), "not json", value("c")]
    raw = spark.createDataFrame([(v, 0, i) for i, v in enumerate(values)], "value string, partition int, offset long")
    raw = raw.withColumn("key", F.when(F.col("offset") == 1, F.lit(value("k"))))
    expected = {"value": [text("b"), text("a"), text("c")], "key": [text("k")]}
    assert wrapper_schemas(raw, {"value": [], "key": []}) == expected
    # Known schemas are matched by prefix; one the batch lacks is not among its own.
    assert wrapper_schemas(raw, {"value": [text("c"), text("z"), text("a")], "key": [text("k")]}) == expected
    assert wrapper_schemas(raw.where("value IS NULL"), {"value": [text("a")]}) == {"value": []}


def test_a_parser_of_guessed_schemas_flags_the_records_of_any_other(spark):
    """The guess is the first record's schemas; a record of another schema, or no compact wrapper,
    gets OTHER_SCHEMA (so that the batch is parsed again), not a wrong decoding."""
    from refine.records.parse import OTHER_SCHEMA, first_wrapper_schemas

    def schema(*names: str) -> dict:
        row = {"type": "struct", "optional": True, "fields": [{"type": "int64", "field": n} for n in names]}
        source = {
            "type": "struct",
            "field": "source",
            "fields": [
                {"type": "int64", "field": "lsn"},
                {"type": "int64", "field": "txId"},
                {"type": "int64", "field": "ts_ms"},
            ],
        }
        return {
            "type": "struct",
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                source,
                {"type": "string", "field": "op"},
            ],
        }

    def wrapped(schema_: dict, payload: dict, separators=(",", ":")) -> str:
        return json.dumps({"schema": schema_, "payload": payload}, separators=separators)

    key_schema = {"type": "struct", "fields": [{"type": "int64", "field": "id"}]}
    first, added = schema("id"), schema("id", "extra")
    records = [
        (None, wrapped(key_schema, {"id": 0})),  # a tombstone first: no value to guess from
        (wrapped(first, {"after": {"id": 1}, "op": "c"}), wrapped(key_schema, {"id": 1})),
        (wrapped(added, {"after": {"id": 2, "extra": 5}, "op": "c"}), wrapped(key_schema, {"id": 2})),
        (wrapped(first, {"after": {"id": 3}, "op": "c"}, separators=None), wrapped(key_schema, {"id": 3})),
        (wrapped(first, {"after": {"id": 4}, "op": "c"}), wrapped({"type": "int64"}, 4)),
        (wrapped(first, {"after": {"id": 5}, "op": "u"}), wrapped(key_schema, {"id": 5})),
    ]
    raw = spark.createDataFrame(
        [(v, k, 0, i) for i, (v, k) in enumerate(records)], "value string, key string, partition int, offset long"
    ).withColumn("headers", F.lit(None).cast("array<struct<key:string,value:binary>>"))

    compact = lambda schema_: json.dumps(schema_, separators=(",", ":"))  # noqa: E731
    texts = first_wrapper_schemas(raw)
    assert texts == {"value": [compact(first)], "key": [compact(key_schema)]}
    parsed = (
        parse_changes(
            raw,
            ConnectSchema.model_validate(key_schema),
            ConnectSchema.model_validate(first),
            schema_texts=texts,
            only_schemas=True,
        )
        .orderBy("kafka_offset")
        .collect()
    )
    assert [row.problem for row in parsed] == [None, None, OTHER_SCHEMA, OTHER_SCHEMA, OTHER_SCHEMA, None]
    assert [(row.op, row.key.id if row.key else None) for row in parsed if row.problem is None] == [
        (TOMBSTONE, 0),
        ("c", 1),
        ("u", 5),
    ]

    assert first_wrapper_schemas(raw.where("offset = 3")) is None  # with spaces: no compact wrapper
    assert first_wrapper_schemas(raw.where("offset = 0")) is None
    # Keys without a wrapper (null, or written without a schema) give no key schema; a batch parsed
    # without one takes such keys, and flags a key in a wrapper.
    for key in (F.lit(None), F.lit('{"id":1}')):
        unwrapped = raw.where("offset IN (1, 2)").withColumn("key", key.cast("string"))
        assert first_wrapper_schemas(unwrapped) == {"value": [compact(first)], "key": []}
    mixed = raw.where("offset IN (1, 5)").withColumn(
        "key", F.when(F.col("offset") == 1, F.lit('{"id":1}')).otherwise(F.col("key"))
    )
    keyless = (
        parse_changes(
            mixed,
            None,
            ConnectSchema.model_validate(first),
            schema_texts={"value": [compact(first)], "key": []},
            only_schemas=True,
        )
        .orderBy("kafka_offset")
        .collect()
    )
    assert [row.problem for row in keyless] == [None, OTHER_SCHEMA]
