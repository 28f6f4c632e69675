"""One request's inputs fail that request alone: the rows decoding beside it finish with the
same greedy tokens as when they run without it.

The engine worker is driven by hand (``setup()`` then ``step()`` on this thread) on
the tiny checkpoint, so the test is deterministic.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlxcel.engine.cache.entries import Hit
from mlxcel.testing.engine import ListSink, worker_for
from mlxcel.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
VICTIMS = [[3, 4, 5, 6, 7], [11, 12, 13], [21, 22, 23, 24, 25, 26, 27]]


@pytest.fixture(scope="module")
def worker(tiny_checkpoint):
    return worker_for(tiny_checkpoint, chunk=64, parallel=8)


def submit(worker, prompt, sampling=GREEDY, max_tokens=8) -> ListSink:
    sink = ListSink()
    req = GenerationRequest(request_id=f"r{id(sink)}", prompt_tokens=tuple(prompt),
                            max_tokens=max_tokens, ignore_eos=True, sampling=sampling)
    worker.enqueue(req, sink)
    return sink


def run_until_done(worker, sinks) -> None:
    for _ in range(2000):
        if all(s.done for s in sinks):
            worker.step()  # drop the finished rows
            return
        worker.step()
    raise AssertionError("requests did not finish")


def victims_alone(worker) -> list[list[int]]:
    out = []
    for prompt in VICTIMS:
        sink = submit(worker, prompt)
        run_until_done(worker, [sink])
        out.append(sink.tokens)
    return out


BOMBS = {
    # msgspec checks types when decoding, not at construction: composition cannot read it
    "composition": lambda w: submit(w, [1, 2, 3], SamplingParams(temperature="hot")),
    "penalty_window": lambda w: submit(w, [1, 2, 3], SamplingParams(
        dry_multiplier=0.8, dry_penalty_last_n="all")),
    "seed": lambda w: submit(w, [1, 2, 3], SamplingParams(temperature=1.0, seed="x")),
    "token_id": lambda w: submit(w, [1, 10**9, 3]),
    "negative_token": lambda w: submit(w, [1, -4, 3]),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_bad_row_fails_alone_and_the_batch_goes_on(worker, bomb):
    expected = victims_alone(worker)
    victims = [submit(worker, VICTIMS[0])]
    worker.step()  # the first victim is decoding when the bomb arrives
    bad = BOMBS[bomb](worker)
    victims += [submit(worker, p) for p in VICTIMS[1:]]
    run_until_done(worker, [*victims, bad])
    assert bad.last.finish_reason == "error" and bad.last.error
    assert [v.last.finish_reason for v in victims] == ["length"] * 3
    assert [v.tokens for v in victims] == expected
    assert worker.queued == 0 and not worker.active and not worker.waiting


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0.0, dry_multiplier=0.8),
    SamplingParams(temperature=0.0, dry_multiplier=0.8, dry_base=1e300),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, dry_multiplier=0.8, seed=3),
])
def test_a_long_repeat_under_dry_samples_fine_beside_other_rows(worker, sampling):
    expected = victims_alone(worker)
    dry = submit(worker, [5] * 1300, sampling, max_tokens=6)
    victims = [submit(worker, p) for p in VICTIMS]
    run_until_done(worker, [dry, *victims])
    assert dry.last.finish_reason == "length" and len(dry.tokens) == 6
    assert 5 not in dry.tokens  # the token extending a 1299-token repeat is penalised away
    assert [v.tokens for v in victims] == expected


def test_a_group_that_cannot_be_set_up_fails_only_its_bad_row(worker):
    expected = victims_alone(worker)
    sinks = [submit(worker, p) for p in VICTIMS]
    bad = submit(worker, [1, 2, 3])
    worker._drain(block=False)
    bad_seq = next(s for s in worker.waiting if s.sink is bad)
    bad_seq.cache_hit = Hit(SimpleNamespace(payload="not an entry", length=2), 2)  # a
    # prefix PrefillJob cannot read
    run_until_done(worker, [*sinks, bad])
    assert bad.last.finish_reason == "error"
    assert [s.tokens for s in sinks] == expected
    assert worker.queued == 0
