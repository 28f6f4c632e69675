"""Responses stores per API key and bounded in bytes: another key gets 404 for a stored
response or a conversation; ``metadata`` and ids are bounded (400 naming the field); what
is stored is what is rendered or returned; the byte budgets drop the least recently used
entries and refuse a conversation past its budget."""

from __future__ import annotations

import pytest
from apphelpers import client_fixture, make_client, wait_ready
from mlxcel.dialects.responses.routes import STORES
from mlxcel.dialects.responses.store import TTLStore, size_of

BODY = {"max_output_tokens": 4, "temperature": 0}
A, B = {"Authorization": "Bearer key-a"}, {"x-api-key": "key-b"}


@pytest.fixture(scope="module")
def keyed(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=1, api_key="key-a,key-b") as c:
        wait_ready(c)
        yield c


def post(client, path, headers, **fields):
    return client.post(path, json=fields, headers=headers)


def test_another_key_gets_404_for_a_stored_response(keyed):
    made = post(keyed, "/v1/responses", A, **BODY, input="Hello").json()
    rid = made["id"]
    for r in (keyed.get(f"/v1/responses/{rid}", headers=B),
              keyed.delete(f"/v1/responses/{rid}", headers=B),
              keyed.post(f"/v1/responses/{rid}/cancel", headers=B)):
        assert r.status_code == 404, r.text
    r = post(keyed, "/v1/responses", B, **BODY, input="x", previous_response_id=rid)
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
    assert keyed.get(f"/v1/responses/{rid}", headers=A).json() == made


def test_another_key_gets_404_for_a_conversation(keyed):
    cid = post(keyed, "/v1/conversations", A).json()["id"]
    first = post(keyed, "/v1/responses", A, **BODY, input="Hello", conversation=cid)
    assert first.status_code == 200
    for r in (post(keyed, "/v1/responses", B, **BODY, input="x", conversation=cid),
              post(keyed, "/v1/responses/input_tokens", B, input="x", conversation=cid),
              keyed.get(f"/v1/conversations/{cid}", headers=B),
              keyed.delete(f"/v1/conversations/{cid}", headers=B)):
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "conversation_not_found"
    again = post(keyed, "/v1/responses/input_tokens", A, input="x", conversation=cid)
    alone = post(keyed, "/v1/responses/input_tokens", A, input="x")
    assert again.json()["input_tokens"] > alone.json()["input_tokens"]  # A's turn is there


@pytest.mark.parametrize(("metadata", "ok"), [
    ({f"k{i}": "v" for i in range(16)}, True), ({f"k{i}": "v" for i in range(17)}, False),
    ({"k" * 64: "v" * 512}, True), ({"k" * 65: "v"}, False), ({"k": "v" * 513}, False),
    ({"k": 1}, False)])
def test_metadata_is_bounded_as_openai_bounds_it(client, metadata, ok):
    for path, body in (("/v1/responses", {**BODY, "input": "x"}), ("/v1/conversations", {})):
        r = client.post(path, json={**body, "metadata": metadata})
        assert r.status_code == (200 if ok else 400), r.text
        if not ok:
            assert r.json()["error"]["param"] == "metadata"


@pytest.mark.parametrize("field", ["conversation", "previous_response_id"])
def test_a_long_id_is_400_and_not_echoed(client, field):
    r = client.post("/v1/responses", json={**BODY, "input": "x", field: "c" * 100_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert len(r.content) < 1000


def test_only_what_is_rendered_or_returned_is_stored(client):
    stores = client.app.state["ctx"].extra[STORES]
    cid = client.post("/v1/conversations", json={}).json()["id"]
    junk = "j" * 200_000
    made = client.post("/v1/responses", json={**BODY, "conversation": cid, "input": [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": junk}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi", "junk": junk}],
         "junk": junk}]})
    assert made.status_code == 200, made.text
    stored = stores.responses.get("\x00" + made.json()["id"])
    convo = stores.conversations.get("\x00" + cid)
    assert size_of(stored.history) < 1000 and size_of(convo) < 5000
    assert convo.items[0] == {"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "Hi"}]}


def test_byte_budgets_drop_the_least_recently_used():
    store: TTLStore[str] = TTLStore(100, 60.0, max_bytes=30)
    assert store.put("a", "x" * 10) and store.put("b", "y" * 10)  # 12 bytes each
    store.get("a")
    assert store.put("c", "z" * 10)  # 36 > 30: the oldest ("a", put first) goes
    assert (store.get("a"), store.bytes) == (None, 24)
    assert not store.put("big", "w" * 40) and store.get("big") is None
    assert store.delete("b") and store.bytes == 12


tight = client_fixture(parallel=1, conversation_store_max_bytes=4000,
                       responses_store_max_bytes=3000)


def test_a_conversation_past_its_budget_is_400(tight):
    cid = tight.post("/v1/conversations", json={}).json()["id"]
    r = tight.post("/v1/responses", json={**BODY, "conversation": cid, "input": "w " * 3000})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
        "conversation", "conversation_too_large")
    ok = tight.post("/v1/responses", json={**BODY, "conversation": cid, "input": "Hi"})
    assert ok.status_code == 200, ok.text


def test_the_responses_store_holds_its_byte_budget(tight):
    stores = tight.app.state["ctx"].extra[STORES]
    ids = [tight.post("/v1/responses", json={**BODY, "input": "w " * 300}).json()["id"]
           for _ in range(6)]
    assert stores.responses.bytes <= 3000
    found = [tight.get(f"/v1/responses/{i}").status_code for i in ids]
    assert found[-1] == 200 and found[0] == 404



IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}


@pytest.mark.parametrize("instructions", [None, "Be brief."])
def test_errors_name_the_input_item_not_messages(client, instructions):
    cid = client.post("/v1/conversations", json={
        "items": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
    }).json()["id"]
    for extra, path in (({}, "input[2].content[1]"),
                        ({"conversation": cid}, "input[2].content[1]")):
        r = client.post("/v1/responses", json={
            **BODY, **extra, "instructions": instructions, "input": [
                {"role": "user", "content": "a"},
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]},
                {"role": "user", "content": [{"type": "input_text", "text": "b"}, IMAGE]}]})
        assert r.status_code == 501, r.text
        error = r.json()["error"]
        assert error["param"] == path and "messages" not in error["message"]
        assert path in error["message"]
        counted = client.post("/v1/responses/input_tokens", json={
            **extra, "input": [{"role": "user", "content": [IMAGE]}]})
        assert counted.json()["error"]["param"] == "input[0].content[0]"


def test_a_too_long_input_is_named_input(client):
    r = client.post("/v1/responses", json={**BODY, "input": "word " * 5000})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
