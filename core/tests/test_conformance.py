"""Core's builtin families pass the conformance runner third-party families use."""

from __future__ import annotations

import pytest
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.conformance import check_family


@pytest.mark.parametrize("shape,family", [("qwen3", "mlx-lm-text"),
                                          ("gemma4_text", "mlx-lm-generic"),
                                          ("qwen3_next", "mlx-lm-generic")])
def test_builtin_families_conform(shape, family, mlxcel_checkpoint_cache):
    check_family(cached_checkpoint(shape, cache_dir=mlxcel_checkpoint_cache, dtype="float32"),
                 family)


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
    """A toy format, ``text <<name {json}>> text``, parsed as it streams; ``hold=False``
    forgets to keep back a ``<`` at a chunk's end, the bug a chunking check must catch."""

    def __init__(self, tools, hold=True, end=True):
        self.buf, self.name, self.inside, self.n, self.hold, self.end = "", None, False, 0, \
            hold, end

    def _ev(self, kind, text="", name=None):
        from mlxcel.toolcalls.api import ParseEvent

        return ParseEvent(kind=kind, text=text, index=self.n, name=name)

    def feed(self, text):
        self.buf += text
        out = []
        while True:
            if not self.inside:
                i = self.buf.find("<<")
                if i < 0:
                    cut = len(self.buf) - (self.hold and self.buf.endswith("<"))
                    out.append(self._ev("content", self.buf[:cut]))
                    self.buf = self.buf[cut:]
                    return out
                out.append(self._ev("content", self.buf[:i]))
                self.buf, self.inside, self.name = self.buf[i + 2:], True, None
            elif self.name is None:
                if " " not in self.buf:
                    return out
                self.name, _, self.buf = self.buf.partition(" ")
                out.append(self._ev("call_start", name=self.name))
            else:
                i = self.buf.find(">>")
                cut = len(self.buf) - self.buf.endswith(">") if i < 0 else i
                out.append(self._ev("call_arguments", self.buf[:cut]))
                self.buf = self.buf[cut:]
                if i < 0:
                    return out
                if self.end:
                    out.append(self._ev("call_end"))
                self.buf, self.inside, self.n = self.buf[2:], False, self.n + 1

    def finish(self):
        out = self.feed("")
        return out + [self._ev("content", self.buf)] if self.buf else out


def _toy(**kw):
    return lambda tools: _Toy(tools, **kw)


TOY_FIXTURES = [
    ('Sure <3. <<get {"city": "Paris", "n": [1, 2]}>><<now {}>> done', [
        {"name": "get", "arguments": {"city": "Paris", "n": [1, 2]}},
        {"name": "now", "arguments": {}}], "Sure <3.  done"),
    ("no call at all, just < and > and <", [], "no call at all, just < and > and <"),
]


def _fmt(parser):
    from mlxcel.toolcalls.api import ToolFormat

    return ToolFormat(name="toy", detect=lambda t: "<<" in t, parser=parser)


def test_a_streaming_tool_format_conforms():
    from mlxcel.testing.conformance import check_tool_format

    check_tool_format(_fmt(_toy()), TOY_FIXTURES, template="{% if tools %}<<{% endif %}")


def test_the_tool_format_runner_catches_a_chunking_bug():
    from mlxcel.testing.conformance import check_tool_format

    with pytest.raises(AssertionError, match="fixture 0: fed as"):
        check_tool_format(_fmt(_toy(hold=False)), TOY_FIXTURES)


@pytest.mark.parametrize("fixture,match", [
    (("<<get {}>>", [{"name": "got", "arguments": {}}]), "calls .* != expected"),
    (("<<get {}>>", [{"name": "get", "arguments": {}}], "x"), "content '' != expected 'x'"),
    (("<<get {oops>>", [{"name": "get", "arguments": {}}]), "arguments are not JSON"),
])
def test_the_tool_format_runner_compares_calls_and_content(fixture, match):
    from mlxcel.testing.conformance import check_tool_format

    with pytest.raises(AssertionError, match=match):
        check_tool_format(_fmt(_toy()), [fixture])


def test_the_tool_format_runner_wants_every_call_ended_and_an_installed_name():
    from mlxcel.testing.conformance import check_tool_format

    with pytest.raises(AssertionError, match="call 0 never ends"):
        check_tool_format(_fmt(_toy(end=False)), [("<<get {}>>", [])])
    with pytest.raises(AssertionError, match="no installed tool format 'no-such-format'"):
        check_tool_format("no-such-format", [])
    with pytest.raises(AssertionError, match="detect\\(\\) rejects the template"):
        check_tool_format(_fmt(_toy()), [], template="plain ChatML")
