"""End to end: the Responses API of the real mlxcel-server process through the real
openai SDK: create (plain, streamed, with a forced function tool), retrieve, delete,
chaining with previous_response_id, a previous output sent back as input, and a
server-made conversation."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"]}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": WEATHER, "strict": True}
EXTRA = {"ignore_eos": True}


def test_create_plain(sdk):
    r = sdk.responses.create(model="tiny", input="Say something.", instructions="Be terse.",
                             max_output_tokens=10, temperature=0, extra_body=EXTRA)
    assert r.object == "response" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 10
    assert r.usage.total_tokens == r.usage.input_tokens + 10
    assert isinstance(r.output_text, str) and r.output[0].type == "message"


def test_create_streaming_matches_plain(sdk):
    kw = dict(model="tiny", input="Say something.", max_output_tokens=10, temperature=0,
              extra_body=EXTRA)
    whole = sdk.responses.create(**kw)
    events = list(sdk.responses.create(**kw, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text


def test_a_forced_function_tool_round_trip(sdk):
    with sdk.responses.stream(model="tiny", input="Weather in Paris?", tools=[TOOL],
                              tool_choice={"type": "function", "name": "get_weather"},
                              max_output_tokens=300, temperature=1.0,
                              extra_body={"seed": 7}) as stream:
        first = stream.get_final_response()
    assert first.status == "completed"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    answer = sdk.responses.create(model="tiny", previous_response_id=first.id, tools=[TOOL],
                                  input=[{"type": "function_call_output",
                                          "call_id": call.call_id, "output": "sunny"}],
                                  max_output_tokens=6, extra_body=EXTRA)
    assert answer.previous_response_id == first.id and answer.usage.output_tokens == 6


def test_retrieve_and_delete(sdk):
    made = sdk.responses.create(model="tiny", input="Hi", max_output_tokens=4,
                                extra_body=EXTRA)
    got = sdk.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    sdk.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(made.id)


def test_chaining_and_resending_the_output_read_the_same_history(sdk):
    first = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=6,
                                 temperature=0, extra_body=EXTRA)
    chained = sdk.responses.create(model="tiny", input="And then?", max_output_tokens=4,
                                   previous_response_id=first.id, extra_body=EXTRA)
    resent = [{"role": "user", "content": "Hello"},
              *[item.model_dump(exclude_none=True) for item in first.output],
              {"role": "user", "content": "And then?"}]
    sent_back = sdk.responses.create(model="tiny", input=resent, max_output_tokens=4,
                                     extra_body=EXTRA)
    assert chained.usage.input_tokens == sent_back.usage.input_tokens
    assert chained.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_server_made_conversation_through_the_sdk(sdk, server):
    """``conversations.create`` makes the id; turns collect in it; an id the server did
    not make, or deleted, is a 404 (``conversation_not_found``)."""
    convo = sdk.conversations.create(metadata={"topic": "e2e"})
    assert convo.id.startswith("conv_") and convo.metadata == {"topic": "e2e"}
    first = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=4,
                                 conversation=convo.id, extra_body=EXTRA)
    assert first.conversation.id == convo.id
    second = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=4,
                                  conversation=convo.id, extra_body=EXTRA)
    assert second.usage.input_tokens > first.usage.input_tokens
    assert sdk.conversations.retrieve(convo.id).id == convo.id
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.create(model="tiny", input="x", conversation="conv_made_up",
                             max_output_tokens=4)
    assert missing.value.code == "conversation_not_found"
    sdk.conversations.delete(convo.id)
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.retrieve(convo.id)
