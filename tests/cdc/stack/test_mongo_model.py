"""The MongoDB model's update semantics, on the examples MongoDB's manual gives for each operator."""

from cdc.stack.mongo_model import OPERATORS, Collection, Int64, Update, apply_update, random_writes


def description(document: dict, update: Update) -> tuple[dict, dict, list, list]:
    after = apply_update(document, update)
    return after, update.updated, update.removed, update.truncated


def test_add_to_set_each_appends_only_the_elements_not_held():
    document = {"_id": 2, "item": "cable", "tags": ["electronics", "supplies"]}
    update = Update([("$addToSet", "tags", ["camera", "electronics", "accessories", "camera"])])
    after, updated, removed, truncated = description(document, update)
    assert after["tags"] == ["electronics", "supplies", "camera", "accessories"]
    assert updated == {"tags.2": "camera", "tags.3": "accessories"}
    assert (removed, truncated) == ([], [])
    made = Update([("$addToSet", "colors", ["mauve", "mauve", 1, Int64(1)])])
    # A missing field becomes the array, each element once (an int32 and an int64 1 differ in type).
    assert description(document, made)[1] == {"colors": ["mauve", 1, Int64(1)]}


def test_positional_operators_set_the_elements_they_select():
    grades = [{"grade": 80, "std": 6}, {"grade": 85, "std": 4}, {"grade": 85, "std": 5}]
    document = {"_id": 4, "grades": grades}
    every = Update([("$set", "grades.$[].std", 1)])
    assert description(document, every)[1] == {"grades.0.std": 1, "grades.1.std": 1, "grades.2.std": 1}
    filtered = Update([("$set", "grades.$[e].std", 6)], array_filters={"e": ("grade", 85)})
    after, updated, _, _ = description(document, filtered)
    assert updated == {"grades.1.std": 6, "grades.2.std": 6}
    assert after["grades"][0] == {"grade": 80, "std": 6}
    first = Update([("$set", "grades.$.std", 9)], query=("grades", "grade", 85))  # {"grades.grade": 85}
    assert description(document, first)[1] == {"grades.1.std": 9}
    assert document["grades"] == grades  # the input is left as it was


def test_pipeline_updates_report_mongodbs_diff_of_the_documents():
    document = {"_id": 1, "a": 1, "b": 2, "x": "gone", "sub": {"k": 1, "drop": 0}, "arr": [{"n": 1}, {"n": 2}, 3]}

    def stages(d: dict) -> dict:
        d["total"] = d["a"] + d["b"]  # {$set: {total: {$add: ["$a", "$b"]}}}
        del d["x"]  # {$unset: "x"}
        d["sub"] = {"k": 1, "new": True}  # {$set: {sub: {$mergeObjects: ...}}}, then {$unset: "sub.drop"}
        d["arr"] = [{"n": 5}, {"n": 2}]  # {$set: {arr: ...}}: the first element changed, the last gone
        return d

    after, updated, removed, truncated = description(document, Update([("pipeline", "", stages)]))
    assert after["total"] == 3
    assert updated == {"total": 3, "sub.new": True, "arr.0.n": 5}
    assert removed == ["x", "sub.drop"]
    assert truncated == [("arr", 2)]


def test_an_update_that_changes_nothing_gives_no_event_and_pre_images_ride_along():
    collection = Collection("shop", "things", pre_images=True)
    collection.insert({"_id": 1, "tags": ["a"]})
    collection.update(1, Update([("$addToSet", "tags", ["a"])]), full_document=False)
    assert [e["operationType"] for e in collection.events] == ["insert"]
    collection.update(1, Update([("$set", "n", 1)]), full_document=True)
    collection.delete(1)
    update, delete = collection.events[1:]
    assert "fullDocumentBeforeChange" not in collection.events[0]
    assert update["fullDocumentBeforeChange"] == {"_id": {"$numberInt": "1"}, "tags": ["a"]}
    assert delete["fullDocumentBeforeChange"] == update["fullDocument"]


def test_random_writes_write_every_operator():
    for seed in range(40):
        written = random_writes(seed, Collection("shop", "things"), steps=160, full_document=True)
        assert all(written[operator] for operator in OPERATORS), (seed, written)
