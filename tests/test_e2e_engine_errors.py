"""End to end: a row the engine fails is an error to its client, never a success.

The server under test runs a real engine on the tiny checkpoint whose model raises when a
prefill holds the ``<tool_call>`` token (a test-only wrapper, installed in the server's own
process through a ``sitecustomize`` module on its PYTHONPATH), so one request fails in the
engine for real while the others run beside it.
"""

from __future__ import annotations

import textwrap
import threading

import httpx
import openai
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
MARKER_TEXT = "<tool_call>"
MESSAGE = "marker token reached the model"
WRAPPER = f'''
"""Test-only: the served model raises on a prefill that holds the marker token."""
import mlx.core as mx
import mlxcel.model.loader as loader

_load = loader.load_checkpoint


def load_checkpoint(*args, **kwargs):
    ckpt = _load(*args, **kwargs)
    marker = ckpt.tokenizer.hf.token_to_id({MARKER_TEXT!r})
    base = type(ckpt.model)

    def __call__(self, inputs, *a, **k):
        if inputs.ndim == 2 and inputs.shape[1] > 1 and mx.any(inputs == marker).item():
            raise RuntimeError({MESSAGE!r})
        return base.__call__(self, inputs, *a, **k)

    ckpt.model.__class__ = type("MarkerFailing" + base.__name__, (base,),
                                {{"__call__": __call__}})
    return ckpt


loader.load_checkpoint = load_checkpoint
'''


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    site = tmp_path_factory.mktemp("failing-model")
    (site / "sitecustomize.py").write_text(textwrap.dedent(WRAPPER))
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "2"],
                 env={"PYTHONPATH": str(site)})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


FAILING = [{"role": "user", "content": f"please {MARKER_TEXT} fail"}]
FINE = [{"role": "user", "content": "Say something."}]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_non_streaming_failure_is_500_with_the_message(server):
    r = httpx.post(server.base_url + "/v1/chat/completions",
                   json={"messages": FAILING, "max_tokens": 4}, timeout=30)
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and MESSAGE in err["message"]


def test_sdk_raises_on_a_failed_non_streaming_row(sdk):
    with pytest.raises(openai.InternalServerError) as info:
        sdk.chat.completions.create(model="tiny", messages=FAILING, max_tokens=4)
    assert MESSAGE in info.value.message


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_sdk_raises_api_error_on_a_failed_stream(sdk, server, kind):
    if kind == "chat":
        stream = sdk.chat.completions.create(model="tiny", messages=FAILING, max_tokens=4,
                                             stream=True)
    else:
        ids = httpx.post(server.base_url + "/tokenize",
                         json={"content": f"Once {MARKER_TEXT} upon a time"}).json()["tokens"]
        stream = sdk.completions.create(model="tiny", prompt=ids, max_tokens=4, stream=True)
    seen = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            seen.append(chunk)
    assert MESSAGE in info.value.message
    assert all(c.choices == [] or c.choices[0].finish_reason is None for c in seen)


def test_raw_stream_ends_with_an_error_frame_then_done(server):
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=30,
                      json={"messages": FAILING, "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200
        frames = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert frames[-2].startswith('data: {"error":')
    error = httpx.Response(200, content=frames[-2][6:]).json()["error"]
    assert error["type"] == "server_error" and error["code"] is None
    assert MESSAGE in error["message"]
    assert '"finish_reason":"error"' not in "".join(frames)


def test_other_requests_are_unaffected(sdk):
    started = threading.Event()
    outcome: dict = {}

    def long_stream() -> None:
        stream = sdk.chat.completions.create(model="tiny", messages=FINE, max_tokens=120,
                                             stream=True, **GREEDY)
        chunks = []
        for chunk in stream:
            chunks.append(chunk)
            started.set()
        outcome["finish"] = chunks[-1].choices[0].finish_reason
        outcome["text"] = "".join(c.choices[0].delta.content or "" for c in chunks)

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert started.wait(30)
    with pytest.raises(openai.InternalServerError):
        sdk.chat.completions.create(model="tiny", messages=FAILING, max_tokens=4)
    thread.join(60)
    assert outcome["finish"] == "length"
    alone = sdk.chat.completions.create(model="tiny", messages=FINE, max_tokens=120, **GREEDY)
    assert alone.choices[0].finish_reason == "length"
    assert alone.usage.completion_tokens == 120
