"""n choices of one prompt (``engine.fork``): the prompt is prefilled once, each row then
decodes on its own; and prefill progress events (``return_progress``).

The worker is driven by hand, as in test_admission_groups.py. Checkpoints are float32.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from mlxcel.engine import fork, scheduler
from mlxcel.engine.scheduler import Limits
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import ListSink, request, run_until_done, solo_outputs, worker_for
from mlxcel.types import SamplingParams

rng = random.Random(3)
PROMPT = [rng.randrange(5, 400) for _ in range(30)]
OTHER = [rng.randrange(5, 400) for _ in range(12)]


def _fork(worker, prompt, n, max_tokens=6, **kw):
    sinks = [ListSink() for _ in range(n)]
    reqs = [request(prompt, max_tokens, **kw) for _ in range(n)]
    worker.requests.put(fork.Fork(list(zip(reqs, sinks, strict=True))), lambda: "gone")
    worker.count_queued(n - 1)
    return sinks


def _one(worker, prompt, max_tokens=6, **kw):
    sink = ListSink()
    worker.enqueue(request(prompt, max_tokens, **kw), sink)
    return sink


def test_a_fork_prefills_its_prompt_once_and_every_row_decodes_it(path):
    expected = solo_outputs(path, [PROMPT])[0]
    worker = worker_for(path, chunk=64)
    sinks = _fork(worker, PROMPT, 3)
    worker._drain(block=False)
    job = worker._admit()
    assert isinstance(job, fork.ForkedPrefill) and len(job.seqs) == 3
    assert len(job.job.seqs) == 1  # one row computed
    worker.prefilling = job
    run_until_done(worker, sinks)
    assert worker.stats.total_prefill_tokens == len(PROMPT)  # not 3x
    assert [s.tokens for s in sinks] == [expected] * 3
    assert worker.queued == 0
    assert all(s.last.usage.prompt_tokens == len(PROMPT) for s in sinks)


def test_a_fork_and_other_requests_share_a_group(path):
    """The leader's row is copied into its followers' places among the group's rows."""
    expected = solo_outputs(path, [OTHER, PROMPT, OTHER])
    worker = worker_for(path, chunk=128)
    first = _one(worker, OTHER)
    sinks = _fork(worker, PROMPT, 2)
    last = _one(worker, OTHER)
    worker._drain(block=False)
    job = worker._admit()
    assert len(job.seqs) == 4 and len(job.job.seqs) == 3
    worker.prefilling = job
    run_until_done(worker, [first, *sinks, last])
    assert [s.tokens for s in [first, *sinks, last]] == \
        [expected[0], expected[1], expected[1], expected[2]]


def test_seeded_choices_differ_and_repeat(path):
    """Each choice samples with its own generator: seeds 7, 8, 9 (llama-server's derived
    seeds) give different answers, the same ones on every run."""
    def run_once():
        worker = worker_for(path, chunk=64)
        sinks = [ListSink() for _ in range(3)]
        reqs = [request(PROMPT, 8, sampling=SamplingParams(temperature=1.0, seed=7 + i))
                for i in range(3)]
        worker.requests.put(fork.Fork(list(zip(reqs, sinks, strict=True))), lambda: "x")
        worker.count_queued(2)
        run_until_done(worker, sinks)
        return [s.tokens for s in sinks]
    once, again = run_once(), run_once()
    assert once == again
    assert len({tuple(t) for t in once}) == 3


def test_a_fork_on_mlx_lms_batch_caches(mlxcel_checkpoint_cache):
    """The mixed path: a lone leader's plain caches become n batch rows; with another
    request in the group, its batch rows are gathered."""
    gemma = cached_checkpoint("gemma4_text", cache_dir=mlxcel_checkpoint_cache,
                              dtype="float32")
    expected = solo_outputs(gemma, [PROMPT, OTHER])
    worker = worker_for(gemma, chunk=64)
    sinks = _fork(worker, PROMPT, 2)
    run_until_done(worker, sinks)
    assert [s.tokens for s in sinks] == [expected[0]] * 2
    other = _one(worker, OTHER)
    more = _fork(worker, PROMPT, 2)
    run_until_done(worker, [other, *more])
    assert [s.tokens for s in [other, *more]] == [expected[1], expected[0], expected[0]]


def test_progress_events_count_up_to_the_whole_prompt(path):
    worker = worker_for(path, chunk=8)
    sink = _one(worker, PROMPT, return_progress=True)
    plain = _one(worker, OTHER)
    run_until_done(worker, [sink, plain])
    progress = [e.progress for e in sink.events if e.progress is not None]
    assert len(progress) >= 4  # the start, then one per 8-column chunk
    assert progress[0].processed == 0 and progress[-1].processed == len(PROMPT)
    assert all(p.total == len(PROMPT) and p.cache == 0 for p in progress)
    done = [p.processed for p in progress]
    assert done == sorted(done)
    first_token = next(i for i, e in enumerate(sink.events) if e.token_ids)
    assert all(e.progress is None for e in sink.events[first_token:])
    assert not any(e.progress for e in plain.events)


def _seq(order, followers=()):
    seq = SimpleNamespace(req=SimpleNamespace(priority=1), order=order, solo=False,
                          finished=False, sink=SimpleNamespace(cancelled=False),
                          leader=None, followers=list(followers))
    return seq


def test_a_fork_waits_for_a_slot_per_row():
    a, b, c = _seq(0), _seq(1), _seq(2)
    fork.link([a, b, c])
    limits = Limits(parallel=4, prefill_chunk=64)
    tail = lambda s: 10  # noqa: E731
    assert scheduler.form_group([a, b, c], 2, 64, limits, tail) == []
    assert scheduler.form_group([a, b, c], 3, 64, limits, tail) == [a, b, c]
    d = _seq(3)
    # followers need slots but no prefill columns: 2 computed rows x 10 <= 20
    assert scheduler.form_group([a, b, c, d], 4, 20, limits, tail) == [a, b, c, d]
    assert scheduler.starters([a, b, c, d]) == [a, d]


def test_a_queued_fork_is_told_when_the_engine_stops(path):
    worker = worker_for(path)
    sinks = _fork(worker, PROMPT, 3)
    worker.close()
    assert all(s.done and s.last.finish_reason == "error" for s in sinks)
