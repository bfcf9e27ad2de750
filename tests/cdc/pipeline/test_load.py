"""Pipeline files: every problem named by its key path and the reason; the shipped examples pass."""

from pathlib import Path

import pytest
import yaml

from cdc.cli import main
from cdc.pipeline.config import JsonEvents, ScdType
from cdc.pipeline.load import PipelineError, load_pipeline

EXAMPLES = Path(__file__).parents[3] / "examples" / "pipelines"
GAME_SCHEMA = (
    "player string, game string, event_type string, time timestamp, "
    "device struct<os: string, model: string>, items array<struct<item_id: string, qty: int>>"
)


def pipeline(**parts) -> dict:
    document = {
        "name": "games",
        "sources": {"game_events": {"kind": "events", "format": "json", "topic": "game-events", "schema": GAME_SCHEMA}},
        "refined": {"players": {"source": "game_events", "keys": ["player"], "ordering": "time"}},
    }
    for key, value in parts.items():
        document[key] = value if not isinstance(value, dict) or key not in document else {**document[key], **value}
    return document


def problems(tmp_path: Path, document: dict | str) -> list[str]:
    file = tmp_path / "pipeline.yaml"
    file.write_text(document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(PipelineError) as raised:
        load_pipeline(file)
    return raised.value.problems


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda path: path.name)
def test_the_shipped_examples_are_valid(example, capsys):
    assert main(["validate", str(example)]) == 0
    assert capsys.readouterr().out == "OK\n"


def test_both_examples_ship():
    assert {path.name for path in EXAMPLES.glob("*.yaml")} == {"shop.yaml", "game_events.yaml"}
    games = load_pipeline(EXAMPLES / "game_events.yaml")
    assert games.refined["events"].split_by == "game"
    assert isinstance(games.sources["game_events"], JsonEvents)


def test_a_valid_file_loads_with_defaults(tmp_path):
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump(pipeline()))
    loaded = load_pipeline(file)
    assert loaded.refined["players"].scd is ScdType.CURRENT
    assert loaded.refined["players"].flatten.enabled


def test_a_schema_file_is_found_beside_the_pipeline_file(tmp_path, monkeypatch):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "score.avsc").write_text('{"type": "record", "name": "Score", "fields": []}')
    file = tmp_path / "p.yaml"
    file.write_text(
        yaml.safe_dump(
            pipeline(
                sources={
                    "game_events": {
                        "kind": "events",
                        "format": "avro",
                        "topic": "t",
                        "schema": {"kind": "file", "path": "schemas/score.avsc"},
                    }
                }
            )
        )
    )
    monkeypatch.chdir("/")  # the jobs read the file from wherever they run
    assert load_pipeline(file).sources["game_events"].schema_.path == tmp_path / "schemas" / "score.avsc"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            pipeline(
                refined={
                    "players": {
                        "source": "game_events",
                        "keys": ["player"],
                        "ordering": "time",
                        "explode": ["device.nope"],
                    }
                }
            ),
            "refined.players.explode[0]: unknown column path 'device.nope': no field 'nope' (fields: os, model)",
        ),
        (
            pipeline(
                refined={
                    "players": {"source": "game_events", "keys": ["player"], "ordering": "time", "explode": ["device"]}
                }
            ),
            (
                "refined.players.explode[0]: column 'device' is a struct<os:string,model:string>, not an array: "
                "it cannot be exploded"
            ),
        ),
        (
            pipeline(refined={"players": {"source": "nope"}}),
            "refined.players.source: unknown source 'nope' (sources: game_events)",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "keys": ["player"]}}),
            "refined.players.ordering: required with `keys`: the column that orders an entity's events",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "keys": ["items"], "ordering": "time"}}),
            "refined.players.keys[0]: 'items' is a array<struct<item_id:string,qty:int>>: it must be a single value",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "split_by": "device.cpu"}}),
            "refined.players.split_by: unknown column path 'device.cpu': no field 'cpu' (fields: os, model)",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "ordering": "time"}}),
            "refined.players: `ordering` only applies together with `keys` (without keys every event is appended)",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "scd": 3}}),
            "refined.players.scd: Input should be 1 or 2",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "scd": 2}}),
            "refined.players.scd: SCD type 2 needs `keys` (the entity whose versions are kept)",
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "keys": ["player", "player"], "ordering": "time"}}),
            "refined.players.keys: listed more than once: player",
        ),
        (
            pipeline(refined={"bad-name": {"source": "game_events"}}),
            (
                "refined.bad-name: 'bad-name' is not a valid name: letters, digits and single underscores, "
                "starting with a "
                "letter (`__` is kept for child tables)"
            ),
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "colour": "red"}}),
            "refined.players.colour: Extra inputs are not permitted",
        ),
        (
            pipeline(sources={"game_events": {"kind": "kafka", "topic": "x"}}),
            (
                "sources.game_events: Input tag 'kafka' found using 'kind' does not match any of the expected tags: "
                "'debezium_postgres', 'debezium_mongodb', 'events'"
            ),
        ),
        (
            pipeline(sources={"game_events": {"kind": "events", "format": "json", "topic": "t", "schema": "a int,"}}),
            "sources.game_events.schema: not a Spark DDL schema: the type ends early",
        ),
        (
            pipeline(
                sources={
                    "game_events": {
                        "kind": "events",
                        "format": "avro",
                        "topic": "t",
                        "schema": {"kind": "registry", "url": "ftp://r"},
                    }
                }
            ),
            "sources.game_events.schema.url: 'ftp://r' is not an http:// or https:// URL",
        ),
        (
            pipeline(
                sources={
                    "game_events": {
                        "kind": "events",
                        "format": "protobuf",
                        "topic": "t",
                        "schema": {"kind": "file", "path": "missing.proto"},
                    }
                }
            ),
            "sources.game_events.schema.path: no such file: {tmp}/missing.proto",
        ),
        (
            pipeline(sources={"game_events": {"kind": "events", "format": "avro", "topic": "t"}}),
            "sources.game_events.schema: Field required",
        ),
        (
            pipeline(sources={"game_events": {"kind": "events", "format": "json", "topic": "a b"}}),
            "sources.game_events.topic: String should match pattern '^[A-Za-z0-9._-]{1,249}$'",
        ),
        (
            pipeline(
                sources={
                    "game_events": {"kind": "events", "format": "json", "topic": "t"},
                    "again": {"kind": "debezium_postgres", "topic": "t"},
                }
            ),
            "sources.again.topic: topic 't' is already the topic of sources.game_events",
        ),
        (
            pipeline(
                sources={"db": {"kind": "debezium_postgres", "topic": "demo.shop.customers"}},
                refined={"players": {"source": "db", "keys": ["id"]}},
            ),
            (
                "refined.players.keys: applies to event sources only: a Debezium table's "
                "key is its primary key and its "
                "changes are ordered by their source position (source 'db' is debezium_postgres)"
            ),
        ),
        (
            pipeline(
                sources={"db": {"kind": "debezium_mongodb", "topic": "m.db.people"}},
                refined={"players": {"source": "db", "flatten": {"keep": ["address"]}}},
            ),
            (
                "refined.players.flatten: applies to event sources only: a MongoDB table "
                "keeps nested documents as struct "
                "columns, typed from Extended JSON"
            ),
        ),
        (
            pipeline(refined={"players": {"source": "game_events", "renames": {"a": "b"}}}),
            (
                "refined.players.renames: applies to Debezium Postgres sources only: an event source's schema is "
                "declared or inferred (source 'game_events' is events)"
            ),
        ),
        (
            pipeline(
                sources={"db": {"kind": "debezium_mongodb", "topic": "m.db.people"}},
                refined={"players": {"source": "db", "drop_columns": True}},
            ),
            (
                "refined.players.drop_columns: applies to Debezium Postgres sources only: a MongoDB field that "
                "changes type becomes JSON text, and a document's fields come and go"
            ),
        ),
        (
            pipeline(
                sources={"db": {"kind": "debezium_postgres", "topic": "d.s.t", "source_time_zone": "Mars/Olympus"}}
            ),
            "sources.db.source_time_zone: unknown time zone 'Mars/Olympus' (an IANA name, e.g. Europe/Berlin)",
        ),
        (
            pipeline(business={"sessions": {"sql": "SELECT * FROM players p JOIN scores s USING (player)"}}),
            "business.sessions.sql: unknown table 'scores' (tables: players, sessions)",
        ),
        (
            pipeline(
                sources={"db": {"kind": "debezium_postgres", "topic": "d.shop.items"}},
                refined={"items": {"source": "db", "renames": {"old_name": "new_name"}}},
                business={
                    "by_name": {"sql": "SELECT i.`old_name`, count(*) AS n FROM items i GROUP BY 1"},
                    "fine": {"sql": "SELECT new_name AS old_name, 'old_name', \"old_name\" FROM items -- old_name"},
                    "other": {"sql": "SELECT p.old_name FROM players p JOIN items i ON p.id = i.id"},
                },
            ),
            (
                "business.by_name.sql: uses column 'old_name' of refined.items, which the source renamed to "
                "'new_name' (refined.items.renames): rows written since hold it as 'new_name' only"
            ),
        ),
        (
            pipeline(
                business={"a": {"sql": "SELECT * FROM b"}, "b": {"sql": "WITH x AS (SELECT 1) SELECT * FROM a, x"}}
            ),
            "business.a.sql: cycle: a -> b -> a",
        ),
        (
            pipeline(business={"players": {"sql": "SELECT 1"}}),
            "business.players: the name 'players' is already used by refined.players",
        ),
        (
            pipeline(business={"sessions": {"sql": "SELECT 1", "trigger_interval_s": 0}}),
            "business.sessions.trigger_interval_s: Input should be greater than 0",
        ),
        (
            pipeline(expectations={"hr": {"table": "nope", "constraint": "x > 0"}}),
            "expectations.hr.table: unknown refined table 'nope' (refined tables: players)",
        ),
        (
            pipeline(expectations={"hr": {"table": "players", "constraint": "x > 0", "action": "explode"}}),
            "expectations.hr.action: Input should be 'warn', 'drop' or 'fail'",
        ),
    ],
)
def test_each_problem_names_the_key_and_the_reason(tmp_path, document, expected):
    assert problems(tmp_path, document) == [expected.replace("{tmp}", str(tmp_path))]


def test_flattening_collisions_and_reserved_names(tmp_path):
    schema = "device struct<os: string>, device_os string, _cdc_offset long"
    document = pipeline(
        sources={"game_events": {"kind": "events", "format": "json", "topic": "t", "schema": schema}},
        refined={"players": {"source": "game_events"}},
    )
    assert problems(tmp_path, document) == [
        "refined.players.flatten: flattening gives two columns named 'device_os': 'device.os' and 'device_os'"
    ]
    document["refined"]["players"]["flatten"] = {"keep": ["device"]}
    assert problems(tmp_path, document) == [
        (
            "refined.players.flatten: column '_cdc_offset' (from '_cdc_offset') uses the prefix '_cdc_', kept for the "
            "tool's own"
        )
    ]


def test_every_problem_is_reported_at_once(tmp_path):
    document = pipeline(
        refined={"players": {"source": "nope"}, "other": {"source": "game_events", "explode": ["x"]}},
        expectations={"e": {"table": "t", "constraint": "true"}},
    )
    assert [line.split(":")[0] for line in problems(tmp_path, document)] == [
        "refined.players.source",
        "refined.other.explode[0]",
        "expectations.e.table",
    ]


def test_repeated_keys_and_broken_yaml(tmp_path):
    text = "name: games\nsources:\n  a: {kind: debezium_postgres, topic: x}\n  a: {kind: debezium_postgres, topic: y}\n"
    assert problems(tmp_path, text) == ["sources.a: given twice (lines 3 and 4)"]
    assert problems(tmp_path, "name: [unclosed\n") == [
        "line 2, column 1: not valid YAML: expected ',' or ']', but got '<stream end>'"
    ]
    assert problems(tmp_path, "- a list\n") == ["the file must hold a YAML mapping (name, sources, refined, ...)"]


def test_validate_prints_one_line_per_problem_and_exits_2(tmp_path, capsys):
    file = tmp_path / "p.yaml"
    file.write_text(
        yaml.safe_dump(pipeline(refined={"players": {"source": "nope"}, "other": {"source": "x"}}), sort_keys=False)
    )
    assert main(["validate", str(file)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "refined.players.source: unknown source 'nope' (sources: game_events)",
        "refined.other.source: unknown source 'x' (sources: game_events)",
    ]
    assert captured.out == ""
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the file: No such file or directory" in capsys.readouterr().err


def shaped(mongo: bool = False, **table) -> dict:
    """A pipeline of one Debezium table with shaping keys ``table``."""
    kind, topic = ("debezium_mongodb", "demo.shop.carts") if mongo else ("debezium_postgres", "demo.shop.customers")
    return {
        "name": "crm",
        "sources": {"customers": {"kind": kind, "topic": topic}},
        "refined": {"customers": {"source": "customers", **table}},
    }


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            shaped(mask={"email": "md5"}),
            "refined.customers.mask.email: Input should be 'sha256', 'hmac_sha256', 'redact' or 'nullify'",
        ),
        (shaped(deletes="archive"), "refined.customers.deletes: Input should be 'hard' or 'soft'"),
        (
            shaped(columns=["id"], except_columns=["notes"]),
            "refined.customers: `columns` and `except_columns` exclude each other: give one",
        ),
        (
            shaped(mask={"email": "hmac_sha256"}),
            "refined.customers: mask: email is hmac_sha256, which needs `mask_key` ({env: NAME} or {file: path})",
        ),
        (
            shaped(mask={"email": "hmac_sha256"}, mask_key={"env": "K", "file": "k"}),
            "refined.customers.mask_key: give one of `env` or `file`",
        ),
        (
            shaped(cluster_by=["id"], except_columns=["id"]),
            "refined.customers: cluster_by: id is left out of the table",
        ),
        (
            shaped(partition_by=["email"], mask={"email": "sha256"}),
            "refined.customers: email is masked: a masked column cannot lay out the table",
        ),
        (
            shaped(track_history_columns=["email"]),
            (
                "refined.customers.track_history_columns: applies with `scd: 2` only: without a history "
                "there are no versions to track"
            ),
        ),
        (
            shaped(explode=["tags"], except_columns=["tags"]),
            "refined.customers.explode: tags is left out of the table (columns/except_columns): nothing to explode",
        ),
        (
            shaped(cluster_by=["id"], drop_columns=True),
            (
                "refined.customers.cluster_by: a clustering or partition column cannot be dropped: "
                "`drop_columns: true` would drop it if the source did"
            ),
        ),
        (
            shaped(mongo=True, where="qty > 0"),
            "refined.customers.where: applies to Debezium Postgres sources only (not yet to MongoDB)",
        ),
        (
            shaped(computed={"_cdc_x": "1"}),
            "refined.customers: computed: _cdc_x: names starting with _cdc_ are reserved",
        ),
        (shaped(mask_policy="strict"), "refined.customers.mask_policy: Extra inputs are not permitted"),
        (
            shaped(mask={"notes": "redact"}, except_columns=["notes"]),
            "refined.customers: mask: notes is left out of the table (columns/except_columns)",
        ),
        (
            shaped(partition_by=["is_active"], schema_changes="evolve"),
            (
                "refined.customers.partition_by: a clustering or partition column cannot be dropped: "
                "`schema_changes: evolve` would drop it if the source did"
            ),
        ),
        (
            shaped(scd=2, track_history_columns=["notes"], except_columns=["notes"]),
            "refined.customers: track_history_columns: notes is left out of the table (columns/except_columns)",
        ),
    ],
)
def test_shaping_keys_are_checked_with_the_key_named(tmp_path, document, expected):
    assert problems(tmp_path, document) == [expected]


def test_shaping_keys_of_an_event_source_are_refused(tmp_path):
    document = pipeline(
        refined={"players": {"source": "game_events", "keys": ["player"], "ordering": "time", "deletes": "soft"}}
    )
    assert problems(tmp_path, document) == [
        (
            "refined.players.deletes: applies to Debezium Postgres sources only: an event source's schema is declared "
            "or inferred (source 'game_events' is events)"
        )
    ]


def test_a_mask_key_file_is_found_beside_the_pipeline_file(tmp_path, monkeypatch):
    file = tmp_path / "pipeline.yaml"
    document = shaped(mask={"email": "hmac_sha256"}, mask_key={"file": "secrets/mask.key"})
    file.write_text(yaml.safe_dump(document, sort_keys=False))
    monkeypatch.chdir("/")  # the jobs read the key from wherever they run
    assert load_pipeline(file).refined["customers"].mask_key.file == tmp_path / "secrets" / "mask.key"
