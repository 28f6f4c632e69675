"""Conformance runners: what a plugin must do to be served like a builtin one.

``check_family(checkpoint, family)``: the installed family that claims the checkpoint is
``family``; it loads; greedy outputs under batching (``--parallel 4``, a padded group, rows
joining a running batch) equal solo runs; and the prompt cache reuses the state of a
finished request whose context the next prompt extends (the agent-turn case every cache
kind supports), with the tokens of a cold run. Core's own families pass it
(``core/tests/test_conformance.py``); a family distribution's test calls it on a tiny
checkpoint of its types. Each check raises ``AssertionError`` naming what failed.

``check_tool_format(tool_format, fixtures)``: each fixture (model output text, the calls it
holds, optionally the content around them) parses to the same events fed whole, one
character at a time and in seeded random chunkings (adjacent content and argument fragments
merged, empty ones dropped), since a stream is cut wherever tokens end; and the events up to
``finish()`` give exactly the expected calls (name and parsed JSON arguments), every call
started is ended, and indices count up from 0.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

from mlxcel.testing.engine import engine_for, request, run, solo_tokens


def _prompts(vocab: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    top = min(vocab, 400)
    return [[rng.randrange(5, top) for _ in range(n)] for n in (5, 23, 40, 9, 31, 64)]


def check_family(checkpoint: Any, family: str) -> None:
    """Run every family check on ``checkpoint`` (see the module docstring)."""
    import json
    import pathlib

    from mlxcel.engine.loader import select_family
    from mlxcel.plugins import load_plugins

    config = json.loads((pathlib.Path(checkpoint) / "config.json").read_text())
    picked = select_family(load_plugins().families, config, pathlib.Path(checkpoint))
    assert picked.name == family, f"model_type {config.get('model_type')!r} is served by " \
                                  f"{picked.name!r}, not {family!r}"
    engine = engine_for(checkpoint, parallel=4, chunk=64, cache=1 << 26)
    try:
        vocab = engine.worker.checkpoint.tokenizer.vocab_size
        reqs = [request(p, 6 + 2 * i) for i, p in enumerate(_prompts(vocab))]
        together = [ids for ids, _ in run(engine, reqs[:4], then=reqs[4:], stagger=0.01)]
        first = reqs[-1]
        out, _ = run(engine, [first])[0]
        turn = request([*first.prompt_tokens, *out, 7, 8, 9], 6)
        reused, last = run(engine, [turn])[0]
        cached = last.usage.cached_tokens
    finally:
        engine.shutdown()
    alone = solo_tokens(checkpoint, [*reqs, turn])
    assert together == alone[:-1], "batched greedy outputs differ from solo runs"
    assert cached >= len(first.prompt_tokens), \
        f"the next turn reused {cached} tokens of a {len(first.prompt_tokens)}-token prompt"
    assert reused == alone[-1], "a prompt-cache hit changed the output"


def check_dialect(client: Any, dialect: Any, path: str, key: str) -> None:
    """A dialect on a running app (``client``: an httpx-style client of an app started with
    ``--api-key key``; ``path``: a GET route of the dialect that answers 200): its prefix
    owns the edge's error bodies, in its own shape (``Dialect.errors``), and every key form
    admits a request while none in the query string does."""
    from mlxcel import errors
    from mlxcel.lazy import resolve

    body = resolve(dialect.errors) if dialect.errors else None
    prefix = next(iter(dialect.prefixes), path)
    missing = client.get(f"{prefix}/no-such-route-here")
    assert missing.status_code == 401, missing.text  # no key: refused before routing
    if body is not None:
        want = body(errors.MissingApiKey(missing.json().get("error", {}).get("message", "")))
        assert _keys(missing.json()) == _keys(want), (missing.json(), want)
    for headers in ({"Authorization": f"Bearer {key}"}, {"Authorization": key},
                    {"x-api-key": key}):
        assert client.get(path, headers=headers).status_code == 200, headers
    assert client.get(f"{path}?api_key={key}").status_code == 401
    unknown = client.get(f"{prefix}/no-such-route-here", headers={"x-api-key": key})
    assert unknown.status_code == 404
    if body is not None:
        assert _keys(unknown.json()) == _keys(body(errors.NotFound("x"))), unknown.json()
    assert key not in missing.text + unknown.text


def _keys(doc: Any) -> Any:
    """The shape of a JSON body: its keys, nested (values aside)."""
    if isinstance(doc, dict):
        return {k: _keys(v) for k, v in doc.items()}
    return type(doc).__name__ if not isinstance(doc, (str, type(None))) else "scalar"


class ToolFixture(NamedTuple):
    """Model output ``text``, the ``calls`` in it (``{"name", "arguments"}`` with the
    arguments parsed), and the user-visible ``content`` (None: not checked)."""

    text: str
    calls: list[dict[str, Any]]
    content: str | None = None


def check_tool_format(tool_format: Any, fixtures: Any, *, tools: Any = (),
                      template: str | None = None, chunkings: int = 32, seed: int = 0) -> None:
    """Run the tool-format checks (see the module docstring) on every fixture.

    ``tool_format``: an installed format's name (then ``template``, if given, must select
    it among every installed format) or a ``ToolFormat``; ``fixtures``: ``ToolFixture``s or
    tuples of their fields; ``tools``: what ``new_parser(tools)`` is given."""
    from mlxcel.lazy import resolve

    fmt = _installed_format(tool_format, template) if isinstance(tool_format, str) \
        else tool_format
    if template is not None:
        assert fmt.detect(template), f"{fmt.name}: detect() rejects the template"
    new_parser, rng = resolve(fmt.parser), random.Random(seed)
    for n, fixture in enumerate(ToolFixture(*f) for f in fixtures):
        where = f"{fmt.name} fixture {n}"
        whole = _parse(new_parser, list(tools), [fixture.text], where)
        want = [{"name": c["name"], "arguments": c["arguments"]} for c in fixture.calls]
        got = _calls(whole, where)
        assert got == want, f"{where}: calls {got} != expected {want}"
        if fixture.content is not None:
            content = "".join(text for kind, text, _, _ in whole if kind == "content")
            assert content == fixture.content, f"{where}: content {content!r} != " \
                                               f"expected {fixture.content!r}"
        for pieces in _chunkings(fixture.text, rng, chunkings):
            split = _parse(new_parser, list(tools), pieces, where)
            assert split == whole, _difference(where, pieces, split, whole)


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


def _chunkings(text: str, rng: random.Random, count: int) -> list[list[str]]:
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


def _parse(new_parser: Any, tools: list, pieces: list[str], where: str) -> list[tuple]:
    """Every event of one parser fed ``pieces`` then finished, as merged tuples."""
    from mlxcel.toolcalls.api import ParseEvent

    parser = new_parser(tools)
    events = [e for piece in pieces for e in parser.feed(piece)] + list(parser.finish())
    merged: list[tuple] = []
    for e in events:
        assert isinstance(e, ParseEvent), f"{where}: {e!r} is not a ParseEvent"
        if e.kind in ("content", "call_arguments") and not e.text:
            continue
        last = merged[-1] if merged else None
        if last and e.kind == last[0] and e.kind in ("content", "call_arguments") \
                and e.index == last[2]:
            merged[-1] = (e.kind, last[1] + e.text, e.index, None)
        else:
            merged.append((e.kind, e.text, e.index, e.name))
    return merged


def _difference(where: str, pieces: list[str], split: list[tuple], whole: list[tuple]) -> str:
    """The first event where a chunking and the whole text part ways, and the chunking."""
    at = next((i for i, (a, b) in enumerate(zip(split, whole, strict=False)) if a != b),
              min(len(split), len(whole)))
    got, want = (events[at] if at < len(events) else "no event" for events in (split, whole))
    shown = repr(pieces) if len(pieces) <= 40 else f"{pieces[:40]!r}... ({len(pieces)} pieces)"
    return f"{where}: fed as {shown}, event {at} is {got}; the whole text gives {want}"


def _calls(events: list[tuple], where: str) -> list[dict[str, Any]]:
    """The calls the events describe; each must start (with a name), take argument
    fragments only while open, end, and parse as JSON."""
    import json

    calls: list[dict[str, Any]] = []
    open_ = None
    for kind, text, index, name in events:
        if kind == "call_start":
            assert open_ is None, f"{where}: call {index} starts inside call {open_}"
            assert index == len(calls), f"{where}: call index {index}, expected {len(calls)}"
            assert name, f"{where}: call {index} starts without a name"
            calls.append({"name": name, "arguments": ""})
            open_ = index
        elif kind in ("call_arguments", "call_end"):
            assert open_ == index, f"{where}: {kind} for call {index} while {open_} is open"
            if kind == "call_end":
                open_ = None
            else:
                calls[index]["arguments"] += text
    assert open_ is None, f"{where}: call {open_} never ends (finish() must end it)"
    for n, call in enumerate(calls):
        try:
            call["arguments"] = json.loads(call["arguments"])
        except ValueError:
            raise AssertionError(f"{where}: call {n} arguments are not JSON: "
                                 f"{call['arguments']!r}") from None
    return calls
