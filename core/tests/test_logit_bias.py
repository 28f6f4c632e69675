"""``logit_bias`` in llama-server's and OpenAI's forms, ``ignore_eos`` as EOS bans, and
the biases in the sampler chain (merged per token, -inf winning, before the penalties)."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlxcel.chat.logit_bias import (
    bias_settings,
    check_openai_range,
    parse_logit_bias,
    request_bias,
)
from mlxcel.engine.penalties import BANNED, FLT_MAX, Penalties, merge_bias
from mlxcel.errors import InvalidRequest
from mlxcel.types import SamplingParams

NEVER = -math.inf


def test_every_form_names_the_same_tokens(tokenizer):
    hello = tokenizer.encode("hello", False)
    assert len(hello) > 1  # a text stands for each of its tokens
    assert parse_logit_bias([[7, 1.5], ["hello", -2], [9, False]], tokenizer) == (
        (7, 1.5), *((t, -2.0) for t in hello), (9, NEVER))
    assert parse_logit_bias({"7": 1.5, "hello": -2, "9": False}, tokenizer) == (
        (7, 1.5), *((t, -2.0) for t in hello), (9, NEVER))
    assert parse_logit_bias(None, tokenizer) == () == parse_logit_bias({}, tokenizer)


@pytest.mark.parametrize("value,param", [
    ([[7]], "logit_bias[0]"),
    ([7, 1.0], "logit_bias[0]"),
    ([[7, True]], "logit_bias[0]"),
    ([[7, "1"]], "logit_bias[0]"),
    ([[1 << 40, 1.0]], "logit_bias[0]"),
    ([[-1, 1.0]], "logit_bias[0]"),
    ([[1.5, 1.0]], "logit_bias[0]"),
    ({"999999": 1}, "logit_bias.999999"),
    ({"": 1}, "logit_bias."),
    ("7:1", "logit_bias"),
])
def test_bad_entries_are_refused_naming_them(tokenizer, value, param):
    with pytest.raises(InvalidRequest) as err:
        parse_logit_bias(value, tokenizer)
    assert err.value.param == param


def test_openai_range(tokenizer):
    check_openai_range({"7": 100, "8": -100, "9": False})
    check_openai_range([[7, 100.0]])
    for value in ({"7": 100.5}, [[7, -101]]):
        with pytest.raises(InvalidRequest, match="between -100 and 100"):
            check_openai_range(value)


def test_ignore_eos_bans_every_eos_and_reports_them_as_null(tokenizer):
    bias = request_bias([[7, 2]], tokenizer, ignore_eos=True)
    assert bias == ((7, 2.0), *((t, NEVER) for t in sorted(tokenizer.eos_ids)))
    assert bias_settings(bias) == [{"bias": 2.0, "token": 7}] + [
        {"bias": None, "token": t} for t in sorted(tokenizer.eos_ids)]
    assert request_bias(None, tokenizer, ignore_eos=False) == ()


def test_merged_per_token_with_never_winning():
    assert merge_bias([(1, 2.0), (1, 3.0), (2, NEVER), (2, FLT_MAX), (2, FLT_MAX),
                       (3, FLT_MAX), (3, FLT_MAX)]) == ((1, 5.0), (2, NEVER), (3, FLT_MAX))


def test_biases_apply_per_row_before_the_penalties():
    rows = [SamplingParams(logit_bias=((1, 4.0), (2, NEVER)), repetition_penalty=2.0),
            SamplingParams()]
    penalties = Penalties(rows)
    assert penalties.rows[0].active and not penalties.rows[1].active
    logits = mx.zeros((2, 4))
    out = penalties(logits, [[1], [1]], [[], []]).tolist()
    assert out[0] == [0.0, 2.0, pytest.approx(BANNED), 0.0]  # 4 added, then halved
    assert out[1] == [0.0, 0.0, 0.0, 0.0]


def test_a_banned_token_still_beats_one_the_constraint_masked():
    """At a grammar's end only EOS is allowed; ``ignore_eos`` bans it: the constraint must
    win, or the row would sample a masked token."""
    masked = mx.array([[-math.inf, -math.inf, 5.0, -math.inf]])  # what apply_masks leaves
    out = Penalties([SamplingParams(logit_bias=((1, NEVER), (2, NEVER)))])(
        masked, [[0]], [[]])
    assert out.tolist()[0] == [-FLT_MAX, -FLT_MAX, pytest.approx(BANNED), -FLT_MAX]
    assert mx.argmax(out, axis=-1).item() == 2
    free = Penalties([SamplingParams(logit_bias=((1, NEVER),))])(mx.zeros((1, 3)), [[0]], [[]])
    assert mx.argmax(free, axis=-1).item() != 1 and free.tolist()[0][1] < -1e29


def test_an_id_past_the_logits_is_dropped():
    out = Penalties([SamplingParams(logit_bias=((9, 1.0), (0, 1.0)))])(
        mx.zeros((1, 4)), [[0]], [[]]).tolist()
    assert out == [[1.0, 0.0, 0.0, 0.0]]
