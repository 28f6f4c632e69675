"""Tool-format conformance runners (re-exported by ``mlxcel.testing.conformance``).

``check_tool_format(tool_format, fixtures)``: tool-format contract v1
(``mlxcel.toolcalls.api``), on fixture model outputs. Fed whole, one character at a time
and in seeded random chunkings (``feed(piece, ())``: no token ids), a parser gives the same
events (adjacent text and one call's adjacent argument fragments merged, empty ones
dropped), since a stream is cut wherever tokens end, and the same ``finish().calls``.
Those calls are the fixture's (name, parsed arguments, id where the fixture gives one),
each ``arguments`` a JSON object's text. Calls the events stream start with a name, count
up from 0, take fragments only while open and end by ``finish()``; each agrees with the
call of its index in ``finish().calls`` (name, the fragments joined = its arguments, its
id), because a client keeps what was streamed. A parser may stream nothing and report
every call at ``finish()``. ``CallError`` comes where, and only where, a fixture says its
text holds broken markup; the content a client sees is the text and ``CallError`` events'
text, in order. A call's arguments name each key once. Its pieces serve a format's own
tests too: ``chunkings_of``, ``parse_pieces`` (``merge_events``) and ``streamed_calls``.

``check_text_values(tool_format, write_call)``: a format that writes argument values as
bare text (GLM-4.7, LongCat, MiniMax, Qwen3-Coder) reads them by the rules they all share
(``mlxcel.toolcalls.values``): ``UNTYPED_VALUES`` for a parameter the schema does not
describe (no tools, a tool without ``parameters``, no ``properties`` entry, an entry
without a type) and ``NULL_VALUES`` for null spellings under typed schemas, each call
written by ``write_call(name, {key: text})`` and run through ``check_tool_format``.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple, get_args

from mlxcel.types import toolcalls as ev


class ToolFixture(NamedTuple):
    """Model output ``text``; the ``calls`` in it (``{"name", "arguments"}``, the arguments
    parsed; an ``"id"`` too where the format writes one); the ``content`` a client sees
    (None: not checked); ``errors``: the text holds markup that opens a call and does not
    parse, which the parser must report as a ``CallError``."""

    text: str
    calls: list[dict[str, Any]]
    content: str | None = None
    errors: bool = False


def check_tool_format(tool_format: Any, fixtures: Any, *, tools: Any = (),
                      template: str | None = None, chunkings: int = 32, seed: int = 0) -> None:
    """Run the tool-format checks (see the module docstring) on every fixture.

    ``tool_format``: an installed format's name (then ``template``, if given, must select
    it among every installed format) or a ``ToolFormat``; ``fixtures``: ``ToolFixture``s or
    tuples of their fields; ``tools``: what ``new_parser(tools)`` is given (a tuple of
    ``mlxcel.types.messages.Tool``)."""
    from mlxcel.lazy import resolve

    fmt = _installed_format(tool_format, template) if isinstance(tool_format, str) \
        else tool_format
    if template is not None:
        assert fmt.detect(template), f"{fmt.name}: detect() rejects the template"
    new_parser, rng = resolve(fmt.parser), random.Random(seed)
    for n, fixture in enumerate(ToolFixture(*f) for f in fixtures):
        where = f"{fmt.name} fixture {n}"
        whole, calls = parse_pieces(new_parser, tuple(tools), [fixture.text], where)
        _check_answer(whole, calls, fixture, where)
        for pieces in chunkings_of(fixture.text, rng, chunkings):
            split, split_calls = parse_pieces(new_parser, tuple(tools), pieces, where)
            assert split == whole, _difference(where, pieces, split, whole)
            assert split_calls == calls, \
                f"{where}: fed as {_shown(pieces)}, finish() gives the calls {split_calls}; " \
                f"the whole text gives {calls}"


def _installed_format(name: str, template: str | None) -> Any:
    from mlxcel.errors import StartupError
    from mlxcel.plugins import load_plugins

    formats = load_plugins().tool_formats
    assert name in formats, f"no installed tool format {name!r} (installed: {sorted(formats)})"
    if template is not None:
        try:
            picked = formats.select(template)
        except StartupError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        assert picked is not None and picked.name == name, \
            f"the template selects {picked and picked.name!r}, not {name!r}"
    return formats.get(name)


def chunkings_of(text: str, rng: random.Random, count: int) -> list[list[str]]:
    """One character at a time, then ``count`` random cuts with pieces of 1 to 2..16 chars."""
    out = [list(text)]
    for _ in range(count):
        top, pieces, i = rng.choice((2, 3, 5, 8, 16)), [], 0
        while i < len(text):
            step = rng.randint(1, top)
            pieces.append(text[i:i + step])
            i += step
        out.append(pieces)
    return out


def parse_pieces(new_parser: Any, tools: tuple, pieces: list[str],
                 where: str = "parser") -> tuple[list, tuple]:
    """One parser fed ``pieces`` (no token ids) then finished: its events, merged
    (``merge_events``), and ``finish().calls``."""
    parser = new_parser(tools)
    events = [e for piece in pieces for e in parser.feed(piece, ())]
    result = parser.finish()
    assert isinstance(result, ev.ParseResult), f"{where}: finish() gave {result!r}, not a " \
                                            "ParseResult"
    return merge_events([*events, *result.events], where), tuple(result.calls)


def merge_events(events: list, where: str = "parser") -> list:
    """``events`` as a client that concatenates them sees them: adjacent text, and adjacent
    fragments of one call, merged; empty ones dropped. Each must be a ``ToolEvent``."""
    merged: list[Any] = []
    for e in events:
        assert isinstance(e, get_args(ev.ToolEvent)), \
            f"{where}: {e!r} is not a ToolEvent (mlxcel.types.toolcalls)"
        if isinstance(e, ev.ToolText | ev.CallArguments) and not e.text:
            continue
        last = merged[-1] if merged else None
        if isinstance(e, ev.ToolText) and isinstance(last, ev.ToolText):
            merged[-1] = ev.ToolText(text=last.text + e.text)
        elif isinstance(e, ev.CallArguments) and isinstance(last, ev.CallArguments) \
                and e.index == last.index:
            merged[-1] = ev.CallArguments(index=e.index, text=last.text + e.text)
        else:
            merged.append(e)
    return merged


def _shown(pieces: list[str]) -> str:
    return repr(pieces) if len(pieces) <= 40 else f"{pieces[:40]!r}... ({len(pieces)} pieces)"


def _difference(where: str, pieces: list[str], split: list, whole: list) -> str:
    """The first event where a chunking and the whole text part ways, and the chunking."""
    at = next((i for i, (a, b) in enumerate(zip(split, whole, strict=False)) if a != b),
              min(len(split), len(whole)))
    got, want = (events[at] if at < len(events) else "no event" for events in (split, whole))
    return f"{where}: fed as {_shown(pieces)}, event {at} is {got}; the whole text gives {want}"


def _check_answer(events: list, calls: tuple, fixture: ToolFixture, where: str) -> None:
    """The whole text's events and calls against the fixture and against each other."""
    errors = [e for e in events if isinstance(e, ev.CallError)]
    assert not errors or fixture.errors, f"{where}: unexpected {errors[0]!r}"
    assert errors or not fixture.errors, \
        f"{where}: the fixture's broken markup gave no CallError"
    got = _calls(calls, where)
    want = [{"name": c["name"], "arguments": c["arguments"],
             **({"id": c["id"]} if "id" in c else {})} for c in fixture.calls]
    seen = [{k: g[k] for k in w} for g, w in zip(got, want, strict=False)] \
        if len(got) == len(want) else got
    assert seen == want, f"{where}: calls {seen} != expected {want}"
    if fixture.content is not None:
        content = "".join(e.text for e in events if isinstance(e, ev.ToolText | ev.CallError))
        assert content == fixture.content, \
            f"{where}: content {content!r} != expected {fixture.content!r}"
    for n, (name, cid, arguments) in enumerate(streamed_calls(events, where)):
        if n >= len(calls):
            assert fixture.errors, \
                f"{where}: call {n} streamed, but finish() has {len(calls)} calls"
            continue
        final = calls[n]
        assert (name, arguments) == (final.name, final.arguments), \
            f"{where}: call {n} streamed as {name!r} {arguments!r}; finish() has " \
            f"{final.name!r} {final.arguments!r}"
        assert cid is None or final.id in (None, cid), \
            f"{where}: call {n} streamed with id {cid!r}; finish() has {final.id!r}"


def _calls(calls: tuple, where: str) -> list[dict[str, Any]]:
    """``finish().calls`` as dicts with parsed arguments; each must be a ``ParsedCall``
    whose ``arguments`` is a JSON object's text that names no key twice."""
    import json

    out = []
    for n, call in enumerate(calls):
        assert isinstance(call, ev.ParsedCall), f"{where}: finish().calls[{n}] is {call!r}"
        try:
            arguments = json.loads(call.arguments, object_pairs_hook=_unique_keys)
        except _RepeatedKey as exc:
            raise AssertionError(f"{where}: call {n} arguments name the key {exc.args[0]!r} "
                                 f"twice: {call.arguments!r}") from None
        except (TypeError, ValueError):
            arguments = None
        assert isinstance(arguments, dict), \
            f"{where}: call {n} arguments are not a JSON object's text: {call.arguments!r}"
        out.append({"name": call.name, "arguments": arguments, "id": call.id})
    return out


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen[key] = value
    return seen


def streamed_calls(events: list, where: str = "parser") -> list[tuple[str, str | None, str]]:
    """The calls the events stream, as (name, id, arguments): each starts with a name,
    takes fragments only while open and ends; indices count up from 0."""
    calls: list[list[Any]] = []
    open_ = None
    for e in events:
        if isinstance(e, ev.CallStart):
            assert open_ is None, f"{where}: call {e.index} starts inside call {open_}"
            assert e.index == len(calls), \
                f"{where}: call index {e.index}, expected {len(calls)}"
            assert e.name, f"{where}: call {e.index} starts without a name"
            calls.append([e.name, e.id, ""])
            open_ = e.index
        elif isinstance(e, ev.CallArguments | ev.CallEnd):
            kind = type(e).__name__
            assert open_ == e.index, f"{where}: {kind} for call {e.index} while " \
                                     f"{open_} is open"
            if isinstance(e, ev.CallEnd):
                open_ = None
            else:
                calls[e.index][2] += e.text
    assert open_ is None, f"{where}: call {open_} never ends (finish() must end it)"
    return [tuple(c) for c in calls]


# -- values written as bare text -----------------------------------------------------------
# (the text a model writes for a parameter the schema does not describe, its value by the
# rule of ``mlxcel.toolcalls.values``)
UNTYPED_VALUES: tuple[tuple[str, Any], ...] = (
    ("7", 7), (" -2.5 ", -2.5), ("1e3", 1000.0), ("true", True), ("False", False),
    ("null", None), ("None", None), ('{"a": [1, null]}', {"a": [1, None]}),
    ('[1, "x"]', [1, "x"]), ("{'k': (1, True)}", {"k": [1, True]}), ("Paris", "Paris"),
    ("007", "007"), ('"quoted"', '"quoted"'), (" two words ", " two words "), ("", ""),
    ("line one\nline two", "line one\nline two"), ("1e999", "1e999"), ("NaN", "NaN"),
    ("{not json}", "{not json}"),
)
_INT, _STR, _NULL = {"type": "integer"}, {"type": "string"}, {"type": "null"}
# (a parameter's schema, the text a model writes, its value): null spellings
NULL_VALUES: tuple[tuple[dict, str, Any], ...] = (
    ({"type": ["integer", "null"]}, "None", None), ({"type": ["integer", "null"]}, "null", None),
    ({"type": ["integer", "null"]}, "7", 7), ({"anyOf": [_INT, _NULL]}, "None", None),
    ({"oneOf": [_STR, _NULL]}, "null", None), ({"oneOf": [_STR, _NULL]}, "nil", "nil"),
    ({"type": "string", "nullable": True}, "None", None), (_INT, "null", None),
    (_STR, "None", "None"), ({"anyOf": [_INT, _STR]}, "null", "null"),
)


def check_text_values(tool_format: Any, write_call: Any, *, chunkings: int = 4,
                      seed: int = 0) -> None:
    """A bare-text format reads ``UNTYPED_VALUES`` and ``NULL_VALUES`` by the shared rules
    (see the module docstring). ``write_call(name, arguments)``: the model's text of one
    call of ``name`` whose ``arguments`` (key -> text) are written as the format writes a
    value; ``tool_format`` as ``check_tool_format`` takes it."""
    from mlxcel.types.messages import Tool

    def tool(**function: Any) -> Tool:
        return Tool(name="probe", definition={"type": "function", "function": {
            "name": "probe", **function}})

    def object_of(**properties: Any) -> dict:
        return {"type": "object", "properties": properties}

    def fixtures(cases: Any) -> list[ToolFixture]:
        return [ToolFixture(write_call("probe", {"x": text}),
                            [{"name": "probe", "arguments": {"x": value}}])
                for text, value in cases]

    for tools in ((), (tool(),), (tool(parameters=object_of(other=_INT)),),
                  (tool(parameters=object_of(x={"description": "anything"})),)):
        check_tool_format(tool_format, fixtures(UNTYPED_VALUES), tools=tools,
                          chunkings=chunkings, seed=seed)
    for schema, text, value in NULL_VALUES:
        check_tool_format(tool_format, fixtures([(text, value)]),
                          tools=(tool(parameters=object_of(x=schema)),),
                          chunkings=chunkings, seed=seed)
