"""The engine's batched KV cache: absolute and shared-position modes against solo forwards.

Each scenario plays the engine's cache life by hand -- left-padded group prefill, decode
steps, a longer group joining, a row leaving (common padding trimmed), a prompt-cache
prefix copied out and restored -- and checks every row's logits at every step against a
forward pass of that row's tokens alone (no cache, no batch).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama, phi3, qwen3
from mlx_lm.models.cache import make_prompt_cache
from mlxcel.engine.cache import kvcache
from mlxcel.engine.cache.kvcache import BatchCache, rotate, shared_position_rope

VOCAB = 97


def _model(kind: str, **extra):
    mx.random.seed(3)
    common = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  vocab_size=VOCAB)
    if kind == "qwen3":
        model = qwen3.Model(qwen3.ModelArgs(model_type="qwen3", head_dim=16, rope_theta=1e4,
                                            tie_word_embeddings=False, max_position_embeddings=4096,
                                            **common, **extra))
    elif kind == "llama":
        model = llama.Model(llama.ModelArgs(model_type="llama", rope_theta=5e5, **common, **extra))
    else:
        model = phi3.Model(phi3.ModelArgs(model_type="phi3", rope_theta=1e4, **common, **extra))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _solo_last_logits(model, tokens: list[int]) -> np.ndarray:
    return np.array(model(mx.array([tokens]))[0, -1])


class Rows:
    """Caches + per-row token history, driven like the engine's PrefillJob/DecodeBatch."""

    def __init__(self, model, rope):
        self.model, self.rope = model, rope
        self.cache = None
        self.seqs: list[list[int]] = []  # tokens already in the cache, per row
        self.pending: list[int] = []  # next input per row

    def group(self, prompts: list[list[int]], prefixes=None):
        """Prefill prompts[:-1], right-aligned, like PrefillJob: ``prefixes[i]`` is
        (per-layer keys, values, n) cached for prompt i's first n tokens, or None."""
        prefixes = prefixes or [None] * len(prompts)
        lengths = [len(p) - 1 for p in prompts]
        width = max(lengths)
        start = width - max(n - (pre[2] if pre else 0) for n, pre in zip(lengths, prefixes,
                                                                          strict=True))
        pads = [width - n for n in lengths]
        if start:
            cache = BatchCache.from_prefixes(
                [(mx.stack(pre[0]), mx.stack(pre[1])) if pre and start > pad else None
                 for pre, pad in zip(prefixes, pads, strict=True)], pads, start, self.rope)
        else:
            cache = [BatchCache(pads, self.rope) for _ in self.model.layers]
        rows = mx.array([[0] * pad + p[:-1] for pad, p in zip(pads, prompts, strict=True)])
        for col in range(start, width, 5):  # chunked like the engine
            self.model(rows[:, col:col + 5], cache=cache)
        return cache, [p[:-1] for p in prompts], [p[-1] for p in prompts]

    def join(self, *jobs, drop: tuple[int, ...] = ()):
        """Like DecodeBatch.join: several groups merge into the batch at once; rows
        ``drop`` (finished rows a lazy batch kept) leave in the same merge."""
        caches = [job[0] for job in jobs]
        keep = None
        if drop:
            keep = [i for i in range(len(self.seqs)) if i not in drop]
            self.seqs = [self.seqs[i] for i in keep]
            self.pending = [self.pending[i] for i in keep]
        if self.cache is None:
            self.cache, caches = caches[0], caches[1:]
        if caches or keep:
            for mine, *theirs in zip(self.cache, *caches, strict=True):
                mine.extend(*theirs, keep=keep)
        for _, seqs, last in jobs:
            self.seqs += seqs
            self.pending += last

    def step(self, seed: int) -> list[float]:
        """One decode step (next inputs drawn from ``seed``); max |logits - solo| per row."""
        logits = np.array(self.model(mx.array(self.pending)[:, None], cache=self.cache)[:, -1])
        errs = []
        for i, seq in enumerate(self.seqs):
            seq.append(self.pending[i])
            errs.append(float(np.abs(logits[i] - _solo_last_logits(self.model, seq)).max()))
        self.pending = _tokens(seed, len(self.seqs))
        return errs

    def drop(self, row: int):
        keep = [i for i in range(len(self.seqs)) if i != row]
        for c in self.cache:
            c.filter(keep)
        self.seqs = [self.seqs[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, VOCAB, n).tolist()


def _scenario(model, rope) -> list[float]:
    rows, errs = Rows(model, rope), []
    # two groups prefilled apart join an empty batch together
    rows.join(rows.group([_tokens(1, 6), _tokens(2, 11)]), rows.group([_tokens(9, 4)]))
    for s in range(3):
        errs += rows.step(10 + s)
    rows.drop(2)
    rows.join(rows.group([_tokens(3, 23), _tokens(4, 3)]))  # longer than the batch so far
    for s in range(3):
        errs += rows.step(20 + s)
    # two groups join a running batch at once: one shorter, one longer than the batch
    rows.join(rows.group([_tokens(11, 5)]), rows.group([_tokens(12, 40), _tokens(13, 9)]))
    for s in range(2):
        errs += rows.step(25 + s)
    assert rows.cache[0].pads[5] == 0 and min(rows.cache[0].pads[:5] + rows.cache[0].pads[6:]) > 0
    rows.drop(5)  # the only row with no padding leaves: common padding is trimmed
    rows.drop(4)
    rows.drop(3)
    assert min(rows.cache[0].pads) == 0
    for s in range(2):
        errs += rows.step(30 + s)
    # a lazily kept row leaves in a join's merge: the only unpadded one, so the merge
    # also trims the padding every remaining row has
    pads = rows.cache[0].pads
    lone = pads.index(0)
    assert pads.count(0) == 1, pads
    before = rows.cache[0]._idx
    rows.join(rows.group([_tokens(14, 3)]), drop=(lone,))
    assert min(rows.cache[0].pads) == 0 and rows.cache[0]._idx < before
    for s in range(2):
        errs += rows.step(35 + s)
    # prompt cache: copy rows out, restore them as new rows' prefixes
    n = 8
    keys, values = zip(*(c.row(0, n) for c in rows.cache), strict=True)
    prompt = rows.seqs[0][:n] + _tokens(5, 6)
    rows.join(rows.group([prompt], prefixes=[(keys, values, n)]))
    for s in range(3):
        errs += rows.step(40 + s)
    # a group: two hits of different lengths (reused in part, right-aligned) and a miss
    held = [zip(*(c.row(i, m) for c in rows.cache), strict=True) for i, m in ((1, 12), (0, 5))]
    prompts = [rows.seqs[1][:12] + _tokens(6, 4), rows.seqs[0][:5] + _tokens(7, 9),
               _tokens(8, 7)]
    rows.join(rows.group(prompts, prefixes=[(*held[0], 12), (*held[1], 5), None]))
    for s in range(3):
        errs += rows.step(50 + s)
    return errs


@pytest.mark.parametrize("kind,extra", [("qwen3", {}), ("llama", {"rope_scaling": LLAMA3_SCALING})])
def test_batched_cache_matches_solo_forward_in_both_modes(kind, extra):
    model = _model(kind, **extra)
    rope = shared_position_rope(model, family_allows=True)
    assert rope is not None
    absolute, shared = _scenario(model, None), _scenario(model, rope)
    assert max(absolute) < 1e-4
    assert max(shared) < 1e-4


def test_shared_mode_rebases_far_positions(monkeypatch):
    model = _model("qwen3")
    monkeypatch.setattr(kvcache, "REBASE_AT", 2)
    rows = Rows(model, shared_position_rope(model, family_allows=True))
    rows.join(rows.group([_tokens(1, 4), _tokens(2, 12), _tokens(3, 9)]))
    errs = [e for s in range(3) for e in rows.step(10 + s)]
    rows.drop(1)  # trims 8 slots: base 8 > REBASE_AT, so every key is re-rotated
    assert rows.cache[0].base == 0 and min(rows.cache[0].pads) == 0
    errs += [e for s in range(3) for e in rows.step(20 + s)]
    assert max(errs) < 1e-4


def test_copied_out_rows_are_in_the_canonical_frame():
    """row() gives the keys a solo KVCache holds for those tokens, in either mode."""
    model = _model("qwen3")
    tokens = [_tokens(7, 5), _tokens(8, 12)]
    for rope in (None, shared_position_rope(model, family_allows=True)):
        rows = Rows(model, rope)
        rows.join(rows.group(tokens))
        rows.step(1)
        solo = make_prompt_cache(model)
        model(mx.array([rows.seqs[0]]), cache=solo)
        k, v = rows.cache[1].row(0, len(rows.seqs[0]))
        assert np.allclose(np.array(k), np.array(solo[1].keys[..., :k.shape[2], :]), atol=1e-5)
        assert np.allclose(np.array(v), np.array(solo[1].values[..., :v.shape[2], :]), atol=1e-5)


def test_offsets_and_masks():
    model = _model("qwen3")
    rope = shared_position_rope(model, family_allows=True)
    shared, absolute = BatchCache([2, 0], rope), BatchCache([2, 0])
    for c in (shared, absolute):
        c.update_and_fetch(mx.zeros((2, 2, 5, 16)), mx.zeros((2, 2, 5, 16)))
    assert shared.offset == 5  # one int for every row
    assert absolute.offset.tolist() == [3, 5]  # each row's own position
    assert shared.make_mask(1).shape == (2, 1, 1, 6)  # padded rows need a mask
    lone = BatchCache([0], rope)
    lone.update_and_fetch(mx.zeros((1, 2, 4, 16)), mx.zeros((1, 2, 4, 16)))
    assert lone.make_mask(1) is None and lone.make_mask(3).shape == (3, 7)


def test_rotate_composes_and_inverts():
    rope = shared_position_rope(_model("qwen3"), family_allows=True)
    x = mx.random.normal((1, 2, 6, 16))
    assert np.allclose(np.array(rotate(rope, rotate(rope, x, 7), -7)), np.array(x), atol=1e-5)
    assert np.allclose(np.array(rotate(rope, x, 5)), np.array(rotate(rope, rotate(rope, x, 2), 3)),
                       atol=1e-5)
    # one position moved by d is that position's RoPE at offset d
    one = x[:, :, :1]
    assert np.allclose(np.array(rotate(rope, one, 9)), np.array(rope(one, offset=9)), atol=1e-5)
    assert not np.allclose(np.array(rotate(rope, one, 9)), np.array(one), atol=1e-3)


def test_shared_positions_only_when_safe():
    qwen = _model("qwen3")
    assert shared_position_rope(qwen, family_allows=False) is None
    assert shared_position_rope(qwen, family_allows=True) is not None
    # Phi-3 long-context RoPE depends on the absolute position: never shifted
    su = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
          "original_max_position_embeddings": 64}
    assert shared_position_rope(_model("phi3", rope_scaling=su, max_position_embeddings=256),
                                family_allows=True) is None


def test_grouped_decode_attention_matches_mlx_masked_sdpa():
    from mlxcel.engine.accel.attention import grouped_decode_attention

    q = mx.random.normal((3, 8, 1, 16))
    k, v = mx.random.normal((3, 2, 11, 16)), mx.random.normal((3, 2, 11, 16))
    mask = mx.array([0, 4, 9])[:, None, None, None] <= mx.arange(11)  # left padding
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = grouped_decode_attention(q, k, v, 0.25, mask)
    assert got.shape == want.shape
    assert np.allclose(np.array(got), np.array(want), atol=1e-5)
    # the padded keys really are ignored: changing them changes nothing
    k2 = mx.where(mask.squeeze(2)[:, :, :, None], k, 100.0)
    assert np.allclose(np.array(grouped_decode_attention(q, k2, v, 0.25, mask)), np.array(got),
                       atol=1e-5)


def test_installed_attention_serves_only_masked_steps_on_engine_caches():
    from mlxcel.engine.accel import attention

    model = _model("qwen3")
    calls = []
    real = attention.grouped_decode_attention
    attention.grouped_decode_attention = lambda *a: calls.append(1) or real(*a)
    try:
        assert attention.install(model, enable=True)
        assert attention.install(model, enable=True)  # idempotent: wrapped once
        rope = shared_position_rope(model, family_allows=True)
        for mode in (None, rope):
            errs = _scenario(model, mode)
            assert max(errs) < 1e-4
        assert calls  # the padded decode steps went through it
        n = len(calls)
        solo = make_prompt_cache(model)
        model(mx.array([[1, 2, 3]]), cache=solo)
        model(mx.array([[4]]), cache=solo)  # plain KVCache: MLX's own kernel
        assert len(calls) == n
    finally:
        attention.uninstall(model)
        attention.grouped_decode_attention = real
    assert not hasattr(qwen3.scaled_dot_product_attention, "mlxcel_original")


def test_stored_rows_copy_every_layer_like_row_does():
    model = _model("qwen3")
    for rope in (None, shared_position_rope(model, family_allows=True)):
        rows = Rows(model, rope)
        rows.join(rows.group([_tokens(1, 5), _tokens(2, 13), _tokens(3, 9)]))
        rows.step(1)
        rows.join(rows.group([_tokens(4, 20)]))  # moves base in shared mode
        rows.step(2)
        for idx, lengths in (([3, 0, 2], [18, 4, 7]), ([1], [11])):
            stored = kvcache.stored_rows(rows.cache, idx, lengths)
            for got, i, n in zip(stored, idx, lengths, strict=True):
                assert got.keys.shape == (len(rows.cache), 1, 2, n, 16)
                # its own buffers: a stored row holds only its tokens
                assert got.nbytes == 2 * len(rows.cache) * 2 * n * 16 * 4
                for layer, cache in enumerate(rows.cache):
                    k1, v1 = cache.row(i, n)
                    assert np.allclose(np.array(got.keys[layer]), np.array(k1), atol=1e-5)
                    assert np.array_equal(np.array(got.values[layer]), np.array(v1))


def test_decode_attention_mode_follows_the_setting_and_the_device():
    from mlxcel.engine.accel import attention, varlen_attention

    assert not varlen_attention.available()  # CPU: no CUDA kernel
    assert attention.mode() == "composed"  # auto
    for choice, want in (("auto", "composed"), ("composed", "composed"), ("fused", "fused"),
                         ("grouped", "grouped"),
                         ("varlen", "grouped")):  # varlen falls back where it cannot run
        assert attention.mode(choice) == want
    model = _model("qwen3")
    try:
        assert attention.install(model, enable=True, choice="varlen") == "grouped"
        assert qwen3.scaled_dot_product_attention.mlxcel_mode == "grouped"
    finally:
        attention.uninstall(model)


def test_varlen_kernel_reference_and_where_the_kernel_is_used():
    from mlxcel.engine.accel import varlen_attention as va
    from mlxcel.engine.accel.attention import grouped_decode_attention

    q = mx.random.normal((3, 8, 1, 64))
    k, v = mx.random.normal((3, 2, 11, 64)), mx.random.normal((3, 2, 11, 64))
    starts = mx.array([0, 4, 9], dtype=mx.int32)
    mask = starts[:, None, None, None] <= mx.arange(11)
    want = grouped_decode_attention(q, k, v, 0.125, mask)
    assert np.allclose(np.array(va.reference(q, k, v, 0.125, starts)), np.array(want),
                       atol=1e-5)
    assert va.supports(q, k, v)
    assert not va.supports(mx.zeros((3, 8, 1, 80)), mx.zeros((3, 2, 11, 80)),
                           mx.zeros((3, 2, 11, 80)))  # head dim without a kernel
    # a long context over few blocks, and a long prefill chunk, go elsewhere
    long_k = mx.zeros((1, 2, va.LONG_CONTEXT + 1, 64))
    assert not va.supports(mx.zeros((1, 8, 1, 64)), long_k, long_k)
    chunk = mx.zeros((1, 8, 512, 64))
    assert not va.supports(chunk, long_k, long_k)
    assert va.supports(mx.zeros((1, 8, 32, 64)), mx.zeros((1, 2, 96, 64)),
                       mx.zeros((1, 2, 96, 64)))
    assert va._heads_per_block(16, 256) == 4 and va._heads_per_block(7, 128) == 7


def test_a_varlen_instantiation_is_used_only_once_it_passed_its_check(monkeypatch):
    """Where the kernel can be built, each (dtype, head dim, group) is compiled and checked
    against the reference when a shape first needs it; one that fails (here: no CUDA to
    compile it) is not used, and the others are not compiled for it."""
    from mlxcel.engine.accel import varlen_attention as va

    checked = []
    real = va._checked.__wrapped__
    monkeypatch.setattr(va, "available", lambda: True)
    monkeypatch.setattr(va, "_checked", lambda *a: (checked.append(a), real(*a))[1])
    va._supports.cache_clear()
    try:
        q, k = mx.zeros((3, 8, 1, 64)), mx.zeros((3, 2, 11, 64))
        assert not va.supports(q, k, k)  # its check failed: the grouped path takes it
        assert not va.supports(mx.zeros((1, 8, 1, 80)), mx.zeros((1, 2, 11, 80)),
                               mx.zeros((1, 2, 11, 80)))  # no kernel for D=80: no check
        assert checked == [(mx.float32, 64, 4)]
    finally:
        va._supports.cache_clear()
    # the check itself passes a kernel that computes the reference, and fails one that
    # does not (the kernel replaced, as CUDA is not here)
    monkeypatch.setattr(va, "varlen_decode_attention", va.reference)
    assert real(mx.bfloat16, 128, 4) and real(mx.float32, 256, 2)
    monkeypatch.setattr(va, "varlen_decode_attention",
                        lambda q, k, v, scale, starts: va.reference(q, k, v, scale, starts * 0))
    assert not real(mx.bfloat16, 128, 4)


@pytest.mark.parametrize("shape,kind", [
    ((3, 4, 9, 16, 2, 9), "causal"),  # B, Hq, N, D, Hkv, L: a prefill chunk
    ((3, 4, 9, 16, 2, 14), "padded"),  # chunk after cached slots, rows left-padded
    ((5, 8, 1, 64, 2, 30), "padded"),  # a decode step of padded rows
    ((5, 8, 1, 64, 8, 30), None),  # no mask, no grouping
    ((2, 4, 6, 16, 4, 6), "per-head"),  # a [B, Hq, N, L] additive mask
])
def test_cpu_attention_matches_mlx(shape, kind):
    """The CPU path (composed softmax) against MLX's own attention, every mask form."""
    from mlx_lm.models.base import create_causal_mask
    from mlxcel.engine.accel import cpu_attention

    b, hq, n, d, hkv, length = shape
    q = mx.random.normal((b, hq, n, d))
    k, v = mx.random.normal((b, hkv, length, d)), mx.random.normal((b, hkv, length, d))
    if kind == "causal":
        mask = "causal"
    elif kind == "padded":  # row r starts at slot 2r: its padded queries see no key
        mask = create_causal_mask(n, length - n, left_padding=mx.arange(b) * 2)
    elif kind == "per-head":
        mask = mx.random.normal((b, hq, n, length))
    else:
        mask = None
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=d ** -0.5, mask=mask)
    got = cpu_attention.attention(q, k, v, d ** -0.5, mask)
    assert got.shape == want.shape
    assert bool(mx.all(mx.isfinite(got)))
    assert float(mx.abs(got - want).max()) < 1e-5


def test_cpu_softmax_precision_and_what_it_leaves_to_mlx():
    from mlxcel.engine.accel import cpu_attention

    y = mx.linspace(cpu_attention.FLOOR, 0, 100001)
    assert float((mx.abs(cpu_attention.exp2(y) - mx.power(2.0, y)) / mx.power(2.0, y)).max()) \
        < 2e-6
    x = mx.random.normal((4, 300)) * 8
    x = mx.where(mx.random.uniform(shape=x.shape) < 0.3, -mx.inf, x)
    assert float(mx.abs(cpu_attention.softmax(x) - mx.softmax(x, axis=-1)).max()) < 1e-6
    q = mx.zeros((1, 2, 1, 16), mx.float16)  # half precision stays with MLX
    assert cpu_attention.attention(q, q, q, 0.25, None) is None


def test_trim_drops_the_padding_every_row_has():
    model = _model("llama")
    rope = shared_position_rope(model, True)
    for mode in (None, rope):
        cache = BatchCache([3, 5], mode)
        keys = mx.random.normal((2, 2, 8, 16))
        cache.update_and_fetch(keys, keys)
        before = cache.offset
        cache.trim()
        assert cache.pads == [0, 2] and cache.make_mask(1) is not None
        k, _ = cache.update_and_fetch(keys[:, :, :1], keys[:, :, :1])
        assert k.shape[2] == 6 and mx.array_equal(k[:, :, :5], keys[:, :, 3:]).item()
        if mode is not None:  # the next position is what it was
            assert cache.offset == before + 1
        lone = BatchCache([4], mode)
        lone.update_and_fetch(keys[:1], keys[:1])
        lone.trim()
        assert lone.pads == [0] and lone.make_mask(1) is None


def test_a_lone_restored_row_holds_its_entrys_buffers_until_written():
    """A prompt-cache hit restored alone (an agent's next turn) is not copied when its
    caches are made; the first write grows each layer into a buffer of its own and leaves
    the entry's arrays as they were."""
    mx.random.seed(4)
    keys, values = mx.random.normal((2, 1, 2, 2048, 64)), mx.random.normal((2, 1, 2, 2048, 64))
    mx.eval(keys, values)
    kept = mx.array(keys)
    mx.eval(kept)
    before = mx.get_active_memory()
    caches = BatchCache.from_prefixes([(keys, values)], [0], 2048, None)
    mx.eval([a for c in caches for a in c.state])
    assert mx.get_active_memory() - before < keys.nbytes // 4
    new = mx.ones((1, 2, 1, 64))
    for layer, cache in enumerate(caches):
        k, v = cache.update_and_fetch(new, new)
        assert k.shape[2] == 2049 and mx.array_equal(k[:, :, :2048], keys[layer]).item()
        assert mx.array_equal(v[:, :, 2048:], new).item()
    assert mx.array_equal(keys, kept).item()
