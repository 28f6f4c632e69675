"""Rows that finish on a lazy batch (CUDA's ``lazy_leave``, forced here on the CPU) stay in
the cache until finished rows are the majority or a group joins; outputs and slot counts
are what they would be without."""

from __future__ import annotations

from apphelpers import PROMPTS
from mlxcel.testing.engine import run_until_done, solo_outputs, submit, worker_for


def test_finished_rows_stay_until_they_are_the_majority(path):
    lengths = [3, 6, 12]
    expected = solo_outputs(path, PROMPTS, lengths)
    worker = worker_for(path, cache=True)
    worker.batch.lazy_leave = True
    sinks = [submit(worker, p, max_tokens=n) for p, n in zip(PROMPTS, lengths, strict=True)]
    seen = []
    for _ in range(200):
        if all(s.done for s in sinks):
            break
        worker.step()
        seen.append((len(worker.batch.rows), len(worker.batch), len(worker.active),
                     worker._free()))
    assert [s.tokens for s in sinks] == expected
    # one of three finished: it stays (3 rows, 2 decoding, 2 slots busy)
    assert (3, 2, 2, 6) in seen
    # two of three finished: the majority, so the next turn drops them
    at = seen.index((3, 1, 1, 7))
    assert seen[at + 1] == (1, 1, 1, 7)
    assert worker.prompt_cache.stats()["inserts"] == 3  # stored as they finished


def test_a_join_drops_the_finished_rows_in_its_merge(path):
    lengths = [3, 12]
    expected = solo_outputs(path, PROMPTS[:2], lengths) + solo_outputs(path, PROMPTS[2:], 4)
    worker = worker_for(path, cache=False)
    worker.batch.lazy_leave = True
    sinks = [submit(worker, p, max_tokens=n) for p, n in zip(PROMPTS[:2], lengths,
                                                               strict=True)]
    while not sinks[0].done:
        worker.step()
    worker.step()
    assert len(worker.batch.rows) == 2 and len(worker.batch) == 1  # kept: 1 of 2 finished
    extends = []
    cache = worker.batch.cache[0]
    real = type(cache).extend

    def spy(self, *others, keep=None):
        extends.append(keep)
        return real(self, *others, keep=keep)

    type(cache).extend = spy
    try:
        late = submit(worker, PROMPTS[2], max_tokens=4)
        while len(worker.batch.rows) != 2 or len(worker.batch) != 2:
            worker.step()
    finally:
        type(cache).extend = real
    assert extends and extends[0] == [1]  # the merge kept the running row only
    run_until_done(worker, [sinks[1], late])
    assert [s.tokens for s in [*sinks, late]] == expected
