"""n choices, ``timings_per_token`` and ``return_progress`` on the real ``mlxcel-server``,
with OpenAI's and llama-server's field names.

- ``n`` > 1 (chat, completions) and ``n_cmpl`` (native ``/completion``): one choice per
  ``index``, the prompt prefilled once (the engine's ``total_prefill_tokens`` grows by
  the prompt's length, not n times it), usage counting the prompt once, seeded choices
  that differ and repeat, streams interleaving chunks by ``index``; ``n`` over the slots
  is a 400.
- ``timings_per_token``: llama-server's ``timings`` on every streamed chunk.
- ``return_progress``: ``prompt_progress`` (``total``, ``cache``, ``processed``,
  ``time_ms``) before the first token, in chat, native and Responses streams.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
PARALLEL = 4
MSG = [{"role": "user", "content": "Tell me a long story about a llama and a server."}]
LONG = " ".join(f"word{i}" for i in range(120))  # several 16-token prefill chunks
TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
           "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
PROGRESS = {"total", "cache", "processed", "time_ms"}


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", str(PARALLEL),
                  "--ubatch-size", "16"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


def prefilled(http) -> int:
    return http.get("/health").json()["observability"]["total_prefill_tokens"]


def chat(http, **fields):
    body = {"messages": MSG, "max_tokens": 8, "cache_prompt": False, **fields}
    return http.post("/v1/chat/completions", json=body)


def test_n_choices_prefill_the_prompt_once(http):
    before = prefilled(http)
    one = chat(http, n=1)
    assert one.status_code == 200, one.text
    single = prefilled(http) - before
    three = chat(http, n=3, temperature=1.0)
    assert three.status_code == 200, three.text
    assert prefilled(http) - before - single == single  # the same prompt, computed once
    body = three.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] in ("stop", "length") for c in body["choices"])
    usage = body["usage"]
    assert usage["prompt_tokens"] == one.json()["usage"]["prompt_tokens"]
    # each choice generates 8 tokens at most; the sum is reported once
    assert 3 <= usage["completion_tokens"] <= 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_seeded_choices_differ_and_repeat(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    def texts():
        r = client.chat.completions.create(model="tiny", messages=MSG, n=3, seed=11,
                                           temperature=1.0, max_tokens=12,
                                           extra_body={"ignore_eos": True})
        return [c.message.content for c in sorted(r.choices, key=lambda c: c.index)]
    first = texts()
    assert first == texts()
    assert len(set(first)) == 3


def test_streamed_choices_interleave_by_index(http):
    r = chat(http, n=2, stream=True, temperature=1.0, max_tokens=6, ignore_eos=True,
             stream_options={"include_usage": True})
    assert r.status_code == 200, r.text
    chunks = events(r.text)
    assert r.text.rstrip().endswith("data: [DONE]") and r.text.count("[DONE]") == 1
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"]
                for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finishes == {0: "length", 1: "length"}
    usage = [c for c in chunks if not c["choices"]]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 12
    # a sampled ``<think>`` sends the rest of a choice to reasoning_content: both are its text
    text = {0: "", 1: ""}
    for c in chunks:
        if c["choices"]:
            delta = c["choices"][0]["delta"]
            text[c["choices"][0]["index"]] += ((delta.get("content") or "")
                                               + (delta.get("reasoning_content") or ""))
    assert text[0] and text[1]


def test_structured_output_holds_for_every_choice(http):
    schema = {"type": "string", "enum": ["yes", "no"]}
    r = chat(http, n=3, temperature=1.0, max_tokens=20, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert json.loads(choice["message"]["content"]) in ("yes", "no")


def test_completions_and_native_n_cmpl(http):
    r = http.post("/v1/completions", json={"prompt": "Once upon", "n": 2, "max_tokens": 4,
                                           "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    assert r.json()["usage"]["completion_tokens"] == 8
    native = http.post("/completion", json={"prompt": "Once upon", "n_cmpl": 2,
                                            "n_predict": 4, "ignore_eos": True})
    assert native.status_code == 200, native.text
    results = native.json()
    assert isinstance(results, list) and [b["index"] for b in results] == [0, 1]
    assert all(b["tokens_predicted"] == 4 for b in results)
    streamed = http.post("/completion", json={"prompt": "Once upon", "n_cmpl": 2, "n": 2,
                                              "n_predict": 3, "stream": True,
                                              "ignore_eos": True})
    finals = [e for e in events(streamed.text) if e.get("stop")]
    assert sorted(e["index"] for e in finals) == [0, 1]


def test_n_over_the_slots_or_under_one_is_400(http):
    for n in (PARALLEL + 1, 0):
        r = chat(http, n=n)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "n"
    native = http.post("/completion", json={"prompt": "x", "n_cmpl": PARALLEL + 1})
    assert native.status_code == 400 and "n_cmpl" in native.text


def test_timings_per_token_on_every_streamed_chunk(http):
    r = chat(http, stream=True, timings_per_token=True, max_tokens=5, ignore_eos=True)
    chunks = [c for c in events(r.text) if c["choices"]]
    content = [c for c in chunks if c["choices"][0]["delta"].get("content")
               or c["choices"][0]["finish_reason"]]
    assert content and all(TIMINGS <= set(c["timings"]) for c in content)
    assert content[-1]["timings"]["predicted_n"] == 5
    plain = chat(http, stream=True, max_tokens=3)
    assert not any("timings" in c for c in events(plain.text))


def _progress(chunks: list[dict], total: int | None = None) -> list[dict]:
    found = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert len(found) >= 3, chunks[:3]  # the start, then a report per 16-token chunk
    assert all(set(p) == PROGRESS for p in found)
    assert found[0]["processed"] == found[0]["cache"] == 0
    assert found[-1]["processed"] == found[-1]["total"]
    assert [p["processed"] for p in found] == sorted(p["processed"] for p in found)
    if total is not None:
        assert found[-1]["total"] == total
    return found


def test_return_progress_in_chat_native_and_responses_streams(http):
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": LONG}], "stream": True,
        "return_progress": True, "max_tokens": 3, "cache_prompt": False})
    chunks = events(r.text)
    found = _progress(chunks)
    first_content = next(i for i, c in enumerate(chunks)
                         if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert all("prompt_progress" not in c for c in chunks[first_content:])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert found[-1]["total"] > 100

    native = http.post("/completion", json={"prompt": LONG, "stream": True,
                                            "return_progress": True, "n_predict": 2,
                                            "cache_prompt": False})
    _progress(events(native.text))

    resp = http.post("/v1/responses", json={"input": LONG, "stream": True,
                                            "return_progress": True,
                                            "max_output_tokens": 3, "cache_prompt": False})
    opening = [e for e in events(resp.text) if e["type"] in ("response.created",
                                                              "response.in_progress")]
    # llama-server's shape: the first report rides the in_progress event that opens the
    # stream after response.created; each later report is an in_progress event of its own
    assert [e["type"] for e in opening[:2]] == ["response.created", "response.in_progress"]
    assert "prompt_progress" not in opening[0]
    progress = opening[1:]
    assert all(e["type"] == "response.in_progress" and "prompt_progress" in e
               and set(e) == {"type", "sequence_number", "response", "prompt_progress"}
               and e["response"]["status"] == "in_progress"
               and e["response"]["object"] == "response"
               and e["response"]["id"] == opening[0]["response"]["id"] for e in progress)
    _progress(progress)

    quiet = http.post("/completion", json={"prompt": LONG, "stream": False,
                                           "return_progress": True, "n_predict": 2})
    assert "prompt_progress" not in quiet.text  # stream mode only, as llama-server


def test_timings_per_token_in_responses_stream(http):
    r = http.post("/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 4,
                                         "timings_per_token": True})
    timed = [e for e in events(r.text) if "timings" in e]
    assert timed and all(TIMINGS <= set(e["timings"]) for e in timed)
    assert timed[-1]["type"] in ("response.completed", "response.incomplete")


def test_every_choice_makes_its_own_forced_tool_call(tmp_path_factory):
    """Each choice parses its own answer: a forced call comes back in every choice, with
    ``finish_reason`` ``tool_calls`` and arguments valid for the declared function."""
    from mlxcel.testing import build_checkpoint

    ckpt = build_checkpoint(tmp_path_factory.mktemp("chatml") / "ckpt", template="chatml")
    srv = Server(["--model", str(ckpt), "--parallel", "2"])
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
        schema = {"type": "object", "properties": {"tz": {"type": "string",
                                                          "enum": ["UTC", "CET"]}},
                  "required": ["tz"]}
        r = client.chat.completions.create(
            model="tiny", messages=MSG, n=2, seed=3, temperature=1.0, max_tokens=300,
            tools=[{"type": "function", "function": {"name": "get_time",
                                                      "parameters": schema}}],
            tool_choice="required")
        assert [c.index for c in r.choices] == [0, 1]
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls"
            (call,) = choice.message.tool_calls
            assert call.function.name == "get_time"
            assert json.loads(call.function.arguments)["tz"] in ("UTC", "CET")
    finally:
        srv.stop()
