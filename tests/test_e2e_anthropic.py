"""End to end: the real mlxcel-server process, the real anthropic SDK: messages.create,
messages.stream, count_tokens, a forced tool call and its result, errors."""

from __future__ import annotations

import anthropic
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
KEY = "k-e2e-anthropic"
SYSTEM = "You are terse."
MESSAGES = [{"role": "user", "content": "Say something."}]
TOOLS = [{"name": "get_time", "description": "The time in a zone.", "input_schema": {
    "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["tz"]}}]
# this SDK takes no sampling arguments: they travel as extra body fields
GREEDY = {"extra_body": {"temperature": 0, "ignore_eos": True}}


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "2", "--api-key", KEY])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sdk(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)


def blocks(message):
    """A message's content as plain data, tool-use ids left out (each answer makes its own)."""
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"}
            for b in message.content]


def test_create(sdk):
    msg = sdk.messages.create(model="tiny", max_tokens=12, system=SYSTEM, messages=MESSAGES,
                              metadata={"user_id": "u1"}, **GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert [b.type for b in msg.content] == ["text"]
    assert msg.usage.output_tokens == 12 and msg.usage.input_tokens > 0


def test_stream_final_message_equals_create(sdk):
    kw = dict(model="tiny", max_tokens=12, system=SYSTEM, messages=MESSAGES, **GREEDY)
    whole = sdk.messages.create(**kw)
    with sdk.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert blocks(final) == blocks(whole) and text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_count_tokens_matches_the_prompt_a_create_uses(sdk):
    counted = sdk.messages.count_tokens(model="tiny", system=SYSTEM, messages=MESSAGES,
                                        tools=TOOLS)
    msg = sdk.messages.create(model="tiny", max_tokens=2, system=SYSTEM, messages=MESSAGES,
                              tools=TOOLS, **GREEDY)
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    bare = sdk.messages.count_tokens(model="tiny", messages=MESSAGES)
    assert bare.input_tokens < counted.input_tokens


def test_tool_use_round_trip(sdk):
    """A forced call, its result sent back, and the next turn: what an agent does."""
    messages = [{"role": "user", "content": "What time is it?"}]
    first = sdk.messages.create(model="tiny", max_tokens=200, messages=messages, tools=TOOLS,
                                tool_choice={"type": "any"}, extra_body={"seed": 1})
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_time" and call.input["tz"] in ("UTC", "CET")
    with sdk.messages.stream(model="tiny", max_tokens=200, messages=messages, tools=TOOLS,
                             tool_choice={"type": "any"}, extra_body={"seed": 1}) as stream:
        streamed = stream.get_final_message()
    assert blocks(streamed) == blocks(first) and streamed.stop_reason == "tool_use"
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": call.id, "content": "12:00"}]}]
    second = sdk.messages.create(model="tiny", max_tokens=8, messages=messages, tools=TOOLS,
                                 **GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert total > first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_errors_through_the_sdk(sdk, server):
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(model="tiny", max_tokens=5, messages=[])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(model="tiny", max_tokens=5, messages=MESSAGES,
                            tool_choice={"type": "tool", "name": "nope"}, tools=TOOLS)
    bad = anthropic.Anthropic(base_url=server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="tiny", max_tokens=5, messages=MESSAGES)
    assert info.value.body["error"]["type"] == "authentication_error"
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk.messages.create(model="tiny", max_tokens=5, messages=[
            {"role": "user", "content": [image]}])
    assert info.value.status_code == 501
