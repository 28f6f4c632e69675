"""Image rows take every request feature text rows take: structured output, forced tool
calls and cancellation, through the real app on the tiny Qwen2-VL checkpoint."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from mlxcel.testing.engine import (
    ListSink,
    app_client,
    media_request,
    request,
    run_until_done,
    worker_for,
)
from PIL import Image

CHAT = "/v1/chat/completions"


def data_uri(seed: int) -> str:
    out = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((56, 56, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def image_message(seed: int, text: str = "What is in the picture?") -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": data_uri(seed), "detail": "low"}}, {"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def client(vlm_checkpoint):
    # hermes: a format with a grammar, so a forced call is constrained on random weights
    with app_client(vlm_checkpoint("qwen2_vl"), parallel=4, tool_call_format="hermes") as c:
        yield c


def test_an_image_answer_follows_a_json_schema(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string",
                                                          "enum": ["red", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    r = client.post(CHAT, json={"messages": [image_message(1)], "max_tokens": 40,
                                "temperature": 0, "response_format": {
                                    "type": "json_schema",
                                    "json_schema": {"name": "c", "schema": schema}}})
    assert r.status_code == 200, r.text
    answer = json.loads(r.json()["choices"][0]["message"]["content"])
    assert answer["colour"] in ("red", "blue") and set(answer) == {"colour"}


def test_an_image_turn_can_be_forced_to_call_a_tool(client):
    tool = {"type": "function", "function": {"name": "describe", "parameters": {
        "type": "object", "properties": {"what": {"type": "string", "maxLength": 12}},
        "required": ["what"]}}}
    r = client.post(CHAT, json={"messages": [image_message(2)], "max_tokens": 60,
                                "temperature": 0, "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 200, r.text
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "describe"
    assert "what" in json.loads(calls[0]["function"]["arguments"])


def test_image_prompt_tokens_count_the_images_tokens(client):
    def prompt_tokens(content) -> int:
        r = client.post(CHAT, json={"messages": [{"role": "user", "content": content}],
                                    "max_tokens": 1})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    text = {"type": "text", "text": "Hi"}
    with_image = prompt_tokens([image_message(3)["content"][0], text])
    # 56x56 pixels: a 4x4 patch grid merged 2x2 -> 4 image tokens, with the template's
    # <|vision_start|> and <|vision_end|> around them
    assert with_image - prompt_tokens([text]) == 4 + 2


def test_a_cancelled_image_row_frees_its_slot(vlm_checkpoint):
    from mlxcel.families.api import LoadOptions
    from mlxcel.media.api import MediaLimits
    from mlxcel.media.image import decode
    from mlxcel.types.media import MediaBlob
    from mlxcel_family_vlm.load import decoder, load

    path = vlm_checkpoint("qwen2_vl")
    model = decoder(load(path, LoadOptions()))
    ids = list(model.processor.tokenizer.encode("<|image_pad|> say", add_special_tokens=False))
    blob = MediaBlob.of(base64.b64decode(data_uri(4).split(",")[1]), "image/png", "data")
    prompt = model.expand_media(ids, [decode(blob, MediaLimits())], {})
    worker = worker_for(path, chunk=16, parallel=1)
    sink = ListSink()
    worker.enqueue(media_request(prompt, 200), sink)
    for _ in range(5):
        worker.step()
    assert sink.tokens and not sink.done
    sink.cancelled = True
    worker.step()
    worker.step()
    assert sink.last.finish_reason == "cancelled" and not worker.active
    after = ListSink()
    worker.enqueue(request(ids[1:], 3), after)
    run_until_done(worker, [after], settle=True)
    assert after.last.finish_reason == "length"


def test_an_image_is_decoded_and_processed_off_the_event_loop(client, monkeypatch):
    """A small body is prepared inline, but decoding and processing its image would hold
    up every stream the event loop serves: a request with media is prepared in the pool
    (``dialects.prepare``), for the chat route and llama-server's ``/completion``."""
    import threading

    from mlxcel_family_vlm.load import VisionLanguageModel

    threads = []
    original = VisionLanguageModel.expand_media

    def spy(self, *args, **kw):
        threads.append(threading.current_thread().name)
        return original(self, *args, **kw)

    monkeypatch.setattr(VisionLanguageModel, "expand_media", spy)
    body = {"messages": [image_message(7)], "max_tokens": 2}
    assert len(json.dumps(body)) < 64 << 10  # inline by its size alone
    assert client.post(CHAT, json=body).status_code == 200
    uri = data_uri(8)
    r = client.post("/completion", json={"n_predict": 2, "prompt": {
        "prompt_string": "Describe <__media__> briefly.",
        "multimodal_data": [uri.split(",", 1)[1]]}})
    assert r.status_code == 200, r.text
    assert len(threads) == 2
    assert all(name.startswith("mlxcel-prepare") for name in threads), threads
