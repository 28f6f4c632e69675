"""Conformance runners: what a plugin must do to be served like a builtin one.

``check_family(checkpoint, family)``: the installed family that claims the checkpoint is
``family``; it loads; greedy outputs under batching (``--parallel 4``, a padded group, rows
joining a running batch) equal solo runs; and the prompt cache reuses the state of a
finished request whose context the next prompt extends (the agent-turn case every cache
kind supports), with the tokens of a cold run. Core's own families pass it
(``core/tests/test_conformance.py``); a family distribution's test calls it on a tiny
checkpoint of its types. Each check raises ``AssertionError`` naming what failed.

``check_media_model(checkpoint, items, token_ids)``: a ``generate`` decoder's media
contract (``mlxcel.families.media``) on a prompt with placeholders for ``items``.

Side tasks: ``check_embedder`` and ``check_reranker`` (``mlxcel.testing.task_conformance``,
re-exported here). Tool formats: ``check_tool_format`` and ``check_text_values``
(``mlxcel.testing.tool_conformance``, re-exported here); forced-call grammars:
``forced_calls`` and ``check_grammar``. Media decoders: ``check_media_decoder``
(``mlxcel.testing.media_conformance``, re-exported here). Drafters: ``check_drafter``
(``mlxcel.testing.draft_conformance``, re-exported here).
"""

from __future__ import annotations

import random
from typing import Any

from mlxcel.testing.draft_conformance import check_drafter  # noqa: F401
from mlxcel.testing.engine import cpu_policy, engine_for, request, run, solo_tokens
from mlxcel.testing.media_conformance import check_media_decoder  # noqa: F401
from mlxcel.testing.speech_conformance import check_speaker, check_transcriber  # noqa: F401
from mlxcel.testing.task_conformance import check_embedder, check_reranker  # noqa: F401
from mlxcel.testing.tool_conformance import (  # noqa: F401 - the kit's public names
    NULL_VALUES,
    UNTYPED_VALUES,
    ToolFixture,
    check_text_values,
    check_tool_format,
    chunkings_of,
    merge_events,
    parse_pieces,
    streamed_calls,
)
from mlxcel.types.toolcalls import ToolText


def _prompts(vocab: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    top = min(vocab, 400)
    return [[rng.randrange(5, top) for _ in range(n)] for n in (5, 23, 40, 9, 31, 64)]


def check_family(checkpoint: Any, family: str) -> None:
    """Run every family check on ``checkpoint`` (see the module docstring)."""
    import json
    import pathlib

    from mlxcel.model.loader import select_family
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


# -- forced-call grammars ------------------------------------------------------------------
def _nested(levels: int) -> dict:
    """An object nested ``levels`` deep, each level's one property required."""
    node: dict = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"x": node}, "required": ["x"]}
    return node


# tool parameters a client may send that are odd (not objects, wrong keyword types, refs)
# or deep: a format's grammar must still build a constraint that compiles
ODD_PARAMETERS: tuple[Any, ...] = (
    True, False, [], {"properties": []},
    {"properties": {"a": True}, "required": "a"},
    {"properties": {"a": {"type": 123}}, "required": [1, None]},
    {"properties": {"a": {"enum": "x"}, "b": {"anyOf": "x", "type": ["integer", 5]}}},
    {"properties": {"a": {"items": [1]}, "b": {"type": "array", "items": True}}},
    {"properties": {"a": {"enum": [{"x": 1}, [1], "a<b", "\x01", 2]}}, "required": ["a"]},
    {"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "integer"}}},
    {"type": "object", "properties": {"a": _nested(40)}, "required": ["a"]},
)


def forced_calls(checkpoint: Any, grammar: Any, new_parser: Any, tools: tuple,
                 markers: tuple[str, ...], seeds: int = 6) -> list[tuple[Any, str]]:
    """Run ``grammar(tools, "required")`` on ``checkpoint``'s engine for ``seeds`` random
    samplings; each answer must end in the constraint (``stop``), parse with the format's
    parser into calls and nothing else, and write every marker of ``markers`` as the
    tokenizer's own token (never spelled in pieces). Returns ``(calls, text)`` per answer,
    for the caller's schema checks."""
    from mlxcel.engine.constraints import ConstraintCompiler
    from mlxcel.types import GenerationRequest, SamplingParams

    engine = engine_for(checkpoint, 2)
    try:
        tok = engine.worker.checkpoint.tokenizer
        compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids))
        guide = compiler.compile(grammar(tools, "required"))
        outputs = run(engine, [
            GenerationRequest(request_id=f"g{seed}", prompt_tokens=(5, 6, 7 + seed),
                              max_tokens=300, guide=guide,
                              sampling=SamplingParams(temperature=1.0, seed=seed))
            for seed in range(seeds)])
    finally:
        engine.shutdown()
    answers = []
    for ids, last in outputs:
        assert last.finish_reason == "stop"
        text = tok.decode(ids, skip_special=False)
        parser = new_parser(tools)
        parser.feed(text)
        result = parser.finish()
        assert result.calls and not [e for e in result.events if isinstance(e, ToolText)], \
            text
        for marker in markers:
            assert ids.count(tok.hf.token_to_id(marker)) == text.count(marker) > 0, marker
        answers.append((result.calls, text))
    return answers


def check_grammar(grammar: Any, vocabulary: Any, cache_dir: Any, parameters: dict) -> None:
    """A format's ``grammar(tools, choice)``: for each of ``ODD_PARAMETERS`` it builds a
    constraint that compiles for ``vocabulary``, and its size grows at most linearly with
    the tools (8 and 64 tools taking ``parameters``), within the compile limits."""
    from mlxcel.engine.constraints import ConstraintCompiler
    from mlxcel.engine.constraints.limits import MAX_PATTERN_BYTES
    from mlxcel.types.messages import Tool

    def tool(name: str, params: Any) -> Tool:
        return Tool(name=name, definition={"type": "function", "function": {
            "name": name, "parameters": params}})

    compiler = ConstraintCompiler(vocabulary, cache_dir=cache_dir)
    for i, params in enumerate(ODD_PARAMETERS):
        constraint = grammar((tool("f", params),), "required")
        assert constraint is not None, f"ODD_PARAMETERS[{i}]: no grammar"
        assert compiler.compile(constraint).matcher(), f"ODD_PARAMETERS[{i}]"
    small, large = (len(grammar(tuple(tool(f"tool_{i}", parameters) for i in range(n)),
                                "required").pattern) for n in (8, 64))
    assert large < 8 * small + 8 * 64 and large < MAX_PATTERN_BYTES // 4, (small, large)


def check_media_model(checkpoint: Any, items: list[Any], token_ids: list[int]) -> None:
    """Run the media contract's checks (``mlxcel.families.media``) on ``checkpoint``'s
    decoder: ``token_ids`` is a rendered prompt holding one placeholder per item of
    ``items`` (decoded items, e.g. ``mlxcel.media.image.decode`` of PNG bytes).

    The expansion's spans, digests and growth agree with its ids; the embeddings and
    positions cover the whole prompt; the text after the items fed as token ids (with
    its positions) gives the logits it gives fed as embeddings; an image row's greedy
    tokens batched beside a text row equal the same request alone; the same prompt again
    reuses the prompt cache past its items; an image its processor cannot take (sides
    500 times apart, one pixel) is expanded or refused with ``MediaRefused`` or a
    ``ValueError``, which core answers with a 400, never another error."""
    from mlxcel.engine.cache.entries import BLOCK_SIZE
    from mlxcel.engine.media_rows import FeatureCache
    from mlxcel.families.media import media_kinds

    engine = engine_for(checkpoint, parallel=2, chunk=16, cache=1 << 26)
    try:
        model = engine.worker.checkpoint.model
        assert "image" in media_kinds(model), "the decoder lacks a media contract member"
        prompt = model.expand_media(list(token_ids), items, {})
        _odd_images_expand_or_are_refused(model, token_ids, len(items))
        ids = prompt.token_ids
        assert len(prompt.spans) == len(items) == len(prompt.digests) == len(prompt.grown)
        assert len(ids) == len(token_ids) + sum(added for _, added in prompt.grown)
        assert [d for _, d in prompt.digest_positions()] == [i.digest for i in items]
        for start, length in prompt.spans:
            assert 0 <= start and start + length <= len(ids) and length > 0
        positions, _ = model.media_positions(prompt)
        embeds = model.media_embeddings(prompt, FeatureCache(4))
        assert embeds.shape[:2] == (1, len(ids)), f"embeddings {embeds.shape} for {len(ids)}"
        assert positions is None or positions.shape[-1] == len(ids)
        image = request(ids, 6, media=prompt, media_digests=prompt.digest_positions())
        text = request(list(token_ids), 6)
        together = [out for out, _ in run(engine, [image, text])]
        _, again = run(engine, [image])[0]
    finally:
        engine.shutdown()
    _text_tail_matches(checkpoint, prompt)
    assert together == solo_tokens(checkpoint, [image, text]), \
        "an image row batched beside a text row differs from the two alone"
    _media_rows_group(checkpoint, model, token_ids, items, image)
    whole = (len(ids) - 1) // BLOCK_SIZE * BLOCK_SIZE  # the prompt's whole blocks
    assert whole > max(s + n for s, n in prompt.spans), \
        "give a prompt with a whole 16-token block of text after its items"
    assert again.usage.cached_tokens >= whole, \
        "the same image prompt again did not reuse the cache past its items"


def _media_rows_group(checkpoint: Any, model: Any, token_ids: list[int], items: list[Any],
                      image: Any) -> None:
    """Where the decoder says its media rows prefill together (``media_batch``): image
    rows of unequal length in one padded group, over several chunks, one of them past a
    prompt-cache hit, give each row's tokens alone; so do they with their images encoded
    in one call (``media_features``), where the decoder has it."""
    from mlxcel.engine.media_rows import batches_media

    if not batches_media(model):
        return
    longer = model.expand_media([*token_ids, *token_ids[-7:]], items[::-1], {})  # text
    other = request(longer.token_ids, 6, media=longer,
                    media_digests=longer.digest_positions())
    engine = engine_for(checkpoint, parallel=3, chunk=16, cache=1 << 26,
                        policy=cpu_policy(burst_chunks=8))
    try:
        assert engine.worker.media_grouped, "media_batch is set, yet media rows do not group"
        run(engine, [image])  # stored: next time its items lie in its cached prefix
        mixed = [out for out, _ in run(engine, [image, other])]  # a text tail beside images
        again = [out for out, _ in run(engine, [image, other])]  # both hit
    finally:
        engine.shutdown()
    together = None
    if hasattr(model, "media_features"):  # the group's images through one tower call
        engine = engine_for(checkpoint, parallel=3, chunk=16,
                            policy=cpu_policy(burst_chunks=8, media_together=True))
        try:
            together = [out for out, _ in run(engine, [image, other])]
        finally:
            engine.shutdown()
    alone = solo_tokens(checkpoint, [image, other])
    assert mixed == alone, "image rows prefilled together differ from each alone"
    assert again == alone, "image rows past a prompt-cache hit, grouped, differ from alone"
    assert together in (None, alone), \
        "image rows whose images went through media_features together differ from alone"


def _odd_images_expand_or_are_refused(model: Any, token_ids: list[int], count: int) -> None:
    from mlxcel.families.media import MediaRefused
    from mlxcel.media.image import plain

    for size in ((4000, 8), (8, 4000), (1, 1)):
        item = plain(*size, rgb=(90, 120, 200))
        try:
            model.expand_media(list(token_ids), [item] * count, {})
        except MediaRefused as exc:
            assert 0 <= exc.index < count, f"MediaRefused names item {exc.index} of {count}"
        except ValueError:
            pass  # core answers 400 for the request's media as a whole
        except Exception as exc:
            raise AssertionError(f"expand_media raised {type(exc).__name__} for a "
                                 f"{size[0]}x{size[1]} image; refuse an item with "
                                 "MediaRefused (or a ValueError)") from exc


def _text_embeddings_match(model: Any, prompt: Any, embeds: Any) -> None:
    """The decoder's optional ``text_embeddings`` give ``media_embeddings``' values at the
    prompt's text positions."""
    import mlx.core as mx

    text = getattr(model, "text_embeddings", None)
    if text is None:
        return
    ids = mx.array([list(prompt.token_ids)], dtype=mx.int32)
    got = text(ids)
    assert got.shape == embeds.shape, f"text_embeddings gave {got.shape}, want {embeds.shape}"
    inside = {i for s, n in prompt.spans for i in range(s, s + n)}
    keep = mx.array([i for i in range(len(prompt.token_ids)) if i not in inside])
    gap = float(mx.abs(got[:, keep].astype(mx.float32)
                       - embeds[:, keep].astype(mx.float32)).max())
    assert gap < 1e-4 * max(1.0, float(mx.abs(embeds).max())), \
        f"text_embeddings differ from media_embeddings at text positions by {gap}"


def _text_tail_matches(checkpoint: Any, prompt: Any) -> None:
    """``prompt`` fed whole as embeddings, and fed as embeddings up to the end of its last
    item then as token ids: the text's logits agree (the media contract's ``__call__``)."""
    import mlx.core as mx

    from mlxcel.engine.media_rows import FeatureCache
    from mlxcel.testing.engine import _load

    model, ids = _load(checkpoint)().model, prompt.token_ids
    cut = max(s + n for s, n in prompt.spans)
    assert cut < len(ids), "give a prompt with text after its items"
    positions, _ = model.media_positions(prompt)
    embeds = model.media_embeddings(prompt, FeatureCache(4))
    _text_embeddings_match(model, prompt, embeds)
    tokens = mx.array([list(ids)], dtype=mx.uint32)

    def at(n: int, m: int) -> Any:
        return None if positions is None else positions[..., n:m]

    # fresh slices each call: a model may scale the embeddings it is given in place
    # (mlx-vlm's Gemma 3: ``h = inputs_embeds; h *= ...``), as the engine's slices allow
    whole = model(tokens, model.make_cache(), embeds=embeds[:, :len(ids)], positions=positions)
    cache = model.make_cache()
    model(tokens[:, :cut], cache, embeds=embeds[:, :cut], positions=at(0, cut))
    tail = model(tokens[:, cut:], cache, positions=at(cut, len(ids)))
    gap = float(mx.abs(tail.astype(mx.float32) - whole[:, cut:].astype(mx.float32)).max())
    assert gap < 1e-3 * max(1.0, float(mx.abs(whole).max())), \
        f"the text after the items fed as ids differs from its embeddings by {gap}"
