"""Each sampler's effect on constructed logits, vectorized over the batch."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlxcel.engine.penalties import Penalties, dry_penalties
from mlxcel.engine.sampling import BatchSampler, RowRandom, logprob_arrays
from mlxcel.types import SamplingParams

PROBS = [0.5, 0.3, 0.15, 0.05]
LOGITS = [math.log(p) for p in PROBS]


def draw(params: SamplingParams, rows: int = 400, logits=LOGITS) -> set[int]:
    """Tokens sampled over many identical rows (global PRNG)."""
    sampler = BatchSampler([params] * rows, [RowRandom(None) for _ in range(rows)], len(logits))
    return set(sampler(mx.array([logits] * rows)).tolist())


def test_greedy_and_mixed_rows():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=5.0, seed=1)]
    sampler = BatchSampler(params, [RowRandom(p.seed) for p in params], 4)
    out = sampler(mx.array([[0.0, 3.0, 1.0, 2.0]] * 2)).tolist()
    assert out[0] == 1 and 0 <= out[1] < 4


@pytest.mark.parametrize("kw,expected", [
    ({"top_k": 2}, {0, 1}),
    ({"top_k": 1}, {0}),
    ({"top_k": 0}, {0, 1, 2, 3}),
    ({"top_k": 99}, {0, 1, 2, 3}),
    ({"top_p": 0.7}, {0, 1}),
    ({"top_p": 0.85}, {0, 1, 2}),
    ({"min_p": 0.5}, {0, 1}),
    ({"min_p": 0.25}, {0, 1, 2}),
    ({"p_less": True}, {0}),
    ({"xtc_probability": 1.0, "xtc_threshold": 0.1}, {2, 3}),
    ({"xtc_probability": 1.0, "xtc_threshold": 0.4}, {0, 1, 2, 3}),  # one above: no-op
])
def test_truncation_keeps_exactly_the_right_tokens(kw, expected):
    assert draw(SamplingParams(temperature=1.0, **kw)) == expected


def test_p_less_keeps_more_of_a_flat_distribution():
    flat = [math.log(p) for p in (0.3, 0.3, 0.25, 0.15)]  # sum p^2 = 0.265
    assert draw(SamplingParams(temperature=1.0, p_less=True), logits=flat) == {0, 1}


def test_seeded_row_is_independent_of_its_neighbours():
    seeded = SamplingParams(temperature=1.0, seed=42)
    other = SamplingParams(temperature=1.0)
    logits = [[0.1 * i for i in range(50)]]

    def run(batch):
        sampler = BatchSampler(batch, [RowRandom(p.seed) for p in batch], 50)
        return [sampler(mx.array(logits * len(batch))).tolist()[0] for _ in range(8)]
    assert run([seeded]) == run([seeded, other, other]) == run([seeded, seeded])
    assert run([seeded]) != run([SamplingParams(temperature=1.0, seed=43)])


@pytest.mark.parametrize("kw", [{"top_p": 0.9}, {"seed": 7}, {"top_p": 0.9, "seed": 7},
                                {"min_p": 0.1}])
def test_logits_wider_than_the_vocabulary_are_sampled_whole(kw):
    """Checkpoints pad their output layer past the tokenizer (Qwen: 151936 logits, 151665
    tokens): every filter and a seeded draw work on the logits' own width."""
    params = SamplingParams(temperature=1.0, top_k=0, **kw)
    rows = 64
    logits = [-9.0] * 4 + [math.log(p) for p in PROBS]  # all the mass past id 4
    seeds = [None if params.seed is None else params.seed + i for i in range(rows)]
    sampler = BatchSampler([params] * rows, [RowRandom(s) for s in seeds], 4)
    out = sampler(mx.array([logits] * rows)).tolist()
    assert set(out) <= {4, 5, 6, 7} and 4 in out


def test_repetition_frequency_presence_penalties():
    base = mx.array([[2.0, -2.0, 1.0, 0.5]])
    rep = Penalties([SamplingParams(repetition_penalty=2.0, repetition_context_size=2)])
    # window = last 2 context tokens = {0, 1}; token 2 is outside the window
    assert rep(base, [[2, 0, 1]], [[]]).tolist()[0] == [1.0, -4.0, 1.0, 0.5]
    counts = Penalties([SamplingParams(frequency_penalty=0.5, presence_penalty=1.0)])
    out = counts(base, [[9, 3, 3, 0]], [[3, 3, 0]]).tolist()[0]
    assert out == pytest.approx([2.0 - 0.5 - 1.0, -2.0, 1.0, 0.5 - 1.0 - 1.0])


def test_dry_penalises_the_token_that_extends_a_repeat():
    p = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2)
    assert dry_penalties([1, 2, 3, 4, 1, 2, 3], p) == {4: 2.0}
    assert dry_penalties([1, 2, 3, 4, 1, 2], p) == {3: 1.0}
    breaker = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2,
                             dry_sequence_breakers=(2,))
    assert dry_penalties([1, 2, 3, 4, 1, 2, 3], breaker) == {}
    last_n = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2,
                            dry_penalty_last_n=4)
    assert dry_penalties([1, 2, 3, 4, 1, 2, 3], last_n) == {}


def test_dry_applies_through_the_batch_block():
    p = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2)
    out = Penalties([p, SamplingParams()])(mx.zeros((2, 6)), [[1, 2, 3, 4, 1, 2, 3], [1, 1]],
                                            [[], []])
    assert out.tolist() == [[0, 0, 0, 0, -2.0, 0], [0] * 6]


def test_logprob_arrays():
    logits = mx.array([[0.0, 1.0, 2.0, 3.0]])
    chosen, ids, vals = logprob_arrays(logits, mx.array([2]), 2)
    lse = math.log(sum(math.exp(x) for x in range(4)))
    assert chosen.tolist() == pytest.approx([2.0 - lse], abs=1e-5)
    assert ids.tolist() == [[3, 2]]
    assert vals.tolist()[0] == pytest.approx([3.0 - lse, 2.0 - lse], abs=1e-5)
