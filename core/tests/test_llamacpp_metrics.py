"""llama-server's ``llamacpp:`` metric families: the served totals and their scrape window,
and the families in process (a native stream counts there, not in ``mlxcel_requests_total``)."""

from __future__ import annotations

import threading
import time

import pytest
from apphelpers import ready_client
from mlxcel.engine.served import ServedTotals
from mlxcel.metrics_llamacpp import SPEC
from prometheus_client.parser import text_string_to_metric_families


def test_served_window_and_rates_leave_the_first_token_out():
    served = ServedTotals()
    # prompt 10 (4 from the cache), 5 generated; first token 0.5 s after submit, last 2 s later
    served.request(10, 4, 5, started=100.0, first=100.5, last=102.5)
    served.request(3, 0, 1, started=200.0, first=200.25, last=200.25)  # one token only
    total, bucket = served.snapshot(reset_bucket=True)
    assert (total.prompt_tokens, total.cached_tokens, total.predicted_tokens) == (9, 4, 6)
    assert total.prompt_seconds == pytest.approx(0.75)
    assert total.predicted_steps == 4 and total.predicted_seconds == pytest.approx(2.0)
    assert bucket.predicted_rate == pytest.approx(4 / 2.0)  # not 6 / 2.0
    assert bucket.prompt_rate == pytest.approx(9 / 0.75)
    total2, empty = served.snapshot(reset_bucket=True)
    assert total2 == total and empty.prompt_rate == empty.predicted_rate == 0
    served.side_batch(7, 0.5)
    total3, bucket3 = served.snapshot()
    assert total3.prompt_tokens == 16 and total3.side_batches == 1
    assert bucket3.prompt_rate == pytest.approx(7 / 0.5)


def samples(client) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and int(r.headers["process-start-time-unix"]) > 0
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    out = {}
    for name, type_, help_ in SPEC:
        family = families[name.removesuffix("_total") if type_ == "counter" else name]
        assert (family.type, family.documentation) == (type_, help_)
        [sample] = family.samples
        out[sample.name] = sample.value
    out["mlxcel_requests_total"] = families["mlxcel_requests"].samples[0].value
    return out


def test_a_native_stream_counts_in_the_llamacpp_families(tiny_checkpoint):
    with ready_client(tiny_checkpoint, parallel=2, metrics=True) as c:
        before = samples(c)
        body = {"prompt": "Once upon a time", "n_predict": 6, "ignore_eos": True,
                "temperature": 0, "stream": True}
        with c.stream("POST", "/completion", json=body) as r:
            assert r.status_code == 200 and '"stop":true' in "".join(r.iter_text())
        after = samples(c)
        assert after["mlxcel_requests_total"] == before["mlxcel_requests_total"]
        assert after["llamacpp:tokens_predicted_total"] - \
            before["llamacpp:tokens_predicted_total"] == 6
        assert after["llamacpp:prompt_tokens_total"] > before["llamacpp:prompt_tokens_total"]
        assert after["llamacpp:predicted_tokens_seconds"] > 0
        assert samples(c)["llamacpp:predicted_tokens_seconds"] == 0  # a new window


def test_prompt_seconds_leave_out_a_queued_requests_wait(tiny_checkpoint):
    """A request queued behind a busy slot adds its prefill's seconds, not its wait, to
    the totals and to its ``timings.prompt_ms`` (llama-server counts both from
    ``t_start_process_prompt``)."""
    with ready_client(tiny_checkpoint, parallel=1, metrics=True) as c:
        before = samples(c)
        long = {"prompt": "Once upon a time", "n_predict": 8000, "ignore_eos": True,
                "temperature": 0, "cache_prompt": False}
        done: list = []
        holder = threading.Thread(target=lambda: done.append(c.post("/completion", json=long)))
        holder.start()
        deadline = time.monotonic() + 30
        while samples(c)["llamacpp:requests_processing"] < 1:  # the long one holds the slot
            assert time.monotonic() < deadline
            time.sleep(0.01)
        start = time.perf_counter()
        short = c.post("/completion", json={"prompt": "Hello there", "n_predict": 1,
                                            "temperature": 0, "cache_prompt": False})
        waited = time.perf_counter() - start
        holder.join(60)
        assert short.status_code == 200 and done and done[0].status_code == 200
        after = samples(c)
        held = done[0].json()["tokens_predicted"]
        assert held > 1000 and waited > 0.3  # it sat in the queue behind the long one
        assert after["llamacpp:tokens_predicted_total"] - \
            before["llamacpp:tokens_predicted_total"] == held + 1
        # two short prompts' prefills: a small part of the wait, which is not counted
        assert after["llamacpp:prompt_seconds_total"] - \
            before["llamacpp:prompt_seconds_total"] < waited / 4
        # and its own timings say the same: prompt_ms is the prefill, not the wait
        assert short.json()["timings"]["prompt_ms"] < waited * 1e3 / 4
