"""The builtin markup tool formats (``mlxcel.builtin.toolcalls.markup_formats``): MiniMax
M2/M3, Kimi K2, GLM-4.7, LongCat-Flash, Harmony and FunctionGemma.

Fixtures (``data/toolcalls/markup_fixtures.json``) are model outputs written from each
format's documentation and templates, each with the calls it holds, the content a client
sees, and whether it holds broken markup; ``check_tool_format`` parses each whole, one
character at a time and in seeded random chunkings, and wants the same merged events and
calls, and the family's template must select the format among every installed one. Calls
are also round-tripped: a template of each family's shape
(``data/toolcalls/markup_templates``) writes a call back, and the parser reads the same
call out of what it wrote.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from mlxcel.builtin.toolcalls.markup_formats import FORMATS
from mlxcel.builtin.toolcalls.markup_values import typed_value
from mlxcel.lazy import resolve
from mlxcel.model.chat_template import ChatTemplate
from mlxcel.testing.conformance import (
    ToolFixture,
    check_text_values,
    check_tool_format,
    chunkings_of,
    parse_pieces,
    streamed_calls,
)
from mlxcel.testing.templates import STYLES, template_text
from mlxcel.types.messages import Tool
from mlxcel.types.toolcalls import (
    CallArguments,
    CallEnd,
    CallStart,
    ToolText,
)

DATA = Path(__file__).parent / "data" / "toolcalls"
FIXTURES = json.loads((DATA / "markup_fixtures.json").read_text("utf-8"))
BY_NAME = {fmt.name: fmt for fmt in FORMATS}
STR, INT, BOOL, NUM = ({"type": t} for t in ("string", "integer", "boolean", "number"))


def _tool(name: str, properties: dict) -> Tool:
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "description": f"{name} tool",
        "parameters": {"type": "object", "properties": properties}}})


TOOLS = (
    _tool("get_weather", {"city": STR, "days": INT, "hourly": BOOL,
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
    _tool("lookup", {"zip": STR, "count": INT, "enabled": BOOL, "ratio": NUM, "code": INT,
                     "label": STR, "note": {"type": ["string", "null"]}}),
    _tool("search", {"query": STR, "limit": INT, "exact": BOOL, "threshold": NUM,
                     "filters": {"type": "object", "properties": {
                         "lang": STR, "year": INT, "tags": {"type": "array", "items": STR}}},
                     "ids": {"type": "array", "items": INT},
                     "cursor": {"anyOf": [STR, {"type": "null"}]}}),
    _tool("write_file", {"path": STR, "content": STR, "overwrite": BOOL}),
    _tool("batch", {"jobs": {"type": "array", "items": {
        "type": "object", "properties": {"id": INT, "name": STR}}}}),
    _tool("get_time", {}),
)


def parse(name: str, pieces: list[str]) -> tuple[list, tuple]:
    """One parser of format ``name`` fed ``pieces``: its events merged (adjacent text,
    adjacent fragments of one call; empty ones dropped) and ``finish().calls``."""
    return parse_pieces(resolve(BY_NAME[name].parser), TOOLS, pieces, name)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixtures_conform_and_the_template_selects_the_format(name):
    fixtures = [ToolFixture(f["text"], f["calls"], f["content"], f["errors"])
                for f in FIXTURES[name]]
    check_tool_format(name, fixtures, tools=TOOLS, template=_template(TEMPLATES[name][0]))


def test_every_format_has_fixtures_with_several_calls_and_broken_markup():
    assert set(FIXTURES) == set(BY_NAME)
    for name, fixtures in FIXTURES.items():
        assert any(len(f["calls"]) >= 2 for f in fixtures), name
        assert any(f["errors"] for f in fixtures), name


ARGS = [
    ("get_weather", {"city": "São Paulo", "days": 3, "unit": "celsius", "hourly": True}),
    ("lookup", {"zip": "007", "count": 7, "enabled": False, "note": None, "ratio": 0.25,
                "label": "null"}),
    ("search", {"query": "tags <b> & \"quotes\"\nline two, {braces}: yes",
                "filters": {"lang": "ko", "year": 2024, "tags": ["뉴스", "007"]},
                "ids": [1, 2, 3], "exact": True}),
    ("write_file", {"path": "src/main.py", "overwrite": False,
                    "content": "\ndef f():\n    return {'a': [1, 2]}\n"}),
    ("get_time", {}),
]
# Where each template's answer ends: the family's end-of-turn (or stop) text.
ROUND_TRIPS = {"glm47": ("glm47.jinja", None), "longcat": ("longcat.jinja", "</longcat_s>"),
               "minimax_m2": ("minimax_m2.jinja", "[e~["),
               "minimax_m3": ("minimax_m3.jinja", "[e~["),
               "kimi_k2": ("kimi_k2.jinja", "<|im_end|>"),
               "function_gemma": ("function_gemma.jinja", "<start_function_response>"),
               "harmony": (None, "<|call|>")}


def written_answer(name: str, calls: list[tuple[str, dict]], reasoning: str = "") -> str:
    """What the family's template writes after its generation prompt for an assistant
    turn with ``calls``: the answer a model trained on it produces."""
    file, end = ROUND_TRIPS[name]
    source = template_text("harmony") if file is None else \
        (DATA / "markup_templates" / file).read_text("utf-8")
    template = ChatTemplate(source)
    tools = [t.definition for t in TOOLS]
    user = [{"role": "user", "content": "Please help."}]
    turn = {"role": "assistant", "content": "", "reasoning_content": reasoning or None,
            "tool_calls": [{"id": f"functions.{n}:{i}", "type": "function",
                            "function": {"name": n, "arguments": a}}
                           for i, (n, a) in enumerate(calls)]}
    prompt = template.render(user, tools=tools, add_generation_prompt=True)
    full = template.render([*user, turn], tools=tools, add_generation_prompt=False)
    assert full.startswith(prompt), name
    answer = full[len(prompt):]
    return answer.split(end)[0] if end and name != "harmony" else \
        answer.removesuffix(end or "")


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_a_call_the_template_writes_parses_back(name):
    for tool, arguments in ARGS:
        answer = written_answer(name, [(tool, arguments)])
        _, calls = parse(name, [answer])
        want = {k: v for k, v in arguments.items()
                if v is not None or name != "minimax_m3"}  # its template drops None
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [(tool, want)], answer
    answer = written_answer(name, ARGS[:3])
    assert [c.name for c in parse(name, list(answer))[1]] == [t for t, _ in ARGS[:3]]


def test_harmony_analysis_then_call_from_the_test_kit_template():
    answer = written_answer("harmony", [ARGS[0]], reasoning="Weather needs a tool call.")
    assert answer.startswith(STYLES["harmony"].reasoning[0])
    events, calls = parse("harmony", list(answer))
    assert not [e for e in events if isinstance(e, ToolText)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [ARGS[0]]


TEMPLATES = {"glm47": ["glm47.jinja"], "longcat": ["longcat.jinja"],
             "minimax_m2": ["minimax_m2.jinja"], "minimax_m3": ["minimax_m3.jinja"],
             "kimi_k2": ["kimi_k2.jinja"], "function_gemma": ["function_gemma.jinja"],
             "harmony": ["harmony_gpt_oss.jinja", "harmony"]}


def _template(ref: str) -> str:
    return (DATA / "markup_templates" / ref).read_text("utf-8") if ref.endswith(".jinja") \
        else template_text(ref)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detect_picks_only_its_own_family(name):
    for ref in TEMPLATES[name]:
        source = _template(ref)
        assert [f.name for f in FORMATS if f.detect(source)] == [name], ref


@pytest.mark.parametrize("style", ["chatml", "llama3", "mistral", "gemma4", "qwen3_coder"])
def test_other_families_templates_are_not_detected(style):
    assert not [f.name for f in FORMATS if f.detect(template_text(style))]


def test_specificity_and_no_grammar():
    assert {f.name: f.specificity for f in FORMATS} == {
        "minimax_m2": 20, "minimax_m3": 20, "kimi_k2": 20, "glm47": 30, "longcat": 20,
        "harmony": 20, "function_gemma": 20}
    assert all(f.grammar is None for f in FORMATS)


# One call per format, and where its markup closes (the call is sent there, not before).
CLOSING = {
    "glm47": ("<tool_call>get_time", "</tool_call>"),
    "longcat": ("<longcat_tool_call>get_time\n", "</longcat_tool_call>"),
    "minimax_m2": ("<minimax:tool_call>\n<invoke name=\"get_time\">\n", "</invoke>"),
    "minimax_m3": ("]<]minimax[>[<tool_call>]<]minimax[>[<invoke name=\"get_time\">",
                   "]<]minimax[>[</invoke>"),
    "kimi_k2": ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
                "<|tool_call_argument_begin|>{}", "<|tool_call_end|>"),
    "function_gemma": ("<start_function_call>call:get_time{}", "<end_function_call>"),
    "harmony": ("<|channel|>commentary to=functions.get_time json<|message|>{}",
                "<|call|>"),
}


@pytest.mark.parametrize("name", sorted(CLOSING))
def test_a_partial_marker_is_held_and_a_call_is_sent_when_it_closes(name):
    head, close = CLOSING[name]
    parser = resolve(BY_NAME[name].parser)(TOOLS)
    if name == "harmony":  # the final message's end marker is cut, then a call follows
        lead, rest = "<|channel|>final<|message|>Hi <|en", "d|><|start|>assistant" + head
    else:
        lead, rest = "Hi " + head[:4], head[4:]
    early = parser.feed(lead)
    assert early == [ToolText(text="Hi ")], early
    assert parser.feed(rest + close[:-1]) == []
    sent = parser.feed(close[-1])
    assert [type(e) for e in sent] == [CallStart, CallArguments, CallEnd], sent
    assert sent[1].text == "{}" and parser.finish().calls[0].name == "get_time"


def test_json_bodies_keep_the_model_text_verbatim():
    body = '{"city" :  "Paris",\n "days": 3.0, "list": [1e2]}'
    kimi = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            f"<|tool_call_argument_begin|> {body} <|tool_call_end|>")
    harmony = f"<|channel|>commentary to=functions.get_weather json<|message|>{body}"
    for name, text in (("kimi_k2", kimi), ("harmony", harmony)):
        assert parse(name, [text])[1][0].arguments == body, name


def test_values_follow_the_schema_into_nested_m3_elements():
    ns = "]<]minimax[>["
    text = (f'{ns}<tool_call>{ns}<invoke name="search">{ns}<filters>{ns}<year>2024{ns}</year>'
            f'{ns}<tags>{ns}<item>1{ns}</item>{ns}</tags>{ns}</filters>{ns}<ids>{ns}<item>'
            f'1{ns}</item>{ns}</ids>{ns}<cursor>null{ns}</cursor>{ns}</invoke>')
    call = parse("minimax_m3", [text])[1][0]
    assert json.loads(call.arguments) == {"filters": {"year": 2024, "tags": ["1"]},
                                          "ids": [1], "cursor": None}


def test_importing_the_formats_loads_no_parser_and_no_mlx_lm():
    code = ("import sys, mlxcel.builtin.toolcalls.markup_formats as m; "
            "print(len(m.FORMATS), sorted(n for n in sys.modules if n.startswith("
            "('mlx_lm', 'mlxcel.builtin.toolcalls.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split(" ", 1)
    assert out[0] == "7"
    assert json.loads(out[1].replace("'", '"')) == [
        "mlxcel.builtin.toolcalls.markup_formats"]


NULLABLE = {"type": ["string", "null"]}
EITHER = {"anyOf": [INT, STR]}


@pytest.mark.parametrize(("text", "schema", "value"), [
    ("007", STR, "007"), ("null", STR, "null"), (" padded \n", STR, " padded \n"),
    ("7", INT, 7), (" 7 ", INT, 7), ("007", INT, 7), ("+7", INT, 7), ("7.0", INT, 7),
    ("abc", INT, "abc"), ("", INT, ""), ("true", BOOL, True), ("True", BOOL, True),
    ("FALSE", BOOL, False), ("null", NULLABLE, None), ("None", NULLABLE, None),
    ("007", NULLABLE, "007"), ("7", EITHER, 7), ("abc", EITHER, "abc"),
    ("None", {"type": "string", "nullable": True}, None), ("null", EITHER, "null"),
    ("None", {"anyOf": [INT, {"type": "null"}]}, None), ("null", INT, None),
    ("None", None, None), ("True", None, True), ('"q"', None, '"q"'),
    ("1", {"type": "string", "enum": ["1", "2"]}, "1"), ("0.5", NUM, 0.5),
    ("1e999", NUM, "1e999"), ("NaN", NUM, "NaN"), ("{'a': (1, 2)}", None, {"a": [1, 2]}),
    ("{1, 2}", None, "{1, 2}"), ("007", None, "007"), ("7", None, 7),
    ('"quoted"', None, '"quoted"'), ("[1, {\"k\": null}]", None, [1, {"k": None}]),
])
def test_values_are_typed_by_the_schema(text, schema, value):
    got = typed_value(text, schema)
    assert got == value and type(got) is type(value)


# Pieces of every format's markup, and of the text around it, for random answers.
VOCABULARY = sorted({*(m for head, close in CLOSING.values() for m in (head, close)),
                     "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                     "</arg_value>", "<minimax:tool_call>", "</minimax:tool_call>",
                     "<parameter name=\"city\">", "</parameter>", "]<]minimax[>[", "<city>",
                     "</city>", "<item>", "</item>", "<|tool_call_begin|>",
                     "<|tool_calls_section_end|>", "<|tool_call_argument_begin|>",
                     "<escape>", "{", "}", "[", "]", ",", ":", "\"", "<|start|>assistant",
                     "<|channel|>", "final", "analysis", "<|message|>", "<|end|>", "<|call|>",
                     " to=functions.get_weather", "json", "{\"city\": \"Oslo\"}", "call:",
                     "get_weather", "Paris", "7", "null", " ", "\n", "<", "|", "é 東"})


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_random_markup_never_raises_and_parses_the_same_however_cut(name):
    rng = random.Random(name)
    for _ in range(150):
        text = "".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 30)))
        whole = parse(name, [text])
        for pieces in chunkings_of(text, random.Random(rng.randrange(1 << 30)), 2):
            assert parse(name, pieces) == whole, (name, pieces)
        streamed_calls(whole[0], name)


# One call of tool ``name`` whose ``arguments`` (key -> the text a model writes) each
# format writes as its template does.
NS = "]<]minimax[>["
WRITE_CALL = {
    "glm47": lambda name, args: f"<tool_call>{name}" + "".join(
        f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in args.items())
        + "</tool_call>",
    "longcat": lambda name, args: f"<longcat_tool_call>{name}\n" + "".join(
        f"<longcat_arg_key>{k}</longcat_arg_key>\n<longcat_arg_value>{v}"
        "</longcat_arg_value>\n" for k, v in args.items()) + "</longcat_tool_call>",
    "minimax_m2": lambda name, args: f'<minimax:tool_call>\n<invoke name="{name}">\n'
        + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in args.items())
        + "</invoke>\n</minimax:tool_call>",
    "minimax_m3": lambda name, args: f'{NS}<tool_call>{NS}<invoke name="{name}">'
        + "".join(f"{NS}<{k}>{v}{NS}</{k}>" for k, v in args.items())
        + f"{NS}</invoke>{NS}</tool_call>",
}


@pytest.mark.parametrize("name", sorted(WRITE_CALL))
def test_bare_text_values_follow_the_shared_rules(name):
    """An unschema'd parameter and a null spelling read alike in every bare-text format
    (``mlxcel.toolcalls.values``), whole and in random chunkings."""
    check_text_values(name, WRITE_CALL[name])


@pytest.mark.parametrize("name", sorted(WRITE_CALL))
def test_a_nullable_parameter_written_as_python_none_is_null(name):
    """What Qwen3.5-style templates print for a None argument (``| string``)."""
    schema = {"anyOf": [INT, {"type": "null"}]}
    tools = (_tool("page", {"cursor": schema, "size": {"type": ["integer", "null"]},
                            "note": {"type": "string", "nullable": True}}),)
    text = WRITE_CALL[name]("page", {"cursor": "None", "size": "null", "note": "None"})
    _, calls = parse_pieces(resolve(BY_NAME[name].parser), tools, [text], name)
    assert [json.loads(c.arguments) for c in calls] == \
        [{"cursor": None, "size": None, "note": None}]


def test_harmony_drops_a_message_to_a_builtin_tool_with_a_debug_log(monkeypatch):
    """Neither content nor a call, and the log names the recipient, never the body."""
    import mlxcel.builtin.toolcalls.harmony as harmony

    seen = []

    class Recorder:
        def debug(self, event, **fields):
            seen.append((event, fields))

    monkeypatch.setattr(harmony, "log", Recorder())
    text = ("<|channel|>commentary to=container.exec <|constrain|>json<|message|>"
            '{"cmd": ["rm", "-rf", "build"]}<|call|>')
    events, calls = parse("harmony", list(text))
    assert events == [] and calls == ()
    assert seen == [("harmony_message_dropped",
                     {"recipient": "container.exec", "channel": "commentary"})]


def test_harmony_a_message_to_functions_without_a_name_is_broken_markup():
    events, calls = parse("harmony", ["<|channel|>commentary to=functions. json<|message|>{}"])
    assert calls == () and [type(e).__name__ for e in events] == ["CallError"]
