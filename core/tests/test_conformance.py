"""Core's builtin families pass the conformance runner third-party families use."""

from __future__ import annotations

import json

import pytest
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.conformance import (
    ToolFixture,
    check_family,
    check_text_values,
    check_tool_format,
)
from mlxcel.types.toolcalls import (
    CallArguments,
    CallEnd,
    CallError,
    CallStart,
    ParsedCall,
    ParseResult,
    ToolText,
)


@pytest.mark.parametrize("shape,family", [("qwen3", "mlx-lm-text"),
                                          ("gemma4_text", "mlx-lm-generic"),
                                          ("qwen3_next", "mlx-lm-generic")])
def test_builtin_families_conform(shape, family, mlxcel_checkpoint_cache):
    """``family`` serves ``shape`` unless an installed distribution lists the type (the
    gemma4 family lists gemma4_text): the runner checks whichever family claims it."""
    from mlxcel.plugins import load_plugins

    listing = [f.name for _, f in load_plugins().families.items()
               if shape in f.model_types and "generate" in f.tasks]
    check_family(cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype="float32"),
                 listing[0] if listing else family)


def test_the_runner_names_a_family_that_does_not_claim_the_checkpoint(mlxcel_checkpoint_cache):
    path = cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")
    with pytest.raises(AssertionError, match="served by 'mlx-lm-text', not 'acme'"):
        check_family(path, "acme")


def test_builtin_dialects_conform(tiny_checkpoint):
    from apphelpers import make_client, wait_ready
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.conformance import check_dialect

    dialects = load_plugins().dialects
    with make_client(tiny_checkpoint, api_key="s3cret", parallel=1) as c:
        wait_ready(c)
        check_dialect(c, dialects.get("openai"), "/v1/models", "s3cret")
        check_dialect(c, dialects.get("llamacpp"), "/props", "s3cret")


class _Toy:
    """A toy format, ``text <<name {json}>> text``: each call is sent when its ``>>``
    arrives, text as soon as it cannot start ``<<``. The switches are the bugs the runner
    must catch: ``hold=False`` forgets to keep back a ``<`` at a chunk's end, ``end=False``
    never ends a call, ``final`` rewrites the arguments ``finish()`` reports, ``ids`` gives
    the calls ids (``streamed_ids`` others in the stream), ``stream=False`` sends no call
    before ``finish()`` (which is allowed)."""

    def __init__(self, tools, hold=True, end=True, final=None, ids=False, streamed_ids=None,
                 stream=True):
        self.buf, self.inside, self.calls = "", False, []
        self.hold, self.end, self.final, self.stream = hold, end, final, stream
        self.ids, self.streamed_ids = ids, streamed_ids

    def feed(self, text, token_ids=()):
        return self._sent(self._feed(text))

    def _sent(self, events):
        calls = (CallStart, CallArguments, CallEnd)
        return events if self.stream else [e for e in events if not isinstance(e, calls)]

    def _feed(self, text):
        self.buf += text
        out = []
        while True:
            if not self.inside:
                i = self.buf.find("<<")
                cut = len(self.buf) - (self.hold and self.buf.endswith("<")) if i < 0 else i
                out.append(ToolText(text=self.buf[:cut]))
                self.buf = self.buf[cut:]
                if i < 0:
                    return out
                self.buf, self.inside = self.buf[2:], True
            else:
                i = self.buf.find(">>")
                if i < 0:
                    return out
                body, self.buf, self.inside = self.buf[:i], self.buf[i + 2:], False
                out += self._call(body)

    def _call(self, body):
        name, _, arguments = body.partition(" ")
        try:
            json.loads(arguments)
        except ValueError:
            return [CallError(message="not JSON", text=f"<<{body}>>")]
        n = len(self.calls)
        self.calls.append((name, arguments))
        cid = (self.streamed_ids or "call_{}").format(n) if self.ids else None
        events = [CallStart(index=n, name=name, id=cid), CallArguments(index=n, text=arguments)]
        return events + [CallEnd(index=n)] if self.end else events

    def finish(self):
        out = self._feed("")
        if self.buf:
            out.append(ToolText(text=("<<" if self.inside else "") + self.buf))
        calls = tuple(ParsedCall(name=name, arguments=(self.final or str)(arguments),
                                 id=f"call_{n}" if self.ids else None)
                      for n, (name, arguments) in enumerate(self.calls))
        return ParseResult(events=tuple(self._sent(out)), calls=calls)


def _toy(**kw):
    return lambda tools: _Toy(tools, **kw)


TOY_FIXTURES = [
    ToolFixture('Sure <3. <<get {"city": "Paris", "n": [1, 2]}>><<now {}>> done', [
        {"name": "get", "arguments": {"city": "Paris", "n": [1, 2]}},
        {"name": "now", "arguments": {}}], "Sure <3.  done"),
    ToolFixture("no call at all, just < and > and <", [], "no call at all, just < and > and <"),
    ToolFixture("<<get {oops>> then <<now {}>>", [{"name": "now", "arguments": {}}],
                "<<get {oops>> then ", errors=True),
]


def _fmt(parser):
    from mlxcel.toolcalls.api import ToolFormat

    return ToolFormat(name="toy", detect=lambda t: "<<" in t, parser=parser)


@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_format_conforms_streaming_or_reporting_at_finish(stream):
    check_tool_format(_fmt(_toy(stream=stream)), TOY_FIXTURES,
                      template="{% if tools %}<<{% endif %}")


def test_the_tool_format_runner_catches_a_chunking_bug():
    with pytest.raises(AssertionError, match="fixture 0: fed as"):
        check_tool_format(_fmt(_toy(hold=False)), TOY_FIXTURES)


@pytest.mark.parametrize("fixture,match", [
    (("<<get {}>>", [{"name": "got", "arguments": {}}]), "calls .* != expected"),
    (("<<get {}>>", [{"name": "get", "arguments": {}}], "x"), "content '' != expected 'x'"),
    (("<<get [1]>>", [{"name": "get", "arguments": [1]}]), "not a JSON object's text"),
    (("<<get {oops>>", []), "unexpected CallError"),
    (('<<get {"a": 1, "a": 2}>>', [{"name": "get", "arguments": {"a": 2}}]),
     "name the key 'a' twice"),
    (("<<get {}>>", [{"name": "get", "arguments": {}}], None, True), "gave no CallError"),
])
def test_the_tool_format_runner_compares_calls_content_and_errors(fixture, match):
    with pytest.raises(AssertionError, match=match):
        check_tool_format(_fmt(_toy()), [fixture])


def test_the_streamed_calls_must_be_the_calls_finish_reports():
    spaced = _fmt(_toy(final=lambda a: json.dumps(json.loads(a), indent=1)))
    with pytest.raises(AssertionError, match="call 0 streamed as 'get' '{\"a\": 1}'; finish"):
        check_tool_format(spaced, [('<<get {"a": 1}>>', [{"name": "get", "arguments": {"a": 1}}])])
    check_tool_format(_fmt(_toy(ids=True)), [("<<f {}>>", [{"name": "f", "arguments": {},
                                                             "id": "call_0"}])])
    with pytest.raises(AssertionError, match="calls .* != expected"):
        check_tool_format(_fmt(_toy(ids=True)), [("<<f {}>>", [{"name": "f", "arguments": {},
                                                                 "id": "call_9"}])])
    with pytest.raises(AssertionError, match="streamed with id 'x0'; finish"):
        check_tool_format(_fmt(_toy(ids=True, streamed_ids="x{}")),
                          [("<<f {}>>", [{"name": "f", "arguments": {}}])])


def test_the_tool_format_runner_wants_every_call_ended_and_an_installed_name():
    with pytest.raises(AssertionError, match="call 0 never ends"):
        check_tool_format(_fmt(_toy(end=False)), [("<<get {}>>", [{"name": "get",
                                                                     "arguments": {}}])])
    with pytest.raises(AssertionError, match="no installed tool format 'no-such-format'"):
        check_tool_format("no-such-format", [])
    with pytest.raises(AssertionError, match="detect\\(\\) rejects the template"):
        check_tool_format(_fmt(_toy()), [], template="plain ChatML")


class _Strings:
    """A bare-text toy, ``<<name key=text>>``, that reads every value as a string: what
    ``check_text_values`` must refuse (an unschema'd ``7`` is the number 7)."""

    def __init__(self, tools):
        self.text = ""

    def feed(self, text, token_ids=()):
        self.text += text
        return []

    def finish(self):
        name, _, pair = self.text.removeprefix("<<").removesuffix(">>").partition(" ")
        key, _, value = pair.partition("=")
        call = ParsedCall(name=name, arguments=json.dumps({key: value}))
        return ParseResult(calls=(call,))


def test_the_text_values_check_refuses_a_format_that_reads_numbers_as_strings():
    def write(name, arguments):
        return f"<<{name}" + "".join(f" {k}={v}" for k, v in arguments.items()) + ">>"

    with pytest.raises(AssertionError, match=r"calls .*'x': '7'.* != expected .*'x': 7"):
        check_text_values(_fmt(lambda tools: _Strings(tools)), write)
