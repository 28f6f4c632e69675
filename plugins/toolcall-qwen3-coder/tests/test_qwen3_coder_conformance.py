"""qwen3_coder passes mlxcel's tool-format conformance runner on the fixtures: each parsed
whole, one character at a time and in random chunkings gives the same events, the
expected calls and content, and finish() calls equal to the streamed ones."""

from __future__ import annotations

from mlxcel.testing.conformance import check_tool_format
from mlxcel.testing.templates import template_text
from qwen3_coder_fixtures import BROKEN, FIXTURES, TOOLS


def test_qwen3_coder_conforms():
    """Selected by the test kit's Qwen3-Coder template among every installed format."""
    check_tool_format("qwen3_coder", FIXTURES, tools=TOOLS, template=template_text("qwen3_coder"),
                      chunkings=48)


def test_broken_calls_conform():
    check_tool_format("qwen3_coder", BROKEN, tools=TOOLS, chunkings=48)


def test_without_tools_every_value_is_a_string():
    """No schema to type a value by: the text the model wrote, verbatim."""
    check_tool_format("qwen3_coder", [(FIXTURES[0].text, [
        {"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}])])
