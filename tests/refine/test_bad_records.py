"""Malformed records on a real Debezium Postgres topic, of envelopes or of rows flattened by
ExtractNewRecordState: each goes to the quarantine with a reason naming the field, every good record is
applied, the job exits 0 and a rerun changes nothing; a batch that fails for another reason stops the
job with one line naming the cause, the table and the batch.

The good records are the real connector's, byte for byte: captured from a table of this test's own,
then produced again, in order, to a topic of their own with the malformed ones (copies of real records,
mutated) between them.
"""

from __future__ import annotations

import json
import re
import shutil

import psycopg
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.stack.postgres import remove_connector
from refine.apply.merge import METADATA_COLUMNS
from refine.config import refined_table_location
from refine.quality.quarantine import quarantine_location
from refine.records.parse import MESSAGE_ON_A_TABLE_TOPIC, VALUE_NOT_UTF8

COLUMNS = (
    "id int PRIMARY KEY, name text NOT NULL, born date, seen_at timestamp(6), updated_at timestamptz, "
    "price numeric(10,2), qty bigint, flag boolean"
)
SPARK_SCHEMA = (
    "id int, name string, born date, seen_at timestamp_ntz, updated_at timestamp, price decimal(10,2), "
    "qty long, flag boolean"
)


# ExtractNewRecordState as connectors are told to set it up: the row, the change's op, LSN and time,
# and a delete as a row marked `__deleted: "true"` followed by a tombstone (Debezium 3's name for the
# setting that was `delete.handling.mode=rewrite`).
FLATTENED = {
    "transforms": "unwrap",
    "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
    "transforms.unwrap.add.fields": "op,lsn,source.ts_ms",
    "transforms.unwrap.delete.tombstone.handling.mode": "rewrite-with-tombstone",
}


@pytest.fixture
def captured_table(stack, stack_config, unique_name):
    yield from _captured_table(stack_config, unique_name, {})


@pytest.fixture
def captured_flattened_table(stack, stack_config, unique_name):
    yield from _captured_table(stack_config, unique_name, FLATTENED)


def _captured_table(stack_config, unique_name, settings: dict[str, str]):
    """``capture(statements)``: the table ``<unique_name>.items`` (:data:`COLUMNS`), changed by the SQL
    ``statements`` while a Debezium connector of this test's own (with the connector ``settings``)
    captures it; returns its topic's records once the last statement's change is there. Removes the
    connector with its slot and publication."""
    from connectors import definitions
    from connectors.client import ConnectClient
    from connectors.definitions import ConnectorDefinition

    dsn, client = stack_config.postgres.dsn(), ConnectClient(stack_config.connect.url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {unique_name}")
        conn.execute(f"CREATE TABLE {unique_name}.items ({COLUMNS})")
    connector = ConnectorDefinition(
        unique_name,
        {
            **definitions.load("postgres").config,
            "topic.prefix": unique_name,
            "slot.name": unique_name,
            "publication.name": unique_name,
            "schema.include.list": unique_name,
            **settings,
        },
    )
    topic = f"{unique_name}.{unique_name}.items"

    def capture(statements: list[str], kafka, last_value) -> list[tuple]:
        client.register(connector)
        client.wait_running(connector.name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.format(table=f"{unique_name}.items"))
        return kafka.wait_for_last_value(topic, last_value)

    capture.topic, capture.dsn, capture.table = topic, dsn, f"{unique_name}.items"
    capture.read = lambda spark: spark.createDataFrame(  # the table in Postgres, as the refined table types it
        psycopg.connect(dsn).execute(f"SELECT * FROM {unique_name}.items").fetchall(), SPARK_SCHEMA
    )
    yield capture
    remove_connector(stack_config, connector)


WORKLOAD = [
    (
        "INSERT INTO {table} SELECT i, 'item ' || i, date '2020-01-01' + i, "
        "timestamp '2026-01-01 10:00:00.123456' + i * interval '1 hour', "
        "timestamptz '2026-02-01 00:00:00+00' + i * interval '1 minute', "
        "i * 1.25, i * 1000000000000, i % 2 = 0 FROM generate_series(1, 8) i"
    ),
    "UPDATE {table} SET name = 'renamed', price = 99.99 WHERE id = 2",
    "UPDATE {table} SET born = NULL, flag = NULL WHERE id = 3",
    "DELETE FROM {table} WHERE id = 4",
    "UPDATE {table} SET id = 40 WHERE id = 5",
    "INSERT INTO {table} (id, name) VALUES (9, 'late')",
]


# The reasons the quarantine gives, as the code words them: a test matching a generic word ("value", "key")
# would pass whichever check caught the record.
NOT_ENVELOPE = "value is not a Debezium JSON envelope"
NOT_ROW = "value is not a JSON row of the topic's schema"
KEY_NOT_JSON = "key is not a Debezium JSON key of the table's key schema"
KEY_NOT_UTF8 = "key is not UTF-8 text (its bytes are in the raw table's key_bytes)"
# A value in Confluent's Avro wire format (magic byte 0, a 4-byte schema id, Avro binary) on a JSON topic.
AVRO_FRAMED = b"\x00\x00\x00\x00\x07" + b"\x02\x0cBAD-ROW"


def _split(value: bytes) -> tuple[dict, dict]:
    document = json.loads(value)
    return document["schema"], document["payload"]


def _wrap(schema: dict, payload) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def _key(key_schema: dict, key: dict) -> bytes:
    return _wrap(key_schema, key)


def malformed_records(records: list[tuple]) -> list[tuple[str, str, bytes | None, bytes | None]]:
    """(kind, the text its reason must hold, key, value): copies of the real ``records``, mutated."""
    create = next(r for r in records if r[4] and _split(r[4])[1]["op"] == "c")
    key_schema, _ = _split(create[3])
    schema, payload = _split(create[4])

    def new_row(row_id: int, **changes) -> dict:  # a create of a row Postgres never had
        return {**payload, "after": {**payload["after"], "id": row_id, "name": "BAD", **changes}}

    def record(kind, reason, row_id, after=None, key=None, value_schema=None, **envelope):
        value = {**new_row(row_id, **(after or {})), **envelope}
        return (
            kind,
            reason,
            _key(key_schema, key if key is not None else {"id": row_id}),
            _wrap(value_schema or schema, value),
        )

    good_value = create[4]
    newer_source = {**payload["source"], "lsn": max(_split(r[4])[1]["source"]["lsn"] for r in records if r[4]) + 1000}
    unknown_type = json.loads(json.dumps(schema))
    next(f for f in unknown_type["fields"] if f["field"] == "after")["fields"][6]["type"] = "int128"
    not_envelope = {
        "type": "struct",
        "optional": False,
        "name": "x.Value",
        "fields": [{"type": "int32", "optional": False, "field": "id"}],
    }
    wrong_key_schema = {**key_schema, "fields": [{"type": "int32", "optional": False, "field": "nope"}]}
    return [
        ("value not JSON", NOT_ENVELOPE, _key(key_schema, {"id": 101}), b"{not json"),
        ("value cut short", NOT_ENVELOPE, _key(key_schema, {"id": 102}), good_value[: len(good_value) // 2]),
        ("value not UTF-8", VALUE_NOT_UTF8, _key(key_schema, {"id": 103}), b"\xff\xfe" + good_value[2:]),
        ("value a JSON array", NOT_ENVELOPE, _key(key_schema, {"id": 104}), b"[1,2,3]"),
        ("payload null", NOT_ENVELOPE, _key(key_schema, {"id": 105}), _wrap(schema, None)),
        ("value Avro-framed", NOT_ENVELOPE, _key(key_schema, {"id": 128}), AVRO_FRAMED),
        record("unknown op", "unknown op x", 106, op="x"),
        record("no op", "unknown op null", 107, op=None),
        ("after a string", "after", _key(key_schema, {"id": 108}), _wrap(schema, {**payload, "after": "oops"})),
        ("create without after", "after", _key(key_schema, {"id": 109}), _wrap(schema, {**payload, "after": None})),
        record("date as a string", "after.born", 110, after={"born": "2020-01-01"}),
        record("timestamp as a string", "after.seen_at", 111, after={"seen_at": "2026-01-01T10:00:00"}),
        record("zoned timestamp not a time", "after.updated_at", 112, after={"updated_at": "yesterday"}),
        record("int32 key column a string", "after.id", 113, after={"id": "one hundred"}),
        record("int32 key column out of range", "after.id", 114, after={"id": 2**40}),
        record("decimal not base64", "after.price", 115, after={"price": "!!"}),
        record("boolean a string", "after.flag", 116, after={"flag": "yes"}),
        record("int64 a fraction", "after.qty", 117, after={"qty": 1.5}),
        record("required column null", "after.name", 118, after={"name": None}),
        record("source.lsn a string", "source.lsn", 119, source={**payload["source"], "lsn": "abc"}),
        ("key not JSON", KEY_NOT_JSON, b"{oops", _wrap(schema, new_row(120))),
        ("key not UTF-8", KEY_NOT_UTF8, b"\xff\xfe\x00", _wrap(schema, new_row(121))),
        record("key disagrees with after", "field key.id: 1 is not the row's after.id", 122, key={"id": 1}),
        (
            "key missing on a keyed table",
            "field key.id: null is not the row's after.id",
            None,
            _wrap(schema, new_row(123)),
        ),
        (
            "key schema names a field the value lacks",
            "nope",
            _wrap(wrong_key_schema, {"nope": 124}),
            _wrap(schema, new_row(124)),
        ),
        record("unknown type in the schema", "int128", 125, value_schema=unknown_type),
        ("schema not an envelope", "envelope", _key(key_schema, {"id": 126}), _wrap(not_envelope, {"id": 126})),
        # Changes of rows the table holds, newer than their last good change: applied, they would show.
        record(
            "existing row: an update with a date as a string",
            "field after.born: cannot read",
            1,
            after={"born": "2020-01-01"},
            op="u",
            source=newer_source,
        ),
        (
            "existing row: a delete whose before holds a fraction for an int64",
            "field before.qty: cannot read",
            _key(key_schema, {"id": 6}),
            _wrap(
                schema,
                {
                    **payload,
                    "op": "d",
                    "before": {**payload["after"], "id": 6, "qty": 1.5},
                    "after": None,
                    "source": newer_source,
                },
            ),
        ),
        (
            "existing row: a logical decoding message on the table's topic",
            MESSAGE_ON_A_TABLE_TOPIC,
            _key(key_schema, {"id": 7}),
            _wrap(schema, {**payload, "op": "m", "before": None, "after": None, "source": newer_source}),
        ),
    ]


def malformed_rows(records: list[tuple]) -> list[tuple[str, str, bytes | None, bytes | None]]:
    """(kind, the text its reason must hold, key, value): copies of the real flattened ``records``
    (rows with ``__op``, ``__lsn``, ``__source_ts_ms`` and ``__deleted``), mutated."""
    create = next(r for r in records if r[4] and _split(r[4])[1]["__op"] == "c")
    key_schema, _ = _split(create[3])
    schema, payload = _split(create[4])

    def new_row(row_id: int, **changes) -> dict:  # a create of a row Postgres never had
        return {**payload, "id": row_id, "name": "BAD", **changes}

    def record(kind, reason, row_id, row=None, key=None, value_schema=None):
        return (
            kind,
            reason,
            _key(key_schema, key if key is not None else {"id": row_id}),
            _wrap(value_schema or schema, new_row(row_id, **(row or {}))),
        )

    good_value = create[4]
    newer_lsn = max(_split(r[4])[1]["__lsn"] for r in records if r[4]) + 1000
    unknown_type = json.loads(json.dumps(schema))
    next(f for f in unknown_type["fields"] if f["field"] == "qty")["type"] = "int128"
    row_schema = {**schema, "optional": True}
    envelope = {
        "type": "struct",
        "optional": False,
        "name": "x.Envelope",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "optional": False, "field": "source", "fields": []},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    wrong_key_schema = {**key_schema, "fields": [{"type": "int32", "optional": False, "field": "nope"}]}
    return [
        ("value not JSON", NOT_ROW, _key(key_schema, {"id": 101}), b"{not json"),
        ("value cut short", NOT_ROW, _key(key_schema, {"id": 102}), good_value[: len(good_value) // 2]),
        ("value not UTF-8", VALUE_NOT_UTF8, _key(key_schema, {"id": 103}), b"\xff\xfe" + good_value[2:]),
        ("value a JSON array", NOT_ROW, _key(key_schema, {"id": 104}), b"[1,2,3]"),
        ("payload null", NOT_ROW, _key(key_schema, {"id": 105}), _wrap(schema, None)),
        ("payload a string", NOT_ROW, _key(key_schema, {"id": 106}), _wrap(schema, "oops")),
        ("value Avro-framed", NOT_ROW, _key(key_schema, {"id": 128}), AVRO_FRAMED),
        record("unknown op", "field __op: unknown op x", 107, row={"__op": "x"}),
        record(
            "__deleted neither true nor false",
            "field __deleted: yes is neither true nor false",
            108,
            row={"__deleted": "yes"},
        ),
        record("date as a string", "field born", 110, row={"born": "2020-01-01"}),
        record("timestamp as a string", "field seen_at", 111, row={"seen_at": "2026-01-01T10:00:00"}),
        record("zoned timestamp not a time", "field updated_at", 112, row={"updated_at": "yesterday"}),
        record("int32 key column a string", "field id", 113, row={"id": "one hundred"}),
        record("int32 key column out of range", "field id", 114, row={"id": 2**40}),
        record("decimal not base64", "field price", 115, row={"price": "!!"}),
        record("boolean a string", "field flag", 116, row={"flag": "yes"}),
        record("int64 a fraction", "field qty", 117, row={"qty": 1.5}),
        record("required column null", "field name", 118, row={"name": None}),
        record("__lsn a string", "field __lsn", 119, row={"__lsn": "abc"}),
        ("key not JSON", KEY_NOT_JSON, b"{oops", _wrap(schema, new_row(120))),
        ("key not UTF-8", KEY_NOT_UTF8, b"\xff\xfe\x00", _wrap(schema, new_row(121))),
        record("key disagrees with the row", "field key.id: 1 is not the row's id", 122, key={"id": 1}),
        ("key missing", "key: missing, and the topic's rows are keyed", None, _wrap(schema, new_row(123))),
        (
            "key schema names a field the row lacks",
            "nope",
            _wrap(wrong_key_schema, {"nope": 124}),
            _wrap(schema, new_row(124)),
        ),
        record("unknown type in the schema", "int128", 125, value_schema=unknown_type),
        ("schema not a struct", "struct", _key(key_schema, {"id": 126}), _wrap({"type": "string"}, "row 126")),
        (
            "an envelope among rows",
            "envelope",
            _key(key_schema, {"id": 127}),
            _wrap(envelope, {"before": None, "after": new_row(127), "source": {}, "op": "c"}),
        ),
        # Changes of rows the table holds, newer than their last good change: applied, they would show.
        record(
            "existing row: an update with a date as a string",
            "field born: cannot read",
            1,
            row={"born": "2020-01-01", "__op": "u", "__lsn": newer_lsn},
        ),
        record(
            "existing row: a delete with a fraction for an int64",
            "field qty: cannot read",
            6,
            row={"qty": 1.5, "__op": "d", "__deleted": "true", "__lsn": newer_lsn},
        ),
    ]


def _refine_with_malformed(spark, kafka, captured, records, bad, warehouse, capsys, topic) -> None:
    """Produce the real ``records`` with the ``bad`` ones (:func:`malformed_records`) between them to
    ``topic``, land and refine it twice (the second run replays every batch), and check after each run
    that every bad record is quarantined with its reason and the refined table equals Postgres."""
    from cdc.cli import main

    # One topic: the real records in their order, a malformed one after each (and the rest at the end), then
    # the malformed changes of existing rows, after those rows' last good change.
    good = [(key, value, headers) for _, _, _, key, value, headers in records]
    late = [record for record in bad if record[0].startswith("existing row")]
    bad = [record for record in bad if record not in late]
    mixed = []
    for index in range(max(len(good), len(bad))):
        if index < len(good):
            mixed.append(("good", good[index]))
        if index < len(bad):
            kind, reason, key, value = bad[index]
            mixed.append(((kind, reason), (key, value)))
    mixed += [((kind, reason), (key, value)) for kind, reason, key, value in late]
    kafka.produce(topic, [record for _, record in mixed], partition=0)
    kinds = {offset: kind for offset, (kind, _) in enumerate(mixed) if kind != "good"}

    assert main(["raw", "--topic", topic, "--warehouse", warehouse, "--available-now"]) == 0
    refined = lambda: spark.read.format("delta").load(refined_table_location(warehouse, topic))  # noqa: E731
    quarantined = lambda: spark.read.format("delta").load(quarantine_location(warehouse))  # noqa: E731
    for run in range(2):  # the second replays every batch: nothing changes
        if run:
            shutil.rmtree(f"{warehouse}/_cdc/checkpoints/refine/{topic}")
        capsys.readouterr()
        assert main(["refine", "--table", topic, "--warehouse", warehouse, "--available-now"]) == 0, (
            capsys.readouterr().err
        )
        rows = quarantined().where(F.col("topic") == topic).select("offset", "reason").collect()
        offsets = sorted(row.offset for row in rows)
        assert offsets == sorted(kinds), "each bad record is quarantined once, and no good one (after a rerun too)"
        reasons = {row.offset: row.reason for row in rows}
        wrong = {
            kind: reasons.get(offset)
            for offset, (kind, expected) in kinds.items()
            if expected.lower() not in (reasons.get(offset) or "").lower()
        }
        assert not wrong, f"not quarantined with a reason naming the field: {wrong}"
        assert all("\n" not in reason for reason in reasons.values()), reasons
        assertDataFrameEqual(refined().drop(*METADATA_COLUMNS), captured.read(spark))


def test_malformed_records_go_to_the_quarantine_and_every_good_record_is_applied(
    spark, kafka, captured_table, tmp_path, monkeypatch, capsys, unique_name
):
    records = captured_table(WORKLOAD, kafka, lambda value: value is not None and b'"name":"late"' in value)
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    topic = kafka.create_topic(f"{unique_name}.corpus")
    bad = malformed_records(records)
    _refine_with_malformed(spark, kafka, captured_table, records, bad, str(tmp_path), capsys, topic)


def test_malformed_flattened_rows_go_to_the_quarantine_and_every_good_row_is_applied(
    spark, kafka, captured_flattened_table, tmp_path, monkeypatch, capsys, unique_name
):
    """The same for a topic of rows flattened by ExtractNewRecordState (deletes as rows marked
    ``__deleted`` followed by tombstones)."""
    captured = captured_flattened_table
    records = captured(WORKLOAD, kafka, lambda value: value is not None and b'"name":"late"' in value)
    assert b'"__deleted":"true"' in b"".join(r[4] for r in records if r[4]), "no delete in the rows"
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    topic = kafka.create_topic(f"{unique_name}.corpus")
    bad = malformed_rows(records)
    _refine_with_malformed(spark, kafka, captured, records, bad, str(tmp_path), capsys, topic)


def test_a_batch_that_fails_stops_the_job_with_one_line_naming_the_cause_table_and_batch(
    spark, kafka, captured_table, tmp_path, monkeypatch, cdc_process
):
    """The refined table's location is taken by a file (a user's mistake, a broken copy): the batch's
    first write fails inside Spark, with no error of the tool's own. `cdc refine` runs as a process of
    its own: what the user sees is all it prints."""
    from cdc.cli import main

    topic = captured_table.topic
    warehouse = str(tmp_path)
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    captured_table(["INSERT INTO {table} (id, name, qty) VALUES (1, 'one', 1)"], kafka, lambda value: value is not None)
    assert main(["raw", "--topic", topic, "--warehouse", warehouse, "--available-now"]) == 0
    (tmp_path / "refined").mkdir()
    (tmp_path / "refined" / topic).write_text("not a table")
    for debug in (False, True):
        job = cdc_process(
            [*(["--debug"] if debug else []), "refine", "--table", topic, "--warehouse", warehouse, "--available-now"]
        )
        output = job.wait(timeout=300)
        assert job.returncode == 9, output
        errors = [line for line in output.splitlines() if line.startswith("cdc: error:")]
        assert len(errors) == 1, output
        assert re.fullmatch(
            rf"cdc: error: a refine batch failed: [\w.]+: \S.* \(table={re.escape(topic)}, batch=0\)", errors[0]
        ), output
        # Spark's log of the failure (with the Python Proxy's traceback) and the traceback: only under --debug.
        assert ("Python Proxy" in output) == debug, output
        assert ("Traceback" in output) == debug, output
