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
    """One update of a document: its operators (``$set``/``$unset``/``$inc``/``$rename``/``$push``/``$pop``/
    ``$pull`` with paths that do not overlap, as MongoDB requires; ``$rename``'s value is the new path) and
    the ``updateDescription`` it gives."""

    operations: list[tuple[str, str, Any]]
    updated: dict[str, Any] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    truncated: list[tuple[str, int]] = field(default_factory=list)


def apply_update(document: dict, update: Update) -> dict:
    """The document after ``update`` (MongoDB's semantics); fills in ``update``'s description."""
    document = copy.deepcopy(document)
    for operator, path, value in update.operations:
        parent, last = parent_of(document, path, operator in ("$set", "$push"))
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
OPERATORS = ("$set", "$unset", "$inc", "$rename", "$push", "$pop", "$pull")  # what random_writes writes


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

    def _event(self, operation: str, document_id: Any, **fields: Any) -> dict:
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
        self.documents[document["_id"]] = copy.deepcopy(document)
        self._event("replace", document["_id"], fullDocument=canonical(document))

    def delete(self, document_id: Any) -> None:
        del self.documents[document_id]
        self._event("delete", document_id)

    def update(self, document_id: Any, update: Update, full_document: bool) -> None:
        """``full_document``: the event carries the document as a lookup finds it (capture mode
        change_streams_update_full); the harness leaves it out otherwise anyway."""
        self.documents[document_id] = apply_update(self.documents[document_id], update)
        description = {
            "updatedFields": canonical(update.updated),
            "removedFields": update.removed,
            "truncatedArrays": [{"field": f, "newSize": {"$numberInt": str(s)}} for f, s in update.truncated],
        }
        extra = {"fullDocument": canonical(self.documents[document_id])} if full_document else {}
        event = self._event("update", document_id, updateDescription=description, **extra)
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
    was written: up to ``steps`` more writes are made until each of :data:`OPERATORS` has been. With
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
        else:
            operations, used = [], set()
            for name in rng.sample(sorted(values), rng.randint(1, 4)):
                used.add(name)
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
            collection.update(document_id, Update(operations), full_document)
            done.update(operator for operator, _, _ in operations)

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
    for _ in range(steps):  # on, until each update operator has been written (a seed may draw one late)
        if all(done[operator] for operator in OPERATORS):
            break
        step()
    if later_lookups:
        done["later lookup"] = collection.lookups_see_later_writes(random.Random(seed + 1))
    return done
