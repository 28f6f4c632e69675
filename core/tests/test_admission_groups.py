"""Admission: waiting requests are prefilled together, prompt-cache hits included.

The engine worker is driven by hand (``setup()`` then ``step()`` on this thread), so
which requests form one prefill group is deterministic.
"""

from __future__ import annotations

from apphelpers import BASE, PROMPTS
from mlxcel.testing.engine import run_until_done, solo_outputs, submit, worker_for


def solo(path, prompts=PROMPTS, **kw) -> list[list[int]]:
    return solo_outputs(path, prompts, **kw)


def test_prompt_cache_hits_are_prefilled_together_with_misses(path):
    expected = solo(path)
    worker = worker_for(path, cache=True)
    first = submit(worker, BASE)
    run_until_done(worker, [first])  # BASE + its output is now cached
    chunks = worker.stats.prefill_chunks_processed
    sinks = [submit(worker, p) for p in PROMPTS]
    worker._drain(block=False)
    job = worker._admit()
    assert job is not None and len(job.seqs) == 3  # one group: two hits and a miss
    # right-aligned (prefill widths 36, 43, 5) and computing the widest uncached tail
    # (43 - 32 = 11 columns): the second hit reuses its whole block-aligned 32 tokens, the
    # first only the 25 left of those columns, the miss nothing
    assert [s.cached for s in job.seqs] == [25, 32, 0]
    worker.prefilling = job
    run_until_done(worker, sinks)
    assert worker.stats.prefill_chunks_processed == chunks + 1
    assert [s.tokens for s in sinks] == expected
    assert [s.events[-1].usage.cached_tokens for s in sinks] == [25, 32, 0]


def test_groups_are_bounded_by_rows_times_the_widest_tail(path):
    worker = worker_for(path, cache=False, chunk=40)
    sinks = [submit(worker, [3 + i] * 12) for i in range(5)]  # 12 tokens to prefill each
    worker._drain(block=False)
    job = worker._admit()
    assert len(job.seqs) == 3  # 3 x 12 <= 40 < 4 x 12
    worker.prefilling = job
    run_until_done(worker, sinks)
    assert all(len(s.tokens) == 6 for s in sinks)


def test_aligned_prefill_columns_give_the_same_tokens(path):
    """CUDA's column multiple (here forced to 16): more left padding and fewer reused
    tokens, every chunk a multiple of 16 columns, the same greedy outputs."""
    expected = solo(path)
    worker = worker_for(path, cache=True, chunk=48, prefill_align=16)
    first = submit(worker, BASE)
    run_until_done(worker, [first])
    sinks = [submit(worker, p) for p in PROMPTS]
    worker._drain(block=False)
    job = worker._admit()
    # aligned tails: 16 columns per row (widest uncached tail 11 -> 16), so 3 x 16 <= 48
    assert len(job.seqs) == 3 and job.width - job.done_cols == 16
    # the widest prompt (43 to prefill) reuses 43 - 16 = 27 of its 32 cached tokens
    assert [s.cached for s in job.seqs] == [20, 27, 0]
    widths = []
    step = job.step

    def recording_step(chunk, max_cols=None):
        before = job.done_cols
        done = step(chunk, max_cols)
        widths.append(job.done_cols - before)
        return done

    job.step = recording_step
    worker.prefilling = job
    run_until_done(worker, sinks)
    assert widths and all(w % 16 == 0 for w in widths)
    assert [s.tokens for s in sinks] == expected
    assert [s.events[-1].usage.cached_tokens for s in sinks] == [20, 27, 0]


def test_cuda_step_order_gives_the_same_tokens(path):
    """``emit_first`` (CUDA: step n's tokens go out before step n+1 is queued) changes
    when tokens are handed out, not which."""
    expected = solo(path)
    worker = worker_for(path, cache=True, emit_first=True)
    sinks = [submit(worker, p) for p in PROMPTS]
    run_until_done(worker, sinks)
    assert [s.tokens for s in sinks] == expected


def test_the_whole_cuda_policy_gives_the_same_tokens(path):
    """Every choice CUDA resolves (held groups, bursts, lazy leave, emit-first, columns
    aligned to 32, fused projections, bound submodules, grouped masked attention), run on
    this device: the solo greedy tokens, a prompt-cache hit among the rows."""
    expected = solo(path, [BASE, *PROMPTS])
    worker = worker_for(path, cache=True, hold_groups=True, burst_chunks=8, lazy_leave=True,
                        emit_first=True, prefill_align=32, fuse_projections=True,
                        bind_modules=True, decode_attention="grouped")
    first = submit(worker, BASE)
    run_until_done(worker, [first])
    sinks = [submit(worker, p) for p in PROMPTS]
    run_until_done(worker, sinks)
    assert [first.tokens, *(s.tokens for s in sinks)] == expected
    assert sinks[1].events[-1].usage.cached_tokens > 0


def test_a_failing_queue_still_sends_held_finish_events(path, monkeypatch):
    """Finished rows' events are held until the prompt-cache store; if queuing the next
    step fails in between, they still go out (no stream hangs)."""
    from mlxcel.engine import steps

    # hand out, then queue: the queue fails after rows finished
    worker = worker_for(path, cache=True, emit_first=True)
    short, long = submit(worker, BASE[:20], max_tokens=2), submit(worker, BASE[:24], 50)
    calls = []
    real = steps.Step.start

    def start(self):
        calls.append(1)
        if len(calls) == 3:  # the step queued right after the short request's last token
            raise RuntimeError("injected queue failure")
        real(self)

    monkeypatch.setattr(steps.Step, "start", start)
    for _ in range(100):
        if short.done and long.done:
            break
        try:
            worker.step()
        except RuntimeError:
            worker._fail_running("engine error: injected")
    assert short.done and short.events[-1].finish_reason == "length"
    assert long.done and long.events[-1].finish_reason == "error"
    assert worker.prompt_cache.stats()["inserts"] >= 1  # the short one was still stored


def _record_joins(worker) -> list[int]:
    """Groups per ``DecodeBatch.join`` call (the real join runs)."""
    joins: list[int] = []
    real = worker.batch.join

    def join(jobs):
        joins.append(len(jobs))
        return real(jobs)

    worker.batch.join = join
    return joins


def test_a_burst_joins_the_idle_batch_in_one_merge(path):
    """Nothing decodes: groups prefill back to back and become rows together (one cache
    merge, one first step), with the same greedy tokens."""
    expected = solo(path)
    # 42 + 35 > 45: one prompt per group; held to join, as on CUDA
    worker = worker_for(path, cache=False, chunk=45, hold_groups=True)
    joins = _record_joins(worker)
    sinks = [submit(worker, p) for p in PROMPTS]
    worker.step()
    assert len(worker.prefilled) == 1 and not worker.batch  # held: the next can start now
    run_until_done(worker, sinks)
    assert joins == [3]
    assert [s.tokens for s in sinks] == expected


def test_groups_held_while_rows_decode_are_bounded(path):
    """While rows decode, at most MAX_DEFERRED groups wait for one merge; a group joins at
    once when nothing else can start prefilling in one chunk."""
    from mlxcel.engine.scheduler import MAX_DEFERRED

    worker = worker_for(path, cache=False, chunk=16, parallel=MAX_DEFERRED + 4,
                        hold_groups=True)  # as on CUDA
    running = submit(worker, BASE[:10], max_tokens=60)
    for _ in range(3):
        worker.step()
    assert len(worker.batch) == 1
    joins = _record_joins(worker)
    before = len(running.tokens)
    burst = [submit(worker, [20 + i] * 12) for i in range(MAX_DEFERRED + 2)]  # 11 each
    long = submit(worker, list(range(3, 40)))  # 36 to prefill: three chunks
    run_until_done(worker, [*burst, long])
    assert joins == [MAX_DEFERRED, 2, 1]
    assert all(len(s.tokens) == 6 for s in burst)
    # the running row kept decoding: a step with each of the 6 + 3 prefill chunks
    assert len(running.tokens) >= before + MAX_DEFERRED + 2 + 3


def test_a_cancelled_row_in_a_held_group_frees_its_slot(path):
    worker = worker_for(path, cache=False, chunk=45, parallel=2, hold_groups=True)
    sinks = [submit(worker, p) for p in PROMPTS]
    worker.step()
    assert [len(j.seqs) for j in worker.prefilled] == [1] and worker._free() == 1
    sinks[0].cancelled = True
    worker.step()  # the held row leaves: its group is gone, the slot is free again
    assert sinks[0].events[-1].finish_reason == "cancelled"
    assert worker._free() >= 0 and all(not s.finished for j in worker.prefilled for s in j.seqs)
    run_until_done(worker, sinks[1:])
    assert all(len(s.tokens) == 6 for s in sinks[1:])


def test_a_prefill_group_allocates_its_width_only(path):
    """A group's cache holds its own columns (prompt-cache prefix included), not a whole
    256-slot growth step: it is copied into the batch on joining anyway."""
    worker = worker_for(path, cache=True, chunk=512)
    first = submit(worker, BASE)
    run_until_done(worker, [first])
    sinks = [submit(worker, p) for p in PROMPTS]  # two prompt-cache hits and a miss
    worker._drain(block=False)
    job = worker._admit()
    assert job.done_cols > 0  # the hits' prefix columns are already in the cache
    assert job.step(512)
    assert {c.keys.shape[2] for c in job.cache} == {job.width}
    worker.prefilling = job
    run_until_done(worker, sinks)
    assert all(len(s.tokens) == 6 for s in sinks)


def test_off_cuda_each_group_joins_as_soon_as_it_is_prefilled(path):
    """Without ``hold_groups`` (CPU) a burst's first group decodes while the next ones
    prefill: its rows get their first token one group in, not after the whole burst."""
    worker = worker_for(path, cache=False, chunk=45)
    assert not worker.policy.hold_groups
    joins = _record_joins(worker)
    sinks = [submit(worker, p) for p in PROMPTS]
    worker.step()
    assert len(worker.batch) == 1 and not worker.prefilled
    worker.step()  # the second group joins; the first one's first token is out
    assert len(worker.batch) == 2 and sinks[0].tokens and not sinks[2].tokens
    run_until_done(worker, sinks)
    assert joins == [1, 1, 1]


def test_a_lone_row_with_aligned_columns_decodes_unmasked(path):
    """The left padding that aligning a lone row's prefill adds (CUDA's column multiple,
    here 16) is dropped when its prefill ends: its decode steps need no mask, as an
    unpadded cache's do, and give the solo tokens."""
    prompt = PROMPTS[0]  # 36 tokens to prefill: 12 slots of padding at a multiple of 16
    expected = solo(path, [prompt])
    worker = worker_for(path, cache=False, prefill_align=16)
    sink = submit(worker, prompt)
    worker._drain(block=False)
    job = worker._admit()
    assert job.width == 48 and job.cache[0].pads == [12]
    while not job.step(512):
        pass
    assert all(c.pads == [0] and c.make_mask(1) is None for c in job.cache)
    worker.prefilling, worker.prefilled = None, [job]
    run_until_done(worker, [sink])
    assert [sink.tokens] == expected


def test_a_group_whose_prefill_fails_prefills_again_one_row_at_a_time(path, monkeypatch):
    """A group's failed prefill (here: too large for memory, once) fails none of its rows:
    each prefills again alone and gives its solo tokens; a row that fails alone too ends
    with an error of its own."""
    from mlxcel.engine import batch

    expected = solo(path)
    original, failed = batch.PrefillJob.step, []

    def step(self, chunk, max_cols=None):
        if len(self.seqs) > 1 and not failed:
            failed.append(len(self.seqs))
            raise MemoryError("out of memory")
        return original(self, chunk, max_cols)

    monkeypatch.setattr(batch.PrefillJob, "step", step)
    worker = worker_for(path, cache=False)
    sinks = [submit(worker, p) for p in PROMPTS]
    run_until_done(worker, sinks)
    assert failed == [3]
    assert [s.tokens for s in sinks] == expected
    assert all(s.events[-1].finish_reason == "length" for s in sinks)
    assert worker.stats.sequences_started == 3 and worker.requests.queued == 0

    def always(self, chunk, max_cols=None):
        if any(s.req.prompt_tokens == tuple(PROMPTS[1]) for s in self.seqs):
            raise ValueError("this prompt cannot be prefilled")
        return original(self, chunk, max_cols)

    monkeypatch.setattr(batch.PrefillJob, "step", always)
    sinks = [submit(worker, p) for p in PROMPTS]
    run_until_done(worker, sinks)
    assert sinks[1].events[-1].finish_reason == "error"
    assert [sinks[0].tokens, sinks[2].tokens] == [expected[0], expected[2]]
