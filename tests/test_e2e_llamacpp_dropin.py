"""End to end: the llama-server drop-in's errors and objects (#33) on the real mlxcel-server
process, read with llama-server's own field names: ``/detokenize``'s 500, ``/metrics``
mounted only with ``--metrics`` and its ``llamacpp:`` families (parsed with
``prometheus_client``), ``exceed_context_size_error``, ``/slots`` and ``with_pieces``."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from mlxcel.testing.e2e import server_client
from mlxcel.testing.servers import MlxcelServer
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow
KEY = {"Authorization": "Bearer k-dropin"}
CTX = 8192  # over --parallel 2: 4096 tokens per slot
N_CTX = CTX // 2
# llama-server's families, type and help as it writes them, counters first
FAMILIES = [
    ("llamacpp:prompt_tokens_total", "counter",
     "Number of prompt tokens processed, excluding cached tokens"),
    ("llamacpp:prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("llamacpp:tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls, excluding "
     "speculative decoding and multimodal decoding"),
    ("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("llamacpp:requests_processing", "gauge", "Number of requests processing"),
    ("llamacpp:requests_deferred", "gauge", "Number of requests deferred"),
    ("llamacpp:n_busy_slots_per_decode", "gauge",
     "Average number of busy slots per llama_decode() call"),
]


@pytest.fixture(scope="module")
def server(tiny_checkpoint, side_checkpoint):
    embedder = side_checkpoint("embedder", kind="qwen3")
    srv = MlxcelServer(["--model", str(tiny_checkpoint), "--parallel", "2", "--ctx-size",
                        str(CTX), "--api-key", "k-dropin", "--metrics", "--slots",
                        "--embedding-model", str(embedder)])
    yield srv
    srv.stop()


def scrape(http) -> tuple[dict[str, tuple[str, str, float]], httpx.Response]:
    """``llamacpp:`` samples by name -> (family type, help, value), and the response."""
    r = http.get("/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name.startswith("llamacpp:"):
                out[sample.name] = (family.type, family.documentation, sample.value)
    return out, r


def values(samples: dict) -> dict[str, float]:
    return {name: value for name, (_, _, value) in samples.items()}


def test_detokenize_out_of_vocabulary_is_500_server_error(http):
    """The first bad id in request order is named; ids past 32 bits reach the check."""
    r = http.post("/detokenize", json={"tokens": [1, 2, 2**40, -3]})
    assert r.status_code == 500
    vocab = int(r.json()["error"]["message"].rsplit(" ", 1)[1].rstrip(")"))
    assert r.json() == {"error": {"type": "server_error", "code": None, "message":
                                  f"token id {2**40} is out of vocabulary range "
                                  f"(vocab_size {vocab})"}}
    for tokens, bad in (([5, -7, 10**9], -7), ([vocab - 1, vocab], vocab),
                        ([2**63 - 1], 2**63 - 1)):
        r = http.post("/detokenize", json={"tokens": tokens})
        assert r.status_code == 500 and "content" not in r.json()  # no partial text
        assert r.json()["error"]["message"] == \
            f"token id {bad} is out of vocabulary range (vocab_size {vocab})"
    assert http.post("/detokenize", json={"tokens": [vocab - 1]}).status_code == 200


def test_metrics_is_not_mounted_without_the_flag(tiny_checkpoint, http):
    with server_client(["--model", str(tiny_checkpoint), "--slots"]) as plain:
        assert plain.get("/metrics").status_code == 404
        assert plain.get("/slots").status_code == 200
    assert http.get("/metrics").status_code == 200  # this module's server: --metrics


def test_llamacpp_families_count_requests_and_rates_exclude_the_first_token(http):
    before, first = scrape(http)
    assert [(n, t, h) for n, (t, h, _) in before.items()] == \
        [(n, t, h) for n, t, h in FAMILIES]
    start = first.headers["Process-Start-Time-Unix"]
    assert int(start) <= time.time()
    done = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 9,
                                          "temperature": 0, "ignore_eos": True}).json()
    after, second = scrape(http)
    assert second.headers["Process-Start-Time-Unix"] == start  # the same process
    b, a = values(before), values(after)
    delta = {k: a[k] - b[k] for k in a}
    assert delta["llamacpp:tokens_predicted_total"] == done["tokens_predicted"] == 9
    assert delta["llamacpp:prompt_tokens_total"] == \
        done["tokens_evaluated"] - done["tokens_cached"]
    assert delta["llamacpp:prompt_seconds_total"] > 0
    # a decode per token after the first, less the drafts a verify round kept
    kept = done["timings"].get("draft_n_accepted", 0)
    assert delta["llamacpp:n_decode_total"] >= 8 - kept
    # the window since the previous scrape holds this one request: 8 tokens after its
    # first, over the seconds from its first token to its last
    gen_s = delta["llamacpp:tokens_predicted_seconds_total"]
    assert a["llamacpp:predicted_tokens_seconds"] == pytest.approx(8 / gen_s, rel=1e-6)
    assert a["llamacpp:prompt_tokens_seconds"] == pytest.approx(
        delta["llamacpp:prompt_tokens_total"] / delta["llamacpp:prompt_seconds_total"],
        rel=1e-6)
    assert a["llamacpp:requests_processing"] == a["llamacpp:requests_deferred"] == 0
    assert a["llamacpp:n_busy_slots_per_decode"] >= 1
    again = values(scrape(http)[0])  # a scrape starts a new window
    assert again["llamacpp:predicted_tokens_seconds"] == 0
    assert again["llamacpp:prompt_tokens_seconds"] == 0
    assert again["llamacpp:tokens_predicted_total"] == a["llamacpp:tokens_predicted_total"]


def test_embedding_prompts_are_counted(http):
    before = values(scrape(http)[0])
    r = http.post("/v1/embeddings", json={"model": "emb", "input": ["a quiet river", "stone"]})
    assert r.status_code == 200
    after = values(scrape(http)[0])
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == \
        r.json()["usage"]["prompt_tokens"]
    assert after["llamacpp:prompt_seconds_total"] > before["llamacpp:prompt_seconds_total"]
    assert after["llamacpp:n_decode_total"] > before["llamacpp:n_decode_total"]
    assert after["llamacpp:tokens_predicted_total"] == before["llamacpp:tokens_predicted_total"]


def test_prompt_over_the_context_is_exceed_context_size_error(http):
    prompt = [10 + i % 200 for i in range(5000)]  # 5000 token ids, a slot holds 4096
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 4})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 5000,
        "n_ctx": N_CTX, "message": "request (5000 tokens) exceeds the available context "
        f"size ({N_CTX} tokens), try increasing it"}}
    # the OpenAI routes keep their error, with the two counts beside it
    r = http.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 4})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (5000, N_CTX)


def test_slots_carry_llama_server_fields(http):
    idle = http.get("/slots").json()
    assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in idle] == \
        [(0, N_CTX, False), (1, N_CTX, False)]
    assert all(isinstance(s["speculative"], bool) and "id_task" not in s for s in idle)
    body = {"prompt": "Tell me a story", "n_predict": 3000, "temperature": 0.5, "top_k": 7,
            "seed": 3, "ignore_eos": True, "stream": True}  # far from done when it is left
    with http.stream("POST", "/completion", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # generation started
        busy = http.get("/slots").json()[0]
    assert busy["is_processing"] is True and busy["state"] == "decoding"
    assert isinstance(busy["id_task"], int) and busy["n_ctx"] == N_CTX
    assert busy["n_prompt_tokens"] == \
        busy["n_prompt_tokens_processed"] + busy["n_prompt_tokens_cache"] > 0
    params = busy["params"]
    assert (params["temperature"], params["top_k"], params["seed"]) == (0.5, 7, 3)
    assert params["n_predict"] == params["max_tokens"] == 3000
    assert params["ignore_eos"] is True and params["mirostat"] == 0
    assert isinstance(params["samplers"], list) and "temperature" in params["samplers"]
    [token] = busy["next_token"]
    assert set(token) == {"has_next_token", "has_new_line", "n_remain", "n_decoded"}
    assert token["has_next_token"] is True and isinstance(token["has_new_line"], bool)
    assert token["n_decoded"] + token["n_remain"] == 3000 and token["n_decoded"] >= 1


def test_tokenize_with_pieces(http):
    text = "héllo 日本 🙂 Ω"
    plain = http.post("/tokenize", json={"content": text}).json()["tokens"]
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    assert all(set(p) == {"id", "piece"} for p in pieces)
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                   for p in pieces)
    assert raw == text.encode()
    assert any(isinstance(p["piece"], list) for p in pieces)  # a part of one character
    assert any(isinstance(p["piece"], str) and p["piece"].startswith(" ") for p in pieces)
    json.dumps(pieces)  # plain JSON: byte values are ints
