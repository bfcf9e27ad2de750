"""Decoding throughput of Protobuf event values (Python in Spark's workers) next to JSON and Avro (Spark's own).

    .venv/bin/python bench/protobuf_decode.py [--events 200000] [--rounds 3]

Protobuf values are decoded by Python code over Arrow batches (cdc/pipeline/events/protobuf.py, mapInArrow):
spark-protobuf's from_protobuf is not on Maven Central as this project's machines reach it. This
measures what that costs against the two paths Spark decodes in the JVM, on the same events:

- EVENTS page-view events (~1 KB as Protobuf: ids, a Timestamp, an enum, nested structs, a repeated
  message, a map, strings) are built once and written as three raw-like Delta tables (value / value_bytes,
  partition, offset, as `cdc raw` lands them): Protobuf, JSON text, Avro binary;
- each path decodes its whole table (cdc.pipeline.events.protobuf.decode_protobuf, cdc.pipeline.events.job.decode_json
  with from_json, cdc.pipeline.events.avro.decode_avro) into Spark's no-op sink, after a first pass counting
  the values that did not decode (a warm-up, and a check: it should be 0), ROUNDS times; the best
  round gives events/s. Reading the table alone is timed too (the floor every path pays).

Prints figures; asserts nothing. Needs no running stack. Figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastavro
from google.protobuf import message_factory
from pyspark.sql import DataFrame, SparkSession

from cdc.core.config import SparkConfig
from cdc.core.session import build_spark_session
from cdc.pipeline.config import SchemaFile
from cdc.pipeline.events.avro import AvroDecoding, avro_event_schema, decode_avro
from cdc.pipeline.events.job import decode_json
from cdc.pipeline.events.protobuf import ProtobufDecoder, compile_schema_file, message_descriptor

PROTO = """
syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";

message PageView {
  string event_id = 1;
  string user_id = 2;
  string session_id = 3;
  google.protobuf.Timestamp time = 4;
  Kind kind = 5;
  string url = 6;
  string referrer = 7;
  Device device = 8;
  Geo geo = 9;
  repeated string tags = 10;
  map<string, string> properties = 11;
  repeated Item items = 12;
  int64 duration_ms = 13;
  bool is_bot = 14;
  string user_agent = 15;
  string note = 16;
}
enum Kind { KIND_UNSPECIFIED = 0; VIEW = 1; CLICK = 2; PURCHASE = 3; }
message Device { string os = 1; string browser = 2; string model = 3; int32 screen_width = 4; int32 screen_height = 5; }
message Geo { string country = 1; string city = 2; double lat = 3; double lon = 4; }
message Item { string sku = 1; int32 quantity = 2; double price = 3; }
"""
KINDS = ["KIND_UNSPECIFIED", "VIEW", "CLICK", "PURCHASE"]
DEVICE = {
    "type": "record",
    "name": "Device",
    "fields": [
        {"name": "os", "type": "string"},
        {"name": "browser", "type": "string"},
        {"name": "model", "type": "string"},
        {"name": "screen_width", "type": "int"},
        {"name": "screen_height", "type": "int"},
    ],
}
GEO = {
    "type": "record",
    "name": "Geo",
    "fields": [
        {"name": "country", "type": "string"},
        {"name": "city", "type": "string"},
        {"name": "lat", "type": "double"},
        {"name": "lon", "type": "double"},
    ],
}
ITEM = {
    "type": "record",
    "name": "Item",
    "fields": [
        {"name": "sku", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
    ],
}
AVRO = {
    "type": "record",
    "name": "PageView",
    "namespace": "bench",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "user_id", "type": "string"},
        {"name": "session_id", "type": "string"},
        {"name": "time", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": KINDS}},
        {"name": "url", "type": "string"},
        {"name": "referrer", "type": "string"},
        {"name": "device", "type": ["null", DEVICE]},
        {"name": "geo", "type": ["null", GEO]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "properties", "type": {"type": "map", "values": "string"}},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
        {"name": "duration_ms", "type": "long"},
        {"name": "is_bot", "type": "boolean"},
        {"name": "user_agent", "type": "string"},
        {"name": "note", "type": "string"},
    ],
}
RAW = "value string, value_bytes binary, partition int, offset long"
SLICE = 25_000


def page_view(rng: random.Random, number: int) -> dict:
    """One event as a dict (the same content in all three encodings)."""
    return {
        "event_id": f"{rng.getrandbits(128):032x}",
        "user_id": f"user-{rng.randrange(100_000)}",
        "session_id": f"{rng.getrandbits(64):016x}",
        "time": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=number * 37),
        "kind": rng.choice(KINDS[1:]),
        "url": f"https://shop.example.com/catalog/{rng.randrange(5000)}/product-{rng.randrange(10**6)}?ref=home&page=2",
        "referrer": "https://www.example.org/search?q="
        + "+".join(rng.choice(["red", "shoes", "sale", "blue"]) for _ in range(6)),
        "device": {
            "os": rng.choice(["android", "ios", "linux"]),
            "browser": "firefox",
            "model": "pixel-9",
            "screen_width": 1080,
            "screen_height": 2400,
        },
        "geo": {
            "country": "FR",
            "city": rng.choice(["Paris", "Lyon", "Nantes"]),
            "lat": rng.uniform(43, 50),
            "lon": rng.uniform(-2, 7),
        },
        "tags": [f"tag-{rng.randrange(50)}" for _ in range(5)],
        "properties": {f"property_{i}": f"value-{rng.randrange(10**8)}-{i}" for i in range(10)},
        "items": [
            {
                "sku": f"SKU-{rng.randrange(10**6):06d}",
                "quantity": rng.randrange(1, 5),
                "price": round(rng.uniform(1, 300), 2),
            }
            for _ in range(3)
        ],
        "duration_ms": rng.randrange(60_000),
        "is_bot": rng.random() < 0.01,
        "user_agent": "Mozilla/5.0 (Linux; Android 15; Pixel 9) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/131.0.0.0 Mobile Safari/537.36",
        "note": "x" * 150,
    }


def encodings(events: list[tuple[int, dict]], message_class: type[Any]) -> dict[str, list[tuple]]:
    """Each (offset, event) as a raw row of each format: (value, value_bytes, partition, offset)."""
    avro_schema = fastavro.parse_schema(AVRO)
    rows: dict[str, list[tuple]] = {"protobuf": [], "json": [], "avro": []}
    for offset, event in events:
        message = message_class(**{key: value for key, value in event.items() if key != "time"})
        message.time.FromDatetime(event["time"])
        rows["protobuf"].append((None, message.SerializeToString(), 0, offset))
        rows["json"].append((json.dumps({**event, "time": event["time"].isoformat()}), None, 0, offset))
        out = io.BytesIO()
        fastavro.schemaless_writer(out, avro_schema, event)
        rows["avro"].append((None, out.getvalue(), 0, offset))
    return rows


def write_tables(spark: SparkSession, count: int, message_class: type[Any], folder: str) -> dict[str, float]:
    """The three raw-like Delta tables ``<folder>/raw/<format>``, built and written in slices (a slice's
    events leave Python before the next is built); the mean value size of each format."""
    rng = random.Random(7)
    sizes = {"protobuf": 0, "json": 0, "avro": 0}
    for start in range(0, count, SLICE):
        events = [(number, page_view(rng, number)) for number in range(start, min(start + SLICE, count))]
        for name, rows in encodings(events, message_class).items():
            sizes[name] += sum(len(row[0] or row[1]) for row in rows)
            spark.createDataFrame(rows, RAW).write.format("delta").mode("append").save(f"{folder}/raw/{name}")
    return {name: total / count for name, total in sizes.items()}


def best_rate(decode: Callable[[], DataFrame], rounds: int, count: int) -> tuple[float, list[float]]:
    """Events/s of the best of ``rounds`` full runs of ``decode()`` into the no-op sink, and each run's seconds."""
    seconds = []
    for _ in range(rounds):
        started = time.monotonic()
        decode().write.format("noop").mode("overwrite").save()
        seconds.append(time.monotonic() - started)
    return count / min(seconds), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = build_spark_session(SparkConfig(app_name="bench-protobuf-decode", shuffle_partitions=2, driver_memory="2g"))
    with tempfile.TemporaryDirectory(prefix="bench-protobuf-") as folder:
        (Path(folder) / "page_view.proto").write_text(PROTO)
        compiled = compile_schema_file(Path(folder) / "page_view.proto")
        message_class = message_factory.GetMessageClass(message_descriptor(compiled, "bench.PageView"))
        started = time.monotonic()
        sizes = write_tables(spark, args.events, message_class, folder)
        tables = {name: spark.read.format("delta").load(f"{folder}/raw/{name}") for name in sizes}
        print(
            f"{args.events:,} events built and written in {time.monotonic() - started:.0f} s; mean value size: "
            + ", ".join(f"{name} {size:,.0f} B" for name, size in sizes.items()),
            flush=True,
        )

        protobuf = ProtobufDecoder(
            SchemaFile(kind="file", path=Path(folder) / "page_view.proto"), "bench", "bench.PageView"
        )
        avro = AvroDecoding(reader=json.dumps(AVRO), framed=False)
        json_schema = avro_event_schema(spark, json.dumps(AVRO))  # the same columns, as JSON is read
        paths = {
            "read only (no decoding)": lambda: tables["protobuf"],
            "JSON (from_json, JVM)": lambda: decode_json(tables["json"], json_schema),
            "Avro (from_avro, JVM)": lambda: decode_avro(tables["avro"], avro),
            "Protobuf (Python, mapInArrow)": lambda: protobuf.decode(tables["protobuf"]),
        }
        for name, decode in paths.items():
            # A first full pass (also a warm-up): every event must decode.
            problems = decode().where("problem IS NOT NULL").count() if "only" not in name else decode().count() * 0
            rate, seconds = best_rate(decode, args.rounds, args.events)
            print(
                f"{name:32} {rate:>10,.0f} events/s  (runs: {', '.join(f'{s:.1f} s' for s in seconds)}; "
                f"{problems} problems)",
                flush=True,
            )
    spark.stop()


if __name__ == "__main__":
    main()
