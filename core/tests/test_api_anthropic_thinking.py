"""Anthropic thinking: thinking blocks from a template that opens the reasoning block
(the tiny chatml checkpoint with a generation prompt ending ``<think>\\n``, as Qwen3's
thinking templates do), ``budget_tokens``, ``disabled``, thinking blocks in assistant
turns, and the thinking-block memory."""

from __future__ import annotations

import pytest
from anthropic_helpers import TOOLS, USER, accumulate, events
from apphelpers import make_client, wait_ready
from mlxcel.dialects.anthropic.memory import ThinkingMemory, blocks_key, message_key
from mlxcel.testing.templates import template_text
from mlxcel.types.messages import Message, TextPart, ToolCall

CLOSED = "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}"
OPENED = "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- else %}\n        {{- '<think>\\n' }}\n" \
         "    {%- endif %}"
THINK = {"type": "enabled", "budget_tokens": 4}
# sampled with a seed: the random weights' greedy choice right after <think> is </think>
BASE = {"model": "m", "max_tokens": 16, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "min_p": 0, "seed": 1, "ignore_eos": True, "messages": [USER], "thinking": THINK}


@pytest.fixture(scope="module")
def opened(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint's chatml template, its generation prompt opening ``<think>``
    unless ``enable_thinking`` is false."""
    source = template_text("chatml")
    assert source.count(CLOSED) == 1
    path = tmp_path_factory.mktemp("opened") / "opened.jinja"
    path.write_text(source.replace(CLOSED, OPENED))
    with make_client(tiny_checkpoint, parallel=2, chat_template_file=str(path)) as c:
        wait_ready(c)
        yield c


def count(client, **body):
    r = client.post("/v1/messages/count_tokens", json={"model": "m", **body})
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


def tokens(client, text):
    return len(client.post("/tokenize", json={"content": text}).json()["tokens"])


def test_the_opened_block_comes_back_as_a_thinking_block(opened):
    body = opened.post("/v1/messages", json=BASE).json()
    kinds = [b["type"] for b in body["content"]]
    assert kinds[0] == "thinking" and set(kinds[1:]) <= {"text"}, body
    thinking = body["content"][0]
    assert thinking["thinking"] and isinstance(thinking["signature"], str)
    assert thinking["signature"]
    assert body["usage"]["output_tokens"] == 16
    again = opened.post("/v1/messages", json=BASE).json()
    assert again["content"] == body["content"]  # seeded, and the signature is stable


def test_the_budget_closes_the_reasoning_and_the_answer_follows(opened):
    short = opened.post("/v1/messages", json=BASE).json()
    longer = opened.post("/v1/messages", json={
        **BASE, "thinking": {"type": "enabled", "budget_tokens": 10}}).json()
    assert len(longer["content"][0]["thinking"]) > len(short["content"][0]["thinking"])
    unbounded = opened.post("/v1/messages", json={**BASE, "thinking": None}).json()
    assert [b["type"] for b in unbounded["content"]] == ["thinking"]  # 16 tokens of it


def test_streamed_thinking_equals_the_whole_message(opened):
    whole = opened.post("/v1/messages", json=BASE).json()
    evs = events(opened.post("/v1/messages", json={**BASE, "stream": True}))
    start = evs[1]
    assert start["type"] == "content_block_start" and start["content_block"] == {
        "type": "thinking", "thinking": "", "signature": ""}
    deltas = [e["delta"]["type"] for e in evs if e["type"] == "content_block_delta"
              and e["index"] == 0]
    assert set(deltas[:-1]) == {"thinking_delta"} and deltas[-1] == "signature_delta"
    streamed = accumulate(evs)
    assert streamed["content"] == whole["content"]
    assert streamed["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_disabled_thinking_closes_the_block_in_the_prompt(opened):
    plain = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    assert count(opened, messages=[USER], thinking=THINK) == tokens(opened, plain + "<think>\n")
    off = {"type": "disabled"}
    assert count(opened, messages=[USER], thinking=off) == tokens(
        opened, plain + "<think>\n\n</think>\n\n")
    assert count(opened, messages=[USER], thinking=off,
                 chat_template_kwargs={"enable_thinking": True}) == tokens(
        opened, plain + "<think>\n")
    body = opened.post("/v1/messages", json={**BASE, "thinking": off}).json()
    assert [b["type"] for b in body["content"]] == ["text"]


def test_thinking_blocks_of_assistant_turns_render_as_its_reasoning(opened):
    turn = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Let me see.", "signature": "x"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Hi."}]}
    expected = ("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n"
                "Let me see.\n</think>\n\nHi.")
    assert count(opened, messages=[USER, turn]) == tokens(opened, expected)


def _forced_call(client, stream):
    body = {**BASE, "max_tokens": 200, "ignore_eos": False, "tools": TOOLS,
            "tool_choice": {"type": "any"}, "stream": stream}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    return accumulate(events(r)) if stream else r.json()


def _histories(first):
    """The next request's history, with the answer's thinking block and without it."""
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "12:00"}]}
    shown = [b for b in first["content"] if b["type"] != "thinking"]
    return ([USER, {"role": "assistant", "content": first["content"]}, result],
            [USER, {"role": "assistant", "content": shown}, result])


@pytest.mark.parametrize("stream", [False, True])
def test_the_memory_puts_back_a_dropped_thinking_block(opened, stream):
    first = _forced_call(opened, stream)
    assert first["stop_reason"] == "tool_use" and first["content"][0]["type"] == "thinking"
    kept, dropped = _histories(first)
    with_thinking = count(opened, messages=kept, tools=TOOLS, thinking=THINK)
    assert count(opened, messages=dropped, tools=TOOLS, thinking=THINK) == with_thinking
    # without the prompt cache, or without thinking, nothing is put back
    bare = count(opened, messages=dropped, tools=TOOLS, thinking=THINK, cache_prompt=False)
    assert bare < with_thinking
    assert count(opened, messages=dropped, tools=TOOLS) == bare


def test_no_memory_when_the_server_has_no_prompt_cache(tiny_checkpoint, opened):
    template = opened.app.state["ctx"].settings.chat_template_file
    with make_client(tiny_checkpoint, parallel=1, no_cache_prompt=True,
                     chat_template_file=template) as c:
        wait_ready(c)
        first = _forced_call(c, False)
        assert first["content"][0]["type"] == "thinking"
        kept, dropped = _histories(first)
        assert count(c, messages=dropped, tools=TOOLS, thinking=THINK) < \
            count(c, messages=kept, tools=TOOLS, thinking=THINK)
        assert "anthropic_thinking_memory" not in c.app.state["ctx"].extra


def test_memory_keys_and_bound():
    blocks = [{"type": "thinking", "thinking": "R", "signature": "s"},
              {"type": "text", "text": "Hi."},
              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1, "b": [2]}}]
    resent = Message(role="assistant", content=(TextPart(text="Hi."),),
                     tool_calls=(ToolCall(id="t1", name="f", arguments={"b": [2], "a": 1}),))
    assert blocks_key(blocks) == message_key(resent)
    other = Message(role="assistant", content=(TextPart(text="Hi!"),))
    assert message_key(other) != message_key(resent)
    memory = ThinkingMemory(max_entries=2)
    memory.remember(blocks)
    assert memory.recall(resent) == "R" and memory.recall(other) is None
    memory.remember([{"type": "thinking", "thinking": "R2", "signature": ""},
                     {"type": "text", "text": "Two"}])
    memory.recall(resent)  # used: now the most recent
    memory.remember([{"type": "thinking", "thinking": "R3", "signature": ""},
                     {"type": "text", "text": "Three"}])
    assert len(memory) == 2 and memory.recall(resent) == "R"
    two = Message(role="assistant", content=(TextPart(text="Two"),))
    assert memory.recall(two) is None
    memory.remember([{"type": "text", "text": "no reasoning"}])
    assert len(memory) == 2


def test_the_memory_belongs_to_the_key_that_made_it(tiny_checkpoint, opened):
    """Key A's remembered reasoning is put back for A only: key B resending the same turn
    without its thinking block gets nothing back."""
    template = opened.app.state["ctx"].settings.chat_template_file
    a, b = {"x-api-key": "key-a"}, {"Authorization": "Bearer key-b"}
    with make_client(tiny_checkpoint, parallel=1, api_key="key-a,key-b",
                     chat_template_file=template) as c:
        wait_ready(c)
        body = {**BASE, "max_tokens": 200, "ignore_eos": False, "tools": TOOLS,
                "tool_choice": {"type": "any"}}
        first = c.post("/v1/messages", json=body, headers=a).json()
        assert first["content"][0]["type"] == "thinking"
        kept, dropped = _histories(first)

        def counted(headers, messages):
            r = c.post("/v1/messages/count_tokens", headers=headers, json={
                "model": "m", "messages": messages, "tools": TOOLS, "thinking": THINK})
            assert r.status_code == 200, r.text
            return r.json()["input_tokens"]

        with_thinking = counted(a, kept)
        assert counted(a, dropped) == with_thinking
        assert counted(b, dropped) < with_thinking


def test_scoped_memories_share_entries_but_not_reasoning():
    blocks = [{"type": "thinking", "thinking": "R", "signature": "s"},
              {"type": "text", "text": "Hi."}]
    resent = Message(role="assistant", content=(TextPart(text="Hi."),))
    shared = ThinkingMemory(max_entries=2)
    one, two = shared.scoped("one"), shared.scoped("two")
    one.remember(blocks)
    assert one.recall(resent) == "R" and two.recall(resent) is None
    assert shared.recall(resent) is None and len(two) == 1
