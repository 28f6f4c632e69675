"""The builtin JSON-body tool formats (``mlxcel.builtin.toolcalls.json_formats``).

Fixture model outputs per format (``data/toolcalls/json_<format>.txt``, written from each
family's templates and docs) parse to the same events and calls fed whole, one character
at a time and in random cuts; JSON arguments are the model's text verbatim; names and
argument fragments stream while the JSON grows; broken markup is a ``CallError`` and
nothing of the answer is lost; real-shaped templates select each format.

Fixture files: ``# ...`` comment lines first; ``=== title`` starts a fixture, the model
output follows verbatim up to ``--- calls`` (a JSON list of ``{"name", "arguments"[,
"id"]}``); ``--- content`` (a JSON string: what a client sees, ``CallError`` text
included); ``--- errors`` marks a fixture whose markup does not parse.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlxcel.builtin.toolcalls import json_formats
from mlxcel.lazy import resolve
from mlxcel.plugins import load_plugins
from mlxcel.testing.conformance import ToolFixture, check_tool_format, merge_events, parse_pieces
from mlxcel.testing.templates import template_text
from mlxcel.types.messages import Tool
from mlxcel.types.toolcalls import CallArguments, CallEnd, CallError, CallStart, ToolText

DATA = Path(__file__).parent / "data" / "toolcalls"
FORMATS = {fmt.name: fmt for fmt in json_formats.FORMATS}
STREAMING = ("hermes", "mistral_nemo", "mistral_bracketed", "llama3", "generic_json",
             "functionary_v3_1", "functionary_v3_2", "command_r", "granite", "deepseek_v3_1",
             "deepseek_r1", "firefunction_v2")
SPECIFICITY = {"hermes": 10, "generic_json": 10, "mistral_nemo": 20, "mistral_bracketed": 20,
               "llama3": 20, "command_r": 20, "functionary_v3_1": 30, "functionary_v3_2": 30,
               "granite": 30, "pythonic": 30, "deepseek_v3_1": 20, "deepseek_r1": 20,
               "firefunction_v2": 20}
CHAT_TEMPLATES = Path(__file__).parents[2] / "tests" / "chat_templates"


KIT = {"hermes": "chatml", "llama3": "llama3", "mistral_bracketed": "mistral"}


def fixtures(name: str) -> list[ToolFixture]:
    out: list[ToolFixture] = []
    for block in (DATA / f"json_{name}.txt").read_text("utf-8").split("\n=== ")[1:]:
        _title, _, rest = block.partition("\n")
        text, _, rest = rest.partition("\n--- calls\n")
        calls, _, rest = rest.partition("\n--- content\n")
        content, errors, _ = rest.partition("\n--- errors")
        out.append(ToolFixture(text, json.loads(calls),
                               json.loads(content) if content.strip() else None, bool(errors)))
    assert out, name
    return out


def parse(name: str, pieces: list[str], tools: tuple = ()) -> tuple[list, tuple]:
    """Feed ``pieces`` to a fresh parser: merged events and finish().calls."""
    return parse_pieces(resolve(FORMATS[name].parser), tools, pieces, name)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_passes_the_conformance_runner_on_its_fixtures(name: str) -> None:
    """Whole, one character at a time and in random cuts: the same events and calls, the
    fixture's calls and content, CallError only where the fixture says; the test kit's
    template of the family, where there is one, selects the format among all installed."""
    template = template_text(KIT[name]) if name in KIT else None
    check_tool_format(name, fixtures(name), template=template, chunkings=24)


@pytest.mark.parametrize("name", [n for n in sorted(FORMATS) if n != "pythonic"])
def test_json_arguments_are_the_models_text_verbatim(name: str) -> None:
    """The first fixture of each file spells numbers as 1.50 and 1e3, with unicode and
    odd spacing: each call's arguments must be a slice of the model's text."""
    fx = fixtures(name)[0]
    _, calls = parse(name, [fx.text])
    assert calls
    for call in calls:
        assert call.arguments in fx.text, (name, call.arguments)
    joined = "".join(c.arguments for c in calls)
    assert "1.50" in joined and "1e3" in joined, (name, joined)


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("name", STREAMING)
def test_names_and_arguments_stream_while_the_json_grows(name: str) -> None:
    fx = fixtures(name)[0]
    pieces = _pieces(fx.text)
    events, calls = parse(name, pieces)
    parser = resolve(FORMATS[name].parser)(())
    arrived: dict[type, list[int]] = {CallStart: [], CallArguments: [], CallEnd: []}
    for n, piece in enumerate(pieces):
        for e in parser.feed(piece, ()):
            if type(e) in arrived and e.index == 0:
                arrived[type(e)].append(n)
    assert parser.finish().calls == calls
    first_args = calls[0].arguments
    done_at = (fx.text.index(first_args) + len(first_args) - 1) // 4  # the piece closing it
    assert arrived[CallStart] and arrived[CallStart][0] < done_at, (name, arrived)
    assert len(set(arrived[CallArguments])) >= 2, (name, arrived)
    assert arrived[CallArguments][0] < done_at, (name, arrived)
    assert arrived[CallEnd] and arrived[CallEnd][0] < len(pieces), (name, arrived)


def test_the_call_starts_when_its_name_is_whole_and_fragments_follow_the_text() -> None:
    parser = resolve(FORMATS["hermes"].parser)(())
    assert parser.feed('Hi <tool_call>\n{"name": "get_wea', ()) == [ToolText(text="Hi ")]
    assert parser.feed('ther", "argu', ()) == [CallStart(index=0, name="get_weather")]
    assert parser.feed('ments": {"city": "Pa', ()) == \
        [CallArguments(index=0, text='{"city": "Pa')]
    assert parser.feed('ris"}}\n</tool_call>', ()) == \
        [CallArguments(index=0, text='ris"}'), CallEnd(index=0)]
    assert parser.finish().calls[0].arguments == '{"city": "Paris"}'


def test_pythonic_calls_are_sent_whole_when_the_list_closes() -> None:
    parser = resolve(FORMATS["pythonic"].parser)(())
    assert parser.feed('[get_weather(city="Pa', ()) == []
    assert parser.feed('ris"), f(x=1)', ()) == []
    out = parser.feed("]", ())
    assert [type(e) for e in out] == [CallStart, CallArguments, CallEnd] * 2
    assert out[1].text == '{"city": "Paris"}' and out[4].text == '{"x": 1}'


@pytest.mark.parametrize(("name", "marker", "after"), [
    ("hermes", "<tool_call>", '{"name": "f", "arguments": {}}</tool_call>'),
    ("mistral_bracketed", "[TOOL_CALLS]", 'f[ARGS]{}'),
    ("llama3", "<|python_tag|>", '{"name": "f", "parameters": {}}'),
    ("granite", "<|tool_call|>", '[{"name": "f", "arguments": {}}]'),
    ("pythonic", "<|tool_call_start|>", "[f()]<|tool_call_end|>"),
    ("command_r", "<|START_ACTION|>", '[{"tool_name": "f", "parameters": {}}]'),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜>",
     "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("deepseek_r1", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"
     "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("firefunction_v2", " functools[", '{"name": "f", "arguments": {}}]'),
])
def test_a_partial_marker_is_held_until_the_text_decides(name, marker, after) -> None:
    cut = len(marker) - 3
    parser = resolve(FORMATS[name].parser)(())
    assert merge_events(parser.feed("Hi! " + marker[:cut], ())) == [ToolText(text="Hi! ")]
    got = parser.feed(marker[cut:] + after, ()) + list(parser.finish().events)
    assert not [e for e in got if isinstance(e, ToolText | CallError)], got
    assert [e.name for e in got if isinstance(e, CallStart)] == ["f"]
    held = resolve(FORMATS[name].parser)(())
    assert merge_events(held.feed("Hi! " + marker[:cut], ())) == [ToolText(text="Hi! ")]
    assert merge_events(held.feed("!", ())) == [ToolText(text=marker[:cut] + "!")]
    ended = resolve(FORMATS[name].parser)(())
    ended.feed(marker[:cut], ())
    assert merge_events(list(ended.finish().events)) == [ToolText(text=marker[:cut])]


def _tool(name: str) -> Tool:
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "parameters": {"type": "object", "properties": {}}}})


@pytest.mark.parametrize(("name", "text"), [
    ("llama3", '{"name": "%s", "parameters": {"q": 1}}'),
    ("generic_json", '[{"name": "%s", "arguments": {"q": 1}}]'),
    ("pythonic", "[%s(q=1)]"),
])
def test_unmarked_json_is_a_call_only_under_a_declared_name(name, text) -> None:
    tools = (_tool("lookup"), _tool("get_weather"))
    events, calls = parse(name, [text % "get_weather"], tools)
    assert [c.name for c in calls] == ["get_weather"]
    events, calls = parse(name, [text % "undeclared"], tools)
    assert calls == () and events == [ToolText(text=text % "undeclared")]


def test_a_call_that_breaks_after_it_started_ends_and_is_reported_whole() -> None:
    block = '<tool_call>{"name": "a", "arguments": {"b": tru}}</tool_call>'
    events, calls = parse("hermes", [block + " ok"])
    assert events == [CallStart(index=0, name="a"), CallArguments(index=0, text='{"b": tru}'),
                      CallEnd(index=0), CallError(message=events[3].message, text=block, index=0),
                      ToolText(text=" ok")]
    assert calls == ()
    cut_short = '[TOOL_CALLS]get_weather[ARGS]{"city": "Par'
    events, calls = parse("mistral_bracketed", _pieces(cut_short))
    assert [type(e) for e in events] == [CallStart, CallArguments, CallEnd, CallError]
    assert events[-1].text == cut_short and events[-1].index == 0 and calls == ()


def test_mistral_ids_reach_the_calls_and_a_call_id_the_start() -> None:
    events, calls = parse("mistral_bracketed", ["[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{}"])
    assert events[0] == CallStart(index=0, name="f", id="abc123XYZ")
    events, calls = parse("mistral_nemo",
                             ['[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "Q1w2E3r4T"}]'])
    assert events[0] == CallStart(index=0, name="f") and calls[0].id == "Q1w2E3r4T"


@pytest.mark.parametrize(("template", "name"), [
    (template_text("chatml"), "hermes"),
    (template_text("llama3"), "llama3"),
    (template_text("mistral"), "mistral_bracketed"),
    *[((DATA / "json_templates" / f"{stem}.jinja").read_text("utf-8"), name) for stem, name in (
        ("mistral_nemo", "mistral_nemo"), ("functionary_v3_1", "functionary_v3_1"),
        ("functionary_v3_2", "functionary_v3_2"), ("command_r7b", "command_r"),
        ("command_r_plus", "command_r"), ("granite_3_3", "granite"), ("lfm2", "pythonic"),
        ("llama3_2_pythonic", "pythonic"), ("generic_json", "generic_json"))],
    *[((CHAT_TEMPLATES / f"{stem}.jinja").read_text("utf-8"), name) for stem, name in (
        ("deepseek-v3.1", "deepseek_v3_1"), ("deepseek-r1-distill-qwen", "deepseek_r1"),
        ("deepseek-r1-distill-llama", "deepseek_r1"), ("firefunction-v2", "firefunction_v2"))],
])
def test_a_real_shaped_template_selects_its_format(template: str, name: str) -> None:
    fmt, why = load_plugins().tool_formats.choose(template)
    assert (fmt and fmt.name, why) == (name, "detected in the chat template")


def test_the_builtin_plugin_registers_every_format_at_its_specificity() -> None:
    plugins = load_plugins()
    info = next(i for i in plugins.infos if i.name == "toolcall-builtin")
    assert info.status == "loaded"
    assert set(SPECIFICITY) <= set(info.registers["tool formats"])
    assert {n: plugins.tool_formats.get(n).specificity for n in SPECIFICITY} == SPECIFICITY
    assert all(plugins.tool_formats.owner(n) == "toolcall-builtin" for n in SPECIFICITY)


def test_the_parsers_import_no_heavy_module() -> None:
    modules = sorted({FORMATS[n].parser.partition(":")[0] for n in FORMATS})
    code = (f"import sys; import {', '.join(modules)}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mlx', 'mlx_lm', 'numpy', 'jinja2')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_firefunctions_grammar_forces_a_call_its_parser_reads(tiny_checkpoint) -> None:
    """`` functools[...]`` with ``required`` and with a named function: every answer is a
    list of calls of the tools left, with their required arguments."""
    import jsonschema
    from apphelpers import forced_answers

    schemas = {"get_weather": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"]}, "get_time": {"type": "object", "properties": {
            "tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}
    fmt = FORMATS["firefunction_v2"]
    tools = tuple(Tool(name=n, definition={"type": "function", "function": {
        "name": n, "parameters": p}}) for n, p in schemas.items())
    for left, choice in ((tools, "required"), (tools[1:], "named")):
        tok, outputs = forced_answers(tiny_checkpoint, resolve(fmt.grammar)(left, choice),
                                      400, "f")
        assert outputs
        for ids, last in outputs:
            text = tok.decode(ids, skip_special=False)
            assert last.finish_reason == "stop" and text.startswith(" functools["), text
            _, calls = parse("firefunction_v2", [text], left)
            assert calls, text
            for call in calls:
                assert call.name in {t.name for t in left}
                jsonschema.validate(json.loads(call.arguments), schemas[call.name])
