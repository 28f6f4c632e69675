"""Sampling parameters: non-finite numbers and out-of-range ints are refused (HTTP 400 naming
the field; a startup error for the flags); every in-range value samples."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.chat.request import SAMPLING_DEFAULTS, check_server_settings, sampling_params
from mlxcel.errors import InvalidRequest, StartupError

MSG = [{"role": "user", "content": "Tell me something"}]
FLOATS = ["temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
          "presence_penalty", "dry_multiplier", "dry_base", "xtc_probability", "xtc_threshold"]
INTS = ["top_k", "repetition_context_size", "dry_allowed_length", "dry_penalty_last_n"]


@pytest.mark.parametrize("field", FLOATS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidRequest) as err:
        sampling_params({field: value}, SAMPLING_DEFAULTS)
    assert err.value.param == field and field in str(err.value)


@pytest.mark.parametrize("field", INTS)
@pytest.mark.parametrize("value", [2**31 + 1, 2**70, 1.5, True])
def test_ints_out_of_bounds_or_not_ints_are_refused(field, value):
    with pytest.raises(InvalidRequest) as err:
        sampling_params({field: value}, SAMPLING_DEFAULTS)
    assert err.value.param == field


@pytest.mark.parametrize("fields", [
    {"dry_base": 1.0}, {"dry_base": 1e300}, {"dry_multiplier": 1e300},
    {"temperature": 1e-300}, {"temperature": 1e300}, {"repetition_penalty": 1e-300},
    {"top_k": 2**31}, {"dry_allowed_length": 2**31}, {"repetition_context_size": -1},
    {"dry_sequence_breakers": [0, 2**32 - 1]},
])
def test_extreme_values_in_range_are_accepted(fields):
    params = sampling_params(fields, SAMPLING_DEFAULTS)
    key, value = next(iter(fields.items()))
    assert key == "repetition_context_size" or getattr(params, key) == (
        tuple(value) if isinstance(value, list) else value)


@pytest.mark.parametrize("flag,value", [
    ("temp", math.nan), ("dry_base", math.inf), ("dry_multiplier", -math.inf),
    ("top_k", 2**40), ("dry_base", 0.5), ("repeat_penalty", math.nan),
])
def test_startup_flags_follow_the_same_rules(flag, value):
    with pytest.raises(StartupError, match=flag.replace("_", "-")):
        check_server_settings(SimpleNamespace(**{flag: value}))


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=2) as c:
        wait_ready(c)
        yield c


@pytest.mark.parametrize("field,raw", [
    ("temperature", "1e999"), ("dry_base", "1e999"), ("dry_multiplier", "-1e999"),
    ("top_k", "4294967296"), ("dry_allowed_length", "99999999999"),
])
def test_huge_literals_over_http_are_400(client, field, raw):
    """msgspec refuses ``1e999`` for a float field itself (the dialect words that error);
    huge ints decode and meet the rules, which name the field."""
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, ' \
        f'"{field}": {raw}}}'
    r = client.post("/v1/chat/completions", content=body,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    if "e999" not in raw:
        assert field in r.json()["error"]["message"]


def test_a_dry_bomb_over_http_completes(client):
    r = client.post("/v1/completions", json={
        "prompt": [5] * 1300, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "dry_multiplier": 0.8, "dry_base": 1e300})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
