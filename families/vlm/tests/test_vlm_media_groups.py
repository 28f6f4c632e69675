"""Image rows that arrive together prefill in one padded group: each row's first-token
log-probabilities and its tokens equal the same request's alone, on a left-padded
(shared-cache) and a right-padded (mixed-cache) model, across chunks and past a
prompt-cache hit; text rows never join an image group."""

from __future__ import annotations

import asyncio

import pytest
from mlxcel.testing.engine import cpu_policy, engine_for, media_request, request
from mlxcel.testing.vlm_reference import feed_rows, noise_item
from mlxcel.types.requests import SamplingParams

MARKS = {"qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
         "gemma3": "<start_of_image>"}
LOGPROBS = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=5)


def _prompts(path, shape):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    mark = MARKS[shape]
    texts = [f"Look at {mark} and say what colour it is, in a few words please.",
             f"Here is a picture {mark} of something. Describe the light, the shapes and "
             "the colours in it, one by one, and then say which one is the brightest."]
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


async def _collect(engine, req) -> tuple[list[int], list]:
    """A request's tokens and their log-probabilities."""
    ids, logprobs = [], []
    async for event in engine.submit(req):
        ids.extend(event.token_ids)
        logprobs.extend(event.logprobs)
    return ids, logprobs


def _run(engine, reqs):
    async def go():
        return await asyncio.gather(*(_collect(engine, r) for r in reqs))
    return asyncio.run(go())


def _tower_calls(model, monkeypatch) -> list[int]:
    """One entry per call of ``model``'s vision tower from now on (a spy)."""
    tower_type = type(model.model.vision_tower)
    calls: list[int] = []
    original = tower_type.__call__

    def spy(self, *args, **kw):
        calls.append(1)
        return original(self, *args, **kw)

    monkeypatch.setattr(tower_type, "__call__", spy)
    return calls


def _close(got, want) -> None:
    """Tokens equal, and each token's log-probability and top 5 within float32 noise."""
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want, strict=True):
        assert tokens == want_tokens
        for a, b in zip(logprobs, want_logprobs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=2e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=2e-4)


@pytest.mark.parametrize("align", [1, 16])
@pytest.mark.parametrize("shape", sorted(MARKS))
def test_image_rows_prefill_together_as_each_alone(vlm_checkpoint, shape, align,
                                                   monkeypatch):
    """``align``: CUDA's rule that prefill columns are a multiple of it (more padding)."""
    path = vlm_checkpoint(shape)
    rows = feed_rows(monkeypatch)
    engine = engine_for(path, parallel=4, chunk=16, cache=1 << 26,
                        policy=cpu_policy(burst_chunks=8, prefill_align=align))
    try:
        model = engine.worker.checkpoint.model
        assert engine.worker.media_grouped
        prompts = [model.expand_media(ids, [noise_item(seed)], {})
                   for ids, seed in zip(_prompts(path, shape), (1, 2), strict=True)]
        assert len({len(p.token_ids) for p in prompts}) == 2  # unequal: padded

        def reqs():
            return [media_request(p, 4, sampling=LOGPROBS) for p in prompts]

        grouped = _run(engine, reqs())
        assert max(rows) == 2, "the two image rows did not prefill in one group"
        rows.clear()
        hit = _run(engine, reqs())  # both hit the prompt cache, then prefill together
        assert max(rows) == 2
        engine.worker.prompt_cache.reset()
        lone = _run(engine, reqs()[1:])  # a lone image row, padded to the alignment
    finally:
        engine.shutdown()
    solo = engine_for(path, parallel=1, chunk=16)
    try:
        alone = [_run(solo, [r])[0] for r in reqs()]
    finally:
        solo.shutdown()
    _close(grouped, alone)
    _close(hit, alone)
    _close(lone, alone[1:])


def test_text_rows_never_join_an_image_group(vlm_checkpoint, monkeypatch):
    path = vlm_checkpoint("qwen2_vl")
    rows = feed_rows(monkeypatch)
    engine = engine_for(path, parallel=4, chunk=16, policy=cpu_policy(burst_chunks=8))
    try:
        model = engine.worker.checkpoint.model
        ids = _prompts(path, "qwen2_vl")[0]
        image = media_request(model.expand_media(ids, [noise_item(3)], {}), 3)
        text = request(ids[-12:], 3)
        _run(engine, [image, text, request(ids[-9:], 3)])
    finally:
        engine.shutdown()
    assert rows and max(rows) == 1  # the image row prefilled alone; the text rows apart


@pytest.mark.parametrize("shape", ["qwen2_vl", "qwen2_5_vl", "gemma3"])
def test_a_groups_images_encoded_in_one_call_equal_each_alone(vlm_checkpoint, shape):
    import mlx.core as mx
    from mlxcel.families.api import LoadOptions
    from mlxcel_family_vlm.features import encoded_together
    from mlxcel_family_vlm.load import decoder, load
    from tokenizers import Tokenizer

    path = vlm_checkpoint(shape)
    model = decoder(load(path, LoadOptions()))
    mark = (MARKS | {"qwen2_5_vl": MARKS["qwen2_vl"]})[shape]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tok.encode(f"One {mark} and two {mark} pictures.", add_special_tokens=False).ids
    prompts = [model.expand_media(ids, [noise_item(4), noise_item(5, 84, 84)], {}),
               model.expand_media(ids, [noise_item(5, 84, 84), noise_item(6, 28, 28)], {})]
    held = {prompts[1].digests[1]}  # already in the feature cache: not encoded again
    together = encoded_together(model.model, prompts, held.__contains__)
    assert set(together) == {prompts[0].digests[0], prompts[0].digests[1]}
    for prompt in prompts:
        for i, digest in enumerate(prompt.digests):
            if digest in together:
                want, got = _alone(model, prompt, i), together[digest]
                assert got.shape == want.shape
                assert mx.allclose(got, want, atol=1e-4).item()


def _alone(model, prompt, i):
    """Image ``i`` of ``prompt`` encoded alone (the family's per-image path)."""
    import mlx.core as mx
    from mlxcel_family_vlm.features import _per_image

    inputs = {k: mx.array(v) for k, v in prompt.inputs.items() if k != "rule"}
    pixels = inputs.pop("pixel_values")
    encoders = _per_image(model.model, prompt, pixels, inputs)
    return encoders[i]()


@pytest.mark.parametrize("together", [True, False])
def test_a_group_of_new_images_runs_the_tower_once_where_the_policy_says(
        vlm_checkpoint, monkeypatch, together):
    path = vlm_checkpoint("qwen2_vl")
    engine = engine_for(path, parallel=4, chunk=16,
                        policy=cpu_policy(burst_chunks=8, media_together=together))
    try:
        model = engine.worker.checkpoint.model
        calls = _tower_calls(model, monkeypatch)
        ids = _prompts(path, "qwen2_vl")
        prompts = [model.expand_media(i, [noise_item(seed)], {})
                   for i, seed in zip(ids, (11, 12), strict=True)]
        grouped = _run(engine, [media_request(p, 3) for p in prompts])
        assert len(calls) == (1 if together else 2)
        assert engine.worker.features.misses == 2
    finally:
        engine.shutdown()
    solo = engine_for(path, parallel=1, chunk=16)
    try:
        alone = [_run(solo, [media_request(p, 3)])[0] for p in prompts]
    finally:
        solo.shutdown()
    assert [t for t, _ in grouped] == [t for t, _ in alone]


def test_an_image_the_tower_fails_on_fails_its_row_not_its_group(vlm_checkpoint,
                                                                 monkeypatch):
    path = vlm_checkpoint("qwen2_vl")
    rows = feed_rows(monkeypatch)
    engine = engine_for(path, parallel=4, chunk=16, policy=cpu_policy(burst_chunks=8))
    try:
        model = engine.worker.checkpoint.model
        prompts = [model.expand_media(ids, [noise_item(seed)], {})
                   for ids, seed in zip(_prompts(path, "qwen2_vl"), (21, 22), strict=True)]
        bad = prompts[0].digests[0]
        original = model.media_embeddings

        def embeddings(prompt, features):
            if bad in prompt.digests:
                raise RuntimeError("the vision tower failed on this image")
            return original(prompt, features)

        monkeypatch.setattr(model, "media_embeddings", embeddings)
        async def last_events():
            async def last(req):
                events = [e async for e in engine.submit(req)]
                return [t for e in events for t in e.token_ids], events[-1]
            return await asyncio.gather(*(last(media_request(p, 3)) for p in prompts))

        got = asyncio.run(last_events())
    finally:
        engine.shutdown()
    assert 2 in rows  # they prefilled as a group first
    (tokens, last), (other, other_last) = got
    assert tokens == [] and last.finish_reason == "error"
    assert "vision tower failed" in last.error
    assert other_last.finish_reason == "length"
    solo = engine_for(path, parallel=1, chunk=16)
    try:
        alone = _run(solo, [media_request(prompts[1], 3)])[0][0]
    finally:
        solo.shutdown()
    assert other == alone


@pytest.mark.parametrize("shape", sorted(MARKS))
def test_a_cached_image_row_beside_a_new_one_builds_no_whole_prompt(vlm_checkpoint, shape,
                                                                   monkeypatch):
    """An image row whose image lies in its cached prefix (an agent's next turn), grouped
    with a new image row, takes its tokens' own embeddings in the chunk where the other
    row's image needs them, not its whole prompt's; both give their solo tokens. (On the
    shared path's right-aligned rows a hit beside a cold row reuses nothing: there it
    computes its whole prompt, image included.)"""
    path = vlm_checkpoint(shape)
    rows = feed_rows(monkeypatch)
    engine = engine_for(path, parallel=4, chunk=16, cache=1 << 26,
                        policy=cpu_policy(burst_chunks=8))
    try:
        model = engine.worker.checkpoint.model
        prompts = [model.expand_media(ids, [noise_item(seed)], {})
                   for ids, seed in zip(_prompts(path, shape), (31, 32), strict=True)]
        calls = {"text": 0, "media": []}
        text, media = model.text_embeddings, model.media_embeddings

        def text_embeddings(ids):
            calls["text"] += 1
            return text(ids)

        def media_embeddings(prompt, features):
            calls["media"].append(prompt.digests)
            return media(prompt, features)

        monkeypatch.setattr(model, "text_embeddings", text_embeddings)
        monkeypatch.setattr(model, "media_embeddings", media_embeddings)
        _run(engine, [media_request(prompts[0], 4)])
        calls["media"].clear()
        rows.clear()
        got = _run(engine, [media_request(p, 4, sampling=LOGPROBS) for p in prompts])
        mixed = engine.worker.path == "mixed"
    finally:
        engine.shutdown()
    assert max(rows) == 2
    if mixed:
        assert calls["text"] >= 1
        assert calls["media"] == [prompts[1].digests]  # the new row's only
    else:
        assert calls["text"] == 0 and len(calls["media"]) == 2
    solo = engine_for(path, parallel=1, chunk=16)
    try:
        alone = [_run(solo, [media_request(p, 4, sampling=LOGPROBS)])[0] for p in prompts]
    finally:
        solo.shutdown()
    _close(got, alone)


def test_a_row_that_leaves_mid_prefill_leaves_its_group_running(vlm_checkpoint):
    """One of two grouped image rows is cancelled between its prefill chunks: the other
    finishes with its solo tokens, the cancelled one ends as cancelled."""
    from mlxcel.testing.engine import ListSink, run_until_done, worker_for

    path = vlm_checkpoint("qwen2_vl")
    worker = worker_for(path, chunk=16, parallel=4, burst_chunks=2)
    model = worker.checkpoint.model
    prompts = [model.expand_media(ids, [noise_item(seed)], {})
               for ids, seed in zip(_prompts(path, "qwen2_vl"), (41, 42), strict=True)]
    sinks = [ListSink(), ListSink()]
    for prompt, sink in zip(prompts, sinks, strict=True):
        worker.enqueue(media_request(prompt, 3), sink)
    worker.step()  # the group's first chunk
    assert worker.prefilling is not None and len(worker.prefilling.seqs) == 2
    sinks[0].cancelled = True
    run_until_done(worker, sinks[1:])
    solo = engine_for(path, parallel=1, chunk=16)
    try:
        alone = _run(solo, [media_request(prompts[1], 3)])[0][0]
    finally:
        solo.shutdown()
    assert sinks[1].tokens == alone
    assert not sinks[0].tokens
    assert sinks[0].done and sinks[0].last.finish_reason == "cancelled"


def test_one_rows_new_images_go_through_the_tower_together(vlm_checkpoint, monkeypatch):
    from tokenizers import Tokenizer

    path = vlm_checkpoint("qwen2_vl")
    engine = engine_for(path, parallel=2, chunk=64,
                        policy=cpu_policy(media_together=True))
    try:
        model = engine.worker.checkpoint.model
        calls = _tower_calls(model, monkeypatch)
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        mark = MARKS["qwen2_vl"]
        ids = tok.encode(f"Compare {mark} with {mark}, please, in a few words.",
                         add_special_tokens=False).ids
        prompt = model.expand_media(ids, [noise_item(51), noise_item(52, 84, 84)], {})
        got = _run(engine, [media_request(prompt, 3)])[0][0]
        assert len(calls) == 1 and engine.worker.features.misses == 2
    finally:
        engine.shutdown()
    solo = engine_for(path, parallel=1, chunk=64)
    try:
        assert got == _run(solo, [media_request(prompt, 3)])[0][0]
    finally:
        solo.shutdown()
