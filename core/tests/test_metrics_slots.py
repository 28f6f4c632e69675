"""GET /metrics and GET /slots in process: mounting flags, exposition format, counting rules."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from apphelpers import make_client, wait_ready
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.engine.client import EngineClient
from mlxcel.metrics import DRAFTS, GOVERNOR, SPEC
from mlxcel.metrics_llamacpp import SPEC as LLAMACPP
from mlxcel.settings import Settings
from prometheus_client.parser import text_string_to_metric_families

# The spec's exposition: HELP and TYPE lines, in this order.
SPEC_HEADERS = """\
# HELP mlxcel_requests_total Total number of completed generation requests; chat completion streams cancelled by the client are excluded
# TYPE mlxcel_requests_total counter
# HELP mlxcel_prompt_tokens_total Total prompt tokens processed
# TYPE mlxcel_prompt_tokens_total counter
# HELP mlxcel_completion_tokens_total Total completion tokens of the requests counted in mlxcel_requests_total
# TYPE mlxcel_completion_tokens_total counter
# HELP mlxcel_generation_time_seconds_total Total generation time in seconds
# TYPE mlxcel_generation_time_seconds_total counter
# HELP mlxcel_slots_total Total number of parallel slots
# TYPE mlxcel_slots_total gauge
# HELP mlxcel_slots_available Available parallel slots
# TYPE mlxcel_slots_available gauge
# HELP mlxcel_queue_depth Current prefill queue depth
# TYPE mlxcel_queue_depth gauge
# HELP mlxcel_batch_sequences_started Total sequences that entered prefill
# TYPE mlxcel_batch_sequences_started counter
# HELP mlxcel_batch_sequences_completed Total sequences that completed generation
# TYPE mlxcel_batch_sequences_completed counter
# HELP mlxcel_batch_prefill_tokens_total Cumulative prefill tokens processed
# TYPE mlxcel_batch_prefill_tokens_total counter
# HELP mlxcel_batch_decode_tokens_total Cumulative decode tokens generated
# TYPE mlxcel_batch_decode_tokens_total counter
# HELP mlxcel_batch_current_size Current active batch size
# TYPE mlxcel_batch_current_size gauge
# HELP mlxcel_cache_pool_active Active cache entries
# TYPE mlxcel_cache_pool_active gauge
""".splitlines()
NAMES = [line.split()[2] for line in SPEC_HEADERS if line.startswith("# TYPE")]
# speculative decoding's counters and governor gauges, then llama-server's families,
# counters first (mlxcel.metrics_llamacpp)
EXTRA = [(name, "counter", help_) for name, help_, _ in DRAFTS] + \
    [(name, "gauge", help_) for name, help_ in GOVERNOR] + list(LLAMACPP)
LLAMACPP_HEADERS = [line for name, type_, help_ in EXTRA
                    for line in (f"# HELP {name} {help_}", f"# TYPE {name} {type_}")]
ALL_NAMES = NAMES + [name for name, _, _ in EXTRA]
CHAT = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 5,
        "temperature": 0, "ignore_eos": True}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
              "ignore_eos": True}


@pytest.fixture(scope="module")
def mclient(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=2, metrics=True, slots=True) as c:
        wait_ready(c)
        yield c


def scrape(client) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    values: dict[str, float] = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            values[name] = float(value)
    return values


def test_slots_off_names_the_flag_and_metrics_is_not_mounted(client):
    """/slots left off is 501 naming its flag, as llama-server answers; /metrics without
    --metrics is not mounted at all (404), as the spec says."""
    r = client.get("/slots")
    assert r.status_code == 501
    assert r.json()["error"] == {
        "message": "the /slots endpoint is off on this server; start it with --slots",
        "type": "not_supported_error", "code": None}
    assert client.get("/metrics").status_code == 404


def test_exposition_has_every_spec_metric_in_order(mclient):
    r = mclient.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    lines = r.text.splitlines()
    assert [ln for ln in lines if ln.startswith("#")] == SPEC_HEADERS + LLAMACPP_HEADERS
    samples = [ln.split()[0] for ln in lines if not ln.startswith("#")]
    assert samples == ALL_NAMES  # one unlabelled sample per family, no _created series
    assert [name for name, _, _ in SPEC] == NAMES
    families = list(text_string_to_metric_families(r.text))
    assert len(families) == len(SPEC) + len(EXTRA)
    for family, (name, type_, help_) in zip(families, list(SPEC) + EXTRA, strict=True):
        assert family.type == type_ and family.documentation == help_
        # the parser folds a counter's name to its base and its sample to ``<base>_total``
        assert family.name == (name.removesuffix("_total") if type_ == "counter" else name)
        assert len(family.samples) == 1 and family.samples[0].value >= 0


def test_counters_follow_the_counting_rules(mclient):
    before = scrape(mclient)
    assert before["mlxcel_slots_total"] == 2

    r = mclient.post("/v1/chat/completions", json=CHAT).json()  # counted
    usage = [r["usage"]]
    with mclient.stream("POST", "/v1/chat/completions",  # counted when generation ends
                        json={**CHAT, "stream": True,
                              "stream_options": {"include_usage": True}}) as s:
        body = "".join(s.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    frames = [json.loads(ln[6:]) for ln in body.splitlines()
              if ln.startswith("data: {")]
    usage.append(frames[-1]["usage"])
    r = mclient.post("/v1/completions", json=COMPLETION).json()  # counted
    usage.append(r["usage"])
    with mclient.stream("POST", "/v1/completions",  # a streamed completion is not counted
                        json={**COMPLETION, "stream": True}) as s:
        assert "".join(s.iter_text()).rstrip().endswith("data: [DONE]")

    after = scrape(mclient)
    delta = {k: after[k] - before[k] for k in after}
    assert delta["mlxcel_requests_total"] == 3
    assert delta["mlxcel_prompt_tokens_total"] == sum(u["prompt_tokens"] for u in usage)
    assert delta["mlxcel_completion_tokens_total"] == 5 + 5 + 4
    assert delta["mlxcel_completion_tokens_total"] == sum(u["completion_tokens"] for u in usage)
    assert 0 < delta["mlxcel_generation_time_seconds_total"] < 30
    # the engine saw all four generations
    assert delta["mlxcel_batch_sequences_started"] == 4
    assert delta["mlxcel_batch_sequences_completed"] == 4
    assert delta["mlxcel_batch_decode_tokens_total"] >= 5 + 5 + 4 + 4
    assert delta["mlxcel_batch_prefill_tokens_total"] >= sum(
        u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] for u in usage)
    idle = {k: after[k] for k in ("mlxcel_slots_available", "mlxcel_queue_depth",
                                  "mlxcel_batch_current_size", "mlxcel_cache_pool_active")}
    assert idle == {"mlxcel_slots_available": 2, "mlxcel_queue_depth": 0,
                    "mlxcel_batch_current_size": 0, "mlxcel_cache_pool_active": 0}


def test_failed_request_is_not_counted(mclient):
    before = scrape(mclient)["mlxcel_requests_total"]
    r = mclient.post("/v1/chat/completions", json={**CHAT, "max_tokens": 0})
    assert r.status_code == 400
    assert scrape(mclient)["mlxcel_requests_total"] == before


def test_slots_idle(mclient):
    r = mclient.get("/slots")
    assert r.status_code == 200
    ctx_size = mclient.get("/health").json()["context_size"]
    slots = r.json()
    assert all(isinstance(s.pop("speculative"), bool) for s in slots)  # a drafter or not
    assert slots == [
        {"id": i, "state": "idle", "model": "tiny", "context_size": ctx_size,
         "n_ctx": ctx_size, "is_processing": False} for i in range(2)]


def test_slots_decoding_and_queued(tiny_checkpoint):
    """One slot busy with a long generation, one request waiting for it."""
    with make_client(tiny_checkpoint, parallel=1, slots=True) as c:
        wait_ready(c)
        long = {**CHAT, "max_tokens": 300, "stream": True}  # long enough to be seen
        results: list[int] = []

        def run() -> None:
            results.append(c.post("/v1/chat/completions", json=long).status_code)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        seen = None
        deadline = time.time() + 30
        while seen is None and time.time() < deadline and any(t.is_alive() for t in threads):
            slots = c.get("/slots").json()
            if [s["state"] for s in slots] == ["decoding", "queued"]:
                seen = slots
        assert seen is not None, slots
        assert [s["id"] for s in seen] == [0, 1]
        assert [s["is_processing"] for s in seen] == [True, False]
        assert {s["model"] for s in seen} == {"tiny"}
        assert c.get("/metrics").status_code == 404  # --slots alone does not mount it
        for t in threads:
            t.join(60)
        assert results == [200, 200]
        assert [s["state"] for s in c.get("/slots").json()] == ["idle"]


def test_metrics_while_loading_report_zeros(tiny_checkpoint):
    gate = threading.Event()
    engine = EngineClient(lambda: gate.wait(30), parallel=3)
    app = create_app(Settings(model=str(tiny_checkpoint), metrics=True), engine=engine)
    with TestClient(app) as c:
        try:
            values = scrape(c)
            assert set(values) == set(ALL_NAMES)
            assert all(v == 0 for v in values.values())
        finally:
            gate.set()


def test_metrics_behind_api_key(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=1, metrics=True, slots=True,
                     api_key="k") as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/slots").status_code == 401
        r = c.get("/metrics", headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and "mlxcel_requests_total" in r.text


def test_two_apps_keep_separate_registries(tiny_checkpoint, mclient):
    with make_client(tiny_checkpoint, parallel=1, metrics=True) as other:
        wait_ready(other)
        mine = scrape(mclient)["mlxcel_requests_total"]
        assert other.post("/v1/completions", json=COMPLETION).status_code == 200
        assert scrape(other)["mlxcel_requests_total"] == 1
        assert scrape(mclient)["mlxcel_requests_total"] == mine


def test_metrics_port_listener_starts_and_stops_with_the_app(tiny_checkpoint):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    with make_client(tiny_checkpoint, parallel=1, metrics_port=port) as c:
        assert c.get("/metrics").status_code == 404  # --metrics-port alone: not on the main port
        r = httpx.get(url, timeout=5)
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert int(r.headers["process-start-time-unix"]) <= time.time()
        assert [ln for ln in r.text.splitlines() if ln.startswith("#")] == \
            SPEC_HEADERS + LLAMACPP_HEADERS
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=5)
