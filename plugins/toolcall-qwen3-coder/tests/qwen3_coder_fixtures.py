"""Qwen3-Coder model outputs, written from the format its chat template teaches, and the
tools of the request they answer (their schemas type the values)."""

from __future__ import annotations

import textwrap

from mlxcel.testing.conformance import ToolFixture
from mlxcel.types.messages import Tool


def tool(name: str, **properties: dict) -> Tool:
    """A function tool whose parameters are ``properties`` (JSON schemas)."""
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": properties}}})


TOOLS = (
    tool("get_weather", city={"type": "string"}, days={"type": "integer"},
         unit={"type": "string", "enum": ["celsius", "fahrenheit"]}),
    tool("write_file", path={"type": "string"}, content={"type": "string"},
         append={"type": "boolean"}),
    tool("search", query={"type": "string"}, filters={"type": "object"},
         tags={"type": "array", "items": {"type": "string"}},
         limit={"anyOf": [{"type": "integer"}, {"type": "string"}]},
         after={"type": ["integer", "null"]}),
    # nullable the ways clients write it (Pydantic v2's anyOf, a type list, OpenAPI's
    # nullable), beside a plain string
    tool("page", cursor={"anyOf": [{"type": "integer"}, {"type": "null"}]},
         size={"type": ["integer", "null"], "default": 5},
         note={"type": "string", "nullable": True},
         query={"oneOf": [{"type": "string"}, {"type": "null"}]}, label={"type": "string"}),
)


def call(*lines: str) -> str:
    """The lines of one call's XML, joined by newlines."""
    return "\n".join(lines)


WEATHER = call("<tool_call>", "<function=get_weather>", "<parameter=city>", "Paris",
               "</parameter>", "<parameter=days>", "3", "</parameter>", "</function>",
               "</tool_call>")
CODE = textwrap.dedent("""\
    def close(tag):
        if tag < "</parameter>":
            return f"</{tag}>"  # </function> and <parameter=x> are text here
        return "</tool_call>\"""")

FIXTURES = [
    ToolFixture(text="I'll check the weather.\n\n" + WEATHER,
                calls=[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
                content="I'll check the weather.\n\n"),
    # two blocks, then two functions in one block
    ToolFixture(
        text=WEATHER + "\n" + call(
            "<tool_call>", "<function=get_weather>", "<parameter=city>", "Lyon",
            "</parameter>", "</function>", "<function=search>", "<parameter=query>",
            "rain", "</parameter>", "</function>", "</tool_call>"),
        calls=[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
               {"name": "get_weather", "arguments": {"city": "Lyon"}},
               {"name": "search", "arguments": {"query": "rain"}}],
        content="\n"),
    # nested JSON (multi-line), an array written as a Python literal, anyOf and nullable
    ToolFixture(
        text=call("<tool_call>", "<function=search>", "<parameter=filters>", "{",
                  '  "year": [2024, 2025],', '  "where": {"lang": null, "q": "a</b>"}', "}",
                  "</parameter>", "<parameter=tags>", "['x', \"y\"]", "</parameter>",
                  "<parameter=limit>", "7", "</parameter>", "<parameter=after>", "null",
                  "</parameter>", "</function>", "</tool_call>"),
        calls=[{"name": "search", "arguments": {
            "filters": {"year": [2024, 2025], "where": {"lang": None, "q": "a</b>"}},
            "tags": ["x", "y"], "limit": 7, "after": None}}],
        content=""),
    # unicode, a multi-line value, code with every tag in it, a boolean, an unknown key
    ToolFixture(
        text="Écrivons ☃ :\n" + call(
            "<tool_call>", "<function=write_file>", "<parameter=path>", "docs/東京 ✓.py",
            "</parameter>", "<parameter=content>", CODE, "", "</parameter>",
            "<parameter=append>", "False", "</parameter>", "<parameter=mode>", "0644",
            "</parameter>", "</function>", "</tool_call>"),
        calls=[{"name": "write_file", "arguments": {
            "path": "docs/東京 ✓.py", "content": CODE + "\n", "append": False,
            "mode": "0644"}}],
        content="Écrivons ☃ :\n"),
    # </parameter> inside a value, followed by text: the value goes on
    ToolFixture(
        text=call("<tool_call>", "<function=write_file>", "<parameter=content>",
                  "a </parameter> b", "</parameter>x", "</parameter>", "</function>",
                  "</tool_call>") + " done",
        calls=[{"name": "write_file", "arguments": {"content": "a </parameter> b\n"
                                                               "</parameter>x"}}],
        content=" done"),
    # no </function>; an unknown tool, so no schema: "null" is null, an empty value ""
    ToolFixture(
        text=call("<tool_call>", "<function=lookup>", "<parameter=q>", "null",
                  "</parameter>", "<parameter=empty>", "</parameter>", "</tool_call>"),
        calls=[{"name": "lookup", "arguments": {"q": None, "empty": ""}}],
        content=""),
    # the answer is cut off inside a value
    ToolFixture(
        text="Writing.\n" + call("<tool_call>", "<function=write_file>",
                                 "<parameter=path>", "a.txt", "</parameter>",
                                 "<parameter=content>", "first line", "second </para"),
        calls=[{"name": "write_file", "arguments": {"path": "a.txt",
                                                    "content": "first line\nsecond "}}],
        content="Writing.\n"),
    # no call: a tag's look-alikes in prose
    ToolFixture(text="Use a < b, <tool> or <tool_call-like> text; <function=x> is fine.",
                calls=[],
                content="Use a < b, <tool> or <tool_call-like> text; <function=x> is fine."),
]

# Regressions from upstream test outputs (vLLM's qwen3coder parser and its tests).
FIXTURES += [
    # a Qwen3.5-style template prints a None argument as Python does: null where the
    # schema allows null, the text where it is a plain string
    ToolFixture(
        text=call("<tool_call>", "<function=page>", "<parameter=cursor>", "None",
                  "</parameter>", "<parameter=size>", "null", "</parameter>",
                  "<parameter=note>", "None", "</parameter>", "<parameter=query>", "None",
                  "</parameter>", "<parameter=label>", "None", "</parameter>", "</function>",
                  "</tool_call>"),
        calls=[{"name": "page", "arguments": {"cursor": None, "size": None, "note": None,
                                              "query": None, "label": "None"}}],
        content=""),
    ToolFixture(
        text=call("<tool_call>", "<function=page>", "<parameter=cursor>", "12",
                  "</parameter>", "<parameter=query>", "rain", "</parameter>", "</function>",
                  "</tool_call>"),
        calls=[{"name": "page", "arguments": {"cursor": 12, "query": "rain"}}], content=""),
    # a parameter written twice: one key, the last value, where the first stood
    ToolFixture(
        text=call("<tool_call>", "<function=get_weather>", "<parameter=city>", "Paris",
                  "</parameter>", "<parameter=days>", "3", "</parameter>", "<parameter=city>",
                  "Lyon", "</parameter>", "</function>", "</tool_call>"),
        calls=[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 3}}], content=""),
    ToolFixture(
        text="<tool_call><function=get_weather><parameter=days>1</parameter><parameter=days>"
             "2</parameter></function></tool_call>",
        calls=[{"name": "get_weather", "arguments": {"days": 2}}], content=""),
]

# Markup that opens a call and does not parse: a CallError keeps its text, nothing is lost.
JSON_BODY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# prose where the first parameter should start (after a </parameter>, text that is not
# markup stays in the value: see the fixture of </parameter> inside a value)
STRAY = call("<tool_call>", "<function=get_weather>", "oops, prose", "<parameter=city>",
             "Oslo", "</parameter>", "</function>", "</tool_call>")
BROKEN = [
    ToolFixture(text="Sure. " + JSON_BODY + " Then more.", calls=[],
                content="Sure. " + JSON_BODY + " Then more.", errors=True),
    ToolFixture(text=STRAY + "\nafter",
                calls=[{"name": "get_weather", "arguments": {}}],
                content=STRAY[STRAY.index("oops"):] + "\nafter", errors=True),
    ToolFixture(text="<tool_call>\n<function=bad name\n>\n</tool_call>", calls=[],
                content="<tool_call>\n<function=bad name\n>\n</tool_call>", errors=True),
    ToolFixture(text="Calling: <tool_call>\n<function=get_wea", calls=[],
                content="Calling: <tool_call>\n<function=get_wea", errors=True),
]
