"""Responses stores in process: retrieve, delete and cancel; ``previous_response_id``
chaining and ``conversation`` (checked by the prompt the next turn renders); ``store:
false``; size 0 (storing off: 400s); the oldest entry dropped past the size; expiry."""

from __future__ import annotations

import json

import pytest
from apphelpers import client_fixture, make_client, wait_ready
from mlxcel.dialects.responses.routes import STORES
from mlxcel.dialects.responses.store import TTLStore

BODY = {"max_output_tokens": 6, "temperature": 0}


def create(client, **fields):
    r = client.post("/v1/responses", json={**BODY, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def count(client, **fields) -> int:
    r = client.post("/v1/responses/input_tokens", json=fields)
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("prefix", ["/v1/responses", "/responses"])
def test_retrieve_cancel_and_delete_a_stored_response(client, prefix):
    made = create(client, input="Hello")
    got = client.get(f"{prefix}/{made['id']}")
    assert got.status_code == 200 and got.json() == made
    cancelled = client.post(f"{prefix}/{made['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["id"] == made["id"]
    assert client.get(f"{prefix}/{made['id']}").json()["status"] == "cancelled"
    gone = client.delete(f"{prefix}/{made['id']}")
    assert gone.status_code == 200
    assert gone.json() == {"id": made["id"], "object": "response.deleted", "deleted": True}
    for r in (client.get(f"{prefix}/{made['id']}"), client.delete(f"{prefix}/{made['id']}"),
              client.post(f"{prefix}/{made['id']}/cancel")):
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_store_false_keeps_nothing(client):
    made = create(client, input="Hello", store=False)
    assert made["store"] is False
    assert client.get(f"/v1/responses/{made['id']}").status_code == 404


def test_previous_response_id_continues_from_its_input_and_output(client):
    first = create(client, input="Hello", instructions="Be brief.")
    second = create(client, input="And then?", previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    history = [{"role": "user", "content": "Hello"}, *first["output"],
               {"role": "user", "content": "And then?"}]
    assert second["usage"]["input_tokens"] == count(client, input=history)  # no instructions
    third = count(client, input="Go on", previous_response_id=second["id"])
    assert third == count(client, input=[*history, *second["output"],
                                         {"role": "user", "content": "Go on"}])


def new_conversation(client, **fields) -> str:
    r = client.post("/v1/conversations", json=fields)
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["object"] == "conversation" and made["id"].startswith("conv_")
    return made["id"]


def test_a_conversation_collects_every_turn(client):
    conv_a, conv_b = new_conversation(client), new_conversation(client)
    first = create(client, input="Hello", conversation=conv_a)
    assert first["conversation"] == {"id": conv_a}
    second = create(client, input="And then?", conversation={"id": conv_a})
    history = [{"role": "user", "content": "Hello"}, *first["output"],
               {"role": "user", "content": "And then?"}]
    assert second["usage"]["input_tokens"] == count(client, input=history)
    other = create(client, input="Hello", conversation=conv_b)
    assert other["usage"]["input_tokens"] == first["usage"]["input_tokens"]


def test_conversations_are_made_read_and_deleted_by_the_server(client):
    cid = new_conversation(client, metadata={"topic": "x"},
                           items=[{"role": "user", "content": "Hello"}])
    got = client.get(f"/v1/conversations/{cid}").json()
    assert got["id"] == cid and got["metadata"] == {"topic": "x"}
    made = create(client, input="And then?", conversation=cid)
    assert made["usage"]["input_tokens"] == count(client, input=[
        {"role": "user", "content": "Hello"}, {"role": "user", "content": "And then?"}])
    gone = client.delete(f"/conversations/{cid}")
    assert gone.json() == {"id": cid, "object": "conversation.deleted", "deleted": True}
    assert client.get(f"/v1/conversations/{cid}").status_code == 404


@pytest.mark.parametrize("cid", ["conv-never-made", "conv_" + "0" * 32])
def test_an_unknown_conversation_is_404_and_never_made(client, cid):
    for _ in range(2):  # the first miss made nothing
        r = client.post("/v1/responses", json={**BODY, "input": "x", "conversation": cid})
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert (error["code"], error["param"]) == ("conversation_not_found", "conversation")
    r = client.post("/v1/responses/input_tokens", json={"input": "x", "conversation": cid})
    assert r.status_code == 404


def test_store_true_without_a_conversation_makes_none(client):
    made = create(client, input="Hello")
    assert made["conversation"] is None
    stores = client.app.state["ctx"].extra[STORES]
    before = len(stores.conversations)
    create(client, input="Hello")
    assert len(stores.conversations) == before


def test_an_unknown_previous_response_is_400(client):
    r = client.post("/v1/responses", json={**BODY, "input": "x",
                                           "previous_response_id": "resp_missing"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"


storeless = client_fixture(parallel=1, responses_store_max_entries=0,
                           conversation_store_max_entries=0)


def test_size_0_turns_storing_off_and_its_routes_are_400(storeless):
    made = create(storeless, input="Hello")
    rid = made["id"]
    assert made["store"] is False
    refused = [storeless.get(f"/v1/responses/{rid}"), storeless.delete(f"/responses/{rid}"),
               storeless.post(f"/v1/responses/{rid}/cancel"),
               storeless.post("/v1/responses", json={**BODY, "input": "x",
                                                     "previous_response_id": rid}),
               storeless.post("/v1/responses", json={**BODY, "input": "x",
                                                     "conversation": "c"})]
    for r in refused:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert refused[3].json()["error"]["param"] == "previous_response_id"
    assert refused[4].json()["error"]["param"] == "conversation"


@pytest.fixture
def small(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=1, responses_store_max_entries=2,
                     responses_store_ttl_secs=60, conversation_store_max_entries=1,
                     conversation_store_ttl_secs=30) as c:
        wait_ready(c)
        clock = Clock()
        c.app.state["ctx"].extra[STORES].set_clock(clock)
        yield c, clock


def test_stored_responses_expire_after_their_ttl(small):
    client, clock = small
    made = create(client, input="Hello")
    clock.now += 59
    assert client.get(f"/v1/responses/{made['id']}").status_code == 200
    clock.now += 1
    assert client.get(f"/v1/responses/{made['id']}").status_code == 404
    r = client.post("/v1/responses", json={**BODY, "input": "x",
                                           "previous_response_id": made["id"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"


def test_the_oldest_response_goes_first_past_the_size(small):
    client, _ = small
    ids = [create(client, input="Hello")["id"] for _ in range(3)]
    assert [client.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]


def test_a_conversation_expires_and_the_newest_one_stays(small):
    client, clock = small
    c1 = new_conversation(client)
    fresh = create(client, input="Hello", conversation=c1)["usage"]["input_tokens"]
    assert create(client, input="Hello", conversation=c1)["usage"]["input_tokens"] > fresh
    clock.now += 30  # expired: a 404, not a fresh conversation
    r = client.post("/v1/responses", json={**BODY, "input": "Hello", "conversation": c1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"
    c1, c2 = new_conversation(client), new_conversation(client)  # size 1: c1 is dropped
    assert create(client, input="Hello", conversation=c2)["usage"]["input_tokens"] == fresh
    r = client.post("/v1/responses", json={**BODY, "input": "Hello", "conversation": c1})
    assert r.status_code == 404


def test_ttl_store_rules():
    clock = Clock()
    store: TTLStore[int] = TTLStore(2, 10.0, clock)
    store.put("a", 1)
    store.put("b", 2)
    store.put("a", 3)  # replaced: newest again
    store.put("c", 4)
    assert (store.get("a"), store.get("b"), store.get("c")) == (3, None, 4)
    clock.now += 9.5
    store.put("d", 5)
    clock.now += 0.5
    assert (store.get("a"), store.get("c"), store.get("d")) == (None, None, 5)
    assert store.delete("d") and not store.delete("d") and len(store) == 0
    off: TTLStore[int] = TTLStore(0, 10.0, clock)
    off.put("a", 1)
    assert not off.enabled and off.get("a") is None


def test_a_streamed_response_is_stored_when_it_ends(client):
    r = client.post("/v1/responses", json={**BODY, "input": "Hello", "stream": True})
    last = r.text.strip().split("\n\n")[-1].split("\n", 1)[1][len("data: "):]
    final = json.loads(last)["response"]
    assert client.get(f"/v1/responses/{final['id']}").json() == final
