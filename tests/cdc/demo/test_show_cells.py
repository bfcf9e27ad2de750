"""One cell of a shown table: any Python value a row may hold becomes one line of text."""

from decimal import Decimal

from cdc.demo.show import _cell


def test_a_decimal_without_a_numeric_exponent_is_shown_as_itself():
    # NaN and infinity have a letter for an exponent: the trailing-zeros rule does not apply to them.
    assert [_cell(Decimal(text), 20) for text in ("NaN", "Infinity", "-Infinity")] == ["NaN", "Infinity", "-Infinity"]
    assert _cell(Decimal("1.500000000000000000"), 20) == "1.5"
    assert _cell(Decimal("1.50"), 20) == "1.50"
