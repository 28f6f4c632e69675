"""Every cache mix batches: sliding-window, KV-shared, recurrent and MoE models decode
several rows at once on mlx-lm's batch caches, with the same greedy tokens as one at a time.

Checkpoints are float32, where batched and solo logits agree to ~1e-6 and no greedy pick
flips; in bfloat16 a pick whose top two logits lie within the dtype's rounding (~1e-2)
may (docs/explanation/batching.md, "Models on mlx-lm's batch caches").
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.engine.cache.prompt_cache import PromptCache
from mlxcel.engine.client import EngineClient
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import (
    cpu_policy,
    engine_for,
    request,
    run,
    solo_tokens,
    with_family,
)

# (name, model_type, config overrides): the families the issue names, each a mix of kinds
MODELS = {
    "gemma3": ("gemma3_text", None),
    "gemma4": ("gemma4_text", None),
    "gemma4-moe": ("gemma4_text", {"enable_moe_block": True, "num_experts": 4,
                                   "top_k_experts": 2, "moe_intermediate_size": 32}),
    "gpt-oss": ("gpt_oss", None),
    "ministral": ("ministral3", None),  # sliding-window Mistral
    "qwen3-next": ("qwen3_next", None),
    "qwen3.5": ("qwen3_5", None),
    "kimi-linear": ("kimi_linear", None),
    "nemotron-h": ("nemotron_h", None),
    "llama": ("llama", None),
    "qwen3": ("qwen3", None),
    "jamba": ("jamba", None),  # state layers that ignore padding: prefilled one per group
}
PATHS = {"llama": "shared", "qwen3": "shared"}
rng = random.Random(3)
# lengths around and past the 16-token sliding window
PROMPTS = [[rng.randrange(5, 400) for _ in range(n)] for n in (5, 23, 40, 9, 31, 64, 3, 18)]


def checkpoint(name, cache_dir):
    shape, overrides = MODELS[name]
    return cached_checkpoint(shape, cache_dir=cache_dir, dtype="float32", config=overrides)


def engine(path, parallel, cache_bytes=0, chunk=16, policy=None):
    return engine_for(path, parallel, cache=cache_bytes, chunk=chunk, policy=policy)


def _batched(path, reqs, burst=False):
    """``reqs`` on ``--parallel 4``: the first four at once (one prefill group, padded to
    its longest prompt), the others one by one into the running batch. ``burst``: prefill
    groups may take several chunks' tokens per step (as on CUDA), so a padded group's
    prompts take several chunks each."""
    e = engine(path, parallel=4, chunk=16 if burst else 64,
               policy=cpu_policy(burst_chunks=8) if burst else None)
    try:
        out = run(e, reqs[:4], then=reqs[4:], stagger=0.01)
        return e.worker, [ids for ids, _ in out], e.worker.stats
    finally:
        e.shutdown()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_batched_greedy_equals_solo(name, mlxcel_checkpoint_cache):
    """``--parallel 4``, prompts shorter and longer than the window, different lengths of
    output: a padded group prefills together, rows join and leave a running batch, and
    every request gets the tokens it gets alone."""
    path = checkpoint(name, mlxcel_checkpoint_cache)
    reqs = [request(p, 6 + 2 * i) for i, p in enumerate(PROMPTS)]
    alone = solo_tokens(path, reqs)
    worker, together, stats = _batched(path, reqs)
    assert worker.path == PATHS.get(name, "mixed")
    assert worker.grouped is (name != "jamba")
    assert together == alone
    # several rows per decode step: fewer steps than tokens; a group of several rows
    assert stats.decode_steps_processed < stats.total_decode_tokens
    if worker.grouped:
        assert stats.prefill_chunks_processed < len(reqs)


@pytest.mark.parametrize("name", ["gemma4", "qwen3-next", "gpt-oss"])
def test_padded_groups_prefilled_in_several_chunks(name, mlxcel_checkpoint_cache):
    path = checkpoint(name, mlxcel_checkpoint_cache)
    long = [PROMPTS[i] for i in (5, 2, 4, 1)]  # 64, 40, 31, 23 tokens, chunks of 16
    reqs = [request(p, 8) for p in long]
    alone = solo_tokens(path, reqs)
    _, together, stats = _batched(path, reqs, burst=True)
    assert together == alone
    assert stats.prefill_chunks_processed >= 2 and stats.sequences_started == 4


def test_jamba_state_layers_ignore_padding_so_rows_prefill_alone(mlxcel_checkpoint_cache):
    """The rule that sends jamba's rows to prefill one per group: its state layers never
    read the cache's padding, qwen3-next's do."""
    from mlxcel.engine.mixed_batch import pads_state

    families = load_plugins().families
    jamba = load_checkpoint(str(checkpoint("jamba", mlxcel_checkpoint_cache)), families)
    nxt = load_checkpoint(str(checkpoint("qwen3-next", mlxcel_checkpoint_cache)), families)
    gemma = load_checkpoint(str(checkpoint("gemma4", mlxcel_checkpoint_cache)), families)
    assert not pads_state(jamba.model) and pads_state(nxt.model) and pads_state(gemma.model)


def test_slots_show_several_gemma4_rows_decoding(mlxcel_checkpoint_cache):
    path = checkpoint("gemma4", mlxcel_checkpoint_cache)
    with make_client(path, parallel=4, slots=True) as c:
        wait_ready(c)
        body = {"messages": [{"role": "user", "content": "tell me a story"}],
                "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
        codes: list[int] = []
        threads = [threading.Thread(target=lambda: codes.append(
            c.post("/v1/chat/completions", json=body).status_code)) for _ in range(3)]
        for t in threads:
            t.start()
        most, deadline = 0, time.time() + 60
        while most < 3 and time.time() < deadline and any(t.is_alive() for t in threads):
            slots = c.get("/slots").json()
            most = max(most, sum(s["state"] == "decoding" for s in slots))
        for t in threads:
            t.join(120)
        assert codes == [200, 200, 200]
        assert most >= 2, "the Gemma 4 rows never decoded together"
        assert c.get("/health").json()["batch"]["max_batch_size"] == 4


# -- the prompt cache per cache kind -------------------------------------------------------

def _turn(e, i, prompt, max_tokens=8):
    (ids, last), = run(e, [request(prompt, max_tokens)])
    return ids, last.usage.cached_tokens


@pytest.mark.parametrize("name,mode", [("qwen3-next", "exact"), ("gemma3", "window"),
                                       ("gpt-oss", "window")])
def test_prompt_cache_reuses_an_exact_extension(name, mode, mlxcel_checkpoint_cache):
    """The agent-turn case: the next prompt extends the last request's context. The
    stored state covers every token its row fed, and the reused run gives the tokens a
    cold run gives."""
    path = checkpoint(name, mlxcel_checkpoint_cache)
    turn1 = PROMPTS[5]  # 64 tokens, past the window
    warm = engine(path, parallel=2, cache_bytes=1 << 26)
    try:
        assert warm.prompt_cache.stats()["reuse"] == mode
        out1, cached1 = _turn(warm, 0, turn1)
        assert cached1 == 0
        context = turn1 + out1
        turn2 = context + [7, 8, 9, 10, 11]
        out2, cached2 = _turn(warm, 1, turn2)
        # the last sampled token is fed by the step after it, which may not have run
        assert cached2 in (len(context) - 1, len(context))
        entries = warm.prompt_cache.stats()["entries"]
        # a prompt sharing only a block-aligned prefix, past the window: no reuse
        _, cached3 = _turn(warm, 2, turn1[:48] + [3] * 20)
        assert cached3 == 0 and warm.prompt_cache.stats()["entries"] == entries + 1
    finally:
        warm.shutdown()
    cold = engine(path, parallel=1)
    try:
        assert _turn(cold, 0, turn1)[0] == out1 and _turn(cold, 1, turn2)[0] == out2
    finally:
        cold.shutdown()


def test_rotating_layers_reuse_a_prefix_inside_the_window(mlxcel_checkpoint_cache):
    """With a window longer than the stored entry, any block-aligned prefix is reused."""
    path = cached_checkpoint("gemma3_text", cache_dir=mlxcel_checkpoint_cache,
                             dtype="float32", config={"sliding_window": 128})
    prompt = PROMPTS[5][:40]
    warm = engine(path, parallel=2, cache_bytes=1 << 26)
    try:
        stats = warm.prompt_cache.stats()
        assert (stats["reuse"], stats["reuse_window"]) == ("window", 128)
        _turn(warm, 0, prompt)
        other = prompt[:32] + [5, 6, 7, 8, 9, 10]
        out, cached = _turn(warm, 1, other)
        assert cached == 32
    finally:
        warm.shutdown()
    cold = engine(path, parallel=1)
    try:
        assert _turn(cold, 0, other)[0] == out
    finally:
        cold.shutdown()


def test_plain_kv_reuses_any_block_prefix(mlxcel_checkpoint_cache):
    path = checkpoint("llama", mlxcel_checkpoint_cache)
    warm = engine(path, parallel=2, cache_bytes=1 << 26)
    try:
        assert warm.prompt_cache.stats()["reuse"] == "prefix"
        _turn(warm, 0, PROMPTS[5])
        assert _turn(warm, 1, PROMPTS[5][:48] + [3] * 20)[1] == 48
    finally:
        warm.shutdown()


def test_window_rule_in_numbers():
    from mlxcel.engine.cache.kinds import Reuse

    window = Reuse("window", 64)
    assert window.covers(64, 16) and not window.covers(65, 16) and window.covers(65, 65)
    assert not Reuse("exact").covers(40, 32) and Reuse("exact").covers(40, 40)
    assert Reuse().covers(4000, 16)


def test_reuse_rule_per_cache_kind():
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache
    from mlxcel.engine.cache.kinds import reuse_rule

    assert reuse_rule([KVCache(), KVCache()]).mode == "prefix"
    rule = reuse_rule([KVCache(), RotatingKVCache(512), RotatingKVCache(128)])
    assert (rule.mode, rule.window) == ("window", 128)
    assert reuse_rule([RotatingKVCache(512), ArraysCache(2)]).mode == "exact"
    assert reuse_rule([CacheList(KVCache(), ArraysCache(2))]).mode == "exact"
    assert reuse_rule([CacheList(KVCache(), KVCache())]).mode == "prefix"


MERGED: list[int] = []


def counting_merge(rows):
    """A family's ``batch_cache`` factory (here mlx-lm's merge, counted)."""
    from mlxcel.engine.mixed_batch import merge_rows

    MERGED.append(len(rows))
    return merge_rows(rows)


def test_a_family_batch_cache_factory_is_used(mlxcel_checkpoint_cache):
    """A family naming ``batch_cache`` gets the protocol path through its factory, even
    for a plain-KV model that would otherwise take the shared-position cache."""
    path = checkpoint("qwen3", mlxcel_checkpoint_cache)
    MERGED.clear()
    e = EngineClient(with_family(path, batch_cache=f"{__name__}:counting_merge"), parallel=4,
                     prefill_chunk=16, prompt_cache=PromptCache(0, False))
    e.start()
    try:
        assert e.worker.ready.wait(60) and e.worker.path == "mixed" and e.worker.grouped
        reqs = [request(p, 6) for p in PROMPTS[:4]]
        together = [ids for ids, _ in run(e, reqs)]
    finally:
        e.shutdown()
    assert MERGED and sum(MERGED) == 4
    assert together == solo_tokens(path, reqs)


@pytest.mark.parametrize("name", ["gemma4", "gpt-oss", "qwen3-next"])
def test_cuda_grouped_decode_attention_on_mlx_lm_batch_caches(name, mlxcel_checkpoint_cache):
    """CUDA's grouped decode attention (forced here on the CPU) on mlx-lm's batch caches,
    their rotating layers' rolled masks included, gives the tokens of solo runs (gpt-oss's
    attention sinks keep MLX's own path)."""
    path = checkpoint(name, mlxcel_checkpoint_cache)
    reqs = [request(p, 6 + 2 * i) for i, p in enumerate(PROMPTS)]
    alone = solo_tokens(path, reqs)
    e = engine(path, parallel=4, chunk=64, policy=cpu_policy(decode_attention="grouped"))
    try:
        together = [ids for ids, _ in run(e, reqs[:4], then=reqs[4:], stagger=0.01)]
    finally:
        e.shutdown()
        from mlxcel.engine.accel import attention

        attention.uninstall(e.worker.checkpoint.model)  # later tests get the CPU's path
    assert together == alone


@pytest.mark.parametrize("name", ["gemma4", "gemma3", "qwen3-next", "ministral"])
def test_cuda_varlen_attention_on_mlx_lm_batch_caches(name, mlxcel_checkpoint_cache,
                                                      monkeypatch):
    """CUDA's one-kernel decode attention on mlx-lm's batch caches, with the kernel
    replaced by its composed reference (the kernel itself is checked on CUDA at start-up):
    rows start where the caches say they do, KV-shared layers take their source layer's
    rows, and a wrapped window falls back to the mask. Tokens equal solo runs."""
    from mlxcel.engine.accel import attention, varlen_attention

    path = checkpoint(name, mlxcel_checkpoint_cache)
    reqs = [request(p, 6 + 2 * i) for i, p in enumerate(PROMPTS)]
    alone = solo_tokens(path, reqs)
    calls = {"cache": 0, "shared": 0}

    def kernel(q, k, v, scale, starts):
        calls["cache"] += 1
        return varlen_attention.reference(q, k, v, scale, starts)

    monkeypatch.setattr(varlen_attention, "available", lambda: True)
    monkeypatch.setattr(varlen_attention, "supports", lambda q, k, v: True)
    monkeypatch.setattr(varlen_attention, "varlen_decode_attention", kernel)
    e = engine(path, parallel=4, chunk=64, policy=cpu_policy(decode_attention="varlen"))
    try:
        together = [ids for ids, _ in run(e, reqs[:4], then=reqs[4:], stagger=0.01)]
    finally:
        e.shutdown()
        attention.uninstall(e.worker.checkpoint.model)
    assert together == alone
    assert calls["cache"] > 0


def test_varlen_rows_of_a_kv_shared_layer_are_its_source_layers(monkeypatch):
    """A KV-shared layer calls attention with no cache; given its source layer's mask
    object, it gets its source layer's row starts (the kernel replaced by its reference;
    an unknown mask falls back to the masked path)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache
    from mlxcel.engine.accel import attention, varlen_attention

    monkeypatch.setattr(varlen_attention, "supports", lambda q, k, v: True)
    monkeypatch.setattr(varlen_attention, "varlen_decode_attention", varlen_attention.reference)
    calls = []

    def original(q, k, v, cache, scale, mask, sinks=None):
        calls.append(cache)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    wrapped = attention._wrap(original, "varlen")
    mx.random.seed(1)
    cache = BatchKVCache([3, 0])
    k = mx.random.normal((2, 2, 7, 16))
    cache.update_and_fetch(k, mx.random.normal((2, 2, 7, 16)))
    mask = cache.make_mask(1)  # the model makes it before the step's update
    keys, values = cache.update_and_fetch(mx.random.normal((2, 2, 1, 16)),
                                          mx.random.normal((2, 2, 1, 16)))
    q = mx.random.normal((2, 4, 1, 16))
    want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.25, mask=mask)
    source = wrapped(q, keys, values, cache, 0.25, mask)
    shared = wrapped(q, keys, values, None, 0.25, mask)
    assert mx.allclose(source, want, atol=1e-5) and mx.allclose(shared, want, atol=1e-5)
    other = mask & mx.ones_like(mask)  # a mask no source layer gave: the masked path
    assert mx.allclose(wrapped(q, keys, values, None, 0.25, other), want, atol=1e-5)
    assert calls == []  # every call above took the kernel or the grouped path


def test_after_the_mixed_warm_up_the_engine_serves_as_without(mlxcel_checkpoint_cache):
    path = checkpoint("gemma4", mlxcel_checkpoint_cache)
    reqs = [request(p, 6 + 2 * i) for i, p in enumerate(PROMPTS)]
    plain = engine(path, parallel=4, chunk=64)
    try:
        want = [ids for ids, _ in run(plain, reqs[:4], then=reqs[4:], stagger=0.01)]
    finally:
        plain.shutdown()
    warmed = engine(path, parallel=4, chunk=64, policy=cpu_policy(warm_up=True))
    try:
        got = [ids for ids, _ in run(warmed, reqs[:4], then=reqs[4:], stagger=0.01)]
    finally:
        warmed.shutdown()
    assert got == want


def test_no_chunk_of_a_padded_group_is_one_column():
    from mlxcel.engine.mixed_batch import no_lone_column

    for width in range(2, 40):
        for per_step in range(1, 12):
            for mark in (None, *range(1, width)):
                done, cuts = 0, []
                while done < width:
                    end = min(width, done + per_step, *([mark] if mark and mark > done else []))
                    end = no_lone_column(done, end, width)
                    assert end > done
                    cuts.append(end - done)
                    done = end
                assert done == width and 1 not in cuts, (width, per_step, mark, cuts)


def test_a_padded_sliding_window_group_prefills_in_any_chunk_widths(mlxcel_checkpoint_cache):
    """A padded group on rotating batch caches, cut by a budget of one or a few columns
    per row, or with a remainder of one column, gets its solo tokens (mlx-lm refused
    one-column chunks of a group that was still padded: every row failed)."""
    path = checkpoint("gemma4", mlxcel_checkpoint_cache)
    # prompt-cache marks one column apart (a chat prompt's BOS, then its first message)
    reqs = [request(p, 5, cache_marks=((1, "system"), (2, "turn")))
            for p in (PROMPTS[1][:10], PROMPTS[2][:6], PROMPTS[4][:13], PROMPTS[5][:4])]
    alone = solo_tokens(path, reqs)
    for chunk in (4, 8, 16):  # 1, 2 and 4 columns per row; tails 9, 5, 12, 3 tokens
        e = engine(path, parallel=4, chunk=chunk, cache_bytes=1 << 26,  # one group
                   policy=cpu_policy(burst_chunks=8, hold_groups=True))
        try:
            got = [ids for ids, _ in run(e, reqs)]
        finally:
            e.shutdown()
        assert got == alone, chunk
