"""Extended JSON (strict, as in ``after``; relaxed, as in ``updatedFields``) to typed Spark values."""

import decimal
import json
import math
import random
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DecimalType,
    DoubleType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from refine.mongo.extended_json import (
    ELEMENT_STEP,
    commented_untyped,
    decimal_text_fits,
    decode,
    document_type,
    fits,
    known,
    merge_types,
    read_untyped,
    storable,
    stored_untyped,
    to_variant,
    untyped_comment,
    untyped_paths,
    variant_type,
)

DOCUMENT = (
    '{"_id": {"$oid": "64b7f0c2a1b2c3d4e5f60718"},"n": {"$numberLong": "9007199254740993"},"i": 7,'
    '"d": {"$date": -86400000},"m": {"$numberDecimal": "-12345678901234567890.123456789"},"f": 0.25,'
    '"b": {"$binary": "AQI=","$type": "00"},"nan": NaN,"inf": -Infinity,"text": "NaN, Infinity",'
    '"nested": {"a": [1, 2],"when": {"$date": "2024-01-02T03:04:05.678Z"}},"mixed": [1, "x"],'
    '"ts": {"$timestamp": {"t": 1, "i": 2}},"none": null,"empty": []}'
)


@pytest.fixture(scope="module")
def document(spark):
    return spark.createDataFrame([(DOCUMENT,)], "text string").select(to_variant(F.col("text")).alias("v"))


def shape_of(document, field: str):
    [row] = document.select(F.schema_of_variant(F.try_variant_get("v", f'$["{field}"]', "variant"))).collect()
    return document_type(variant_type(row[0]))


def test_bson_types_map_to_column_types(document):
    expected = {
        "_id": StringType(),
        "n": LongType(),
        "i": LongType(),
        "d": TimestampType(),
        "m": DecimalType(38, 18),
        "f": DoubleType(),
        "b": BinaryType(),
        "nan": DoubleType(),
        "inf": DoubleType(),
        "text": StringType(),
        "nested": StructType([StructField("a", ArrayType(LongType())), StructField("when", TimestampType())]),
        "mixed": StringType(),
        "ts": StringType(),
        "none": NullType(),
        "empty": ArrayType(NullType()),
    }
    assert {field: shape_of(document, field) for field in expected} == expected


def test_values_decode_exactly(document):
    columns = StructType(
        [
            StructField(name, data_type)
            for name, data_type in [
                ("_id", StringType()),
                ("n", LongType()),
                ("i", LongType()),
                ("d", TimestampType()),
                ("m", DecimalType(38, 18)),
                ("f", DoubleType()),
                ("b", BinaryType()),
                ("nan", DoubleType()),
                ("inf", DoubleType()),
                ("text", StringType()),
                ("nested", StructType([StructField("a", ArrayType(LongType())), StructField("when", TimestampType())])),
                ("mixed", StringType()),
                ("ts", StringType()),
                ("none", StringType()),
                ("absent", LongType()),
            ]
        ]
    )
    [row] = document.select(decode(F.col("v"), columns).alias("row")).select("row.*").collect()
    assert row._id == "64b7f0c2a1b2c3d4e5f60718"
    assert row.n == 9007199254740993
    assert row.i == 7
    assert row.d.astimezone(UTC) == datetime(1969, 12, 31, tzinfo=UTC)
    assert row.m == Decimal("-12345678901234567890.123456789")
    assert row.f == 0.25
    assert bytes(row.b) == b"\x01\x02"
    assert math.isnan(row.nan)
    assert row.inf == -math.inf
    assert row.text == "NaN, Infinity"
    assert row.nested.a == [1, 2]
    assert row.nested.when.astimezone(UTC) == datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert row.mixed == '[1,"x"]'
    assert row.ts == '{"$timestamp":{"i":2,"t":1}}'
    assert row.none is None
    assert row.absent is None


def test_values_that_do_not_fit_decode_to_null(spark):
    rows = spark.createDataFrame([('{"n": "abc", "d": {"$date": "yesterday"}, "b": {"$binary": "%%%"}}',)], "t string")
    columns = StructType(
        [StructField("n", LongType()), StructField("d", TimestampType()), StructField("b", BinaryType())]
    )
    [row] = rows.select(decode(to_variant(F.col("t")), columns).alias("r")).select("r.*").collect()
    assert tuple(row) == (None, None, None)


def test_members_named_with_quotes_and_backslashes_decode(spark):
    names = ['a"b', "c'd", "e\\f", "g\"h'i", "j]k", "l.m", "$n"]
    text = json.dumps({name: number for number, name in enumerate(names)} | {"nested": {"p\"q'r": {"s\\t": 9}}})
    columns = StructType(
        [StructField(name, LongType()) for name in names]
        + [StructField("nested", StructType([StructField("p\"q'r", StructType([StructField("s\\t", LongType())]))]))]
    )
    rows = spark.createDataFrame([(text,)], "t string")
    [row] = rows.select(decode(to_variant(F.col("t")), columns).alias("r")).select("r.*").collect()
    assert list(row) == [*range(len(names)), ((9,),)]


def test_not_json_is_null(spark):
    [row] = spark.createDataFrame([("{not json",)], "t string").select(to_variant(F.col("t"))).collect()
    assert row[0] is None


def test_types_merge_widen_and_conflict():
    address = StructType([StructField("city", StringType())])
    with_zip = StructType([StructField("zip", StringType())])
    assert merge_types(address, with_zip) == StructType([*address.fields, *with_zip.fields])
    assert merge_types(LongType(), DoubleType()) == DoubleType()
    assert merge_types(ArrayType(NullType()), ArrayType(LongType())) == ArrayType(LongType())
    assert merge_types(LongType(), StringType()) is None
    assert merge_types(address, StructType([StructField("city", LongType())])) is None
    assert fits(LongType(), DoubleType())
    assert not fits(DoubleType(), LongType())
    assert fits(with_zip, merge_types(address, with_zip))
    assert not fits(with_zip, address)
    assert known(StructType([StructField("a", NullType()), StructField("b", ArrayType(NullType()))])) is None
    # A value of no known type yet ([], nulls) needs no column: it fits where none exists.
    assert fits(ArrayType(NullType()), NullType())
    assert fits(StructType([*address.fields, StructField("codes", ArrayType(NullType()))]), address)
    assert not fits(ArrayType(StringType()), NullType())
    assert not fits(ArrayType(NullType()), LongType())


def test_values_of_any_type_as_json_text(spark):
    """A drifted field's values as JSON text: the strict (``after``) and relaxed (``updatedFields``)
    forms of one value give one text, and a typed column converts to the same text."""
    from refine.mongo.extended_json import json_text, variant_json_text

    pairs = [
        ('{"$numberLong": "5"}', "5", "5"),
        ('{"$date": 1700000000000}', '{"$date": "2023-11-14T22:13:20Z"}', '"2023-11-14T22:13:20.000Z"'),
        ('{"$oid": "64b7f0c2a1b2c3d4e5f60718"}', '{"$oid": "64b7f0c2a1b2c3d4e5f60718"}', '"64b7f0c2a1b2c3d4e5f60718"'),
        ('{"a": {"$numberLong": "1"}, "b": [1.5]}', '{"a": 1, "b": [1.5]}', '{"a":1,"b":[1.5]}'),
        ('"discontinued"', '"discontinued"', '"discontinued"'),
        ("true", "true", "true"),
        ('[1, "x"]', '[1, "x"]', '[1,"x"]'),
        # a field of mixed types in an array's documents: the 8 stays a number
        ('[{"n": "four"}, {"n": 8}]', '[{"n": "four"}, {"n": 8}]', '[{"n":"four"},{"n":8}]'),
        ("null", "null", None),
    ]
    frame = spark.createDataFrame([(s, r) for s, r, _ in pairs], "strict string, relaxed string").select(
        to_variant(F.col("strict")).alias("strict"), to_variant(F.col("relaxed")).alias("relaxed")
    )
    shapes = sorted(
        {
            row[0]
            for column in ("strict", "relaxed")
            for row in frame.select(F.schema_of_variant(column)).distinct().collect()
        }
    )
    texts = frame.select(
        variant_json_text(F.col("strict"), shapes), variant_json_text(F.col("relaxed"), shapes)
    ).collect()
    assert [tuple(row) for row in texts] == [(text, text) for _, _, text in pairs]
    typed = spark.createDataFrame(
        [(5, datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), "discontinued")],
        "n bigint, t timestamp, s string",
    )
    assert tuple(typed.select(*[json_text(F.col(c)) for c in typed.columns]).head()) == (
        "5",
        '"2023-11-14T22:13:20.000Z"',
        '"discontinued"',
    )


def test_untyped_arrays_are_stored_as_string_arrays_and_read_back_untyped():
    untyped = ArrayType(NullType())
    document = StructType(
        [
            StructField("tags", untyped),
            StructField("grid", ArrayType(untyped)),
            StructField("address", StructType([StructField("city", StringType()), StructField("codes", untyped)])),
            StructField(
                "items", ArrayType(StructType([StructField("sku", StringType()), StructField("marks", untyped)]))
            ),
            StructField("none", NullType()),
            StructField("empties", ArrayType(StructType([StructField("a", NullType())]))),
        ]
    )
    assert storable(document) == StructType(document.fields[:4])  # [{}] and null: no type, nothing to keep
    kept = storable(document)
    assert isinstance(kept, StructType)
    assert {f.name: untyped_paths(f.dataType) for f in kept.fields} == {
        "tags": [()],
        "grid": [()],
        "address": [("codes",)],
        "items": [(ELEMENT_STEP, "marks")],
    }
    for field in kept.fields:
        paths = untyped_paths(field.dataType)
        stored = StructField(field.name, stored_untyped(field.dataType), True, untyped_comment(paths))
        assert untyped_paths(stored.dataType) == []  # strings, as a table holds them
        assert commented_untyped(stored) == paths
        assert read_untyped(stored).dataType == field.dataType
    # A column named untyped whose arrays have held typed elements since (a comment left behind) stays typed.
    typed = StructField("tags", ArrayType(LongType()), True, untyped_comment([()]))
    assert read_untyped(typed).dataType == ArrayType(LongType())


def _decimal128_texts(rng: random.Random, count: int) -> list[str]:
    """Decimal128 texts as MongoDB writes them: up to 34 digits, signs, points, exponents, zeros, NaN."""
    texts = ["0", "-0", "0E-6176", "0E+6111", "NaN", "-Infinity", "1E+19", "1E+20", "99999999999999999999"]
    texts += ["1E+9999999999", "0E+99999999999", "5.", ".5", "+.5E1", "-NaN", "1e-18", "1e-19"]
    texts += ["100000000000000000000", "0.000000000000000001", "0.0000000000000000010", "0.0000000000000000001"]
    for _ in range(count):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 34)))
        point = rng.randint(0, len(digits))
        text = digits[:point] + ("." + digits[point:] if point < len(digits) or rng.random() < 0.2 else "")
        text = rng.choice(["", "-", "+"]) + text
        if rng.random() < 0.5:
            text += f"E{rng.randint(-45, 45):+d}"
        texts.append(text)
    return texts


def test_decimal128_texts_fit_a_decimal_as_pythons_decimal_says(spark):
    """The oracle: Python's decimal module. A text fits decimal(38,18) when it is a finite number below 10^20
    whose value has no digit beyond the 18th after the point; it then decodes to exactly that value."""
    texts = _decimal128_texts(random.Random(7), 3000)

    exact = decimal.Context(prec=200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)  # quantizes any text exactly

    def expected(text: str) -> Decimal | None:
        try:
            number = Decimal(text)
        except InvalidOperation:
            return None
        if (
            not number.is_finite()
            or number.copy_abs() >= 10**20
            or number != number.quantize(Decimal("1E-18"), rounding=decimal.ROUND_DOWN, context=exact)
        ):
            return None
        return number

    rows = spark.createDataFrame(
        [(t, json.dumps({"m": {"$numberDecimal": t}})) for t in texts], "text string, doc string"
    )
    decoded = rows.select(
        "text",
        decimal_text_fits(F.col("text")).alias("fits"),
        decode(to_variant(F.col("doc")), StructType([StructField("m", DecimalType(38, 18))]))["m"].alias("m"),
    ).collect()
    wrong = [
        (r.text, r.fits, r.m) for r in decoded if r.fits != (expected(r.text) is not None) or r.m != expected(r.text)
    ]
    assert not wrong, wrong[:10]


def test_decimal128_values_a_decimal_cannot_hold_keep_their_extended_json_as_json_text(spark):
    """In a JSON-text column a Decimal128 is a number with 18 fraction digits; one that decimal(38,18)
    cannot hold exactly (there or nested) keeps its Extended JSON: never rounded, never nulled."""
    from refine.mongo.extended_json import variant_json_text

    values = [
        '{"$numberDecimal": "10.5"}',
        '{"$numberDecimal": "0.1234567890123456789"}',
        '{"p": {"$numberDecimal": "1E+40"}, "q": 1}',
        '{"p": {"$numberDecimal": "2"}, "q": 1}',
        '[{"$numberDecimal": "NaN"}]',
    ]
    frame = spark.createDataFrame([(v,) for v in values], "v string").select(to_variant(F.col("v")).alias("v"))
    shapes = sorted({row[0] for row in frame.select(F.schema_of_variant("v")).distinct().collect()})
    texts = [row[0] for row in frame.select(variant_json_text(F.col("v"), shapes)).collect()]
    assert texts == [
        "10.500000000000000000",
        '{"$numberDecimal":"0.1234567890123456789"}',
        '{"p":{"$numberDecimal":"1E+40"},"q":1}',
        '{"p":2.000000000000000000,"q":1}',
        '[{"$numberDecimal":"NaN"}]',
    ]
