"""A reference model of MongoDB collections: documents with BSON types, MongoDB's update-operator
semantics, and the change-stream documents a 6.0+ replica set sends for each write.

It is the oracle of the MongoDB conformance tests (the final documents) and the input of the
MongoDB harness (:mod:`cdc.stack.mongo_harness`, which turns the change-stream documents into the
records Debezium's connector writes). :func:`random_writes` is a seeded generator of writes.
"""

from __future__ import annotations

import base64
import copy
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any


@dataclass(frozen=True)
class ObjectId:
    hex: str


@dataclass(frozen=True)
class Int64:
    value: int


@dataclass(frozen=True)
class Decimal128:
    text: str


@dataclass(frozen=True)
class Date:
    millis: int


@dataclass(frozen=True)
class Binary:
    data: bytes
    subtype: int = 0


@dataclass(frozen=True)
class Compound:
    """A document as an ``_id`` (hashable): its fields in order."""

    fields: tuple[tuple[str, Any], ...]


def canonical(value: Any) -> Any:
    """``value`` as canonical Extended JSON (a JSON-ready Python value). A Python int is an int32."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return {"$numberInt": str(value)}
    if isinstance(value, float):
        return {"$numberDouble": repr(value)}
    if isinstance(value, Int64):
        return {"$numberLong": str(value.value)}
    if isinstance(value, Decimal128):
        return {"$numberDecimal": value.text}
    if isinstance(value, Date):
        return {"$date": {"$numberLong": str(value.millis)}}
    if isinstance(value, ObjectId):
        return {"$oid": value.hex}
    if isinstance(value, Binary):
        return {"$binary": {"base64": base64.b64encode(value.data).decode(), "subType": f"{value.subtype:02x}"}}
    if isinstance(value, Compound):
        return {k: canonical(v) for k, v in value.fields}
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    raise TypeError(f"no BSON type for {value!r}")


def as_json(value: Any) -> Any:
    """``value`` as the refined table's JSON shows it (``to_json`` of the refined row): ObjectIds as
    their hex digits, dates as ISO text in UTC, binary as base64, decimals and doubles as exact numbers
    (Decimal: read that JSON with ``parse_float=Decimal``); fields holding null are left out, as
    ``to_json`` leaves them out."""
    if isinstance(value, (ObjectId,)):
        return value.hex
    if isinstance(value, Int64):
        return value.value
    if isinstance(value, Decimal128):
        return Decimal(value.text)
    if isinstance(value, float):
        return Decimal(repr(value))  # the shortest text that reads back as the double, as to_json writes it
    if isinstance(value, Date):
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=value.millis)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    if isinstance(value, Binary):
        return base64.b64encode(value.data).decode()
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def parent_of(document: dict, path: str, create: bool) -> tuple[Any, str]:
    """The document or array that holds the dotted ``path``'s last segment, and that segment, as MongoDB
    resolves it (a number is an index into an array); with ``create``, missing documents on the way are
    made (an index past an array's end pads it with nulls). (None, segment) where the way is missing."""
    *parents, last = path.split(".")
    node: Any = document
    for part in parents:
        if isinstance(node, list):
            index = int(part)
            if create and index >= len(node):
                node.extend([None] * (index + 1 - len(node)))
            if create and node[index] is None:
                node[index] = {}
            node = node[index] if index < len(node) else None
        else:
            if create and node.get(part) is None:
                node[part] = {}
            node = node.get(part)
        if node is None:
            return None, last
    return node, last


@dataclass
class Update:
    """One update of a document and the ``updateDescription`` it gives. ``operations`` are
    (operator, path, value): ``$set``/``$unset``/``$inc``/``$rename`` (value: the new path)/``$push``/
    ``$pop``/``$pull``/``$addToSet`` (value: the ``$each`` list), with paths that do not overlap, as
    MongoDB requires; a path may hold a positional operator: ``$[]`` (every element), ``$[e]`` (the
    elements ``array_filters['e']`` = (field, value) matches) or ``$`` (the first element ``query`` =
    (array path, field, value) matched). ``("pipeline", name, stages)`` is an aggregation-pipeline
    update: ``stages(document)`` returns the new document, and the description is MongoDB's diff of the
    two (subdocuments and arrays element by element, a shorter array truncated)."""

    operations: list[tuple[str, str, Any]]
    array_filters: dict[str, tuple[str, Any]] = field(default_factory=dict)
    query: tuple[str, str, Any] | None = None
    updated: dict[str, Any] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    truncated: list[tuple[str, int]] = field(default_factory=list)


def _matches(element: Any, condition: tuple[str, Any]) -> bool:
    name, value = condition
    return isinstance(element, dict) and element.get(name) == value


def _positions(document: dict, update: Update, path: str) -> list[str]:
    """``path`` with its positional operator resolved to the concrete paths it updates."""
    if "$" not in path:
        return [path]
    head, operator, tail = path.partition(".$")
    operator, _, rest = ("$" + tail).partition(".")
    parent, last = parent_of(document, head, create=False)
    elements = parent.get(last) if isinstance(parent, dict) else None
    if not isinstance(elements, list):
        return []
    if operator == "$[]":
        indexes = list(range(len(elements)))
    elif operator == "$":
        assert update.query is not None, "the positional operator $ needs the update's query"
        indexes = [next(i for i, e in enumerate(elements) if _matches(e, update.query[1:]))]
    else:
        condition = update.array_filters[operator[2:-1]]
        indexes = [i for i, e in enumerate(elements) if _matches(e, condition)]
    return [f"{head}.{i}" + (f".{rest}" if rest else "") for i in indexes]


def _diff(old: Any, new: Any, path: str, update: Update) -> None:
    """Record in ``update`` how ``old`` became ``new`` at ``path`` as MongoDB's pipeline-update diff
    reports it: a subdocument field by field, an array element by element (a shorter one truncated)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in old:
            if name not in new:
                update.removed.append(f"{path}{name}")
        for name, value in new.items():
            if name not in old:
                update.updated[f"{path}{name}"] = value
            elif canonical(old[name]) != canonical(value):
                _diff(old[name], value, f"{path}{name}.", update)
    elif isinstance(old, list) and isinstance(new, list):
        if len(new) < len(old):
            update.truncated.append((path[:-1], len(new)))
        for index, value in enumerate(new):
            if index >= len(old):
                update.updated[f"{path}{index}"] = value
            elif canonical(old[index]) != canonical(value):
                _diff(old[index], value, f"{path}{index}.", update)
    else:
        update.updated[path[:-1]] = new


def apply_update(document: dict, update: Update) -> dict:
    """The document after ``update`` (MongoDB's semantics); fills in ``update``'s description."""
    document = copy.deepcopy(document)
    operations = [
        (operator, concrete, value)
        for operator, path, value in update.operations
        for concrete in _positions(document, update, path)
    ]
    for operator, path, value in operations:
        if operator == "pipeline":
            new = value(copy.deepcopy(document))
            _diff(document, new, "", update)
            document = new
            continue
        parent, last = parent_of(document, path, operator in ("$set", "$push", "$addToSet"))
        if operator == "$set":
            if isinstance(parent, list):
                parent.extend([None] * (int(last) + 1 - len(parent)))
                parent[int(last)] = value
            else:
                parent[last] = value
            update.updated[path] = value
        elif operator == "$inc":
            parent[last] = increased(parent.get(last), value)
            update.updated[path] = parent[last]
        elif operator == "$rename":
            if parent is None or last not in parent:
                continue
            moved = parent.pop(last)
            update.removed.append(path)
            target, target_last = parent_of(document, value, create=True)
            target[target_last] = moved
            update.updated[value] = moved
        elif operator == "$unset":
            if isinstance(parent, list):
                if int(last) < len(parent):
                    parent[int(last)] = None
                    update.updated[path] = None  # an array element is set to null, not removed
            elif parent is not None and last in parent:
                del parent[last]
                update.removed.append(path)
        elif operator == "$push":
            if isinstance(parent.get(last), list):
                update.updated[f"{path}.{len(parent[last])}"] = value
                parent[last].append(value)
            else:
                parent[last] = [value]
                update.updated[path] = [value]
        elif operator == "$addToSet":
            present = parent.get(last)
            if present is None:  # the array is made, holding each element once
                parent[last] = []
                for element in value:
                    if canonical(element) not in canonical(parent[last]):
                        parent[last].append(element)
                update.updated[path] = copy.deepcopy(parent[last])
            for element in value if present is not None else []:
                if canonical(element) not in canonical(present):
                    update.updated[f"{path}.{len(present)}"] = element
                    present.append(element)
        elif operator in ("$pop", "$pull"):
            old = parent.get(last) if parent is not None else None
            if not isinstance(old, list) or not old:
                continue
            new = (old[:-1] if value == 1 else old[1:]) if operator == "$pop" else [v for v in old if v != value]
            parent[last] = new
            if len(new) < len(old):
                update.truncated.append((path, len(new)))
            update.updated.update({f"{path}.{i}": v for i, v in enumerate(new) if v != old[i]})
    return document


INT32 = range(-(2**31), 2**31)
# What random_writes writes: update operators, positional operators (``$[e]``: with an array filter) and
# aggregation-pipeline updates.
OPERATORS = ("$set", "$unset", "$inc", "$rename", "$push", "$pop", "$pull", "$addToSet", "$[]", "$[e]", "$", "pipeline")


def increased(number: Any, by: Any) -> Any:
    """``$inc``: ``number`` (None: absent) plus ``by``, in the wider of their types; an int32 sum beyond the
    int32 range becomes an int64, as MongoDB makes it."""
    if number is None:
        return by

    def plain(value: Any) -> Any:
        return value.value if isinstance(value, Int64) else value

    total = plain(number) + plain(by)
    if isinstance(total, float):
        return total
    return Int64(total) if isinstance(number, Int64) or isinstance(by, Int64) or total not in INT32 else total


@dataclass
class Collection:
    """A collection's documents and the change-stream documents its writes gave."""

    db: str
    name: str
    documents: dict[Any, dict] = field(default_factory=dict)  # _id -> document
    events: list[dict] = field(default_factory=list)
    seconds: int = 1_763_700_000
    increment: int = 0
    tick: int = 0
    # Each document's states as writes left them: (writes so far, _id, document or None once deleted).
    states: list[tuple[int, Any, dict | None]] = field(default_factory=list)
    lookups: list[tuple[dict, Any, int]] = field(default_factory=list)  # (update event, _id, its write)
    # Pre- and post-images enabled (changeStreamPreAndPostImages): update, replace and delete events carry
    # the document before the change as ``fullDocumentBeforeChange``, as the capture modes
    # ``*_with_pre_image`` ask for it.
    pre_images: bool = False

    def _event(self, operation: str, document_id: Any, before: dict | None = None, **fields: Any) -> dict:
        if self.pre_images and operation != "insert":
            fields["fullDocumentBeforeChange"] = canonical(before)
        self.increment += 1
        self.tick += 1
        current = self.documents.get(document_id)
        self.states.append((len(self.states), document_id, None if current is None else copy.deepcopy(current)))
        event = {
            "_id": {"_data": f"82{self.seconds:08X}{self.increment:08X}"},
            "operationType": operation,
            "clusterTime": {"$timestamp": {"t": self.seconds, "i": self.increment}},
            "wallTime": {"$date": {"$numberLong": str(self.seconds * 1000 + self.increment % 1000)}},
            "ns": {"db": self.db, "coll": self.name},
            "documentKey": {"_id": canonical(document_id)},
            **fields,
        }
        self.events.append(event)
        return event

    def next_second(self) -> None:
        self.seconds += 1
        self.increment = 0

    def load(self, document: dict) -> None:
        """A document the collection holds before capture starts (no change-stream event)."""
        self.documents[document["_id"]] = copy.deepcopy(document)

    def snapshot(self, during: Callable[[], None] | None = None) -> None:
        """The connector's initial snapshot: a read of every document the collection holds at its start,
        at the current second (the harness's snapshot lines; the connector's snapshot record emitter makes
        records of op ``r``). ``during`` (called before each read but the first) writes while the snapshot runs: a read
        sees its document as it is then (one deleted meanwhile is not read, one inserted meanwhile is
        not scanned), and the change events of those writes follow the reads, as the connector streams
        them from the snapshot's start once it ends."""
        read_at = {"$numberLong": str(self.seconds * 1000)}
        streamed_from = len(self.events)
        reads: list[dict] = []
        for document_id in list(self.documents):
            if during is not None and reads:  # the first read starts the snapshot
                during()
            if document_id not in self.documents:
                continue
            self.tick += 1
            reads.append(
                {
                    "snapshot": {
                        "ns": {"db": self.db, "coll": self.name},
                        "document": canonical(self.documents[document_id]),
                        "readAt": read_at,
                    }
                }
            )
        self.events[streamed_from:streamed_from] = reads

    def insert(self, document: dict) -> None:
        self.documents[document["_id"]] = copy.deepcopy(document)
        self._event("insert", document["_id"], fullDocument=canonical(document))

    def replace(self, document: dict) -> None:
        before = self.documents[document["_id"]]
        self.documents[document["_id"]] = copy.deepcopy(document)
        self._event("replace", document["_id"], before, fullDocument=canonical(document))

    def delete(self, document_id: Any) -> None:
        before = self.documents.pop(document_id)
        self._event("delete", document_id, before)

    def update(self, document_id: Any, update: Update, full_document: bool) -> None:
        """``full_document``: the event carries the document as a lookup finds it (capture mode
        change_streams_update_full); the harness leaves it out otherwise anyway. An update that changes
        nothing gives no event, as MongoDB writes no oplog entry for it."""
        before = self.documents[document_id]
        self.documents[document_id] = apply_update(before, update)
        if canonical(self.documents[document_id]) == canonical(before):
            return
        description = {
            "updatedFields": canonical(update.updated),
            "removedFields": update.removed,
            "truncatedArrays": [{"field": f, "newSize": {"$numberInt": str(s)}} for f, s in update.truncated],
        }
        extra = {"fullDocument": canonical(self.documents[document_id])} if full_document else {}
        event = self._event("update", document_id, before, updateDescription=description, **extra)
        if full_document:
            self.lookups.append((event, document_id, len(self.states) - 1))

    def lookups_see_later_writes(self, rng: random.Random) -> int:
        """Make some update events' ``fullDocument`` what a real lookup may find: the document as writes
        after the update left it (MongoDB looks it up when the event is read), or null where it was deleted
        by then. Returns how many lookups now see a later state (nulls included)."""
        later = 0
        for event, document_id, write in self.lookups:
            seen = write + rng.choice([0, 0, 0, 1, 2, 6])
            state = next(
                (document for at, key, document in reversed(self.states[: seen + 1]) if key == document_id), None
            )
            if seen > write and state != self.states[write][2]:
                later += 1
            event["fullDocument"] = None if state is None else canonical(state)
        return later


# The generator's fields: name -> makers of values (the first is the field's usual type; the others drift).
def _values(rng: random.Random) -> dict[str, list]:
    return {
        "name": [lambda: rng.choice(["Ada", "Bob", "Cy", "Dee", "Ünï", 'q"uote'])],
        "qty": [
            lambda: rng.randint(-(2**31), 2**31 - 1),
            lambda: Int64(rng.randint(-(2**62), 2**62)),
            lambda: rng.choice(["many", "none"]),
        ],
        "price": [
            lambda: rng.choice([0.5, 2.25, -1e10, 3.0]),
            lambda: Decimal128(
                rng.choice(
                    # each exact in decimal(38,18), none in a double
                    [
                        "10.50",
                        "-0.001",
                        "0.123456789012345678",
                        "-99999999999999999999.5",
                        "1.5E+3",
                        "7.10000000000000000000000",
                    ]
                )
            ),
        ],
        "when": [lambda: Date(rng.randint(-(10**12), 2 * 10**12)), lambda: rng.randint(0, 100)],
        "flag": [lambda: rng.random() < 0.5, lambda: "yes"],
        "blob": [lambda: Binary(bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))))],
        "ref": [lambda: ObjectId(f"{rng.getrandbits(96):024x}")],
        "note": [lambda: rng.choice([None, "n1", "n2"])],
        "nested": [lambda: {"a": rng.randint(0, 9), "b": rng.choice(["x", "y"]), "deep": {"c": rng.randint(0, 9)}}],
        "tags": [lambda: [rng.choice(["t1", "t2", "t3"]) for _ in range(rng.randint(0, 4))]],
        "items": [lambda: [{"sku": rng.choice(["a", "b"]), "n": rng.randint(0, 9)} for _ in range(rng.randint(0, 3))]],
    }


def _array_drift(rng: random.Random, name: str, present: list) -> list[tuple[str, str, Any]]:
    """Updates that change the type of the array ``name`` (holding ``present``) or of its elements' fields."""
    if rng.random() < 0.6:
        return []
    drift: list[tuple[str, str, Any]] = [("$set", name, rng.choice(["none", "many"]))]
    if name == "items" and present and isinstance(present[-1], dict):
        drift.append(("$set", f"items.{len(present) - 1}.n", rng.choice(["one", "two"])))
    return drift


def _operator_name(operator: str, path: str) -> str:
    """How :data:`OPERATORS` names an operation: its positional operator where its path holds one."""
    for positional in ("$[]", "$[e]", "$"):
        if f".{positional}." in f"{path}.":
            return positional
    return operator


def _pipeline_stage(rng: random.Random, values: dict[str, list], name: str, current: dict) -> Callable[[dict], None]:
    """An aggregation-pipeline stage on the field ``name`` (of ``current``, the document as it is):
    ``$set`` with ``$add``, ``$concatArrays``, ``$slice``, ``$reverseArray``, ``$map`` with
    ``$mergeObjects``, ``$filter``, or ``$unset`` of the field or of a subdocument's field."""
    present = current.get(name)
    choices: list[Callable[[dict], None]] = []
    if isinstance(present, (int, Int64)) and not isinstance(present, bool):
        by = rng.choice([1, -7, 2**31 - 1])
        choices.append(lambda d: d.__setitem__(name, increased(d[name], by)))  # {$add: ["$qty", by]}
    if isinstance(present, list):
        extra = values[name][0]()[:1]
        keep = rng.randint(0, len(present))
        choices += [
            lambda d: d.__setitem__(name, d[name] + extra),  # {$concatArrays: ["$tags", [...]]}
            lambda d: d.__setitem__(name, d[name][:keep]),  # {$slice: ["$tags", keep]}
            lambda d: d.__setitem__(name, d[name][::-1]),  # {$reverseArray: "$tags"}
        ]
        if all(isinstance(e, dict) for e in present):
            n = rng.randint(0, 9)
            choices += [
                lambda d: d.__setitem__(name, [{**e, "n": n} for e in d[name]]),  # $map + $mergeObjects
                lambda d: d.__setitem__(name, [e for e in d[name] if e.get("sku") == "a"]),  # $filter
            ]
    if isinstance(present, dict):
        a = rng.randint(0, 9)
        choices += [
            lambda d: d.__setitem__(name, {**d[name], "a": a, "e": "new"}),  # $mergeObjects
            lambda d: d[name].pop("b", None),  # {$unset: "nested.b"}
        ]
    if name in current:
        choices.append(lambda d: d.pop(name))  # {$unset: name}
    else:
        value = values[name][0]()
        choices.append(lambda d: d.__setitem__(name, copy.deepcopy(value)))  # {$set: {name: value}}
    return rng.choice(choices)


def random_writes(
    seed: int,
    collection: Collection,
    steps: int,
    full_document: bool,
    array_drift: bool = False,
    snapshot: bool = False,
    later_lookups: bool = False,
    more_ids: bool = False,
) -> Counter[str]:
    """Seeded random writes into ``collection``: inserts (ids of several BSON types; with ``more_ids``, a
    binary and a compound one too), updates with nested $set, $unset, $inc (an int32 beyond its range
    becomes an int64), $rename, $push/$pull/$pop (array truncation), type drift of scalar fields,
    replaces, deletes and re-inserts of the same _id, several changes to one document within a second. With
    ``array_drift``, the arrays drift too: ``tags`` and ``items`` are set to a string now and then,
    and an element's ``items.N.n`` to a string (an update that sets a whole field again makes it an
    array again). With ``snapshot``, the collection first holds a few documents, which the
    connector's initial snapshot reads while random writes go on. Returns how often each update operator
    was written: up to ``5 * steps`` more writes are made until each of :data:`OPERATORS` has been. With
    ``later_lookups`` (and ``full_document``), some updates' full documents are what a lookup finds later
    (:meth:`Collection.lookups_see_later_writes`), counted as ``later lookup``."""
    rng = random.Random(seed)
    values = _values(rng)
    done: Counter[str] = Counter()  # the update operators written
    ids = [ObjectId(f"{rng.getrandbits(96):024x}") for _ in range(3)] + ["s1", "s2", 7, Int64(2**40)]
    if more_ids:
        ids += [Binary(b"\x01\xff"), Compound((("region", "eu"), ("n", 1)))]
    drifting = {"qty", "price", "when", "flag"}

    def document(document_id: Any) -> dict:
        fields = rng.sample(sorted(values), rng.randint(3, len(values)))
        return {"_id": document_id, **{name: values[name][0]() for name in fields}}

    def step() -> None:
        if rng.random() < 0.3:
            collection.next_second()
        document_id = rng.choice(ids)
        current = collection.documents.get(document_id)
        if current is None:
            collection.insert(document(document_id))
            return
        action = rng.choices(["update", "replace", "delete"], [8, 1, 1])[0]
        if action == "delete":
            collection.delete(document_id)
        elif action == "replace":
            collection.replace(document(document_id))
        elif rng.random() < 0.12:
            stages = [
                _pipeline_stage(rng, values, name, current) for name in rng.sample(sorted(values), rng.randint(1, 3))
            ]

            def pipeline(document: dict) -> dict:
                for stage in stages:
                    stage(document)
                return document

            collection.update(document_id, Update([("pipeline", "", pipeline)]), full_document)
            done["pipeline"] += 1
        else:
            operations, update = [], Update([])
            for name in rng.sample(sorted(values), rng.randint(1, 4)):
                present = current.get(name)
                if name in drifting and rng.random() < 0.15:
                    operations.append(("$set", name, rng.choice(values[name])()))
                elif name == "nested" and isinstance(present, dict):
                    operations.append(
                        rng.choice(
                            [
                                ("$set", "nested.a", rng.randint(0, 9)),
                                ("$unset", "nested.b", ""),
                                ("$set", "nested.deep.c", rng.randint(0, 9)),
                            ]
                        )
                    )
                elif name == "items" and present and all(isinstance(e, dict) for e in present) and rng.random() < 0.4:
                    sku = rng.choice([e.get("sku") for e in present])
                    positional = rng.choice(["items.$[].n", "items.$[e].n", "items.$.n"])
                    if positional == "items.$[e].n":
                        update.array_filters["e"] = ("sku", rng.choice(["a", "b"]))
                    elif positional == "items.$.n":
                        update.query = ("items", "sku", sku)
                    operations.append(("$set", positional, rng.randint(0, 9)))
                elif name == "tags" and (present is None or isinstance(present, list)) and rng.random() < 0.3:
                    each = [rng.choice(["t1", "t2", "t3", "t4"]) for _ in range(rng.randint(1, 3))]
                    operations.append(("$addToSet", name, each))
                elif name in ("tags", "items") and isinstance(present, list):
                    element = values[name][0]()[:1] or (
                        [rng.choice(["t1", "t2"])] if name == "tags" else [{"sku": "a", "n": 1}]
                    )
                    operations.append(
                        rng.choice(
                            [
                                ("$push", name, element[0]),
                                ("$pop", name, rng.choice([1, -1])),
                                ("$pull", name, element[0]),
                            ]
                            + ([("$set", "items.0.n", rng.randint(0, 9))] if name == "items" and present else [])
                            + (_array_drift(rng, name, present) if array_drift else [])
                        )
                    )
                elif name == "qty" and isinstance(present, (int, Int64)) and rng.random() < 0.5:
                    operations.append(("$inc", name, rng.choice([1, -3, 2**31 - 1, Int64(5)])))
                elif name == "note" and rng.random() < 0.6 and ("note" in current) != ("remark" in current):
                    old, new = ("note", "remark") if "note" in current else ("remark", "note")
                    operations.append(("$rename", old, new))
                elif rng.random() < 0.2 and name in current:
                    operations.append(("$unset", name, ""))
                else:
                    kind = (
                        values[name][0]
                        if present is None or name not in drifting
                        else rng.choice(values[name][:1] * 5 + values[name])
                    )
                    operations.append(("$set", name, kind()))
            update.operations = operations
            collection.update(document_id, update, full_document)
            done.update(_operator_name(operator, path) for operator, path, _ in operations)

    if snapshot:
        for document_id in rng.sample(ids, rng.randint(1, len(ids))):
            collection.load(document(document_id))

        def meanwhile() -> None:  # writes while the snapshot runs, before some of its reads
            for _ in range(rng.choice([0, 0, 1, 3])):
                step()

        collection.snapshot(during=meanwhile)
        collection.next_second()
    for _ in range(steps):
        step()
    for _ in range(5 * steps):  # on, until each operator has been written (a seed may draw one late)
        if all(done[operator] for operator in OPERATORS):
            break
        step()
    if later_lookups:
        done["later lookup"] = collection.lookups_see_later_writes(random.Random(seed + 1))
    return done
