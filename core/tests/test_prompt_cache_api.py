"""Prompt cache inside the batching engine, through the API: hits across turns and
requests, cache_prompt, --no-cache-prompt, equality with a cold prefill, stats/reset."""

from __future__ import annotations

import pytest
from apphelpers import make_client, wait_ready

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 30}


def chat(c, messages, **kw):
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **kw}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def cached(resp):
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def f32(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")


@pytest.fixture
def cclient(f32):
    with make_client(f32, parallel=4) as c:
        wait_ready(c)
        yield c


def test_second_turn_reuses_the_first(cclient):
    turn1 = [SYSTEM, {"role": "user", "content": "What is a cache?"}]
    first = chat(cclient, turn1)
    assert cached(first) == 0
    reply = first["choices"][0]["message"]["content"]
    turn2 = turn1 + [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And a prefix?"}]
    second = chat(cclient, turn2)
    assert cached(second) >= first["usage"]["prompt_tokens"] - 16
    assert cached(second) % 16 == 0 and cached(second) < second["usage"]["prompt_tokens"]
    stats = cclient.get("/v1/cache/stats").json()
    assert stats["hits"] >= 1 and stats["inserts"] >= 2 and stats["entries"] >= 1
    assert stats["hit_rate"] == pytest.approx(stats["hits"] / stats["lookups"], abs=1e-4)


def test_requests_sharing_a_system_prompt_hit_concurrently(cclient):
    from concurrent.futures import ThreadPoolExecutor

    chat(cclient, [SYSTEM, {"role": "user", "content": "warm"}])
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda q: chat(cclient, [SYSTEM, {"role": "user", "content": q}]),
                             ["one?", "two?", "three?"]))
    assert all(cached(o) >= 16 * 10 for o in outs)


def test_cache_hit_gives_the_same_greedy_output_and_logits(cclient):
    msgs = [SYSTEM, {"role": "user", "content": "Compare me"}]
    chat(cclient, msgs)  # populate
    kw = {"logprobs": True, "top_logprobs": 5, "max_tokens": 8}
    warm = chat(cclient, msgs, **kw)
    cold = chat(cclient, msgs, cache_prompt=False, **kw)
    assert cached(warm) > 0 and cached(cold) == 0
    w, c = (r["choices"][0]["logprobs"]["content"] for r in (warm, cold))
    for a, b in zip(w[0]["top_logprobs"], c[0]["top_logprobs"], strict=True):
        assert a["token"] == b["token"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]


def test_cache_prompt_false_contributes_nothing(cclient):
    before = cclient.get("/v1/cache/stats").json()
    msgs = [{"role": "user", "content": "private " * 40}]
    chat(cclient, msgs, cache_prompt=False)
    chat(cclient, msgs, cache_prompt=False)
    after = cclient.get("/v1/cache/stats").json()
    assert after["inserts"] == before["inserts"] and after["lookups"] == before["lookups"]


def test_reset_is_idempotent_and_frees(cclient):
    chat(cclient, [SYSTEM, {"role": "user", "content": "fill"}])
    stats = cclient.get("/v1/cache/stats").json()
    first = cclient.post("/v1/cache/reset").json()
    assert first == {"cleared": True, "freed_bytes": stats["bytes"],
                     "freed_entries": stats["entries"]}
    assert cclient.post("/v1/cache/reset").json() == {"cleared": True, "freed_bytes": 0,
                                                      "freed_entries": 0}
    assert cclient.get("/v1/cache/stats").json()["entries"] == 0


def test_server_wide_off_cannot_be_reenabled_by_a_request(f32):
    with make_client(f32, parallel=2, no_cache_prompt=True) as c:
        wait_ready(c)
        msgs = [SYSTEM, {"role": "user", "content": "x"}]
        chat(c, msgs, cache_prompt=True)
        again = chat(c, msgs, cache_prompt=True)
        stats = c.get("/v1/cache/stats").json()
    assert cached(again) == 0
    assert stats["enabled"] is False and stats["entries"] == 0 and stats["lookups"] == 0


def test_entries_larger_than_capacity_are_rejected(f32):
    with make_client(f32, parallel=2, prompt_cache_capacity_bytes=4096) as c:
        wait_ready(c)
        chat(c, [SYSTEM, {"role": "user", "content": "big"}])
        stats = c.get("/v1/cache/stats").json()
    assert stats["rejections_oversized"] >= 1 and stats["entries"] == 0
    assert stats["capacity_bytes"] == 4096
