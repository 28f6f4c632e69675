"""API keys are isolated (real server): a stored response and a conversation made with one
key are 404 to another, which can neither read them (through the model, ``input_tokens``
or retrieval), extend them, nor delete them; an unknown conversation id is a 404, never a
fresh one."""

from __future__ import annotations

import time

import httpx
from conftest import assert_no_leak, rss_bytes

BODY = {"max_output_tokens": 2, "temperature": 0}
A, B = {"Authorization": "Bearer key-a"}, {"x-api-key": "key-b"}


def test_one_key_never_reaches_another_keys_entries(start_server):
    srv = start_server("--parallel", "1", "--api-key", "key-a,key-b")
    rss, started = rss_bytes(srv), time.time()
    with httpx.Client(base_url=srv.base_url, timeout=30) as client:
        cid = client.post("/v1/conversations", json={}, headers=A).json()["id"]
        assert cid.startswith("conv_")
        made = client.post("/v1/responses", headers=A, json={
            **BODY, "input": "secret turn", "conversation": cid})
        assert made.status_code == 200, made.text
        rid = made.json()["id"]
        refused = [
            client.get(f"/v1/responses/{rid}", headers=B),
            client.post(f"/v1/responses/{rid}/cancel", headers=B),
            client.delete(f"/v1/responses/{rid}", headers=B),
            client.get(f"/v1/conversations/{cid}", headers=B),
            client.delete(f"/v1/conversations/{cid}", headers=B),
            client.post("/v1/responses", headers=B, json={**BODY, "input": "x",
                                                          "conversation": cid}),
            client.post("/v1/responses/input_tokens", headers=B,
                        json={"input": "x", "conversation": cid}),
        ]
        assert [r.status_code for r in refused] == [404] * 7, [r.text for r in refused]
        chained = client.post("/v1/responses", headers=B, json={
            **BODY, "input": "x", "previous_response_id": rid})
        assert chained.json()["error"]["code"] == "previous_response_not_found"
        # A still has both, untouched by B's attempts
        assert client.get(f"/v1/responses/{rid}", headers=A).status_code == 200
        turn = client.post("/v1/responses", headers=A, json={**BODY, "input": "again",
                                                             "conversation": cid})
        assert turn.status_code == 200
        # an id nobody made is 404 twice: the miss made nothing
        for _ in range(2):
            r = client.post("/v1/responses", headers=A, json={
                **BODY, "input": "x", "conversation": "conv_made_up"})
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "conversation_not_found"
    assert time.time() - started < 40
    assert_no_leak(srv, rss, headers=A)
