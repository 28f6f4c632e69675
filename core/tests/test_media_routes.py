"""Media on the routes of a text-only model: llama-server's multimodal ``/completion`` form
and ``/apply-template`` with an image are 501 before anything is decoded, ``/props`` and
``/v1/models`` say the model takes text only, the ``max_soft_tokens`` knob is checked in
each of its spellings on every dialect, and Responses' ``input_image`` shapes.
(Images on a model that takes them: families/vlm/tests/test_vlm_routes.py.)"""

from __future__ import annotations

import pytest
from apphelpers import client_fixture
from mlxcel.dialects.media_options import media_options

client = client_fixture()

USER = [{"role": "user", "content": "Hi"}]
IMAGE_URL = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def error(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize("data", [["aGk="], ["not base64 at all!"]])
def test_multimodal_completion_on_a_text_model_is_501_before_any_decode(client, data):
    for prompt in ({"prompt_string": "<__media__> hi", "multimodal_data": data},
                   ["plain", {"prompt_string": "<__media__>", "multimodal_data": data}]):
        err = error(client.post("/completion", json={"prompt": prompt, "n_predict": 1}), 501)
        assert err["type"] == "not_supported_error"
        assert "image input is not supported" in err["message"]
        assert err["param"].endswith("multimodal_data")


def test_an_empty_multimodal_data_is_a_text_prompt(client):
    r = client.post("/completion", json={"prompt": {"prompt_string": "Hello",
                                                    "multimodal_data": []},
                                         "n_predict": 1})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("prompt, param", [
    ({"prompt_string": "x", "multimodal_data": "aGk="}, "prompt.multimodal_data"),
    ({"prompt_string": "x", "multimodal_data": [1]}, "prompt.multimodal_data"),
    ({"multimodal_data": ["aGk="]}, "prompt.prompt_string"),
])
def test_a_malformed_multimodal_prompt_is_400(client, prompt, param):
    err = error(client.post("/completion", json={"prompt": prompt}), 400)
    assert err["param"] == param


def test_apply_template_with_an_image_on_a_text_model_is_501(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What?"}, IMAGE_URL]}]
    err = error(client.post("/apply-template", json={"messages": messages}), 501)
    assert err["type"] == "not_supported_error" and err["param"] == "messages[0].content[1]"


def test_props_and_models_say_text_only(client):
    props = client.get("/props").json()
    assert props["modalities"] == {"vision": False, "audio": False}
    assert "media_marker" not in props
    models = client.get("/v1/models").json()["data"]
    assert [m["capabilities"] for m in models] == [["completion"]]


# -- max_soft_tokens ---------------------------------------------------------------------------
class Body:
    def __init__(self, **fields):
        self.__dict__.update(fields)


@pytest.mark.parametrize("fields, want", [
    ({}, {}),
    ({"max_soft_tokens": 280}, {"max_soft_tokens": 280}),
    ({"mm_processor_kwargs": {"max_soft_tokens": 70, "other": "x"}}, {"max_soft_tokens": 70}),
    ({"max_soft_tokens": 140, "mm_processor_kwargs": {"max_soft_tokens": 70}},
     {"max_soft_tokens": 140}),
])
def test_media_options_read_both_spellings(fields, want):
    assert media_options(Body(**fields)) == want


ROUTES = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 1}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 1}),
    ("/v1/responses/input_tokens", {"input": "Hi"}),
    ("/v1/messages", {"model": "m", "messages": USER, "max_tokens": 1}),
    ("/v1/messages/count_tokens", {"model": "m", "messages": USER}),
    ("/completion", {"prompt": "Hi", "n_predict": 1}),
]
BAD = [
    ({"max_soft_tokens": 0}, "max_soft_tokens"),
    ({"max_soft_tokens": -3}, "max_soft_tokens"),
    ({"max_soft_tokens": True}, "max_soft_tokens"),
    ({"max_soft_tokens": 1.5}, "max_soft_tokens"),
    ({"max_soft_tokens": "280"}, "max_soft_tokens"),
    ({"mm_processor_kwargs": {"max_soft_tokens": 0}}, "mm_processor_kwargs.max_soft_tokens"),
    ({"mm_processor_kwargs": [280]}, "mm_processor_kwargs"),
    ({"extra_body": {"mm_processor_kwargs": {"max_soft_tokens": "x"}}},
     "mm_processor_kwargs.max_soft_tokens"),
]


@pytest.mark.parametrize("path, body", ROUTES)
@pytest.mark.parametrize("extra, param", BAD)
def test_a_bad_max_soft_tokens_is_400_on_every_dialect(client, path, body, extra, param):
    err = error(client.post(path, json={**body, **extra}), 400)
    if path.startswith("/v1/messages"):  # Anthropic's error body has no param
        assert err["type"] == "invalid_request_error" and f"'{param}'" in err["message"]
    else:
        assert err["param"] == param
    assert ("must be an object" if param == "mm_processor_kwargs" else
            "must be a positive integer") in err["message"]


@pytest.mark.parametrize("path, body", ROUTES)
def test_a_good_max_soft_tokens_is_taken_on_every_dialect(client, path, body):
    for extra in ({"max_soft_tokens": 280},
                  {"extra_body": {"mm_processor_kwargs": {"max_soft_tokens": 280}}}):
        r = client.post(path, json={**body, **extra})
        assert r.status_code == 200, r.text


# -- Responses input_image ---------------------------------------------------------------------
def _input(part):
    return {"input": [{"role": "user", "content": [{"type": "input_text", "text": "?"},
                                                   part]}]}


@pytest.mark.parametrize("part, param", [
    ({"type": "input_image", "file_id": "file-abc"}, "input[0].content[1].file_id"),
    ({"type": "input_image", "file_id": "file-abc", "image_url": "data:image/png;base64,AA"},
     "input[0].content[1].file_id"),
    ({"type": "input_image", "detail": "auto"}, "input[0].content[1].image_url"),
    ({"type": "input_image", "image_url": 7}, "input[0].content[1].image_url"),
    ({"type": "input_image", "image_url": ""}, "input[0].content[1].image_url"),
])
def test_an_input_image_without_a_usable_url_is_400(client, part, param):
    for path in ("/v1/responses", "/v1/responses/input_tokens"):
        err = error(client.post(path, json=_input(part)), 400)
        assert err["param"] == param
        if "file_id" in part:
            assert "Files API" in err["message"]


@pytest.mark.parametrize("url", ["data:image/png;base64,AAAA",
                                 {"url": "data:image/png;base64,AAAA"}])
@pytest.mark.parametrize("detail", [None, "low", "high", "auto"])
def test_an_input_image_with_a_url_reaches_the_media_rules(client, url, detail):
    part = {"type": "input_image", "image_url": url}
    if detail is not None:
        part["detail"] = detail
    err = error(client.post("/v1/responses/input_tokens", json=_input(part)), 501)
    assert err["type"] == "not_supported_error" and err["param"] == "input[0].content[1]"
