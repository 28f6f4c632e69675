"""Sampling and generation controls end to end (in process): every parameter, logprobs,
loop detection, seeds under concurrency, server defaults in /props."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.engine.sequence import Sequence
from mlxcel.types import GenerationRequest, LoopPolicy

MSG = [{"role": "user", "content": "Tell me something"}]
VALID = {
    "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "p_less": True,
    "repetition_penalty": 1.1, "repetition_context_size": 64, "frequency_penalty": 0.5,
    "presence_penalty": 0.5, "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
    "dry_penalty_last_n": 0, "dry_sequence_breakers": [1, 2, 3], "xtc_probability": 0.5,
    "xtc_threshold": 0.1, "seed": 42, "max_pattern_size": 8, "min_pattern_size": 0,
    "min_count": 3, "cache_prompt": False,
}


@pytest.mark.parametrize("field,value", sorted(VALID.items()))
def test_every_parameter_is_accepted_on_chat_and_completions(client, field, value):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4,
                                                  field: value})
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, field: value})
    assert r.status_code == 200, r.text


def test_all_samplers_at_once(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 24,
                                                  "ignore_eos": True, **VALID})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 24


@pytest.mark.parametrize("field,value", [
    ("top_p", 1.5), ("top_k", -1), ("temperature", -0.1), ("min_p", 2),
    ("repetition_penalty", 0), ("frequency_penalty", 3), ("presence_penalty", -2.5),
    ("dry_multiplier", -1), ("dry_base", 0.5), ("dry_allowed_length", -1),
    ("xtc_probability", 1.5), ("xtc_threshold", -0.1), ("top_logprobs", 21),
    ("top_k", "many"), ("dry_sequence_breakers", "x"), ("seed", -5), ("p_less", "yes"),
    ("max_pattern_size", -1), ("min_count", -2),
])
def test_bad_values_are_400_naming_the_field(client, field, value):
    r = client.post("/v1/chat/completions", json={"messages": MSG, field: value})
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]


@pytest.mark.parametrize("where", ["root", "nested"])
def test_cache_prompt_and_sampling_fields_in_extra_body(client, where):
    extra = {"cache_prompt": False, "top_k": 1, "temperature": 1.0, "seed": 3}
    body = {"messages": MSG, "max_tokens": 8, "ignore_eos": True}
    body.update(extra if where == "root" else {"extra_body": extra})
    first = client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200
    greedy = client.post("/v1/chat/completions", json={**{k: v for k, v in body.items()
                                                           if k != "extra_body"},
                                                        "temperature": 0})
    # top_k 1 makes sampling greedy: the nested fields really took effect
    assert first.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_nested_extra_body_field_is_validated(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG,
                                                  "extra_body": {"top_p": 7}})
    assert r.status_code == 400 and "top_p" in r.json()["error"]["message"]


def test_chat_logprobs_non_streaming_and_streaming(client):
    body = {"messages": MSG, "max_tokens": 6, "ignore_eos": True, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    whole = client.post("/v1/chat/completions", json=body).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry["logprob"] == pytest.approx(tops[0], abs=1e-4)  # greedy picks the top
        assert entry["bytes"] == list(entry["token"].encode())
    r = client.post("/v1/chat/completions", json={**body, "stream": True})
    frames = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    streamed = [e for f in frames for c in f["choices"] if c.get("logprobs")
                for e in c["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]


def test_completion_logprobs_shape(client):
    body = {"prompt": "Once", "max_tokens": 5, "ignore_eos": True, "temperature": 0,
            "logprobs": 2}
    lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 5
    assert all(len(t) <= 2 for t in lp["top_logprobs"])
    assert lp["text_offset"] == sorted(lp["text_offset"])
    plain = client.post("/v1/completions", json={**body, "logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_loop_detection_unit():
    from mlxcel.model.tokenizer import Tokenizer

    class Sink:
        cancelled = False

        def __init__(self):
            self.events = []

        def emit(self, event):
            self.events.append(event)

    def run(policy, tokens):
        import pathlib

        from mlxcel.testing.checkpoint import cached_checkpoint
        tok = Tokenizer.from_dir(pathlib.Path(cached_checkpoint("qwen3")))
        sink = Sink()
        req = GenerationRequest(request_id="l", prompt_tokens=(1,), max_tokens=100,
                                loop=policy)
        seq = Sequence(req, sink, tok, set(), 0)
        for t in tokens:
            if seq.finished:
                break
            seq.accept(t)
        return seq.generated, sink.events[-1].finish_reason

    assert run(LoopPolicy(min_pattern_size=1, max_pattern_size=4, min_count=3),
               [9, 5, 6, 5, 6, 5, 6, 7]) == (7, "stop")
    assert run(LoopPolicy(min_pattern_size=3, max_pattern_size=4, min_count=3),
               [9, 5, 6, 5, 6, 5, 6, 7, 8]) == (9, None)
    assert run(LoopPolicy(min_pattern_size=1, max_pattern_size=4, min_count=4),
               [9, 5, 6, 5, 6, 5, 6, 7]) == (8, None)
    assert run(None, [5] * 20) == (20, None)


def test_loop_detection_setting_and_request_precedence(tiny_checkpoint):
    from mlxcel.options import loop_policy

    with make_client(tiny_checkpoint, parallel=2, loop_detection=loop_policy("1:8:2")) as c:
        wait_ready(c)
        body = {"prompt": "a", "max_tokens": 300, "temperature": 0, "ignore_eos": True}
        looped = c.post("/v1/completions", json=body).json()
        off = c.post("/v1/completions", json={**body, "max_pattern_size": 0}).json()
    assert looped["choices"][0]["finish_reason"] == "stop"
    assert looped["usage"]["completion_tokens"] < 300
    assert off["choices"][0]["finish_reason"] == "length"
    assert off["usage"]["completion_tokens"] == 300


def test_seed_reproducible_while_sharing_the_batch(client):
    seeded = {"messages": MSG, "max_tokens": 16, "ignore_eos": True, "temperature": 1.3,
              "top_k": 0, "top_p": 1.0, "min_p": 0, "seed": 1234}
    alone = client.post("/v1/chat/completions", json=seeded).json()
    others = {"messages": [{"role": "user", "content": "noise"}], "max_tokens": 40,
              "ignore_eos": True, "temperature": 1.0}
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client.post, "/v1/chat/completions", json=others)
                   for _ in range(2)]
        shared = pool.submit(client.post, "/v1/chat/completions", json=seeded)
        [f.result() for f in futures]
    assert shared.result().json()["choices"][0]["message"] == alone["choices"][0]["message"]


def test_greedy_with_cache_prompt_false_is_deterministic(client):
    body = {"messages": MSG, "max_tokens": 12, "temperature": 0, "cache_prompt": False}
    texts = {json.dumps(client.post("/v1/chat/completions", json=body).json()["choices"])
             for _ in range(3)}
    assert len(texts) == 1


def test_server_defaults_from_flags_reach_props_and_requests(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=1, temp=0.0, top_k=7, repeat_penalty=1.2,
                     dry_multiplier=0.5, seed=99, xtc_probability=0.25) as c:
        wait_ready(c)
        d = c.get("/props").json()["default_generation_settings"]
        assert (d["temperature"], d["top_k"], d["repeat_penalty"], d["dry_multiplier"],
                d["seed"], d["xtc_probability"]) == (0.0, 7, 1.2, 0.5, 99, 0.25)
        # temperature 0 by default now: two identical requests give identical text
        body = {"messages": MSG, "max_tokens": 10, "ignore_eos": True}
        a, b = (c.post("/v1/chat/completions", json=body).json() for _ in range(2))
        assert a["choices"] == b["choices"]


def test_loop_policy_precedence():
    from mlxcel.chat.request import request_loop_policy, server_loop_policy
    from mlxcel.families.api import LoopPolicy as FamilyLoop
    from mlxcel.options import loop_policy

    gemma_like = FamilyLoop(min_pattern_size=1, max_pattern_size=20, min_count=4)
    family = server_loop_policy(gemma_like)
    assert (family.min_pattern_size, family.max_pattern_size, family.min_count) == (1, 20, 4)
    assert server_loop_policy(None) is None
    server = server_loop_policy(gemma_like, loop_policy("2:6:3"))
    assert (server.min_pattern_size, server.max_pattern_size, server.min_count) == (2, 6, 3)
    assert not server_loop_policy(gemma_like, loop_policy("off")).enabled
    none = {"min_pattern_size": None, "max_pattern_size": None, "min_count": None}
    assert request_loop_policy(none, family) is family
    assert request_loop_policy({**none, "max_pattern_size": 0}, family) is None
    tuned = request_loop_policy({**none, "min_count": 2, "min_pattern_size": 0}, family)
    assert (tuned.min_pattern_size, tuned.max_pattern_size, tuned.min_count) == (1, 20, 2)
    assert request_loop_policy({**none, "min_count": 1}, family) is None  # < 2 disables
