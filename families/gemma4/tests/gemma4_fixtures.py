"""Gemma 4 model outputs, written from the format its chat template teaches
(``<|tool_call>call:NAME{key:value}<tool_call|>``, strings between ``<|"|>``), and the
tools of the request they answer."""

from __future__ import annotations

from mlxcel.testing.conformance import ToolFixture
from mlxcel.types.messages import Tool

Q = '<|"|>'


def tool(name: str, **properties: dict) -> Tool:
    """A function tool whose parameters are ``properties`` (JSON schemas)."""
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": properties}}})


def s(text: str) -> str:
    """``text`` as Gemma 4 writes a string."""
    return Q + text + Q


def call(name: str, body: str) -> str:
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


TOOLS = (
    tool("get_weather", city={"type": "string"}, days={"type": "integer"},
         zip={"type": "string"}),
    tool("write_file", path={"type": "string"}, content={"type": "string"},
         append={"type": "boolean"}),
    tool("search", query={"type": "string"}, filters={"type": "object"},
         tags={"type": "array"}, limit={"anyOf": [{"type": "integer"}, {"type": "null"}]}),
)

WEATHER = call("get_weather", f"city:{s('Paris')},days:3")
CODE = 'if a}, b: print("<tool_call|>, <|tool_call>call:x{}")'

FIXTURES = [
    ToolFixture(text="I'll check the weather." + WEATHER,
                calls=[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
                content="I'll check the weather."),
    # several calls, text between them, a string-typed bare value
    ToolFixture(
        text=WEATHER + "\n" + call("get_weather", f"city:{s('Lyon')},zip:02139")
        + call("search", f"query:{s('rain')}") + " done",
        calls=[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
               {"name": "get_weather", "arguments": {"city": "Lyon", "zip": "02139"}},
               {"name": "search", "arguments": {"query": "rain"}}],
        content="\n done"),
    # nested objects and arrays, escaped keys, null, floats, Python literals, bare words
    ToolFixture(
        text=call("search", f"filters:{{year:[2024,2025],where:{{lang:null,{s('q-key')}:"
                            f"{s('a}b')}}},score:-1.5e3,ok:True}},tags:[{s('x')},y,[]],"
                            "limit:7"),
        calls=[{"name": "search", "arguments": {
            "filters": {"year": [2024, 2025], "where": {"lang": None, "q-key": "a}b"},
                        "score": -1500.0, "ok": True},
            "tags": ["x", "y", []], "limit": 7}}],
        content=""),
    # unicode, strings holding }, ",", both markers and the string delimiter's neighbours
    ToolFixture(
        text="Écrivons ☃ : " + call("write_file", f"path:{s('docs/東京 ✓.py')},"
                                                   f"content:{s(CODE)},append:false"),
        calls=[{"name": "write_file", "arguments": {
            "path": "docs/東京 ✓.py", "content": CODE, "append": False}}],
        content="Écrivons ☃ : "),
    # two calls in one block, spaces around the pieces, a trailing comma, an empty object
    ToolFixture(
        text="<|tool_call>call:get_weather{ city : " + s("Oslo") + " , days : 2 , }\n"
             "call:search{}<tool_call|>",
        calls=[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}},
               {"name": "search", "arguments": {}}],
        content=""),
    # the answer ends inside the block (a stop token ended it): decoded as it stands
    ToolFixture(text="Ok." + call("get_weather", f"city:{s('Rome')}")[:-len("<tool_call|>")],
                calls=[{"name": "get_weather", "arguments": {"city": "Rome"}}],
                content="Ok."),
    # no call: look-alikes in prose
    ToolFixture(text="Use <|tool or <tool_call> and call:x{a:1}; <|\"|> is a quote.",
                calls=[], content="Use <|tool or <tool_call> and call:x{a:1}; <|\"|> is a "
                                  "quote."),
]

BAD_JSONISH = '<|tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}<tool_call|>'
BROKEN = [
    ToolFixture(text="Sure. " + BAD_JSONISH + " Then.", calls=[],
                content="Sure. " + BAD_JSONISH + " Then.", errors=True),
    ToolFixture(text=call("get_weather", "city:Paris days:3") + "x", calls=[],
                content=call("get_weather", "city:Paris days:3") + "x", errors=True),
    ToolFixture(text="<|tool_call>call:bad name{}<tool_call|>" + WEATHER,
                calls=[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
                content="<|tool_call>call:bad name{}<tool_call|>", errors=True),
    ToolFixture(text="Calling: <|tool_call>call:get_weather{city:" + Q + "Par", calls=[],
                content="Calling: <|tool_call>call:get_weather{city:" + Q + "Par",
                errors=True),
    ToolFixture(text="<|tool_call><tool_call|>", calls=[], content="<|tool_call><tool_call|>",
                errors=True),
]
