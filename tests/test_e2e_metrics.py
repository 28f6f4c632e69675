"""End to end: /metrics, --metrics-port and /slots on the real mlxcel-server process."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from mlxcel.testing.servers import MlxcelServer as Server
from mlxcel.testing.servers import free_port

pytestmark = pytest.mark.slow
KEY = {"Authorization": "Bearer k-metrics"}
CHAT = {"messages": [{"role": "user", "content": "Say something."}], "temperature": 0,
        "ignore_eos": True}
LONG = {**CHAT, "max_tokens": 3000, "stream": True}  # far from done when the client leaves


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    metrics_port = free_port()
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "2", "--api-key", "k-metrics",
                  "--metrics", "--slots", "--metrics-port", str(metrics_port)])
    srv.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    yield srv
    srv.stop()


def scrape(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def states(http) -> list[str]:
    return [s["state"] for s in http.get("/slots").json()]


def wait_idle(http) -> None:
    deadline = time.time() + 10
    while states(http) != ["idle", "idle"]:
        assert time.time() < deadline, states(http)
        time.sleep(0.05)


class LongStream:
    """A long chat stream on its own connection, read up to its first token and held open.

    ``close()`` drops the connection mid-stream, as a client that goes away does.
    """

    def __init__(self, server) -> None:
        self.client = httpx.Client(base_url=server.base_url, headers=KEY, timeout=30)
        self.request = self.client.build_request("POST", "/v1/chat/completions", json=LONG)
        self.response = self.client.send(self.request, stream=True)
        assert self.response.status_code == 200
        self.lines = self.response.iter_lines()  # kept: dropping it would close the stream
        for line in self.lines:  # the role chunk comes before any token
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"):
                return
        raise AssertionError("the stream ended before its first token")

    def close(self) -> None:
        self.response.close()
        self.client.close()


def test_cancelled_chat_stream_is_not_counted_but_a_completed_one_is(server, http):
    before = scrape(http.get("/metrics").text)
    LongStream(server).close()  # the client goes away mid-stream
    with http.stream("POST", "/v1/chat/completions",
                     json={**CHAT, "max_tokens": 8, "stream": True}) as r:
        assert r.read().rstrip().endswith(b"data: [DONE]")
    wait_idle(http)  # the cancelled generation has left its slot
    after = scrape(http.get("/metrics").text)
    delta = {k: after[k] - before[k] for k in after}
    assert delta["mlxcel_requests_total"] == 1
    assert delta["mlxcel_completion_tokens_total"] == 8
    assert delta["mlxcel_batch_sequences_started"] == 2  # the engine did run both
    assert delta["mlxcel_batch_decode_tokens_total"] < 3000


def test_metrics_port_serves_the_same_registry_without_api_key(server, http):
    http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    side = httpx.get(server.metrics_url, timeout=10)
    assert side.status_code == 200
    assert side.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    main = http.get("/metrics")
    assert [ln for ln in side.text.splitlines() if ln.startswith("#")] == \
        [ln for ln in main.text.splitlines() if ln.startswith("#")]
    assert scrape(side.text)["mlxcel_requests_total"] == \
        scrape(main.text)["mlxcel_requests_total"] >= 1
    assert scrape(side.text)["mlxcel_slots_total"] == 2
    # a Prometheus scraper asks for OpenMetrics first; it still gets the 0.0.4 text
    om = httpx.get(server.metrics_url, timeout=10, headers={
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"})
    assert om.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE mlxcel_batch_sequences_started counter" in om.text
    assert httpx.get(server.base_url + "/metrics").status_code == 401  # main port: key


def test_slots_show_decoding_while_streaming_and_idle_after_disconnect(server, http):
    wait_idle(http)
    stream = LongStream(server)
    try:
        for _ in range(5):  # the slot stays busy while the client is there
            slots = http.get("/slots").json()
            assert [s["state"] for s in slots] == ["decoding", "idle"]
            time.sleep(0.05)
        assert [s["is_processing"] for s in slots] == [True, False]
        assert [s["id"] for s in slots] == [0, 1]
        assert slots[0]["model"] == http.get("/health").json()["model"]
    finally:
        stream.close()
    wait_idle(http)
