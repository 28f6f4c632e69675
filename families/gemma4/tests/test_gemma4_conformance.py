"""The tool format passes mlxcel's tool-format conformance runner on the fixtures (each
parsed whole, one character at a time and in random chunkings: the same events, the
expected calls and content), and the family passes the family runner on a tiny
``gemma4_text`` checkpoint: batched greedy outputs equal solo runs, the prompt cache
reuses a finished turn."""

from __future__ import annotations

from gemma4_fixtures import BROKEN, FIXTURES, TOOLS, WEATHER
from mlxcel.testing.conformance import check_family, check_tool_format
from mlxcel.testing.templates import template_text


def test_gemma4_tool_format_conforms_on_good_and_broken_calls():
    """Selected by the test kit's Gemma 4 template among every installed format."""
    template = template_text("gemma4")
    check_tool_format("gemma4", [*FIXTURES, *BROKEN], tools=TOOLS, template=template,
                      chunkings=48)


def test_without_tools_a_value_is_read_by_its_spelling():
    """No schema: a bare number is a number, a bare word a string."""
    text = "<|tool_call>call:lookup{zip:02139,n:5,w:word}<tool_call|>"
    check_tool_format("gemma4", [(text, [{"name": "lookup", "arguments": {
        "zip": "02139", "n": 5, "w": "word"}}], ""), (WEATHER, [
            {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}], "")])


def test_the_gemma4_family_conforms(gemma4_checkpoint):
    check_family(gemma4_checkpoint, "gemma4")
