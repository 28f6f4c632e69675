"""Compaction: the split rules on constructed histories, the capsule and its replay, POST
/v1/responses/compact (shape, what it keeps, nothing stored, its 400s) and
``context_management`` compacting before generation, streamed and not."""

from __future__ import annotations

import base64
import json

import openai
import pytest
from apphelpers import make_client, wait_ready
from mlxcel.dialects.responses.compaction import (
    SUMMARY_LEAD,
    capsule,
    item_text,
    open_capsule,
    plan,
    replay,
    split_points,
)
from mlxcel.errors import InvalidRequest
from test_api_responses import count, sse


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                            "text": text}]}


def assistant(text):
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def system(text):
    return {"type": "message", "role": "system", "content": [{"type": "input_text",
                                                              "text": text}]}


def call(cid, arguments="{}"):
    return {"type": "function_call", "call_id": cid, "name": "f", "arguments": arguments}


def output(cid, text="ok"):
    return {"type": "function_call_output", "call_id": cid, "output": text}


def words(item):
    return len(item_text(item).split())


def test_split_points_are_before_users_and_after_complete_call_groups():
    assert split_points([user("a"), assistant("b"), user("c"), assistant("d")]) == [0, 2, 4]
    group = [user("a"), call("1"), call("2"), output("1"), output("2"), assistant("b"),
             user("c")]
    assert split_points(group) == [0, 5, 6, 7]
    assert split_points([user("a"), assistant("b"), user("c"), call("1")]) == [0, 2]
    assert split_points([user("a"), call("1"), user("b"), output("1")]) == [0, 4]


def test_the_newest_turns_within_keep_tokens_are_kept():
    sys_msg = system("be brief")
    u1, a1 = user("one two three four five"), assistant("six seven eight nine ten")
    u2, a2 = user("eleven twelve"), assistant("thirteen fourteen fifteen")
    history = [sys_msg, u1, a1, u2, a2]
    fits = plan(history, 3, words)  # a2 fits exactly; u2 is kept whatever its size
    assert fits.instructions == [sys_msg] and fits.kept == [u2, a2]
    assert fits.dropped == [u1, a1]
    tight = plan(history, 2, words)  # a2 does not fit: only the last user message stays
    assert tight.kept == [u2] and tight.dropped == [u1, a1, a2]
    assert plan(history, 1000, words).dropped == []


def test_a_call_never_leaves_its_output():
    history = [user("a b c"), assistant("d e f"), user("g"), call("1", "{\"x\": 1}"),
               output("1", "h i"), assistant("j k l m")]
    seen = set()
    for keep in range(1, 30):
        p = plan(history, keep, words)
        seen.add(len(p.kept))
        for side in (p.kept, p.dropped):
            ids = [i.get("call_id") for i in side if i["type"] != "message"]
            assert ids.count("1") in (0, 2)
        assert history[2] in p.kept  # the last user message
    assert seen == {1, 2, 4, 6}  # [g], [g, j..], [g, call, output, j..], everything


def test_a_call_waiting_for_its_output_is_kept():
    history = [user("a b"), assistant("c d e f"), user("g"), call("1", "{\"long\": 2}")]
    p = plan(history, 1, words)
    assert p.kept == [history[2], history[3]] and p.dropped == history[:2]


def test_a_compaction_item_stands_for_the_history_before_it():
    kept = [user("latest")]
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": capsule("S", kept)}
    sys_msg = system("rules")
    replayed = replay([sys_msg, user("old"), assistant("older"), *kept, item, user("new")])
    summary = {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": SUMMARY_LEAD + "S"}]}
    assert replayed == [sys_msg, summary, *kept, user("new")]
    assert replay([item, user("new")]) == [summary, *kept, user("new")]


@pytest.mark.parametrize("text", ["%%%", base64.urlsafe_b64encode(b"[1]").decode(),
                                  capsule("s", [{"type": "compaction",
                                                 "encrypted_content": "x"}])])
def test_a_capsule_this_server_did_not_make_is_400(text):
    with pytest.raises(InvalidRequest) as info:
        open_capsule(text, "input[0].encrypted_content")
    assert info.value.param == "input[0].encrypted_content"


# -- the routes --------------------------------------------------------------------------
def long_text(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i % 7} item{i}" for i in range(n))


HISTORY = [{"role": "system", "content": "You help."},
           {"role": "user", "content": long_text(15, "alpha")},
           {"role": "assistant", "content": long_text(15, "beta")},
           {"role": "user", "content": "What next?"},
           {"role": "assistant", "content": "gamma delta epsilon"}]


def open_wire_capsule(item: dict) -> dict:
    text = item["encrypted_content"]
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def compact(client, **fields):
    return client.post("/v1/responses/compact", json={"input": HISTORY,
                                                       "max_output_tokens": 8, **fields})


def test_compact_answers_the_kept_items_and_a_capsule(client):
    r = compact(client, keep_tokens=1)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response.compaction" and body["model"] == "tiny"
    *kept, item = body["output"]
    assert [(m["role"], m["content"][0]["text"]) for m in kept] == [
        ("system", "You help."), ("user", "What next?")]
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    opened = open_wire_capsule(item)
    assert opened["items"] == kept[1:]
    assert 0 < body["usage"]["output_tokens"] <= 8
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404
    rendered = client.post("/tokenize", json={"content": "gamma delta epsilon"}).json()
    wider = compact(client, keep_tokens=len(rendered["tokens"])).json()["output"]
    assert [m["content"][0]["text"] for m in wider[1:-1]] == ["What next?",
                                                               "gamma delta epsilon"]


def test_a_compacted_history_replays_as_its_summary_and_kept_items(client):
    body = compact(client, keep_tokens=1).json()
    summary = open_wire_capsule(body["output"][-1])["summary"]
    again = count(client, {"input": [*body["output"], {"role": "user", "content": "Go"}]})
    plain = count(client, {"input": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": SUMMARY_LEAD + summary},
        {"role": "user", "content": "What next?"}, {"role": "user", "content": "Go"}]})
    assert again == plain < count(client, {"input": HISTORY})
    answered = client.post("/v1/responses", json={
        "input": [body["output"][-1], {"role": "user", "content": "Go"}],
        "max_output_tokens": 4})
    assert answered.status_code == 200, answered.text


@pytest.mark.parametrize("fields,param", [
    ({"stream": True}, "stream"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "c"}, "conversation"), ({"keep_tokens": 0}, "keep_tokens"),
    ({"keep_tokens": -3}, "keep_tokens"), ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 16385}, "max_output_tokens")])
def test_compact_refusals(client, fields, param):
    r = compact(client, **fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_nothing_to_drop_is_context_length_exceeded(client):
    r = compact(client, keep_tokens=8192)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.fixture(scope="module")
def small_context(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=1, ctx_size=512) as c:
        wait_ready(c)
        yield c


def test_a_history_longer_than_the_context_is_context_length_exceeded(small_context):
    r = small_context.post("/v1/responses/compact", json={
        "input": [{"role": "user", "content": long_text(60, "w")}]})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_a_summary_that_does_not_fit_is_context_length_exceeded(small_context):
    assert count(small_context, {"input": HISTORY}) < 512
    r = compact(small_context, keep_tokens=1, max_output_tokens=600)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "max_output_tokens"


# -- context_management ------------------------------------------------------------------
LONG = [{"role": "user", "content": long_text(120, "alpha")},
        {"role": "assistant", "content": long_text(120, "beta")},
        {"role": "user", "content": "What next?"}]
MANAGED = {"input": LONG, "max_output_tokens": 4, "temperature": 0,
           "context_management": [{"type": "compaction", "compact_threshold": 100}]}


def test_context_management_compacts_before_generating(client):
    r = client.post("/v1/responses", json=MANAGED)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [item["type"] for item in body["output"]] == ["compaction", "message"]
    assert open_wire_capsule(body["output"][0])["items"][0]["content"][0]["text"] == \
        "What next?"
    assert body["usage"]["input_tokens"] < count(client, {"input": LONG})
    later = client.post("/v1/responses", json={"input": "Go", "max_output_tokens": 4,
                                               "previous_response_id": body["id"]})
    assert later.json()["usage"]["input_tokens"] < count(client, {"input": LONG})
    below = client.post("/v1/responses", json={**MANAGED, "context_management": [
        {"type": "compaction", "compact_threshold": 100_000}]}).json()
    assert [item["type"] for item in below["output"]] == ["message"]


def test_a_streamed_compaction_reports_its_progress(client):
    events = sse(client.post("/v1/responses", json={**MANAGED, "stream": True}))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:6] == ["response.created", "response.in_progress", "mlx.compaction.started",
                         "mlx.compaction.completed", "response.output_item.added",
                         "response.output_item.done"]
    done = events[3]
    assert done["input_tokens_before"] == events[2]["input_tokens"] == count(
        client, {"input": LONG})
    assert 0 < done["input_tokens_after"] < done["input_tokens_before"]
    assert events[4]["item"]["type"] == "compaction" and events[4]["output_index"] == 0
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["compaction", "message"]
    assert final["usage"]["input_tokens"] == done["input_tokens_after"]


def test_the_sdk_counts_and_compacts_through_the_aliases_too(client):
    for base in ("/v1", ""):
        sdk = openai.OpenAI(base_url=f"{client.base_url}{base}", api_key="none",
                            http_client=client, max_retries=0)
        counted = sdk.responses.input_tokens.count(model="tiny", input=HISTORY)
        assert counted.object == "response.input_tokens"
        assert counted.input_tokens == count(client, {"input": HISTORY})
        compacted = sdk.responses.compact(model="tiny", input=HISTORY,
                                          extra_body={"keep_tokens": 1, "max_output_tokens": 8})
        assert compacted.object == "response.compaction"
        assert [item.type for item in compacted.output][-1] == "compaction"
        assert compacted.usage.output_tokens <= 8


def test_a_history_with_nothing_to_drop_goes_on_uncompacted(client):
    body = {**MANAGED, "input": LONG[:1]}  # one long user message: it is always kept
    for stream in (False, True):
        r = client.post("/v1/responses", json={**body, "stream": stream})
        assert r.status_code == 200, r.text
        final = sse(r)[-1]["response"] if stream else r.json()
        assert [item["type"] for item in final["output"]] == ["message"]



def test_a_conversation_whose_answer_filled_the_context_goes_on(small_context):
    """A stored conversation whose answer filled the context (so that with the next input
    it is longer than the context) compacts, the summary reading the newest text that
    fits, answers, and goes on from the compacted history."""
    c = small_context
    filled = [user("Tell me everything."), assistant(long_text(300, "beta"))]
    cid = c.post("/v1/conversations", json={"items": filled}).json()["id"]
    over = c.post("/v1/responses/input_tokens", json={"input": "Go on", "conversation": cid})
    assert over.status_code == 400 and over.json()["error"]["code"] == \
        "context_length_exceeded"
    second = c.post("/v1/responses", json={
        "conversation": cid, "input": "Go on", "temperature": 0, "max_output_tokens": 4,
        "context_management": [{"type": "compaction", "compact_threshold": 400}]})
    assert second.status_code == 200, second.text
    assert [item["type"] for item in second.json()["output"]][0] == "compaction"
    assert second.json()["usage"]["input_tokens"] < 400
    third = c.post("/v1/responses/input_tokens", json={"input": "More", "conversation": cid})
    assert third.status_code == 200 and third.json()["input_tokens"] < 400


def test_compact_leaves_out_the_oldest_turns_that_do_not_fit(small_context):
    """/compact of a history longer than the context: the summary reads the newest turns
    that fit (the oldest left out), and the result fits."""
    turns = [user("one"), assistant(long_text(150, "old")), user("two"),
             assistant(long_text(150, "new")), user("three")]
    assert small_context.post("/v1/responses/input_tokens",
                              json={"input": turns}).status_code == 400
    r = small_context.post("/v1/responses/compact", json={
        "input": turns, "keep_tokens": 1, "max_output_tokens": 64})
    assert r.status_code == 200, r.text
    assert count(small_context, {"input": r.json()["output"]}) < 512
