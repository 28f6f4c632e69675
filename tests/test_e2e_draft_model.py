"""The draft-model drafter (``-md``) on the real ``mlxcel-server``: the same greedy text as
without speculation, alone and with concurrent requests, the spec's timings with
``draft_kind`` "draft", the env twin, and a draft with another vocabulary refused in one
line at startup."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.draft_checkpoints import draft_pair
from mlxcel.testing.servers import MlxcelServer as Server
from mlxcel.testing.servers import free_port, server_exe

pytestmark = pytest.mark.slow
PROMPTS = ["alpha beta gamma", "one two three four five", "the cat sat on the mat",
           "zeta eta theta iota kappa lambda"]


@pytest.fixture(scope="module")
def pair(mlxcel_checkpoint_cache):
    return draft_pair(mlxcel_checkpoint_cache)


@pytest.fixture(scope="module")
def servers(pair):
    target, draft = pair
    # --prompt-lookup on: the batch governor stays out, so every request drafts
    on = Server(["--model", str(target), "-md", str(draft), "--parallel", "4",
                 "--draft-max", "4", "--prompt-lookup", "on"])
    off = Server(["--model", str(target), "--parallel", "4", "--prompt-lookup", "off"])
    yield on, off
    on.stop()
    off.stop()


def complete(server, prompt, max_tokens=32):
    with httpx.Client(base_url=server.base_url, timeout=120, trust_env=False) as client:
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                 "temperature": 0, "cache_prompt": False})
    assert r.status_code == 200, r.text
    return r.json()


def test_one_request_gives_the_same_text_and_the_draft_timings(servers):
    on, off = servers
    drafted, plain = complete(on, PROMPTS[0]), complete(off, PROMPTS[0])
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
    timings = drafted["timings"]
    assert timings["draft_kind"] == "draft" and timings["draft_n"] > 0
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert "timings" not in plain


def test_concurrent_requests_give_the_same_texts(servers):
    on, off = servers
    lengths = [24, 40, 16, 32]  # rows leave at different times
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        drafted = list(pool.map(lambda a: complete(on, *a), zip(PROMPTS, lengths,
                                                                 strict=True)))
    plain = [complete(off, p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
    assert [d["choices"][0]["text"] for d in drafted] == \
        [p["choices"][0]["text"] for p in plain]
    assert all(d["timings"]["draft_kind"] == "draft" for d in drafted)


def test_the_env_twin_names_the_draft_model(pair):
    target, draft = pair
    server = Server(["--model", str(target)], env={"LLAMA_ARG_MODEL_DRAFT": str(draft)})
    try:
        body = complete(server, PROMPTS[1], 16)
        assert body["timings"]["draft_kind"] == "draft"
    finally:
        server.stop()


def test_a_draft_with_another_vocabulary_refuses_to_start_in_one_line(pair,
                                                                       mlxcel_checkpoint_cache):
    target, _ = pair
    other = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, vocab_size=640)
    proc = subprocess.run([server_exe(), "-m", str(target), "-md", str(other), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "mlxcel-server: error:" in line]
    assert len(errors) == 1
    assert "vocabulary size 512 (target) vs 640 (draft)" in errors[0]
