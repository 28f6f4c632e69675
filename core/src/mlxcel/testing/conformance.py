"""Conformance runners: what a plugin must do to be served like a builtin one.

``check_family(checkpoint, family)``: the installed family that claims the checkpoint is
``family``; it loads; greedy outputs under batching (``--parallel 4``, a padded group, rows
joining a running batch) equal solo runs; and the prompt cache reuses the state of a
finished request whose context the next prompt extends (the agent-turn case every cache
kind supports), with the tokens of a cold run. Core's own families pass it
(``core/tests/test_conformance.py``); a family distribution's test calls it on a tiny
checkpoint of its types. Each check raises ``AssertionError`` naming what failed.
"""

from __future__ import annotations

import random
from typing import Any

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
