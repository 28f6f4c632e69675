"""The reading rules every bare-text tool format shares (``mlxcel.toolcalls.values``)."""

from __future__ import annotations

import pytest
from mlxcel.testing.conformance import NULL_VALUES, UNTYPED_VALUES
from mlxcel.toolcalls.values import NO_VALUE, literal_value, reads_as_null, untyped_value


@pytest.mark.parametrize(("text", "value"), UNTYPED_VALUES)
def test_an_unschemad_value_is_the_json_it_spells_else_its_text(text, value):
    got = untyped_value(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(("text", "types", "null"), [
    ("null", None, True), (" None\n", frozenset(), True), ("NULL", {"integer"}, True),
    ("None", {"string"}, False), ("null", {"string", "null"}, True),
    ("null", {"integer", "string"}, False), ("nil", {"null"}, False),
    ("none", {"null"}, False), ("Nonesuch", None, False),
])
def test_null_spellings_are_null_unless_a_string_and_no_null_is_allowed(text, types, null):
    assert reads_as_null(text, types) is null


def test_the_conformance_tables_agree_with_the_rule():
    """The kit's null cases: null exactly where ``reads_as_null`` says so."""
    from mlxcel.builtin.toolcalls.markup_values import types_of

    for schema, text, value in NULL_VALUES:
        assert reads_as_null(text, types_of(schema)) is (value is None), (schema, text)


@pytest.mark.parametrize(("text", "types", "value"), [
    ("007", {"integer"}, 7), ("+7", {"number"}, 7), (".5", {"number"}, 0.5),
    ("007", None, NO_VALUE), ("{1, 2}", None, NO_VALUE), ("b'x'", None, NO_VALUE),
    ("[1e999]", None, NO_VALUE), ("(1, [2, None])", None, [1, [2, None]]),
    ("   ", None, NO_VALUE), ('"s"', None, "s"),
])
def test_literal_values(text, types, value):
    got = literal_value(text, types)
    assert got is NO_VALUE if value is NO_VALUE else got == value
