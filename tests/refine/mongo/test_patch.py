"""updateDescription paths applied to document states, in Spark expressions."""

import json
import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from cdc.stack.mongo_model import parent_of
from refine.mongo.extended_json import to_variant
from refine.mongo.patch import apply_patch, path_type, resolve

ORDER = StructType([StructField("qty", LongType()), StructField("sku", StringType())])
COLUMNS = StructType(
    [
        StructField("name", StringType()),
        StructField("address", StructType([StructField("city", StringType()), StructField("zip", StringType())])),
        StructField("orders", ArrayType(ORDER)),
    ]
)


def test_paths_resolve_to_fields_and_indexes():
    assert resolve(COLUMNS, "orders.1.qty") == ["orders", 1, "qty"]
    assert resolve(COLUMNS, "address.city") == ["address", "city"]
    assert resolve(COLUMNS, "address.7") == ["address", "7"]  # a field named "7" in a document
    with pytest.raises(ValueError, match="name is a string, not a document or an array"):
        resolve(COLUMNS, "name.first")
    with pytest.raises(ValueError, match="orders is an array: 'first' is not an index"):
        resolve(COLUMNS, "orders.first")
    # Setting a field of a missing document creates it.
    assert path_type(COLUMNS, "extra.note", StringType()) == StructType([StructField("note", StringType())])
    assert path_type(COLUMNS, "orders.3.qty", LongType()) == ArrayType(StructType([StructField("qty", LongType())]))


def test_patches_apply_in_order(spark):
    state = F.struct(
        F.lit("Ada").alias("name"),
        F.struct(F.lit("London").alias("city"), F.lit("N1").alias("zip")).alias("address"),
        F.array(F.struct(F.lit(1).cast("long").alias("qty"), F.lit("a").alias("sku"))).alias("orders"),
    ).cast(COLUMNS)
    patches = spark.createDataFrame(
        [
            ('{"address.city": "Paris", "orders.0.qty": 5, "orders.2": {"sku": "c", "qty": 3}}', ["address.zip"], None),
            ('{"name": "Ada L."}', None, [("orders", 1)]),
        ],
        "updated string, removed array<string>, truncated array<struct<field: string, size: int>>",
    )
    patch = F.struct(to_variant(F.col("updated")).alias("updated"), F.col("removed"), F.col("truncated"))
    applied = apply_patch(
        state, COLUMNS, patch, ["address.city", "name", "orders.0.qty", "orders.2"], ["address.zip"], ["orders"]
    )
    first, second = [row.s for row in patches.select(applied.alias("s")).collect()]
    assert first.address.asDict() == {"city": "Paris", "zip": None}
    # An index past the end pads with nulls, as MongoDB does.
    assert [o and o.asDict() for o in first.orders] == [{"qty": 5, "sku": "a"}, None, {"qty": 3, "sku": "c"}]
    assert second.name == "Ada L."
    assert second.address.city == "London"
    assert [o.asDict() for o in second.orders] == [{"qty": 1, "sku": "a"}]


WIDE = StructType(
    [StructField(f"f{n}", LongType()) for n in range(12)]
    + [StructField("address", StructType([StructField(n, StringType()) for n in ("city", "zip", "street")]))]
    + [StructField(name, ArrayType(LongType())) for name in ("tags", "scores")]
    + [StructField("orders", ArrayType(ORDER))]
)


def _reference(document: dict, updated: dict, removed: list[str], truncated: list[tuple[str, int]]) -> dict:
    """updateDescription applied as MongoDB's change streams define it: truncate, then set, then unset."""
    document = json.loads(json.dumps(document))

    def walk(path: str, create: bool):
        return parent_of(document, path, create)

    for path, size in truncated:
        parent, last = walk(path, False)
        parent[last] = parent[last][:size]
    for path, value in updated.items():
        parent, last = walk(path, True)
        if isinstance(parent, list):
            parent.extend([None] * (int(last) + 1 - len(parent)))
            parent[int(last)] = value
        else:
            parent[last] = value
    for path in removed:
        parent, last = walk(path, False)
        if isinstance(parent, list):
            if int(last) < len(parent):
                parent[int(last)] = None
        elif parent is not None:
            parent[last] = None
    return document


def _random_patch(rng: random.Random, document: dict) -> tuple[dict, list[str], list[tuple[str, int]]]:
    """A random update of ``document``: paths of one update never overlap (MongoDB refuses that)."""
    candidates = (
        [f"f{n}" for n in range(12)]
        + ["address", "address.city", "address.zip", "address.street", "tags", "scores", "orders"]
        + [f"orders.{i}" for i in range(4)]
        + [f"orders.{i}.qty" for i in range(4)]
    )
    if not isinstance(document.get("orders"), list):  # MongoDB would create a document {"2": ...}
        candidates = [c for c in candidates if not c.startswith("orders.")]
    chosen: list[str] = []
    for path in rng.sample(candidates, rng.randint(1, len(candidates))):
        if not any(path == c or path.startswith(c + ".") or c.startswith(path + ".") for c in chosen):
            chosen.append(path)
    truncated = [
        (name, rng.randint(0, len(document[name])))
        for name in ("tags", "scores", "orders")
        if document.get(name)
        and rng.random() < 0.5
        and name not in chosen
        and not any(c.startswith(name + ".") for c in chosen)
    ]
    updated, removed = {}, []
    for path in chosen:
        if rng.random() < 0.2:
            removed.append(path)
            continue
        last = path.split(".")[-1]
        if path in ("tags", "scores"):
            updated[path] = [rng.randint(-5, 5) for _ in range(rng.randint(0, 3))]
        elif path == "address":
            updated[path] = {"city": rng.choice(["Paris", "Oslo"]), "zip": None, "street": "Main"}
        elif path == "orders":
            updated[path] = [{"qty": rng.randint(0, 9), "sku": "s"} for _ in range(rng.randint(0, 3))]
        elif path.startswith("orders.") and last.isdigit():
            updated[path] = {"qty": rng.randint(0, 9), "sku": rng.choice(["a", "b"])}
        elif last == "qty" or last.startswith("f"):
            updated[path] = rng.randint(-(2**40), 2**40)
        else:
            updated[path] = rng.choice(["x", "y", "z"])
    if rng.random() < 0.3 and isinstance(document.get("orders"), list):  # padding an array past its end
        updated.pop("orders", None)
        updated = {k: v for k, v in updated.items() if not k.startswith("orders.")}
        removed = [p for p in removed if not p.startswith("orders")]
        truncated = [t for t in truncated if t[0] != "orders"]
        updated[f"orders.{len(document.get('orders') or []) + 1}.qty"] = 1
    return updated, removed, truncated


def _as_row(document: dict) -> tuple:
    orders = document.get("orders")
    return (
        *[document.get(f"f{n}") for n in range(12)],
        None
        if document.get("address") is None
        else tuple(document["address"].get(n) for n in ("city", "zip", "street")),
        document.get("tags"),
        document.get("scores"),
        None if orders is None else [None if o is None else (o.get("qty"), o.get("sku")) for o in orders],
    )


def test_many_paths_and_truncated_arrays_apply_like_mongodb(spark, request):
    """Many documents, each updated by a sequence of patches of many paths (sets, unsets and
    truncates of several arrays in one patch), equal a reference applier's documents. A patch of
    ~20 paths used to exceed the analyzer's iteration limit, and truncating one of two arrays
    indexed an empty array (INVALID_ARRAY_INDEX)."""
    seed = random.randrange(2**32)
    request.node.user_properties.append(("seed", seed))
    rng = random.Random(seed)
    rows, expected = [], []
    for document_id in range(20):
        document = {
            **{f"f{n}": n for n in range(12)},
            "address": {"city": "London", "zip": "N1", "street": None},
            "tags": [1, 2, 3],
            "scores": [4, 5],
            "orders": [{"qty": 1, "sku": "a"}, {"qty": 2, "sku": "b"}],
        }
        start, patches = json.loads(json.dumps(document)), []
        for _ in range(rng.randint(1, 4)):
            updated, removed, truncated = _random_patch(rng, document)
            document = _reference(document, updated, removed, truncated)
            patches.append(
                (json.dumps(updated), removed or None, [{"field": f, "size": s} for f, s in truncated] or None)
            )
        rows.append((document_id, _as_row(start), patches))
        expected.append((document_id, _as_row(document)))
    frame = spark.createDataFrame(
        rows,
        StructType(
            [
                StructField("id", LongType()),
                StructField("state", WIDE),
                StructField(
                    "patches",
                    ArrayType(
                        StructType(
                            [
                                StructField("updated", StringType()),
                                StructField("removed", ArrayType(StringType())),
                                StructField(
                                    "truncated",
                                    ArrayType(
                                        StructType(
                                            [StructField("field", StringType()), StructField("size", IntegerType())]
                                        )
                                    ),
                                ),
                            ]
                        )
                    ),
                ),
            ]
        ),
    )
    updated = sorted({p for _, _, ps in rows for u, _, _ in ps for p in json.loads(u)})
    removed = sorted({p for _, _, ps in rows for _, r, _ in ps for p in r or []})
    truncated = sorted({t["field"] for _, _, ps in rows for _, _, t in ps for t in t or []})
    patches = F.transform(
        "patches",
        lambda p: F.struct(
            to_variant(p["updated"]).alias("updated"), p["removed"].alias("removed"), p["truncated"].alias("truncated")
        ),
    )
    state = F.aggregate(patches, F.col("state"), lambda s, p: apply_patch(s, WIDE, p, updated, removed, truncated))
    got = {row.id: row.state for row in frame.select("id", state.cast(WIDE).alias("state")).collect()}
    wanted = spark.createDataFrame(expected, StructType([StructField("id", LongType()), StructField("state", WIDE)]))
    for row in wanted.collect():
        assert got[row.id] == row.state, f"document {row.id} differs (seed {seed}; patches {rows[row.id][2]})"


def test_a_patch_truncating_one_of_the_batchs_arrays(spark):
    """A batch truncating two arrays, each patch only one of them: the other's size is looked up in
    an empty list (it used to raise INVALID_ARRAY_INDEX under ANSI mode)."""
    columns = StructType([StructField("tags", ArrayType(LongType())), StructField("scores", ArrayType(LongType()))])
    state = F.struct(
        F.array(*[F.lit(n).cast("long") for n in (1, 2, 3)]).alias("tags"),
        F.array(*[F.lit(n).cast("long") for n in (4, 5)]).alias("scores"),
    )
    patches = spark.createDataFrame(
        [("{}", None, [("tags", 1)]), ("{}", None, [("scores", 0)])],
        "updated string, removed array<string>, truncated array<struct<field: string, size: int>>",
    )
    patch = F.struct(to_variant(F.col("updated")).alias("updated"), F.col("removed"), F.col("truncated"))
    applied = apply_patch(state, columns, patch, [], [], ["scores", "tags"])
    assert [tuple(row.s) for row in patches.select(applied.alias("s")).collect()] == [([1], [4, 5]), ([1, 2, 3], [])]
