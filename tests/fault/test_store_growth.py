"""Responses store growth (real server): what a client sends that is never rendered is not
kept, so 25 turns of 8 MB unrendered input (a 4 MB reasoning item no output follows, a
4 MB extra key; the body limit is 10 MB) grow neither a conversation, a
``previous_response_id`` chain, nor the process."""

from __future__ import annotations

import time

import httpx
from conftest import assert_no_leak, rss_bytes

JUNK = "j" * (4 << 20)
TURNS = 25
BODY = {"max_output_tokens": 2, "temperature": 0}


def _turn(**fields) -> dict:
    return {**BODY, **fields, "input": [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": JUNK}]},
        {"role": "user", "content": "Hi", "junk": JUNK}]}


def test_unrendered_input_grows_no_store(start_server):
    # budgets far above the junk, so that only storing less keeps the stores small; large
    # frees go back to the OS at once, so that RSS shows what is kept, not the allocator
    srv = start_server("--parallel", "1", "--responses-store-max-bytes", "1G",
                       "--conversation-store-max-bytes", "1G",
                       env={"MALLOC_MMAP_THRESHOLD_": str(1 << 20)})
    started = time.time()
    with httpx.Client(base_url=srv.base_url, timeout=30) as client:
        cid = client.post("/v1/conversations", json={}).json()["id"]
        assert client.post("/v1/responses", json=_turn(conversation=cid)).status_code == 200
        rss = rss_bytes(srv)  # after one turn: the allocator has seen an 8 MB body
        previous = None
        for i in range(TURNS):
            extra = {"previous_response_id": previous} if previous else {}
            chained = client.post("/v1/responses", json=_turn(**extra))
            assert chained.status_code == 200, chained.text
            previous = chained.json()["id"]
            r = client.post("/v1/responses", json=_turn(conversation=cid))
            assert r.status_code == 200, (i, r.text)
        # both go on, with the few tokens of their rendered turns only
        grown = client.post("/v1/responses/input_tokens", json={
            "input": "Go on", "conversation": cid}).json()["input_tokens"]
        chain = client.post("/v1/responses/input_tokens", json={
            "input": "Go on", "previous_response_id": previous}).json()["input_tokens"]
        assert grown < 40 * (TURNS + 1) and chain < 40 * (TURNS + 1)
    growth = rss_bytes(srv) - rss
    assert growth < 128 << 20, f"RSS grew by {growth >> 20} MiB over {2 * TURNS} turns"
    assert time.time() - started < 50
    assert_no_leak(srv, rss)
