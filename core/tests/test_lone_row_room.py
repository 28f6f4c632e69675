"""A lone row's prefill (an agent's next turn over its restored prompt-cache entry) leaves
its cache room for the decode steps: its buffer becomes the batch's own, so a first decode
step that had to grow it would copy the row's whole cache. Outputs stay those of a row run
from scratch."""

from __future__ import annotations

from mlxcel.engine.cache.kvcache import BatchCache
from mlxcel.testing.engine import run_until_done, solo_outputs, submit, worker_for

FIRST = [(7 * i) % 200 + 20 for i in range(70)]
SECOND = FIRST + [(11 * i) % 200 + 20 for i in range(9)]


def test_a_lone_rows_decode_steps_write_in_place(path):
    expected = solo_outputs(path, [SECOND], 6)
    worker = worker_for(path, cache=True)
    sink = submit(worker, FIRST, max_tokens=3)
    run_until_done(worker, [sink], settle=True)
    grown: list[tuple[int, int]] = []
    real = BatchCache.update_and_fetch

    def spy(self, keys, values):
        full = self.keys is None or self._idx + keys.shape[2] > self.keys.shape[2]
        if full:
            grown.append((self._idx, keys.shape[2]))
        return real(self, keys, values)

    BatchCache.update_and_fetch = spy
    try:
        sink = submit(worker, SECOND, max_tokens=6)
        run_until_done(worker, [sink])
    finally:
        BatchCache.update_and_fetch = real
    assert sink.last.usage.cached_tokens > 0  # the turn ran over the restored entry
    assert sink.tokens == expected[0]
    assert grown and all(n > 1 for _, n in grown)  # the prefill grew it; no decode step did
