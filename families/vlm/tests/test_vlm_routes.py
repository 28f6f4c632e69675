"""Images through the routes of a real app on the tiny Qwen2-VL checkpoint: llama-server's
multimodal ``/completion`` form (markers, limits, refusals, the caches), ``/apply-template``
(a ``<__media__>`` marker per image, which round-trips through ``/completion``), ``/props``
and ``/v1/models``, and the counts of ``/v1/messages/count_tokens`` and
``/v1/responses/input_tokens`` (and the compactor's) against what a turn prefills; earlier
``response.output`` sent back with its images."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.settings import Settings
from mlxcel.testing.engine import wait_ready
from PIL import Image

MARKER = "<__media__>"
GREEDY = {"temperature": 0, "ignore_eos": True, "cache_prompt": False}
PAYLOAD_LIMIT = 120_000  # bytes: the noise PNGs below are ~10 kB (56 px) and ~270 kB (300 px)


@pytest.fixture(scope="module")
def client(vlm_checkpoint):
    settings = Settings(model=str(vlm_checkpoint("qwen2_vl")), alias="tiny", max_images=3,
                        max_image_payload_size=PAYLOAD_LIMIT, max_image_width=512,
                        ctx_size=2048, parallel=2)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def png(seed: int, width: int = 56, height: int | None = None) -> str:
    """Raw base64 of a PNG of random pixels."""
    rng = np.random.default_rng(seed)
    pixels = (rng.random((height or width, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def uri(seed: int, width: int = 56) -> str:
    return "data:image/png;base64," + png(seed, width)


def chat_image(seed: int, width: int = 56) -> dict:
    return {"type": "image_url", "image_url": {"url": uri(seed, width)}}


def ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def refused(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def native(client, prompt, **fields) -> dict | list:
    return ok(client.post("/completion", json={"prompt": prompt, "n_predict": 6,
                                               "return_tokens": True, **GREEDY, **fields}))


# -- /apply-template and /completion -------------------------------------------------------------
def test_apply_template_marks_each_image_as_llama_server_does(client):
    messages = [{"role": "user", "content": [chat_image(1), {"type": "text", "text": "and"},
                                             chat_image(2), {"type": "text", "text": "?"}]}]
    prompt = ok(client.post("/apply-template", json={"messages": messages}))["prompt"]
    assert prompt.count(MARKER) == 2 and "<|image_pad|>" not in prompt
    # llama-server prints the bare marker (its tokenizer adds the vision start and end)
    assert f"\n{MARKER}and{MARKER}?" in prompt and "<|vision_start|>" not in prompt


@pytest.mark.parametrize("images", [[1], [1, 2]])
def test_the_marked_prompt_round_trips_through_completion(client, images):
    """The template's prompt with its images back through /completion prefills what the
    chat turn prefills, and greedy decoding answers alike."""
    content = [*(chat_image(s) for s in images), {"type": "text", "text": "What is it?"}]
    messages = [{"role": "user", "content": content}]
    prompt = ok(client.post("/apply-template", json={"messages": messages}))["prompt"]
    chat = ok(client.post("/v1/chat/completions", json={"messages": messages,
                                                         "max_tokens": 6, **GREEDY}))
    body = native(client, {"prompt_string": prompt, "multimodal_data": [png(s) for s in images]})
    assert body["tokens_evaluated"] == chat["usage"]["prompt_tokens"]
    assert body["content"] == chat["choices"][0]["message"]["content"]
    as_uris = native(client, {"prompt_string": prompt,
                              "multimodal_data": [uri(s) for s in images]})
    assert as_uris["tokens"] == body["tokens"]


def test_an_image_prompt_in_a_list_of_prompts(client):
    image = {"prompt_string": f"Look: {MARKER} what?", "multimodal_data": [png(3)]}
    plain, seen = native(client, ["Look: what?", image])
    alone = native(client, image)
    assert seen["tokens"] == alone["tokens"]
    assert seen["tokens_evaluated"] == alone["tokens_evaluated"] > plain["tokens_evaluated"]


def test_the_image_decides_the_answer_and_the_cache(client):
    """A repeated image reuses the cached prompt past it; another image with the same text
    reuses nothing from that image on (its digest is in the block hashes)."""
    def cached(seed: int) -> int:
        text = f"Probe {MARKER} and a longer text after the image, so that blocks fill."
        return native(client, {"prompt_string": text, "multimodal_data": [png(seed)]},
                      cache_prompt=True)["tokens_cached"]

    cached(11)
    again, other = cached(11), cached(12)
    assert again >= 32 and other < 16  # 16-token blocks; the image is in the first


@pytest.mark.parametrize("prompt, param", [
    ({"prompt_string": f"{MARKER}{MARKER}", "multimodal_data": [png(1)]},
     "prompt.multimodal_data"),
    ({"prompt_string": "no marker", "multimodal_data": [png(1)]}, "prompt.multimodal_data"),
    (["x", {"prompt_string": "x", "multimodal_data": [png(1)]}],
     "prompt[1].multimodal_data"),
    ({"prompt_string": f"<|image_pad|>{MARKER}", "multimodal_data": [png(1)]},
     "prompt.prompt_string"),
])
def test_markers_must_match_the_entries(client, prompt, param):
    err = refused(client.post("/completion", json={"prompt": prompt}))
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_more_images_than_max_images_is_400(client):
    prompts = [{"prompt_string": MARKER * 2, "multimodal_data": [png(1), png(2)]},
               {"prompt_string": MARKER * 2, "multimodal_data": [png(3), png(4)]}]
    err = refused(client.post("/completion", json={"prompt": prompts}))
    assert "--max-images (3)" in err["message"]


@pytest.mark.parametrize("entry, words", [
    ("!!not base64!!", "base64"),
    (base64.b64encode(b"plain text, no image").decode(), "not an image"),
    (png(5, 300), "--max-image-payload-size"),
    (png(6, 600, 14), "--max-image-width"),
    ("data:image/jpeg;base64," + png(7), "declared type"),
    ("data:image/png," + png(7), "base64"),
])
def test_a_bad_entry_is_400_naming_it(client, entry, words):
    prompt = {"prompt_string": f"a {MARKER} b {MARKER}", "multimodal_data": [png(1), entry]}
    err = refused(client.post("/completion", json={"prompt": prompt}))
    assert err["param"] == "prompt.multimodal_data[1]" and words in err["message"]


def test_props_and_models_say_the_model_takes_images(client):
    props = ok(client.get("/props"))
    assert props["modalities"] == {"vision": True, "audio": False}
    assert props["media_marker"] == MARKER
    for path in ("/v1/models", "/models"):
        listed = ok(client.get(path))
        assert listed["data"][0]["capabilities"] == ["completion", "multimodal"]
        # llama-server's own list, where its clients read the capabilities
        assert listed["models"][0]["capabilities"] == ["completion", "multimodal"]
        assert listed["models"][0]["name"] == listed["data"][0]["id"]


# -- counting ----------------------------------------------------------------------------------
def anthropic_image(seed: int, width: int = 56) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": png(seed, width)}}


@pytest.mark.parametrize("width", [56, 112])
def test_count_tokens_counts_images_as_the_turn_prefills_them(client, width):
    messages = [{"role": "user", "content": [anthropic_image(1, width),
                                             {"type": "text", "text": "What is it?"}]}]
    body = {"model": "m", "messages": messages}
    counted = ok(client.post("/v1/messages/count_tokens", json=body))["input_tokens"]
    answer = ok(client.post("/v1/messages", json={**body, "max_tokens": 1,
                                                  "cache_prompt": False}))
    assert counted == answer["usage"]["input_tokens"]
    text_only = ok(client.post("/v1/messages/count_tokens", json={
        "model": "m", "messages": [{"role": "user", "content": "What is it?"}]}))
    assert counted > text_only["input_tokens"] + (4 if width == 56 else 16)


def test_count_tokens_counts_an_image_in_a_tool_result(client):
    call = {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1",
              "content": [{"type": "text", "text": "here"}, anthropic_image(2, 112)]}
    tools = [{"name": "shot", "input_schema": {"type": "object", "properties": {}}}]

    def count(content):
        return ok(client.post("/v1/messages/count_tokens", json={
            "model": "m", "tools": tools, "messages": [
                {"role": "user", "content": "Take one"},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": content}]}))["input_tokens"]

    with_image = count([result])
    without = count([{**result, "content": [{"type": "text", "text": "here"}]}])
    assert with_image >= without + 16


def responses_image(seed: int, width: int = 56) -> dict:
    return {"type": "input_image", "image_url": uri(seed, width), "detail": "low"}


def input_tokens(client, body: dict) -> int:
    return ok(client.post("/v1/responses/input_tokens", json=body))["input_tokens"]


def test_input_tokens_count_images_as_the_turn_prefills_them(client):
    question = {"role": "user", "content": [responses_image(1, 112),
                                            {"type": "input_text", "text": "What is it?"}]}
    body = {"input": [question], "max_output_tokens": 3, **GREEDY}
    first = ok(client.post("/v1/responses", json=body))
    assert input_tokens(client, {"input": [question]}) == first["usage"]["input_tokens"]
    assert first["usage"]["input_tokens"] > input_tokens(client, {"input": "What is it?"}) + 16

    # the earlier output sent back as input, with the image still in its user item
    again = [question, *first["output"],
             {"role": "user", "content": [responses_image(2), {"type": "input_text",
                                                              "text": "And this?"}]}]
    second = ok(client.post("/v1/responses", json={**body, "input": again}))
    assert input_tokens(client, {"input": again}) == second["usage"]["input_tokens"]

    # and by previous_response_id: the stored history keeps the image
    chained = {"input": "Once more?", "previous_response_id": first["id"]}
    third = ok(client.post("/v1/responses", json={**body, **chained}))
    assert input_tokens(client, chained) == third["usage"]["input_tokens"] > \
        input_tokens(client, {"input": "Once more?"}) + 16


def sse(response) -> list[dict]:
    events = []
    for block in response.text.split("\n\n"):
        if block:
            _, data = block.split("\n")
            events.append(json.loads(data[len("data: "):]))
    return events


def test_the_compactor_counts_images_as_input_tokens_does(client):
    filler = " ".join(f"word{i}" for i in range(40))
    history = [{"role": "user", "content": [responses_image(3, 112),
                                            {"type": "input_text", "text": filler}]},
               {"role": "assistant", "content": filler},
               {"role": "user", "content": "What next?"}]
    events = sse(client.post("/v1/responses", json={
        "input": history, "max_output_tokens": 2, "stream": True, **GREEDY,
        "context_management": [{"type": "compaction", "compact_threshold": 1}]}))
    started = next(e for e in events if e["type"] == "mlx.compaction.started")
    assert started["input_tokens"] == input_tokens(client, {"input": history})


@pytest.mark.parametrize("part", [{"type": "image_url"}, {"type": "image_url", "image_url": {}},
                                  {"type": "image_url", "image_url": {"detail": "low"}}])
def test_an_image_part_without_a_source_is_a_400_naming_it(client, part):
    r = client.post("/v1/chat/completions", json={"max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}]})
    error = refused(r)
    assert error["param"] == "messages[0].content[1]", error
    assert "no source" in error["message"], error
