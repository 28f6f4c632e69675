"""The Responses output builder on constructed deltas: item order, held whitespace, the
empty answer, length and failure, and a whole answer built like a streamed one."""

from __future__ import annotations

import msgspec
from mlxcel import types as mt
from mlxcel.chat.answer import Answer, Call
from mlxcel.dialects.responses import schemas as s
from mlxcel.dialects.responses.stream import ResponseBuilder

USAGE = mt.Usage(prompt_tokens=10, completion_tokens=6, cached_tokens=4)


def builder() -> ResponseBuilder:
    template = s.Response(id="resp_1", created_at=0, model="m", status="in_progress")
    return ResponseBuilder(template, lambda text: len(text.split()))


def run(deltas):
    b = builder()
    events = [*b.start()]
    for delta in deltas:
        events += b.feed(delta)
    return b, events


def shape(response: s.Response) -> list[tuple]:
    out = []
    for item in msgspec.to_builtins(response.output):
        text = item.get("arguments") or "".join(p["text"] for p in item.get("content", []))
        out.append((item["type"], item["status"], text))
    return out


def test_items_follow_the_deltas_and_whitespace_goes_to_its_own_kind():
    b, events = run([mt.ReasoningDelta(text="\n"), mt.ReasoningDelta(text="think hard"),
                     mt.ContentDelta(text="\n\n"), mt.ContentDelta(text="Hi"),
                     mt.Finish(reason="stop", usage=USAGE)])
    assert shape(b.final) == [("reasoning", "completed", "\nthink hard"),
                              ("message", "completed", "\n\nHi")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    usage = b.final.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (10, 6, 16)
    assert usage.input_tokens_details == {"cached_tokens": 4}
    assert usage.output_tokens_details == {"reasoning_tokens": 2}


def test_whitespace_before_a_call_opens_no_message():
    b, events = run([mt.ContentDelta(text="\n"), mt.ToolCallStart(index=0, id="call_1", name="f"),
                     mt.ToolCallArguments(index=0, text="{\"a\""),
                     mt.ToolCallArguments(index=0, text=": 1}"), mt.ToolCallEnd(index=0),
                     mt.ContentDelta(text="\n"), mt.Finish(reason="tool_calls", usage=USAGE)])
    assert shape(b.final) == [("function_call", "completed", "{\"a\": 1}")]
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == "{\"a\": 1}" and b.final.status == "completed"


def test_an_answer_without_items_is_one_message():
    assert shape(run([mt.Finish(reason="stop", usage=USAGE)])[0].final) == [
        ("message", "completed", "")]
    b, events = run([mt.ContentDelta(text=" "), mt.Finish(reason="stop", usage=USAGE)])
    assert shape(b.final) == [("message", "completed", " ")]
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]


def test_a_length_stop_leaves_the_open_item_incomplete():
    b, events = run([mt.ReasoningDelta(text="a"), mt.ContentDelta(text="b"),
                     mt.Finish(reason="length", usage=USAGE)])
    assert shape(b.final) == [("reasoning", "completed", "a"), ("message", "incomplete", "b")]
    assert b.final.status == "incomplete" and events[-1]["type"] == "response.incomplete"
    assert b.final.incomplete_details == {"reason": "max_output_tokens"}


def test_a_failed_answer_is_response_failed():
    b, events = run([mt.ContentDelta(text="x"), mt.Finish(reason="error", error="engine died")])
    assert b.final is None and events[-1]["type"] == "response.failed"
    response = events[-1]["response"]
    assert response.status == "failed"
    assert response.error == {"code": "server_error", "message": "engine died"}


def test_a_whole_answer_has_the_streamed_items():
    deltas = [mt.ReasoningDelta(text="r"), mt.ContentDelta(text="Sure."),
              mt.ToolCallStart(index=0, id="call_9", name="f"),
              mt.ToolCallArguments(index=0, text="{}"), mt.ToolCallEnd(index=0),
              mt.Finish(reason="tool_calls", usage=USAGE)]
    streamed, _ = run(deltas)
    answer = Answer(content="Sure.", reasoning="r", calls=[Call("call_9", "f", "{}")],
                    finish=deltas[-1])
    whole = builder().whole(answer)
    assert shape(whole) == shape(streamed.final)
    assert whole.output[2].call_id == "call_9"
