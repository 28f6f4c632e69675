"""The forced-call grammar: from random weights, ``tool_choice`` ``required`` and a named
function give calls the parser reads, of a declared function (named: that one), with the
schema's required arguments and values of its types, the markers written as Gemma 4's
special tokens; streamed and whole, through the in-process server."""

from __future__ import annotations

import pytest
from mlxcel.testing import forced_routes as forced
from mlxcel_family_gemma4.grammar import EXACT, grammar, sequence
from mlxcel_family_gemma4.parser import new_parser

WEATHER = {**forced.WEATHER, "required": ["unit", "city"]}  # not in the properties' order
ALARM = {"type": "object", "properties": {
    "hour": {"type": "integer"}, "on": {"type": "boolean"},
    "at:zone": {"enum": ["UTC", "CET"]},
    "label": {"type": ["string", "null"], "maxLength": 6},
    "opts": {"type": "object", "properties": {"loud": {"type": "boolean"},
                                              "level": {"type": "number"}},
             "required": ["loud"]}},
    "required": ["on", "hour", "at:zone", "opts"]}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
_, TOOLS = forced.function_tools(SCHEMAS)
MARKERS = ("<|tool_call>", "<tool_call|>", '<|"|>')


@pytest.fixture(scope="module")
def client(gemma4_checkpoint):
    from mlxcel.testing.engine import app_client

    with app_client(gemma4_checkpoint, parallel=2) as c:
        yield c


def test_the_engine_writes_calls_the_parser_reads_with_the_special_tokens(gemma4_checkpoint):
    from mlxcel.testing.conformance import forced_calls

    seen = set()
    for calls, _ in forced_calls(gemma4_checkpoint, grammar, new_parser, TOOLS, MARKERS):
        for call in calls:
            forced.check_call(SCHEMAS, call.name, call.arguments, set(SCHEMAS))
            seen.add(call.name)
    assert seen == set(SCHEMAS), "six seeds call both tools"


def test_forced_calls_through_the_routes(client):
    """The family's loop detection stays on: a random model's "5555" inside a value must
    not cut the call short (the engine does not stop a row for a loop inside its
    constraint)."""
    forced.check_forced_routes(client, SCHEMAS, streamed="set_alarm")


def test_a_tool_whose_name_the_parser_cannot_read_is_left_out():
    bad = forced.tool("bad{name", {"type": "object", "properties": {}})
    assert grammar((bad,), "required") is None
    constraint = grammar((bad, *TOOLS), "required")
    assert "bad" not in constraint.pattern and constraint.markers == MARKERS


@pytest.mark.parametrize("flags", [(False, False, False), (False, True, False),
                                   (True, False, True), (False,) * (EXACT + 2)])
def test_optional_items_are_separated_once_and_required_ones_kept(flags):
    """Each subset of the optional items (the required ones always in) is one ``,``
    between two items, none before the first; past ``EXACT`` optional-only items, a
    list without the last one ends in ``,`` (the parser takes a trailing comma)."""
    import itertools
    import re

    items = [(chr(97 + i), needed) for i, needed in enumerate(flags)]
    pattern = re.compile(sequence(items))
    optional = [x for x, needed in items if not needed]
    trailing = not any(flags) and len(flags) > EXACT
    for n in range(len(optional) + 1):
        for left_out in itertools.combinations(optional, n):
            kept = [x for x, _ in items if x not in left_out]
            text = ",".join(kept) + ("," if trailing and kept and items[-1][0] in left_out
                                     else "")
            assert pattern.fullmatch(text), (flags, text)
            assert not kept or not pattern.fullmatch("," + text)
    for x, needed in items:
        if needed:
            assert not pattern.fullmatch(",".join(y for y, _ in items if y != x))


def test_the_grammar_passes_the_conformance_checks(tmp_path, gemma4_checkpoint):
    forced.check_grammar_compiles(grammar, gemma4_checkpoint, tmp_path, ALARM)
