"""Speculative decoding on the real ``mlxcel-server``: the spec's timings, present only
when a drafter ran a verify round for the request, on the non-streaming body and on the
chunk that carries ``finish_reason``; and the same greedy text with prompt lookup on and
off."""

from __future__ import annotations

import json

import httpx
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
PROMPT = "alpha beta gamma delta " * 12  # its last words occurred before: lookup drafts
DRAFT = {"draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"}


@pytest.fixture(scope="module")
def servers(tiny_checkpoint):
    on = Server(["--model", str(tiny_checkpoint), "--prompt-lookup", "on", "--metrics"])
    off = Server(["--model", str(tiny_checkpoint), "--prompt-lookup", "off"])
    yield on, off
    on.stop()
    off.stop()


def post(server, path, **body):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        return client.post(path, json={"max_tokens": 24, "temperature": 0,
                                       "cache_prompt": False, **body})


def events(text):
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


def test_a_drafted_completion_carries_the_draft_timings(servers):
    on, off = servers
    body = post(on, "/v1/completions", prompt=PROMPT).json()
    timings = body["timings"]
    assert timings["draft_kind"] == "prompt-lookup" and timings["draft_rounds"] >= 1
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert {"prompt_n", "predicted_n", "predicted_per_second"} <= set(timings)
    plain = post(off, "/v1/completions", prompt=PROMPT).json()
    assert "timings" not in plain
    assert body["choices"][0]["text"] == plain["choices"][0]["text"]


def test_streamed_timings_ride_only_the_finishing_chunk(servers):
    on, _ = servers
    chunks = events(post(on, "/v1/completions", prompt=PROMPT, stream=True).text)
    finishing = [c for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
    middle = [c for c in chunks if c not in finishing]
    assert len(finishing) == 1 and DRAFT <= set(finishing[0]["timings"])
    assert all("timings" not in c for c in middle)


def test_native_completion_timings_gain_the_draft_counters(servers):
    on, off = servers
    native = post(on, "/completion", prompt=PROMPT, n_predict=24).json()
    assert DRAFT <= set(native["timings"]) and native["timings"]["draft_rounds"] >= 1
    plain = post(off, "/completion", prompt=PROMPT, n_predict=24).json()
    assert not DRAFT & set(plain["timings"])
    assert native["content"] == plain["content"]


def test_a_drafted_response_carries_the_draft_timings(servers):
    on, off = servers
    body = {"input": PROMPT, "max_output_tokens": 48, "temperature": 0}
    with httpx.Client(base_url=on.base_url, timeout=120) as client:
        drafted = client.post("/v1/responses", json=body).json()
        streamed = events(client.post("/v1/responses", json={**body, "stream": True}).text)
    assert DRAFT <= set(drafted["timings"]) and drafted["timings"]["draft_rounds"] >= 1
    timed = [e for e in streamed if "timings" in e]
    assert len(timed) == 1 and DRAFT <= set(timed[0]["timings"])
    with httpx.Client(base_url=off.base_url, timeout=120) as client:
        plain = client.post("/v1/responses", json=body).json()
    assert "timings" not in plain
    assert drafted["output"][-1]["content"] == plain["output"][-1]["content"]


def test_metrics_and_health_count_the_verify_rounds(servers):
    from prometheus_client.parser import text_string_to_metric_families

    on, _ = servers
    post(on, "/v1/completions", prompt=PROMPT)
    with httpx.Client(base_url=on.base_url, timeout=60) as client:
        text = client.get("/metrics").text
        health = client.get("/health").json()["observability"]
    values = {s.name: s.value for f in text_string_to_metric_families(text)
              for s in f.samples}
    assert values["mlxcel_draft_rounds_total"] >= 1
    assert 0 < values["mlxcel_draft_accepted_total"] <= values["mlxcel_draft_tokens_total"]
    assert health["draft_rounds"] == values["mlxcel_draft_rounds_total"]
