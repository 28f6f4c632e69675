"""Anthropic Messages routes in process: shapes, the SSE sequence, count_tokens, the turn
mapping (system folding, tool results, tool calls), refusals in Anthropic's error shape."""

from __future__ import annotations

import json

import msgspec
import pytest
from anthropic_helpers import TOOLS, USER, accumulate, events
from apphelpers import make_client, wait_ready
from mlxcel.dialects.anthropic.schemas import MessagesRequest
from mlxcel.dialects.anthropic.translate import prompt_request
from mlxcel.dialects.api import Dialect
from mlxcel.testing.conformance import check_dialect
from mlxcel.types.messages import FunctionChoice, ImagePart, TextPart, ToolCall

BASE = {"model": "any-name", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "messages": [USER]}


def tokens(client, text):
    return len(client.post("/tokenize", json={"content": text}).json()["tokens"])


def without_ids(blocks):
    return [{k: v for k, v in b.items() if k != "id"} for b in blocks]


def count(client, **body):
    r = client.post("/v1/messages/count_tokens", json={"model": "m", **body})
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


@pytest.mark.parametrize("path", ["/v1/messages", "/messages"])
def test_message_shape(client, path):
    r = client.post(path, json={**BASE, "system": "Be terse."})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("msg_") and body["type"] == "message"
    assert body["role"] == "assistant" and body["model"] == "tiny"
    assert [b["type"] for b in body["content"]] == ["text"]
    assert isinstance(body["content"][0]["text"], str)
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    usage = body["usage"]
    assert usage["output_tokens"] == 8 and usage["cache_creation_input_tokens"] == 0
    prompt = "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n" \
             "<|im_start|>assistant\n"
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == tokens(client, prompt)


def test_stream_sequence_matches_the_whole_message(client):
    whole = client.post("/v1/messages", json=BASE).json()
    r = client.post("/v1/messages", json={**BASE, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = events(r)
    kinds = [e["type"] for e in evs]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    start = evs[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0 and start["id"].startswith("msg_")
    delta = evs[-2]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8
    streamed = accumulate(evs)
    assert streamed["content"] == whole["content"]
    assert streamed["stop_reason"] == whole["stop_reason"]
    assert streamed["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_count_tokens_renders_system_tools_and_alias(client):
    plain = count(client, messages=[USER])
    assert plain == tokens(client, "<|im_start|>user\nHello there<|im_end|>\n"
                                   "<|im_start|>assistant\n")
    assert count(client, messages=[USER], system=[{"type": "text", "text": "S"}]) > plain
    assert count(client, messages=[USER], tools=TOOLS) > plain
    r = client.post("/messages/count_tokens", json={"model": "m", "messages": [USER]})
    assert r.json() == {"input_tokens": plain}
    used = client.post("/v1/messages", json={**BASE, "tools": TOOLS}).json()["usage"]
    assert used["input_tokens"] + used["cache_read_input_tokens"] == \
        count(client, messages=[USER], tools=TOOLS)


def test_system_turns_fold_into_the_adjacent_user_turn(client):
    after = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert count(client, messages=after) == tokens(
        client, "<|im_start|>user\nS\n\nU<|im_end|>\n<|im_start|>assistant\n")
    before = [{"role": "user", "content": "U"}, {"role": "system", "content": "S"},
              {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}]
    assert count(client, messages=before) == tokens(
        client, "<|im_start|>user\nU\n\nS<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n")


def test_tool_use_and_tool_result_render_as_a_tool_exchange(client):
    messages = [USER,
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_time",
                     "input": {"tz": "UTC"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"},
                    {"type": "tool_result", "tool_use_id": "toolu_2",
                     "content": [{"type": "text", "text": "13:00"}]},
                    {"type": "text", "text": "And?"}]}]
    expected = ("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nChecking.\n"
                '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
                "<|im_end|>\n<|im_start|>user\n<tool_response>\n12:00\n</tool_response>\n"
                "<tool_response>\n13:00\n</tool_response><|im_end|>\n"
                "<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n")
    assert count(client, messages=messages) == tokens(client, expected)


def test_a_final_assistant_turn_is_continued(client):
    prefill = [USER, {"role": "assistant", "content": "The answer is"}]
    assert count(client, messages=prefill) == tokens(
        client, "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nThe answer is")


@pytest.mark.parametrize("block", [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
    {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}},
    {"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}]},
])
def test_images_are_refused_by_a_text_only_model(client, block):
    msg = {"role": "user", "content": [{"type": "text", "text": "what is it"}, block]}
    r = client.post("/v1/messages", json={**BASE, "messages": [msg]})
    assert r.status_code == 501, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_supported_error"
    assert "text only" in body["error"]["message"] and "'image'" in body["error"]["message"]


def test_stop_sequence_ends_the_answer(client):
    full = client.post("/v1/messages", json={**BASE, "max_tokens": 12}).json()
    text = full["content"][0]["text"]
    stop = text[3:6]
    assert stop.strip(), text
    body = {**BASE, "max_tokens": 12, "stop_sequences": [stop]}
    cut = client.post("/v1/messages", json=body).json()
    assert cut["stop_reason"] == "stop_sequence" and cut["stop_sequence"] == stop
    assert cut["content"] == [{"type": "text", "text": text[:text.index(stop)]}]
    evs = events(client.post("/v1/messages", json={**body, "stream": True}))
    assert evs[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_sampling_fields_and_unknown_top_level_fields(client):
    sampled = {**BASE, "temperature": 1.0, "top_p": 0.9, "top_k": 5, "seed": 3,
               "metadata": {"user_id": "u"}, "service_tier": "auto", "container": None}
    a, b = (client.post("/v1/messages", json=sampled) for _ in range(2))
    assert a.status_code == 200, a.text
    assert a.json()["content"] == b.json()["content"]


def test_forced_tool_use_and_its_result(client):
    body = {**BASE, "max_tokens": 200, "seed": 1, "ignore_eos": False, "tools": TOOLS,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    first = client.post("/v1/messages", json=body).json()
    assert first["stop_reason"] == "tool_use", first
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    assert call["name"] == "get_time" and call["input"]["tz"] in ("UTC", "CET")
    assert call["id"]
    streamed = accumulate(events(client.post("/v1/messages", json={**body, "stream": True})))
    assert without_ids(streamed["content"]) == without_ids(first["content"])
    assert streamed["stop_reason"] == "tool_use"
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "12:00"}]}
    nxt = {**BASE, "tools": TOOLS,
           "messages": [USER, {"role": "assistant", "content": first["content"]}, result]}
    second = client.post("/v1/messages", json=nxt)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["output_tokens"] == 8


def test_named_tool_none_and_server_tools(client):
    other = {"name": "get_date", "input_schema": {"type": "object", "properties": {}}}
    named = {**BASE, "max_tokens": 200, "ignore_eos": False, "tools": [*TOOLS, other],
             "tool_choice": {"type": "tool", "name": "get_date"}}
    body = client.post("/v1/messages", json=named).json()
    assert [b["name"] for b in body["content"] if b["type"] == "tool_use"] == ["get_date"]
    plain = count(client, messages=[USER])
    assert count(client, messages=[USER], tools=TOOLS, tool_choice={"type": "none"}) == plain
    server_tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                    {"type": "code_execution_20250825", "name": "code_execution"}]
    assert count(client, messages=[USER], tools=server_tools) == plain
    r = client.post("/v1/messages", json={**BASE, "tools": server_tools})
    assert r.status_code == 200 and r.json()["content"][0]["type"] == "text"


DROP = object()  # a field left out of the body
BAD = [
    ({"model": DROP}, "model"),
    ({"messages": DROP}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": ["text"]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "messages[0].content[0].source"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]},
     "messages[0].content[0].source.media_type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 5}]}]},
     "messages[0].content[0].content"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "container_upload"}]}]}]},
     "messages[0].content[0].content[0].type"),
    ({"messages": [USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]},
     "messages[1].content[0].input"),
    ({"messages": [USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "input": {}}]}]}, "messages[1].content[0].name"),
    ({"messages": [USER, {"role": "assistant", "content": [
        {"type": "image", "source": {"type": "url", "url": "u"}}]}]},
     "messages[1].content[0].type"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "thinking"}]}]},
     "messages[1].content[0].thinking"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"system": 5}, "system"),
    ({"tools": [{"name": "f", "input_schema": "x"}]}, "tools[0].input_schema"),
    ({"tools": [{"input_schema": {}}]}, "tools[0].name"),
    ({"tools": ["f"]}, "tools[0]"),
    ({"tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "tool"}, "tools": TOOLS}, "tool_choice.name"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tool_choice": {"type": "any"}, "tools": [{"type": "web_search_20250305", "name": "w"}]},
     "tool_choice"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": ["x"] * 17}, "stop_sequences"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
]


@pytest.mark.parametrize("change,field", BAD)
def test_bad_requests_are_400_naming_the_field(client, change, field):
    body = {key: value for key, value in {**BASE, **change}.items() if value is not DROP}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert field in err["error"]["message"], err


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]"])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_malformed_bodies_are_400(client, raw, path):
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_count_tokens_refuses_what_messages_refuses(client):
    r = client.post("/v1/messages/count_tokens", json={"messages": [USER]})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    r = client.post("/v1/messages/count_tokens", json={
        "model": "m", "messages": [USER], "tool_choice": {"type": "any"}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_paths_and_methods_answer_in_anthropic_shape(client):
    for path in ("/v1/messages/nope", "/messages/nope"):
        r = client.post(path, json=BASE)
        assert r.status_code == 404
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_body_over_the_size_limit_is_413(client):
    from mlxcel.app import MAX_BODY

    big = {**BASE, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    r = client.post("/v1/messages", content=json.dumps(big),
                    headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:200]
    assert r.json()["error"]["type"] == "request_too_large"


def test_auth_by_x_api_key_and_refusals_in_anthropic_shape(tiny_checkpoint):
    dialect = Dialect(name="anthropic", routes="mlxcel.dialects.anthropic.routes:build",
                      errors="mlxcel.dialects.anthropic.errors:error_body",
                      prefixes=("/v1/messages", "/messages"))
    with make_client(tiny_checkpoint, parallel=1, api_key="k-anth") as c:
        wait_ready(c)
        r = c.post("/v1/messages", json=BASE)
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error"
        wrong = c.post("/messages/count_tokens", json=BASE, headers={"x-api-key": "nope"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "authentication_error"
        assert "nope" not in wrong.text and "k-anth" not in wrong.text
        ok = c.post("/v1/messages", json=BASE, headers={"x-api-key": "k-anth"})
        assert ok.status_code == 200, ok.text
        check_dialect(c, dialect, "/v1/models", "k-anth")


WIRE_TURNS = [
    {"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AA=="}}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": "s"},
        {"type": "tool_use", "id": "t1", "name": "get_time", "input": {"tz": "UTC"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "text", "text": "12:00"},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]},
]


def test_the_wire_turns_as_the_chat_layer_reads_them():
    body = msgspec.convert({
        "model": "m", "messages": WIRE_TURNS,
        "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        "tools": [*TOOLS, {"type": "web_search_20250305", "name": "ws"}],
        "tool_choice": {"type": "tool", "name": "get_time"}}, MessagesRequest)
    prompt = prompt_request(body)
    system, user, assistant, tool = prompt.messages
    assert system.role == "system" and system.text == "AB"
    assert user.content == (ImagePart(data="AA==", format="image/png", wire_type="image",
                                      path="messages[0].content[0]"),)
    assert assistant.content is None and assistant.reasoning == "hm"
    assert assistant.tool_calls == (ToolCall(id="t1", name="get_time", arguments={"tz": "UTC"}),)
    assert tool.role == "tool" and tool.tool_call_id == "t1"
    assert tool.content == (TextPart(text="12:00"),
                            ImagePart(url="https://x/y.png", wire_type="image",
                                      path="messages[2].content[0].content[1]"))
    assert [t.definition for t in prompt.tools] == [{"type": "function", "function": {
        "name": "get_time", "parameters": TOOLS[0]["input_schema"],
        "description": "The time in a zone."}}]
    assert prompt.tool_choice == FunctionChoice(name="get_time")
    assert not prompt.continue_final_message


def test_documents_and_search_results_are_their_text():
    text_doc = {"type": "document", "title": "Notes", "context": "from a wiki",
                "source": {"type": "text", "media_type": "text/plain", "data": "Llamas hum."},
                "citations": {"enabled": True}}
    content_doc = {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]}}
    result = {"type": "search_result", "source": "https://x/llamas", "title": "Llamas",
              "content": [{"type": "text", "text": "They hum."}]}
    body = msgspec.convert({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [text_doc, content_doc, {"type": "text", "text": "Q?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [result]}]}]}, MessagesRequest)
    user, _, tool = prompt_request(body).messages
    assert [p.text for p in user.content] == ["Notes\n\nfrom a wiki\n\nLlamas hum.",
                                              "One.\n\nTwo.", "Q?"]
    assert [p.text for p in tool.content] == ["Llamas\n\nhttps://x/llamas\n\nThey hum."]


@pytest.mark.parametrize("source, param", [
    ({"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
     "messages[0].content[0].source"),
    ({"type": "file", "file_id": "file_1"}, "messages[0].content[0].source"),
    ({"type": "content", "content": [{"type": "image"}]},
     "messages[0].content[0].source.content[0].type"),
])
def test_a_pdf_or_a_file_document_is_a_400_naming_it(client, source, param):
    r = client.post("/v1/messages", json={**BASE, "messages": [{"role": "user", "content": [
        {"type": "document", "source": source}]}]})
    assert r.status_code == 400, r.text
    assert param in r.json()["error"]["message"], r.text
