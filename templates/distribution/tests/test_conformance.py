"""{{tool_format}} passes mlxcel's tool-format conformance runner.

Add a fixture for every shape the model writes: several calls, nested JSON, unicode,
strings that contain the tags, a call cut off by the end of the answer, tags around
something that is not a call (``errors=True``: the parser reports a ``CallError``), no call
at all.
"""

from mlxcel.testing.conformance import ToolFixture, check_tool_format

TEMPLATE = '{%- if tools %}Call a tool as <{{tool_format}}>{"name": ..., "arguments": ...}{%- endif %}'

CALL = '<{{tool_format}}>{"name": "get_weather", "arguments": {"city": "Paris"}}</{{tool_format}}>'
NOT_A_CALL = "<{{tool_format}}>not a call</{{tool_format}}> then"

# each: the model's text, the calls in it, the text a client sees around them
FIXTURES = [
    ToolFixture("Sure. " + CALL, [{"name": "get_weather", "arguments": {"city": "Paris"}}],
                "Sure. "),
    ToolFixture(NOT_A_CALL, [], NOT_A_CALL, errors=True),
    ToolFixture("no call here", [], "no call here"),
]


def test_the_tool_format_conforms():
    check_tool_format("{{tool_format}}", FIXTURES, template=TEMPLATE)
