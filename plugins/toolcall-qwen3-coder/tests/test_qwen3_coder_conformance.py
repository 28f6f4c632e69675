"""qwen3_coder passes mlxcel's tool-format conformance runner on the fixtures: each parsed
whole, one character at a time and in random chunkings gives the same events, the
expected calls and content, and finish() calls equal to the streamed ones."""

from __future__ import annotations

from mlxcel.testing.conformance import check_text_values, check_tool_format
from mlxcel.testing.templates import template_text
from qwen3_coder_fixtures import BROKEN, FIXTURES, TOOLS


def test_qwen3_coder_conforms_on_good_and_broken_calls():
    """Selected by the test kit's Qwen3-Coder template among every installed format."""
    fixtures = [*FIXTURES, *BROKEN]
    check_tool_format("qwen3_coder", fixtures, template=template_text("qwen3_coder"),
                      tools=TOOLS, chunkings=48)


def test_without_tools_values_are_read_by_the_untyped_rule():
    """No schema to type a value by: the non-string JSON its text spells, else the text
    (``mlxcel.toolcalls.values``), as the builtin bare-text formats read it."""
    check_tool_format("qwen3_coder", [(FIXTURES[0].text, [
        {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}])])


def write_call(name: str, arguments: dict[str, str]) -> str:
    """One call as Qwen3-Coder's template writes it, each value's text as given."""
    params = "".join(f"<parameter={key}>\n{text}\n</parameter>\n"
                     for key, text in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def test_bare_text_values_follow_the_shared_rules():
    """Unschema'd parameters and null spellings read as the builtin GLM, LongCat and
    MiniMax formats read them (the conformance kit's tables)."""
    check_text_values("qwen3_coder", write_call)
