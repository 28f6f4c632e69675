"""The sampler chain stays finite for every value validation lets through, and the DRY walk
matches its definition while staying linear in the window."""

from __future__ import annotations

import math
import random
import time

import mlx.core as mx
import pytest
from mlxcel.engine.penalties import (
    FLT_MAX,
    Penalties,
    dry_match_lengths,
    dry_penalties,
    penalty_row,
)
from mlxcel.engine.sampling import BatchSampler, RowRandom
from mlxcel.types import SamplingParams


def brute_force_dry(history, allowed, breakers, last_n):
    """The definition, walked naively: for each position i after an occurrence of the last
    token, how far the text before i equals the end of the text (never crossing a breaker)."""
    window = list(history[-last_n:] if last_n > 0 else history)
    n = len(window)
    if n < 2:
        return {}
    cap = n
    for j, t in enumerate(reversed(window)):
        if t in breakers:
            cap = j
            break
    best = {}
    for i in range(1, n):
        if window[i - 1] != window[-1]:
            continue
        length = 0
        while length < i and window[i - 1 - length] == window[n - 1 - length]:
            length += 1
        length = min(length, cap)
        if length >= allowed and length > best.get(window[i], -1):
            best[window[i]] = length
    return best


@pytest.mark.parametrize("seed", range(40))
def test_dry_walk_matches_brute_force_on_random_histories(seed):
    rng = random.Random(seed)
    alphabet = rng.randint(1, 6)
    history = [rng.randrange(alphabet) for _ in range(rng.randint(0, 120))]
    if rng.random() < 0.5 and history:  # a planted repeat
        cut = rng.randint(0, len(history))
        history = history + history[:cut]
    breakers = tuple(rng.sample(range(alphabet + 2), rng.randint(0, 2)))
    allowed = rng.randint(0, 4)
    last_n = rng.choice([0, 0, rng.randint(1, 60)])
    p = SamplingParams(dry_multiplier=1.0, dry_base=1.5, dry_allowed_length=allowed,
                       dry_penalty_last_n=last_n, dry_sequence_breakers=breakers)
    assert dry_match_lengths(history, penalty_row(p)) == brute_force_dry(
        history, allowed, set(breakers), last_n)


def test_dry_walk_is_linear_on_a_fully_repetitive_window():
    p = SamplingParams(dry_multiplier=0.8)
    history = [5] * 40000  # every position matches: a quadratic walk takes minutes here
    t = time.perf_counter()
    lengths = dry_match_lengths(history, penalty_row(p))
    assert time.perf_counter() - t < 5.0
    assert lengths == {5: 39999}


@pytest.mark.parametrize("params", [
    SamplingParams(dry_multiplier=0.8),
    SamplingParams(dry_multiplier=0.8, dry_base=1e300),
    SamplingParams(dry_multiplier=1e300, dry_base=1.75),
    SamplingParams(dry_multiplier=0.8, dry_base=1.0000001),
])
def test_huge_dry_penalties_stay_finite(params):
    history = [5] * 1300
    host = dry_penalties(history, params)
    assert 0 < host[5] <= FLT_MAX
    logits = mx.array([[0.5, -1.0, 2.0, 0.0, 1.0, 3.0, -2.0, 0.25]])
    out = Penalties([params])(logits, [history], [[]])
    assert all(math.isfinite(v) for v in out.tolist()[0])
    assert out[0, 5].item() <= 3.0 - 0.8 + 1e-5 and out[0, 2].item() == 2.0
    token = BatchSampler([params], [RowRandom(None)], 8)(out).item()
    assert 0 <= token < 8


@pytest.mark.parametrize("params", [
    SamplingParams(repetition_penalty=1e-300, temperature=1.0),
    SamplingParams(repetition_penalty=1e300, temperature=1.0),
    SamplingParams(temperature=1e-300),
    SamplingParams(temperature=1e300),
    SamplingParams(temperature=5e-324, top_k=3),
    SamplingParams(temperature=1e-30, p_less=True),
    SamplingParams(temperature=1e30, top_p=0.5, min_p=0.5, xtc_probability=1.0,
                   xtc_threshold=0.0),
    SamplingParams(frequency_penalty=2.0, presence_penalty=-2.0, repetition_penalty=1e38,
                   temperature=1.0),
])
def test_extreme_valid_values_sample_a_real_token(params):
    logits = mx.array([[0.0, 1e4, -1e4, 3.0, 0.0, -0.5]] * 2)
    contexts = [[0, 1, 2, 3, 3, 3]] * 2
    scored = Penalties([params] * 2)(logits, contexts, contexts)
    assert all(math.isfinite(v) for row in scored.tolist() for v in row)
    sampler = BatchSampler([params, params.__class__(**{
        **{f: getattr(params, f) for f in params.__struct_fields__}, "seed": 7})],
        [RowRandom(None), RowRandom(7)], 6)
    for _ in range(5):
        tokens = sampler(scored).tolist()
        assert all(0 <= t < 6 for t in tokens)


def test_tiny_temperature_is_near_greedy_not_nan():
    logits = mx.array([[0.0, 2.0, 1.0, -1.0]])
    sampler = BatchSampler([SamplingParams(temperature=1e-300)], [RowRandom(None)], 4)
    assert {sampler(logits).item() for _ in range(20)} == {1}
