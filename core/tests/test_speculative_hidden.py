"""Drafters that read the target's hidden states and cache (``DraftSession.needs_hidden``):
what the engine offers them is what a forward of the row alone computes, the output stays
exact, and a drafter that does not ask costs nothing (the model stays as loaded)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlxcel.drafters import hidden
from mlxcel.drafters.target import row_kv
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.spec_probe import make_caches
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import request, run_joining
from mlxcel.testing.stub_drafters import OneWrong
from mlxcel.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 4, [20, 21, 22, 23] * 3, [40, 41, 42] * 9,
           [100, 200, 100, 200, 100, 200]]


class Checked(OneWrong):
    """Each row's known greedy output with one token changed (``OneWrong``); every row it
    is offered is checked against a forward of its context alone: its hidden state, and
    every layer's keys and values. The engine swallows a session's exceptions: ``errors``
    keeps them."""

    needs_hidden = True

    def __init__(self, outputs) -> None:
        super().__init__(outputs)
        self.model = None
        self.checked = self.committed = 0
        self.errors: list[BaseException] = []

    def __call__(self, target, options):
        self.model = target.model
        return self

    def propose(self, rows, limits):
        try:
            for row in rows:
                self._check(row)
        except BaseException as exc:
            self.errors.append(exc)
            raise
        known = [any(tuple(r.tokens[:len(p)]) == p for p in self.outputs) for r in rows]
        return [super(Checked, self).propose([r], [n])[0] if k else []
                for r, n, k in zip(rows, limits, known, strict=True)]

    def commit(self, rows, accepted):
        for row, n in zip(rows, accepted, strict=True):
            if row.hidden.shape[0] != n + 1:
                self.errors.append(AssertionError((row.hidden.shape, n)))
            self.committed += 1

    def _check(self, row):
        cache = make_caches(self.model)
        inner = hidden.text_model(self.model)
        want = inner(mx.array([row.tokens[:-1]], dtype=mx.uint32), cache)[0, -1:]
        assert row.hidden.shape == want.shape, (row.hidden.shape, want.shape)
        assert mx.allclose(row.hidden, want, atol=1e-4, rtol=1e-3).item(), row.key
        if row.cache is None:  # the startup probe's own rows carry theirs
            return
        for mine, ref in zip(row.cache.layers, cache, strict=False):
            got, exp = row_kv(mine, row.cache.index), row_kv(ref, 0)
            if exp is None:
                continue
            assert got[0].shape == exp[0].shape, (got[0].shape, exp[0].shape)
            assert mx.allclose(got[0], exp[0], atol=1e-4).item()
            assert mx.allclose(got[1], exp[1], atol=1e-4).item()
        self.checked += 1


def run(path, config=None):
    reqs = [request(prompt, 30, SamplingParams(temperature=0.0)) for prompt in PROMPTS]
    return run_joining(path, reqs, config, parallel=3, chunk=16)


@pytest.fixture(params=["shared", "gemma3"])
def checkpoint(request, tiny_checkpoint, mlxcel_checkpoint_cache):
    if request.param == "shared":
        return tiny_checkpoint
    return cached_checkpoint("gemma3_text", cache_dir=mlxcel_checkpoint_cache, dtype="float32")


def test_a_drafter_that_reads_hidden_states_gets_each_rows_own(checkpoint):
    plain, _, _ = run(checkpoint)
    stub = Checked({tuple(p): out for p, out in zip(PROMPTS, plain, strict=True)})
    config = EngineConfig(drafter=stub, drafter_kind="mtp", prompt_lookup="on", draft_max=4)
    fast, usages, worker = run(checkpoint, config)
    assert fast == plain
    assert not stub.errors, stub.errors[0]
    assert stub.checked > 0 and stub.committed > 0
    assert sum(u.draft_n_accepted for u in usages) > 0
    assert worker.spec.tap is not None


def test_a_drafter_that_does_not_ask_leaves_the_model_as_loaded(tiny_checkpoint):
    config = EngineConfig(drafter="mlxcel.drafters.lookup:new_session", prompt_lookup="on")
    _, usages, worker = run(tiny_checkpoint, config)
    assert sum(u.draft_rounds for u in usages) > 0
    assert worker.spec.tap is None
    norm = hidden.final_norm(worker.checkpoint.model)
    assert not type(norm).__name__.startswith("Tapped")


def test_the_tap_records_the_final_norms_output_and_keeps_the_logits(tiny_checkpoint):
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins

    model = load_checkpoint(str(tiny_checkpoint), load_plugins().families).model
    tokens = mx.array([[5, 6, 7, 8]], dtype=mx.uint32)
    before = model(tokens, make_caches(model))
    tap = hidden.tap(model)
    assert hidden.tap(model) is tap  # installed once
    after = model(tokens, make_caches(model))
    states = tap.take()
    assert tap.take() is None
    assert mx.array_equal(before, after).item()
    assert states.shape[:2] == (1, 4)
    assert "_mlxcel_tap" not in dict(hidden.final_norm(model).parameters())


def layer_outputs(model, tokens):
    """Each decoder layer's output over ``tokens``, from mlx-lm's Qwen3 forward written
    out layer by layer on fresh caches."""
    from mlx_lm.models.base import create_attention_mask

    inner = hidden.text_model(model)
    cache = make_caches(model)
    h = inner.embed_tokens(mx.array([tokens], dtype=mx.uint32))
    mask = create_attention_mask(h, cache[0])
    outs = []
    for layer, c in zip(inner.layers, cache, strict=True):
        h = layer(h, mask, c)
        outs.append(h)
    return outs


class CheckedLayers(Checked):
    """``Checked`` for a session that reads decoder layers 1 and 0 (in that order): each
    row's state is those layers' outputs joined, at the row's last kept position."""

    hidden_layers = (1, 0)

    def _check(self, row):
        outs = layer_outputs(self.model, row.tokens[:-1])
        want = mx.concatenate([outs[1][0, -1:], outs[0][0, -1:]], axis=-1)
        assert row.hidden.shape == want.shape, (row.hidden.shape, want.shape)
        assert mx.allclose(row.hidden, want, atol=1e-4, rtol=1e-3).item(), row.key
        self.checked += 1

    def commit(self, rows, accepted):
        width = 2 * hidden.text_model(self.model).embed_tokens.weight.shape[1]
        for row in rows:
            if row.hidden.shape[-1] != width:
                self.errors.append(AssertionError(row.hidden.shape))
        super().commit(rows, accepted)


def test_a_drafter_that_names_layers_gets_their_outputs_joined(tiny_checkpoint):
    plain, _, _ = run(tiny_checkpoint)
    stub = CheckedLayers({tuple(p): out for p, out in zip(PROMPTS, plain, strict=True)})
    config = EngineConfig(drafter=stub, drafter_kind="dflash", prompt_lookup="on",
                          draft_max=4)
    fast, usages, worker = run(tiny_checkpoint, config)
    assert fast == plain
    assert not stub.errors, stub.errors[0]
    assert stub.checked > 0 and stub.committed > 0
    assert sum(u.draft_n_accepted for u in usages) > 0
    assert isinstance(worker.spec.tap, hidden.LayerTap)
    assert not type(hidden.final_norm(worker.checkpoint.model)).__name__.startswith("Tapped")


def test_a_layer_past_the_targets_refuses_to_start(tiny_checkpoint):
    from mlxcel.drafters.api import DraftOptions
    from mlxcel.engine.speculative import Speculation
    from mlxcel.errors import StartupError
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins

    model = load_checkpoint(str(tiny_checkpoint), load_plugins().families).model
    stub = CheckedLayers({})
    stub.hidden_layers = (0, 2)  # the tiny target has layers 0 and 1
    with pytest.raises(StartupError, match=r"no decoder layers \(0, 2\)"):
        Speculation(stub, "dflash", DraftOptions(), model=model)
