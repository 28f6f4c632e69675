"""Responses in process: response shapes, typed SSE events and their sequence numbers, the
input item forms (checked by the prompt they render to), tools, text.format, reasoning,
and every 400 the spec lists. The real ``openai`` SDK parses the answers, in process."""

from __future__ import annotations

import json
import pathlib

import jsonschema
import openai
import pytest
from apphelpers import make_client, wait_ready
from mlxcel.testing.templates import template_text

BODY = {"input": "Hello there", "max_output_tokens": 8, "temperature": 0}
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"]}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": WEATHER, "strict": True}


def sse(response) -> list[dict]:
    """The stream's events; each frame's ``event:`` line names its data's type."""
    events = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        event = json.loads(data[len("data: "):])
        assert event["type"] == name[len("event: "):]
        events.append(event)
    return events


def rendered(client, text: str) -> int:
    return len(client.post("/tokenize", json={"content": text}).json()["tokens"])


def count(client, body: dict) -> int:
    r = client.post("/v1/responses/input_tokens", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "response.input_tokens"
    return r.json()["input_tokens"]


@pytest.fixture(scope="module")
def sdk(client):
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="none", http_client=client,
                         max_retries=0)


@pytest.mark.parametrize("path", ["/v1/responses", "/responses"])
def test_a_response_has_the_sdks_shape(client, path):
    r = client.post(path, json={**BODY, "ignore_eos": True, "metadata": {"k": "v"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["model"] == "tiny" and body["metadata"] == {"k": "v"}
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["id"].startswith("msg_") and message["status"] == "incomplete"
    (part,) = message["content"]
    assert part["type"] == "output_text" and part["annotations"] == []
    usage = body["usage"]
    assert usage["output_tokens"] == 8
    assert usage["total_tokens"] == usage["input_tokens"] + 8
    assert usage["input_tokens_details"]["cached_tokens"] >= 0
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}


def test_the_sdk_reads_a_response(sdk):
    r = sdk.responses.create(model="tiny", input="Hello there", max_output_tokens=6,
                             temperature=0, extra_body={"ignore_eos": True})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert isinstance(r.output_text, str) and r.usage.output_tokens == 6


def test_stream_events_are_ordered_and_numbered_from_zero(client):
    whole = client.post("/v1/responses", json={**BODY, "ignore_eos": True}).json()
    r = client.post("/v1/responses", json={**BODY, "ignore_eos": True, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse(r)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == whole["output"][0]["content"][0]["text"]
    assert events[-4]["text"] == text
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == 8 and final["status"] == "incomplete"
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["id"] == final["id"]


def test_the_sdk_parses_a_stream(sdk):
    stream = sdk.responses.create(model="tiny", input="Hello there", max_output_tokens=6,
                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_tool_choice_yields_a_function_call(client, choice):
    r = client.post("/v1/responses", json={"input": "Weather in Paris?", "tools": [TOOL],
                                           "tool_choice": choice, "max_output_tokens": 300,
                                           "temperature": 1.0, "seed": 3})
    body = r.json()
    assert r.status_code == 200 and body["status"] == "completed", body
    (call,) = [item for item in body["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
    assert call["id"].startswith("fc_") and call["status"] == "completed"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)
    assert body["tools"] == [TOOL] and body["tool_choice"] == choice


def test_streamed_call_arguments_join_and_the_sdk_stream_completes(sdk):
    with sdk.responses.stream(model="tiny", input="Weather?", tools=[TOOL],
                              tool_choice="required", max_output_tokens=300,
                              temperature=1.0, extra_body={"seed": 5}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert call.arguments == deltas and final.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_text_format_json_schema_constrains_the_answer(client):
    fmt = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    r = client.post("/v1/responses", json={"input": "Weather?", "text": {"format": fmt},
                                           "max_output_tokens": 300, "temperature": 1.0,
                                           "seed": 2})
    body = r.json()
    assert body["status"] == "completed", body
    jsonschema.validate(json.loads(body["output"][0]["content"][0]["text"]), WEATHER)
    assert body["text"]["format"] == fmt


def test_instructions_are_a_leading_system_message(client):
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there"
                "<|im_end|>\n<|im_start|>assistant\n")
    r = client.post("/v1/responses", json={**BODY, "instructions": "Be brief."}).json()
    assert r["usage"]["input_tokens"] == rendered(client, expected)
    assert r["instructions"] == "Be brief."


def test_input_item_forms_render_as_their_chat_messages(client):
    items = [
        {"role": "user", "content": "What is the weather?"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Let me see. ", "annotations": []},
            {"type": "refusal", "refusal": "No."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "call the tool"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    expected = (
        "<|im_start|>user\nWhat is the weather?<|im_end|>\n"
        "<|im_start|>assistant\nLet me see. No.<|im_end|>\n"
        "<|im_start|>user\nGo<|im_end|>\n"
        "<|im_start|>assistant\n<think>\ncall the tool\n</think>\n\n<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert count(client, {"input": items}) == rendered(client, expected)


def test_a_previous_output_can_be_sent_back_as_input(client):
    first = client.post("/v1/responses", json={**BODY, "store": False}).json()
    text = first["output"][0]["content"][0]["text"]
    again = [{"role": "user", "content": "Hello there"}, *first["output"],
             {"role": "user", "content": "More"}]
    plain = [{"role": "user", "content": "Hello there"},
             {"role": "assistant", "content": text}, {"role": "user", "content": "More"}]
    assert count(client, {"input": again}) == count(client, {"input": plain})
    assert client.post("/v1/responses", json={**BODY, "input": again}).status_code == 200


def test_an_image_part_on_a_text_model_follows_the_media_rules(client):
    part = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}
    r = client.post("/v1/responses", json={**BODY, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is it?"}, part]}]})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


BUILTIN = ["web_search", "web_search_preview", "file_search", "computer_use_preview",
           "code_interpreter", "image_generation", "mcp", "custom", "apply_patch",
           "function_shell", "local_shell", "shell"]
REFUSED = [
    *[({"tools": [{"type": kind}]}, "tools[0].type") for kind in BUILTIN],
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_file", "file_id": "file-1"}]}]}, "input[0].content[0].type"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format.type"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
     "input[0].arguments"),
    ({"input": [{"type": "compaction", "encrypted_content": "not-a-capsule"}]},
     "input[0].encrypted_content"),
    ({"input": []}, "input"),
    ({"context_management": [{"type": "compaction", "compact_threshold": 0}]},
     "context_management[0].compact_threshold"),
    ({"context_management": [{"type": "truncate"}]}, "context_management[0].type"),
    ({"previous_response_id": "resp_x", "conversation": "c"}, "previous_response_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "required", "text": {"format": {
        "type": "json_schema", "name": "w", "schema": WEATHER}}}, "tool_choice"),
]


@pytest.mark.parametrize("fields,param", REFUSED, ids=[p for _, p in REFUSED])
def test_unsupported_requests_are_400_naming_the_field(client, fields, param):
    r = client.post("/v1/responses", json={**BODY, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_the_sdk_raises_bad_request_for_a_builtin_tool(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}])
    assert "web_search" in info.value.message


@pytest.fixture(scope="module")
def thinking_client(tiny_checkpoint, tmp_path_factory):
    """The test checkpoint with a template whose generation prompt opens ``<think>``."""
    source = template_text("chatml")
    marker = "{{- '<|im_start|>assistant\\n' }}"
    at = source.rindex(marker)
    path = pathlib.Path(tmp_path_factory.mktemp("think")) / "think.jinja"
    path.write_text(source[:at] + "{{- '<|im_start|>assistant\\n<think>\\n' }}"
                    + source[at + len(marker):])
    with make_client(tiny_checkpoint, parallel=1, chat_template_file=str(path)) as c:
        wait_ready(c)
        yield c


def test_reasoning_comes_as_a_reasoning_item_before_the_message(thinking_client):
    both = 0
    for seed in range(6):
        body = {"input": "Hello", "max_output_tokens": 40, "temperature": 1.0, "seed": seed}
        whole = thinking_client.post("/v1/responses", json=body).json()
        kinds = [item["type"] for item in whole["output"]]
        assert kinds in (["reasoning"], ["message"], ["reasoning", "message"]), kinds
        if kinds != ["reasoning", "message"]:
            continue
        both += 1
        reasoning = whole["output"][0]
        assert reasoning["id"].startswith("rs_") and reasoning["summary"] == []
        (part,) = reasoning["content"]
        assert part["type"] == "reasoning_text" and part["text"].strip()
        assert 0 < whole["usage"]["output_tokens_details"]["reasoning_tokens"] <= 40
        events = sse(thinking_client.post("/v1/responses", json={**body, "stream": True}))
        types = [e["type"] for e in events]
        first_text = types.index("response.output_text.delta")
        assert types.index("response.reasoning_text.done") < first_text
        assert "response.reasoning_text.delta" in types[:first_text]
        streamed = "".join(e["delta"] for e in events
                           if e["type"] == "response.reasoning_text.delta")
        assert streamed == part["text"]
        texts = [[(o["type"], o["content"][0]["text"]) for o in r["output"]]
                 for r in (whole, events[-1]["response"])]
        assert texts[0] == texts[1]
    assert both, "no seed gave reasoning then an answer"


def test_the_dialect_conforms(tiny_checkpoint):
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.conformance import check_dialect

    dialect = load_plugins().dialects.get("responses")
    assert dialect.prefixes == ("/v1/responses", "/responses", "/v1/conversations",
                                "/conversations")
    with make_client(tiny_checkpoint, api_key="s3cret", parallel=1) as c:
        wait_ready(c)
        made = c.post("/v1/responses", json=BODY, headers={"x-api-key": "s3cret"}).json()
        check_dialect(c, dialect, f"/v1/responses/{made['id']}", "s3cret")


def test_a_thinking_budget_of_0_ends_the_reasoning_at_once(thinking_client):
    for seed in range(6):
        body = {"input": "Hello", "max_output_tokens": 40, "temperature": 1.0, "seed": seed,
                "thinking_budget_tokens": 0}
        whole = thinking_client.post("/v1/responses", json=body).json()
        assert [item["type"] for item in whole["output"]] == ["message"], whole["output"]
