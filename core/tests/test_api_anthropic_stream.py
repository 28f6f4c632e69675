"""Anthropic content blocks from constructed deltas (order, held whitespace, the whole
answer's calls), stop reasons, the error table, and a failing engine's error event."""

from __future__ import annotations

import pytest
from anthropic_helpers import USER, accumulate, events
from apphelpers import make_client, wait_ready
from mlxcel import errors as e
from mlxcel import types as mt
from mlxcel.dialects.anthropic.errors import error_body
from mlxcel.dialects.anthropic.stream import MessageEncoder, stop_reason
from mlxcel.testing.faults import raise_on_marker
from mlxcel.types.toolcalls import ParsedCall

USAGE = mt.Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4)


def run(deltas):
    """The encoder's events for ``deltas`` and its whole message."""
    enc = MessageEncoder("msg_1", "tiny", 10)
    evs = [{"type": "message_start", "message": {
        "content": [], "usage": {"input_tokens": 10, "output_tokens": 0}}}]
    for delta in deltas:
        evs += enc.add(delta)
    return evs, enc.whole()


def test_blocks_keep_the_order_the_model_wrote():
    evs, whole = run([
        mt.ReasoningDelta(text="\n"), mt.ReasoningDelta(text="think"), mt.ContentDelta(text="\n\n"),
        mt.ContentDelta(text="Hi"), mt.ToolCallStart(index=0, id="c1", name="f"),
        mt.ToolCallArguments(index=0, text='{"a":'), mt.ToolCallArguments(index=0, text=" 1}"),
        mt.ToolCallEnd(index=0), mt.ContentDelta(text=" after"),
        mt.Finish(reason="tool_calls", usage=USAGE,
               calls=(ParsedCall(name="f", arguments='{"a": 1}', id="c1"),))])
    assert [(b["type"], b.get("text", b.get("thinking"))) for b in whole.content] == [
        ("thinking", "\nthink"), ("text", "\n\nHi"), ("tool_use", None), ("text", " after")]
    assert whole.content[2] == {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}
    assert whole.content[0]["signature"]
    assert accumulate(evs)["content"] == whole.content
    assert whole.stop_reason == "tool_use"
    assert (whole.usage.input_tokens, whole.usage.cache_read_input_tokens) == (6, 4)


def test_whitespace_alone_opens_no_block_and_an_empty_answer_gets_one():
    _, whole = run([mt.ContentDelta(text=" \n"), mt.ToolCallStart(index=0, id="c1", name="f"),
                    mt.ToolCallEnd(index=0), mt.Finish(reason="tool_calls", usage=USAGE)])
    assert [b["type"] for b in whole.content] == ["tool_use"]
    assert whole.content[0]["input"] == {}
    evs, whole = run([mt.ContentDelta(text="\n"), mt.Finish(reason="stop", usage=USAGE)])
    assert whole.content == [{"type": "text", "text": "\n"}]
    assert accumulate(evs)["content"] == whole.content
    _, whole = run([mt.Finish(reason="length", usage=USAGE)])
    assert whole.content == [{"type": "text", "text": ""}]


def test_the_whole_answers_calls_are_authoritative():
    evs, whole = run([
        mt.ToolCallStart(index=0, id="c1", name="f"), mt.ToolCallArguments(index=0, text='{"a": 1}'),
        mt.Finish(reason="tool_calls", usage=USAGE, calls=(
            ParsedCall(name="f", arguments='{"a": 2}', id="c1"),
            ParsedCall(name="g", arguments='{"b": 3}', id="c2")))])
    assert [(b["name"], b["input"]) for b in whole.content] == [("f", {"a": 2}), ("g", {"b": 3})]
    streamed = accumulate(evs)["content"]
    assert streamed[0]["input"] == {"a": 1}  # what was streamed stays streamed
    assert streamed[1] == whole.content[1]  # the unstreamed call is sent whole at the end


@pytest.mark.parametrize("finish,reason", [
    (mt.Finish(reason="stop"), "end_turn"),
    (mt.Finish(reason="stop", stop_sequence="END"), "stop_sequence"),
    (mt.Finish(reason="length"), "max_tokens"),
    (mt.Finish(reason="tool_calls"), "tool_use"),
])
def test_stop_reasons(finish, reason):
    assert stop_reason(finish) == reason


@pytest.mark.parametrize("exc,status,kind", [
    (e.InvalidRequest("x"), 400, "invalid_request_error"),
    (e.ContextLengthExceeded("x"), 400, "invalid_request_error"),
    (e.MethodNotAllowed("x"), 405, "invalid_request_error"),
    (e.MissingApiKey("x"), 401, "authentication_error"),
    (e.InvalidApiKey("x"), 401, "authentication_error"),
    (e.Forbidden("x"), 403, "permission_error"),
    (e.NotFound("x"), 404, "not_found_error"),
    (e.PayloadTooLarge("x"), 413, "request_too_large"),
    (e.Overloaded("x"), 503, "overloaded_error"),
    (e.ModelLoading("x"), 503, "overloaded_error"),
    (e.MemoryBudgetExceeded(2, 1), 503, "overloaded_error"),
    (e.CapabilityNotSupported("x"), 501, "not_supported_error"),
    (e.GenerationFailed("x"), 500, "api_error"),
    (e.ServerError(), 500, "api_error"),
])
def test_every_core_error_has_an_anthropic_type(exc, status, kind):
    body = error_body(exc)
    assert exc.status == status and body["type"] == "error"
    assert body["error"]["type"] == kind and body["error"]["message"] == exc.message
    if isinstance(exc, e.MemoryBudgetExceeded):
        assert body["error"]["estimated_bytes"] == 2 and body["error"]["budget_bytes"] == 1


MARKER = "<tool_call>"


@pytest.fixture(scope="module")
def failing(tiny_checkpoint):
    """An app whose model raises on a prefill that holds the marker token."""
    with make_client(tiny_checkpoint, parallel=1) as c:
        wait_ready(c)
        raise_on_marker(c.app.state["ctx"].engine.checkpoint, MARKER,
                        lambda: RuntimeError("marker reached the model"))
        yield c


def test_a_failed_answer_is_an_error_in_anthropic_shape(failing):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": MARKER}]}
    r = failing.post("/v1/messages", json=body)
    assert r.status_code == 500
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    evs = events(failing.post("/v1/messages", json={**body, "stream": True}))
    assert evs[0]["type"] == "message_start"
    assert evs[-1]["type"] == "error" and evs[-1]["error"]["type"] == "api_error"
    assert "message_stop" not in [ev["type"] for ev in evs]
    ok = failing.post("/v1/messages", json={**body, "messages": [USER]})
    assert ok.status_code == 200, ok.text
