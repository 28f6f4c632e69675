"""Request memory admission: size parsing, the budget, the per-request estimate."""

from __future__ import annotations

import asyncio

import pytest
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.memory import device_budget, estimate_request_bytes, request_budget
from mlxcel.errors import MemoryBudgetExceeded, StartupError
from mlxcel.options import build_parser, parse_size
from mlxcel.testing.engine import engine_for
from mlxcel.types import GenerationRequest, SamplingParams

CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 192,
          "vocab_size": 512}


@pytest.mark.parametrize("text,value", [("12G", 12 << 30), ("512M", 512 << 20),
                                        ("1.5g", 3 << 29), ("1048576", 1 << 20),
                                        ("64KiB", 64 << 10), (" 2 GB ", 2 << 30)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["0", "none", "", "12X", "-5G", "garbage", "0M"])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["0", "none", "12X", "-5G", "garbage", "0M"])
def test_bad_budget_values_refuse_to_start(monkeypatch, bad):
    monkeypatch.setenv("MLXCEL_REQUEST_MEMORY_BUDGET", bad)
    with pytest.raises(StartupError, match="MLXCEL_REQUEST_MEMORY_BUDGET"):
        build_parser()
    monkeypatch.delenv("MLXCEL_REQUEST_MEMORY_BUDGET")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--request-memory-budget", bad])


def test_the_setting_can_only_lower_the_device_budget():
    device = device_budget()
    assert request_budget() == device
    assert request_budget(1 << 20) == 1 << 20
    assert request_budget(device * 4) == device


def test_estimate_counts_kv_in_cache_steps():
    small = estimate_request_bytes(CONFIG, 10, 10, 512, 2)
    kv_256 = 2 * 2 * 2 * 16 * 256 * 2  # K+V, layers, kv heads, head_dim, 256 tokens, bf16
    assert small >= kv_256
    assert estimate_request_bytes(CONFIG, 10, 300, 512, 2) - small >= kv_256  # next step
    assert estimate_request_bytes(CONFIG, 10, 10, 512, 4) > small  # float32 costs more


def test_over_budget_request_is_refused_before_it_runs(tiny_checkpoint):
    engine = engine_for(tiny_checkpoint, 2, config=EngineConfig(request_memory_budget=200 << 10))
    try:
        def make(n):
            return GenerationRequest(request_id=str(n), prompt_tokens=(1, 2, 3), max_tokens=n,
                                     sampling=SamplingParams(temperature=0), ignore_eos=True)

        async def run():
            ok = [e async for e in engine.submit(make(4))]
            with pytest.raises(MemoryBudgetExceeded) as info:
                engine.submit(make(3000))
            return ok, info.value
        ok, err = asyncio.run(run())
        assert ok[-1].finish_reason == "length"
        assert err.extra["budget_bytes"] == 200 << 10
        assert err.extra["estimated_bytes"] > err.extra["budget_bytes"]
        from mlxcel.dialects.openai.errors import error_type

        assert err.status == 503
        assert error_type(err) == err.code == "request_memory_budget_exceeded"
    finally:
        engine.shutdown()
