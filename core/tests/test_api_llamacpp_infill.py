"""llama-server's /infill (fill-in-the-middle prompts, with and without FIM tokens),
/apply-template, and the spec routes whose model is not loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from apphelpers import make_client, wait_ready
from tokenizers import Tokenizer as HFTokenizer

QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
            "<|repo_name|>", "<|file_sep|>")
STARCODER_FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
INFILL = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
          "n_predict": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def qwen_fim(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", mlxcel_checkpoint_cache, extra_special_tokens=QWEN_FIM)


@pytest.fixture(scope="module")
def starcoder_fim(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", mlxcel_checkpoint_cache,
                             extra_special_tokens=STARCODER_FIM)


@pytest.fixture(scope="module")
def fim_client(qwen_fim):
    with make_client(qwen_fim, parallel=1) as c:
        wait_ready(c)
        yield c


def engine_of(path, context_size=4096):
    """What the prompt builder reads of an engine: the checkpoint's tokenizer and the
    context size."""
    from mlxcel.model.tokenizer import Tokenizer

    return SimpleNamespace(checkpoint=SimpleNamespace(tokenizer=Tokenizer.from_dir(path)),
                           context_size=context_size)


def hf(path):
    return HFTokenizer.from_file(str(path / "tokenizer.json"))


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def infill_ids(path, context_size=4096, reserve=0, **fields):
    from mlxcel.dialects.llamacpp.infill import fim_markers, infill_prompt
    from mlxcel.dialects.llamacpp.schemas import ExtraChunk, InfillRequest

    extra = [ExtraChunk(**c) for c in fields.pop("input_extra", [])]
    body = InfillRequest(**{**INFILL, **fields}, input_extra=extra)
    engine = engine_of(path, context_size)
    return infill_prompt(engine, body, fim_markers(engine.checkpoint.tokenizer), reserve)


def test_repo_level_pattern_with_qwen_markers(qwen_fim):
    tok = hf(qwen_fim)
    t = tok.token_to_id
    got, cut = infill_ids(qwen_fim, prompt="return",
                          input_extra=[{"filename": "util.py", "text": "X = 1\n"}])
    assert not cut
    assert got == [t("<|repo_name|>"), *ids(tok, "myproject\n"),
                   t("<|file_sep|>"), *ids(tok, "util.py\n"), *ids(tok, "X = 1\n"),
                   t("<|file_sep|>"), *ids(tok, "filename\n"),
                   t("<|fim_prefix|>"), *ids(tok, INFILL["input_prefix"]),
                   t("<|fim_suffix|>"), *ids(tok, INFILL["input_suffix"]),
                   t("<|fim_middle|>"), *ids(tok, "return")]


def test_plain_pattern_without_repo_markers(starcoder_fim):
    tok = hf(starcoder_fim)
    t = tok.token_to_id
    got, _ = infill_ids(starcoder_fim, input_extra=[{"text": "import os\n"}])
    assert got == [*ids(tok, "\n\n--- snippet ---\n\n"), *ids(tok, "import os\n"),
                   t("<fim_prefix>"), *ids(tok, INFILL["input_prefix"]),
                   t("<fim_suffix>"), *ids(tok, INFILL["input_suffix"]), t("<fim_middle>")]


def test_long_input_is_cut_keeping_the_code_around_the_cursor(starcoder_fim):
    tok = hf(starcoder_fim)
    prefix, suffix = "a = 1\n" * 200, "b = 2\n" * 200
    got, cut = infill_ids(starcoder_fim, context_size=128, reserve=16, input_prefix=prefix,
                          input_suffix=suffix, input_extra=[{"text": "c = 3\n" * 50}])
    assert cut and len(got) <= 128 - 16
    pre, suf, mid = (tok.token_to_id(m) for m in STARCODER_FIM)
    assert got[0] == pre and got[-1] == mid  # no room left for the extra context
    kept_prefix, kept_suffix = got[1:got.index(suf)], got[got.index(suf) + 1:-1]
    assert ids(tok, prefix)[-len(kept_prefix):] == kept_prefix
    assert ids(tok, suffix)[:len(kept_suffix)] == kept_suffix
    assert len(kept_prefix) > len(kept_suffix) > 0


def test_infill_route_answers_the_native_shape(fim_client, qwen_fim):
    body = fim_client.post("/infill", json={**INFILL, "input_extra": [
        {"filename": "a.py", "text": "A = 1\n"}]}).json()
    expected, _ = infill_ids(qwen_fim, input_extra=[{"filename": "a.py", "text": "A = 1\n"}])
    assert body["stop"] is True and body["tokens_predicted"] == 4
    assert body["tokens_evaluated"] == len(expected) and body["stop_type"] == "limit"
    events = fim_client.post("/infill", json={**INFILL, "stream": True}).text
    assert events.startswith("data: ") and '"stop":true' in events


def test_infill_without_fim_tokens_is_501_naming_them(client):
    r = client.post("/infill", json=INFILL)
    assert r.status_code == 501
    err = r.json()["error"]
    assert err["type"] == "not_supported_error"
    for role, marker in (("prefix", "<|fim_prefix|>"), ("suffix", "<fim_suffix>"),
                         ("middle", "<MID>")):
        assert role in err["message"] and marker in err["message"]


@pytest.mark.parametrize("body,param", [
    ({"input_suffix": "x"}, "input_prefix"),
    ({"input_prefix": "x"}, "input_suffix"),
    ({"input_prefix": "x", "input_suffix": "y", "prompt": 5}, "prompt"),
    ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "f"}]},
     "input_extra"),
    ({"input_prefix": "x", "input_suffix": "y", "input_extra": "text"}, "input_extra"),
    ({"input_prefix": "x", "input_suffix": "y", "response_format": {"type": "json_object"}},
     "response_format"),
])
def test_infill_invalid_requests_are_400(fim_client, body, param):
    r = fim_client.post("/infill", json=body)
    assert r.status_code == 400, r.text
    assert param in r.json()["error"]["message"]


def test_apply_template_renders_the_chat_prompt(client, template):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    body = client.post("/apply-template", json={"messages": messages}).json()
    assert body == {"prompt": template.render(messages, add_generation_prompt=True)}
    tokens = client.post("/tokenize", json={"content": body["prompt"]}).json()["tokens"]
    chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == len(tokens)
    empty = client.post("/apply-template", json={"messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"


UNSERVED = [("POST", p) for p in (
    "/v1/embeddings", "/embedding", "/embeddings", "/v1/rerank", "/v1/reranking", "/rerank",
    "/reranking", "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/audio/translations",
    "/audio/speech", "/audio/transcriptions", "/audio/translations",
    "/v1/images/generations", "/v1/images/edits", "/images/generations", "/images/edits")
] + [("GET", "/v1/realtime")]


@pytest.mark.parametrize("method,path", UNSERVED)
def test_spec_routes_without_their_model_are_501_not_404(client, method, path):
    r = client.request(method, path, json={"input": "x"} if method == "POST" else None)
    assert r.status_code == 501
    err = r.json()["error"]
    assert err["type"] == "not_implemented" and path in err["message"]
    served = err["message"].split("it serves ")[1].split(", ")
    assert "/v1/chat/completions" in served and "/completion" in served
    assert not {p for _, p in UNSERVED} & set(served)
