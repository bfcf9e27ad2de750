"""Rows flattened by ExtractNewRecordState -> Kafka -> `cdc raw` -> `cdc refine`.

Records are written as the transform writes them with JsonConverter (``schemas.enable=true``),
``add.fields=op,lsn,source.ts_ms`` and ``delete.handling.mode=rewrite`` (``__deleted``), deletes
followed by tombstones, or tombstones alone.
"""

from __future__ import annotations

import functools
import json
import time
from decimal import Decimal

import pytest
from pyspark.testing import assertDataFrameEqual

from cdc.core.tables import is_delta_table
from refine.batch import UNWRAPPED_ROW
from refine.config import refined_table_location
from refine.quality.quarantine import quarantine_location

DECIMAL = {
    "type": "bytes",
    "optional": True,
    "name": "org.apache.kafka.connect.data.Decimal",
    "version": 1,
    "parameters": {"scale": "2", "connect.decimal.precision": "10"},
}
ADDED = [
    {"type": "string", "optional": True, "field": "__op"},
    {"type": "int64", "optional": True, "field": "__lsn"},
    {"type": "int64", "optional": True, "field": "__source_ts_ms"},
    {"type": "string", "optional": True, "field": "__deleted"},
]
PRICES = {"12.50": "BOI=", "3.00": "ASw=", "7.25": "AtU="}  # base64 of the unscaled big-endian integers


def key(topic: str, item_id: int, separators: tuple[str, str] | None = None) -> bytes:
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Key",
        "fields": [{"type": "int64", "optional": False, "field": "id"}],
    }
    return json.dumps({"schema": schema, "payload": {"id": item_id}}, separators=separators).encode()


def row(
    topic: str,
    item_id: int,
    name: str,
    price: str,
    op: str,
    lsn: int,
    deleted: bool = False,
    separators: tuple[str, str] | None = None,
) -> bytes:
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Value",
        "fields": [
            {"type": "int64", "optional": False, "field": "id"},
            {"type": "string", "optional": True, "field": "name"},
            {**DECIMAL, "field": "price"},
            *ADDED,
        ],
    }
    payload = {
        "id": item_id,
        "name": name,
        "price": PRICES[price],
        "__op": op,
        "__lsn": lsn,
        "__source_ts_ms": 1_763_700_000_000 + lsn,
        "__deleted": "true" if deleted else "false",
    }
    return json.dumps({"schema": schema, "payload": payload}, separators=separators).encode()


@pytest.mark.parametrize("compact", [True, False], ids=["compact JSON", "JSON with spaces"])
def test_flattened_rows_are_upserted_and_deleted_in_lsn_order(
    spark, kafka, land_and_refine, unique_name, tmp_path, compact, monkeypatch
):
    """JsonConverter writes compact JSON: batches are then parsed in one pass with the last batch's
    schemas. Values with spaces are read all the same, after their schemas are found."""
    from refine.batch import RefineBatch

    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    searched = []  # batches whose schemas were searched for
    search = RefineBatch._refine
    monkeypatch.setattr(RefineBatch, "_refine", lambda self, *args: searched.append(1) or search(self, *args))
    separators = (",", ":") if compact else None
    key = functools.partial(globals()["key"], separators=separators)
    row = functools.partial(globals()["row"], separators=separators)
    kafka.produce(
        topic,
        [
            (key(topic, 1), row(topic, 1, "a", "12.50", "r", 100)),
            (key(topic, 2), row(topic, 2, "b", "3.00", "c", 200)),
            (key(topic, 1), row(topic, 1, "a2", "7.25", "u", 300)),
            (key(topic, 2), row(topic, 2, "b", "3.00", "d", 400, deleted=True)),  # delete.handling.mode=rewrite
            (key(topic, 2), None),
            (key(topic, 3), row(topic, 3, "c", "3.00", "c", 500)),
            (key(topic, 3), None),  # a delete as the tombstone alone
            (key(topic, 4), row(topic, 4, "d", "12.50", "c", 600)),
            (key(topic, 1), row(topic, 1, "a", "12.50", "r", 100)),  # replayed after a connector restart
        ],
    )
    expected = spark.createDataFrame(
        [(1, "a2", Decimal("7.25"), 300, "u"), (4, "d", Decimal("12.50"), 600, "c")],
        "id long, name string, price decimal(10,2), _cdc_lsn long, _cdc_op string",
    )
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(refined.select(*expected.columns), expected)
    assert "__op" not in refined.columns
    assert "__deleted" not in refined.columns

    kafka.produce(topic, [(key(topic, 1), None)])  # a batch of one tombstone: no schema in it
    land_and_refine(warehouse, topic)
    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    assertDataFrameEqual(refined.select(*expected.columns), expected.where("id = 4"))
    assert len(searched) == (0 if compact else 2)  # with spaces: each of the two batches

    # That tombstone's deleted-keys entry keeps a replay of key 1's last change out, and lets a create of the key
    # by a later transaction in (at the tombstone's own LSN, the largest, it kept every later create out).
    kafka.produce(topic, [(key(topic, 1), row(topic, 1, "a2", "7.25", "u", 300))])
    land_and_refine(warehouse, topic)
    kafka.produce(topic, [(key(topic, 1), row(topic, 1, "back", "3.00", "c", 700))])
    land_and_refine(warehouse, topic)
    refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
    back = spark.createDataFrame([(1, "back", Decimal("3.00"), 700, "c")], expected.schema)
    assertDataFrameEqual(refined.select(*expected.columns), expected.where("id = 4").union(back))


def test_a_batch_of_only_bad_records_on_a_flattened_topic_is_quarantined(
    spark, kafka, land_and_refine, unique_name, tmp_path
):
    """Batches holding no good row: a Debezium envelope (the topic holds rows, as its refined table
    remembers), a value schema that is no struct, a key schema naming a field the rows lack (no key
    schema of the batch can be read). Each is quarantined with its reason, the table is left as it
    was, and the job goes on."""
    topic = kafka.create_topic(f"{unique_name}.shop.items")
    warehouse = str(tmp_path)
    kafka.produce(topic, [(key(topic, 1), row(topic, 1, "a", "12.50", "c", 100))])
    land_and_refine(warehouse, topic)
    good = json.loads(row(topic, 2, "b", "3.00", "c", 200))
    columns = [{**field, "optional": True} for field in good["schema"]["fields"] if not field["field"].startswith("__")]
    envelope = {
        "type": "struct",
        "optional": False,
        "name": f"{topic}.Envelope",
        "fields": [
            {"type": "struct", "optional": True, "field": "before", "fields": columns},
            {"type": "struct", "optional": True, "field": "after", "fields": columns},
            {"type": "struct", "optional": False, "field": "source", "fields": []},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    after = {name: good["payload"][name] for name in ("id", "name", "price")}
    nope = {"type": "struct", "optional": False, "fields": [{"type": "int64", "optional": False, "field": "nope"}]}
    batches = {
        "envelope": [(key(topic, 2), _wrapped(envelope, {"after": after, "source": {}, "op": "c"}))],
        "not a struct": [(key(topic, 3), _wrapped({"type": "string"}, "row 3"))],
        "nope": [(_wrapped(nope, {"nope": 4}), row(topic, 4, "d", "3.00", "c", 400))],
    }
    expected = spark.createDataFrame([(1, "a", Decimal("12.50"))], "id long, name string, price decimal(10,2)")
    for reason, records in batches.items():
        kafka.produce(topic, records)
        land_and_refine(warehouse, topic)
        refined = spark.read.format("delta").load(refined_table_location(warehouse, topic))
        assertDataFrameEqual(refined.select(*expected.columns), expected)
        quarantined = spark.read.format("delta").load(quarantine_location(warehouse)).orderBy("offset").collect()
        assert reason in quarantined[-1].reason, quarantined[-1].reason
    assert [q.offset for q in quarantined] == [1, 2, 3]


def _wrapped(schema: dict, payload) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}).encode()


# Postgres tables with an ``_id`` column (as MongoDB documents have) and no ``id`` column: keyed by it,
# or by another column; their columns.
_ID_TABLES = {
    "by_code": ("code text PRIMARY KEY, _id int, name text", ["code", "_id", "name"]),
    "by__id": ("_id bigint PRIMARY KEY, name text", ["_id", "name"]),
}


@pytest.mark.parametrize("schemas", [True, False], ids=["with schemas", "without schemas"])
def test_real_postgres_rows_with_an__id_column_are_refined_as_rows(
    spark, stack, stack_config, kafka, land, refine, refined_table, unique_name, tmp_path, schemas
):
    """The real connector and ExtractNewRecordState on tables with an ``_id`` column: their rows are refined
    as the tables' rows (not as MongoDB documents, which ExtractNewDocumentState's rows also are: their key
    is the connector's ``{id}``), equal to Postgres after inserts, an update and a delete. Without schemas
    they are quarantined, with the reason (such rows are refined with their schema)."""
    import psycopg

    from cdc.stack.postgres import remove_connector
    from connectors import definitions
    from connectors.client import ConnectClient
    from connectors.definitions import ConnectorDefinition

    dsn = stack_config.postgres.dsn()
    tables = {kind: f"{unique_name}_{kind}" for kind in _ID_TABLES}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for kind, table in tables.items():
            conn.execute(f"CREATE TABLE shop.{table} ({_ID_TABLES[kind][0]})")
    connector = ConnectorDefinition(
        unique_name,
        {
            **definitions.load("postgres").config,
            "topic.prefix": unique_name,
            "slot.name": unique_name,
            "publication.name": unique_name,
            "table.include.list": ",".join(f"shop\\.{table}" for table in tables.values()),
            "transforms": "unwrap",
            "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
            "transforms.unwrap.add.fields": "op,lsn,source.ts_ms",
            "transforms.unwrap.delete.tombstone.handling.mode": "rewrite-with-tombstone",
            "key.converter.schemas.enable": str(schemas).lower(),
            "value.converter.schemas.enable": str(schemas).lower(),
        },
    )
    client = ConnectClient(stack_config.connect.url)
    client.register(connector)
    try:
        client.wait_running(connector.name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO shop.{tables['by_code']} VALUES ('a', 1, 'x'), ('b', 2, 'y'), ('c', 3, 'z')")
            conn.execute(f"UPDATE shop.{tables['by_code']} SET name = 'y2', _id = 20 WHERE code = 'b'")
            conn.execute(f"DELETE FROM shop.{tables['by_code']} WHERE code = 'c'")
            conn.execute(f"INSERT INTO shop.{tables['by__id']} VALUES (1, 'x'), (2, 'y'), (3, 'z')")
            conn.execute(f"UPDATE shop.{tables['by__id']} SET name = 'y2' WHERE _id = 2")
            conn.execute(f"DELETE FROM shop.{tables['by__id']} WHERE _id = 3")
        topics = {kind: f"{unique_name}.shop.{table}" for kind, table in tables.items()}
        deadline = time.monotonic() + 120
        while any(len(kafka.records(topic)) < 6 for topic in topics.values()):  # 3 inserts, update, delete, tombstone
            assert time.monotonic() < deadline, "the connector's records did not arrive"
            time.sleep(0.5)
        warehouse = str(tmp_path)
        for kind, topic in topics.items():
            columns = _ID_TABLES[kind][1]
            with psycopg.connect(dsn) as conn:
                source = conn.execute(f"SELECT {', '.join(columns)} FROM shop.{tables[kind]}").fetchall()
            for _ in range(2):  # a rerun changes nothing
                land(warehouse, topic)
                refine(warehouse, topic)
                if schemas:
                    refined = refined_table(warehouse, topic).select(*columns)
                    assert sorted(tuple(row) for row in refined.collect()) == sorted(source), kind
        if not schemas:  # such rows need their schema: each is quarantined (the tombstones go nowhere)
            quarantined = spark.read.format("delta").load(quarantine_location(warehouse))
            assert sorted(quarantined.groupBy("topic").count().collect()) == sorted((t, 5) for t in topics.values())
            assert {q.reason for q in quarantined.collect()} == {UNWRAPPED_ROW}
            assert not any(is_delta_table(spark, refined_table_location(warehouse, t)) for t in topics.values())
    finally:
        remove_connector(stack_config, connector)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in tables.values():
                conn.execute(f"DROP TABLE IF EXISTS shop.{table}")
