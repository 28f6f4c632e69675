"""{{tool_format}} passes mlxcel's tool-format conformance runner.

Add a fixture for every shape the model writes: several calls, nested JSON, unicode,
strings that contain the tags, a call cut off by the end of the answer, tags around
something that is not a call (``errors=True``: the parser reports a ``CallError``), no call
at all.
"""

from mlxcel.testing.conformance import ToolFixture, check_tool_format

TEMPLATE = '{%- if tools %}Call a tool as <{{tool_format}}>{"name": ..., "arguments": ...}{%- endif %}'

FIXTURES = [
    ToolFixture(
        text='Sure. <{{tool_format}}>{"name": "get_weather", "arguments": {"city": "Paris"}}'
             "</{{tool_format}}>",
        calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}],
        content="Sure. ",
    ),
    ToolFixture(
        text="<{{tool_format}}>not a call</{{tool_format}}> then",
        calls=[],
        content="<{{tool_format}}>not a call</{{tool_format}}> then",
        errors=True,
    ),
    ToolFixture(text="no call here", calls=[], content="no call here"),
]


def test_the_tool_format_conforms():
    check_tool_format("{{tool_format}}", FIXTURES, template=TEMPLATE)
