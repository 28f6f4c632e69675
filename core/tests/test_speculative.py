"""Speculative decoding inside the batch: exact output, the governors, the counters."""

from __future__ import annotations

import types

import mlx.core as mx
import pytest
from mlxcel.drafters import lookup
from mlxcel.drafters.api import DraftOptions, DraftRow
from mlxcel.engine import spec_governors as governors
from mlxcel.engine.cache.kvcache import BatchCache
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.conformance import check_drafter
from mlxcel.testing.drafting import chi2_independence_p
from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for
from mlxcel.testing.stub_drafters import StubDrafter
from mlxcel.types import SamplingParams

LOOKUP = "mlxcel.drafters.lookup:new_session"
REPEATING = [[5, 6, 7, 8, 9, 10, 11, 12] * 4, [20, 21, 22, 23] * 3, list(range(30, 61)),
             [100, 200, 100, 200, 100, 200]]


def spec_config(drafter=LOOKUP, **kw) -> EngineConfig:
    return EngineConfig(drafter=drafter, prompt_lookup="on", **kw)


def run(checkpoint, prompts, config=None, max_tokens=30, sampling=None, stagger=False,
        samplings=None):
    worker = worker_for(checkpoint, parallel=8, config=config)
    sinks = []
    for i, prompt in enumerate(prompts):
        sink = ListSink()
        params = (samplings[i] if samplings else sampling) or SamplingParams(temperature=0.0)
        worker.enqueue(request(prompt, max_tokens, params), sink)
        sinks.append(sink)
        if stagger:
            worker.step()
    run_until_done(worker, sinks)
    return [s.tokens for s in sinks], [s.last.usage for s in sinks], worker


# -- the drafter ------------------------------------------------------------------------------

def test_prompt_lookup_copies_the_latest_match_and_continues_a_repeating_run():
    session = lookup.new_session(None, DraftOptions())
    row = DraftRow(1, [1, 2, 3, 4, 9, 9, 1, 2, 3])
    assert session.propose([row], [3]) == [[4, 9, 9]]
    run_row = DraftRow(2, [7, 5, 5, 5])  # (5, 5) last followed by the final 5
    assert session.propose([run_row], [4]) == [[5, 5, 5, 5]]
    assert session.propose([DraftRow(3, [1, 2, 3])], [4]) == [[]]  # no earlier n-gram
    assert session.propose([row], [0]) == [[]]
    session.release([1, 2, 3])
    assert session.rows == {}


def test_prompt_lookup_passes_the_drafter_conformance(tiny_checkpoint):
    usages = check_drafter(lookup.new_session, tiny_checkpoint)
    assert sum(u.draft_n_accepted for u in usages) > 0  # the repeating prompts were copied
    assert all(u.draft_kind == "prompt-lookup" for u in usages if u.draft_rounds)


# -- exactness -------------------------------------------------------------------------------

@pytest.mark.parametrize("shared", [True, False], ids=["shared-positions", "absolute"])
def test_greedy_output_is_the_same_with_and_without_speculation(tiny_checkpoint, shared):
    prompts = REPEATING + [[3, 4] * 6]
    samplings = [None] * 4 + [SamplingParams(temperature=0.0, repetition_penalty=1.3)]
    plain, _, _ = run(tiny_checkpoint, prompts, EngineConfig(shared_positions=shared),
                      stagger=True, samplings=samplings)
    fast, usages, _ = run(tiny_checkpoint, prompts,
                          spec_config(shared_positions=shared, draft_max=8),
                          stagger=True, samplings=samplings)
    assert fast == plain
    accepted = [u.draft_n_accepted for u in usages]
    assert sum(accepted[:4]) > 0 and len(set(accepted[:4])) > 1  # ragged acceptance
    assert usages[4].draft_rounds > 0  # a penalised row drafts too (test_speculative_rows)


def test_a_seeded_request_gives_the_same_tokens_with_and_without_speculation(tiny_checkpoint):
    sampling = SamplingParams(temperature=0.3, seed=1234)
    plain, _, _ = run(tiny_checkpoint, REPEATING, sampling=sampling)
    fast, usages, _ = run(tiny_checkpoint, REPEATING, spec_config(), sampling=sampling)
    assert fast == plain
    assert sum(u.draft_n_accepted for u in usages) > 0


class FixedDraft(StubDrafter):
    """Proposes the same tokens after every context (a test drafter)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, rows, limits):
        return [self.tokens[:limit] for limit in limits]


def _pairs(tokens_list):
    return [tuple(t[1:3]) for t in tokens_list]


def test_sampled_output_keeps_the_target_distribution(tiny_checkpoint):
    """Unseeded top-3 sampling: the second and third tokens' joint frequencies (a row's
    first token is never drafted) with a drafter that proposes the likeliest pair match
    those without speculation (chi-squared)."""
    from collections import Counter

    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt, n = [5, 6, 7, 8], 240
    plain, _, _ = run(tiny_checkpoint, [prompt] * n, max_tokens=4, sampling=sampling)
    a = Counter(_pairs(plain))
    likeliest = list(a.most_common(1)[0][0])
    fast, usages, _ = run(tiny_checkpoint, [prompt] * n,
                          spec_config(drafter=FixedDraft(likeliest), draft_max=2),
                          max_tokens=4, sampling=sampling)
    b = Counter(_pairs(fast))
    rounds = sum(u.draft_rounds for u in usages)
    kept = sum(u.draft_n_accepted for u in usages)
    assert rounds >= n // 2 and 0 < kept < sum(u.draft_n for u in usages)
    cells = sorted(set(a) | set(b))
    p = chi2_independence_p([[a[c] for c in cells], [b[c] for c in cells]])
    assert p > 0.001, (a, b)


# -- the governors -------------------------------------------------------------------------

class Oracle(StubDrafter):
    """Proposes a known output (right) or tokens the model never picks (wrong)."""

    def __init__(self, prompt, output, wrong_token):
        self.prompt, self.output, self.wrong_token = prompt, output, wrong_token
        self.right = False

    def propose(self, rows, limits):
        out = []
        for row, limit in zip(rows, limits, strict=True):
            if not self.right:
                out.append([self.wrong_token] * limit)
                continue
            done = len(row.tokens) - len(self.prompt)  # generated so far
            out.append(self.output[done:done + limit])
        return out


def oracle_worker(checkpoint, max_tokens, draft_max):
    """A prompt, its greedy output, an ``Oracle`` for it (wrong until told otherwise)
    and a worker that drafts with it."""
    prompt = list(range(40, 60))
    (plain,), _, _ = run(checkpoint, [prompt], max_tokens=max_tokens)
    wrong = next(t for t in range(1000) if t not in plain)
    oracle = Oracle(prompt, plain, wrong)
    worker = worker_for(checkpoint, parallel=2, config=spec_config(drafter=oracle,
                                                                   draft_max=draft_max))
    return prompt, plain, oracle, worker


def test_a_rows_first_token_comes_from_a_plain_step(tiny_checkpoint):
    """A drafter that is always right still waits for the row's first token, and that
    token is delivered (``Deliveries.flush``, as ``_settle`` does after every read-back)
    before any verify forward: its wait is the request's time to first token, which a
    verify forward would lengthen."""
    prompt, plain, oracle, worker = oracle_worker(tiny_checkpoint, 30, 4)
    oracle.right = True
    seen = []  # (tokens emitted, tokens delivered, verify rounds) at each flush

    class Held:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.flush()

        def flush(self):
            seen.append((len(sink.tokens), worker.stats.draft_rounds))

    worker.deliveries = Held()
    sink = ListSink()
    worker.enqueue(request(prompt, 30), sink)
    run_until_done(worker, [sink])
    assert sink.tokens == plain and sink.last.usage.draft_n_accepted > 10
    first = next(rounds for emitted, rounds in seen if emitted)
    assert first == 0, seen  # delivered before any verify forward ran


def test_the_row_governor_stops_a_drafter_that_is_always_wrong_and_resumes(tiny_checkpoint):
    prompt, plain, oracle, worker = oracle_worker(tiny_checkpoint, 200, 4)
    sink = ListSink()
    worker.enqueue(request(prompt, 200), sink)
    for _ in range(120):
        worker.step()
    seq = worker.batch.rows[0]
    wrong_rounds = seq.drafts.rounds
    assert seq.drafts.accepted == 0 and 0 < wrong_rounds <= 12  # backed off, probing
    oracle.right = True
    run_until_done(worker, [sink])
    assert sink.tokens == plain
    usage = sink.last.usage
    assert usage.draft_n_accepted > 20 and usage.draft_rounds > wrong_rounds


class Clock:
    """A stand-in for ``time.perf_counter`` that moves only when told to."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(governors.time, "perf_counter", lambda: self.now)

    def round(self, gov, rows, emitted, seconds):
        """A verify round that took ``seconds`` of the clock, back to back with the last."""
        self.now += seconds
        gov.verified(rows, emitted=emitted, seconds=seconds)


def test_the_batch_governor_pauses_drafting_where_verify_steps_cost_more(monkeypatch):
    gov, clock = governors.BatchGovernor(), Clock(monkeypatch)
    for _ in range(governors.SAMPLES + 1):
        gov.cost[(8, False)] = (0.008, 8.0, governors.SAMPLES)  # 1 ms per token
        clock.round(gov, 8, 8, 0.01)  # 1.25 ms per token against 1 ms
    assert not gov.allows(8) and gov.allows(1)
    gov.steps += governors.BATCH_RETRY
    assert gov.allows(8)


def test_the_batch_governor_pauses_longer_each_time_a_retry_loses(monkeypatch):
    gov, clock = governors.BatchGovernor(), Clock(monkeypatch)
    gov.cost[(8, False)] = (0.008, 8.0, governors.SAMPLES)  # 1 ms per token
    pauses = []
    for _ in range(3):
        while gov.allows(8):
            clock.round(gov, 8, 8, 0.02)  # 2.5 ms per token against 1 ms
        pauses.append(gov.off_until[8] - gov.steps)
        gov.steps = gov.off_until[8]
    assert pauses == [governors.BATCH_RETRY, 2 * governors.BATCH_RETRY,
                      4 * governors.BATCH_RETRY]
    rounds = 0
    while gov.allows(8):  # a retry is judged on fewer rounds than the first verdict
        clock.round(gov, 8, 8, 0.02)
        rounds += 1
    assert rounds == governors.RETRY_SAMPLES < governors.SAMPLES


def test_lopsided_rounds_pause_sooner_and_a_pause_covers_larger_batches(monkeypatch):
    """Rounds that cost many times a plain step per token need fewer samples before the
    verdict; a batch size that stops drafting stops the larger ones too, not the smaller."""
    gov, clock = governors.BatchGovernor(), Clock(monkeypatch)
    gov.cost[(8, False)] = (0.008, 8.0, governors.SAMPLES)  # 1 ms per token
    rounds = 0
    while gov.allows(8):
        clock.round(gov, 8, 8, 0.040)  # 5 ms per token
        rounds += 1
    assert rounds == governors.RETRY_SAMPLES < governors.SAMPLES
    assert not gov.allows(5) and not gov.allows(64) and gov.allows(4) and gov.allows(1)
    gov.steps += governors.BATCH_RETRY
    assert gov.allows(64)


def test_the_batch_governor_times_a_round_from_the_step_before_it(monkeypatch):
    """A round's cost runs from when the step before it was queued (its tokens counted:
    the round waits for them) to the round's end: the drafting and the drafter's commit
    are in it, not just the verify forward."""
    clock = iter([0.0, 0.030, 0.030, 0.030, 0.1])
    monkeypatch.setattr(governors.time, "perf_counter", lambda: next(clock))
    gov = governors.BatchGovernor()
    gov.plain(4)  # queued at 0 ms
    gov.round_begins()  # 30 ms: the drafts start after the read-back
    gov.verified(4, emitted=4, seconds=0.001)  # ends at 30 ms; the forward alone took 1 ms
    assert gov.per_token(4, True) == pytest.approx(0.030 / 8)
    gov.interrupted()  # a prefill chunk ran: the next round counts from its own start
    gov.round_begins()  # 30 ms
    gov.verified(4, emitted=7)  # ends at 100 ms
    seconds = 0.030 + governors.AVERAGE * (0.070 - 0.030)
    tokens = 8 + governors.AVERAGE * (7 - 8)
    assert gov.per_token(4, True) == pytest.approx(seconds / tokens)


def test_the_batch_governor_weighs_rounds_by_the_tokens_they_kept(monkeypatch):
    """A first round that kept one token after a slow first use does not stop drafting
    that pays: the rounds' seconds and tokens average apart, and their ratio decides."""
    gov, clock = governors.BatchGovernor(), Clock(monkeypatch)
    gov.cost[(1, False)] = (0.015, 1.0, governors.SAMPLES)  # 15 ms per plain token
    clock.round(gov, 1, 1, 0.040)  # drafted 16, kept none
    for _ in range(governors.SAMPLES):
        clock.round(gov, 1, 17, 0.030)  # drafted 16, kept all: under 2 ms per token
    assert gov.allows(1) and gov.per_token(1, True) < 0.015


def test_a_one_off_stall_is_not_a_sample_but_a_drafter_always_that_slow_is_judged(
        monkeypatch):
    """A round that costs STALL times the plain step (a kernel compiled on a shape's
    first use) does not pause a batch whose other rounds pay; a drafter whose every round
    is that slow is still paused once its skips are spent."""
    gov, clock = governors.BatchGovernor(), Clock(monkeypatch)
    gov.cost[(8, False)] = (0.008, 8.0, governors.SAMPLES)  # 1 ms per token
    clock.round(gov, 8, 40, 0.025)  # 0.6 ms per token
    clock.round(gov, 8, 40, 4.0)  # a 4 s compile
    for _ in range(governors.SAMPLES):
        clock.round(gov, 8, 40, 0.025)
    assert gov.allows(8) and gov.per_token(8, True) < 0.001

    slow, clock = governors.BatchGovernor(), Clock(monkeypatch)
    slow.cost[(8, False)] = (0.008, 8.0, governors.SAMPLES)
    rounds = 0
    while slow.allows(8):
        clock.round(slow, 8, 40, 1.0)  # 25 ms per token, every round
        rounds += 1
    assert rounds == governors.STALL_SKIPS + governors.RETRY_SAMPLES


def test_a_round_counts_at_the_batch_size_its_forward_ran():
    """Rows that finish in a round leave the batch after it: the round's cost is still
    the forward's batch size's, not the survivors'."""
    from mlxcel.engine.speculative import Speculation

    spec = Speculation(object(), "test", DraftOptions(draft_max=4))
    rows = [types.SimpleNamespace(finished=i < 3, drafts=types.SimpleNamespace(
        kind=None, rounds=0, drafted=0, accepted=0), context=[1]) for i in range(4)]
    spec.settle(rows, [[] for _ in rows], [0] * 4, 0.01, emitted=4)
    assert spec.batch.per_token(4, True) is not None and spec.batch.per_token(1, True) is None


def test_a_row_probes_with_one_token_and_one_miss_backs_it_off_again():
    gov = governors.RowGovernor(16)
    gov.settle(0, 16, 0, 16)
    gov.settle(1, 8, 0, 16)
    assert gov.resume_at == 1 + governors.BACKOFF and gov.length == 1
    gov.settle(20, 1, 0, 16)  # the probe missed: back off at once, twice as long
    assert gov.resume_at == 20 + 2 * governors.BACKOFF and gov.length == 1
    gov.settle(40, 1, 1, 16)  # a probe that hits: drafting grows again
    assert gov.length == 2 and gov.backoff == governors.BACKOFF and not gov.probing
    cold = governors.RowGovernor(16, cold_backoff=64)  # a drafter wrong for everyone
    assert cold.length == 1 and cold.resume_at == 0
    cold.settle(5, 1, 0, 16)
    assert cold.resume_at == 5 + 64


def test_rows_that_join_a_drafter_that_is_always_wrong_start_backed_off(tiny_checkpoint):
    prompt, plain, _, worker = oracle_worker(tiny_checkpoint, 60, 8)

    def serve():
        sink = ListSink()
        worker.enqueue(request(prompt, 60), sink)
        run_until_done(worker, [sink])
        assert sink.tokens == plain
        return sink.last.usage

    first = serve()
    assert first.draft_n > first.draft_rounds  # a fresh drafter's rows draft several
    for _ in range(10):  # until the drafter's record is cold
        if worker.spec.cold >= governors.COLD_ROUNDS:
            break
        serve()
    assert worker.spec.cold >= governors.COLD_ROUNDS
    for _ in range(2):  # one-token probes, the drafter's backoff apart
        backoff = worker.spec.cold_backoff
        u = serve()
        assert u.draft_n == u.draft_rounds <= 1 + 60 // backoff, (u, backoff)


class CountingWrong(StubDrafter):
    """Drafts a token the model never picks, as far as each row may, and records how many
    rows each round asks it for."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.asked: list[int] = []

    def propose(self, rows, limits):
        self.asked.append(len(rows))
        return [[self.token] * n for n in limits]


def test_a_cold_drafter_lets_one_row_scout_per_round(tiny_checkpoint):
    prompts = [list(range(40 + k, 60 + k)) for k in range(4)]
    plain, _, _ = run(tiny_checkpoint, prompts, max_tokens=60)
    drafter = CountingWrong(next(t for t in range(1000) if all(t not in p for p in plain)))
    worker = worker_for(tiny_checkpoint, parallel=4,
                        config=spec_config(drafter=drafter, draft_max=8))

    def serve():
        sinks = [ListSink() for _ in prompts]
        for prompt, sink in zip(prompts, sinks, strict=True):
            worker.enqueue(request(prompt, 60), sink)
        run_until_done(worker, sinks)
        assert [s.tokens for s in sinks] == plain

    serve()
    assert max(drafter.asked) > 1  # a fresh drafter: the rows draft together
    for _ in range(10):
        if worker.spec.cold >= governors.COLD_ROUNDS:
            break
        serve()
    assert worker.spec.cold >= governors.COLD_ROUNDS
    drafter.asked.clear()
    serve()
    assert drafter.asked and max(drafter.asked) == 1  # one scout per round


def test_row_governor_draft_length_follows_acceptance():
    gov = governors.RowGovernor(16)
    gov.length = 4
    gov.settle(0, 4, 4, 16)
    assert gov.length == 8
    gov.settle(1, 8, 2, 16)
    assert gov.length == 3
    gov.settle(2, 3, 0, 16)
    gov.settle(3, 0, 0, 16)
    assert gov.resume_at == 3 + governors.BACKOFF


# -- the cache ------------------------------------------------------------------------------

def test_batch_cache_rollback_keeps_each_rows_accepted_prefix():
    """Absolute positions: after a ragged rollback every row holds what a cache fed only
    its kept tokens holds."""
    def feed(cache, cols):
        k = mx.array(cols, dtype=mx.float32)[:, None, :, None]  # [B, 1, n, 1]
        cache.update_and_fetch(k, k)

    cache = BatchCache([0, 2])
    feed(cache, [[1, 2, 3], [0, 0, 7]])
    feed(cache, [[4, 5, 6, 0], [8, 9, 0, 0]])  # row 0 keeps 3 of 4, row 1 keeps 2
    cache.rollback([1, 2])
    assert cache.pads == [0, 3] and cache._idx == 6
    assert cache.row(0, 6)[0].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6]
    assert cache.row(1, 3)[0].reshape(-1).tolist() == [7, 8, 9]
    assert cache.offset.tolist() == [6, 3]


def test_greedy_rows_verify_every_position_in_one_argmax(tiny_checkpoint, monkeypatch):
    """Plain greedy rows take each position's argmax in one op; rows that want logprobs
    go through the per-position chain, with the same tokens."""
    from mlxcel.engine import verify

    calls = []
    original = verify.Chain.sample
    monkeypatch.setattr(verify.Chain, "sample",
                        lambda self, logits, j: (calls.append(j), original(self, logits, j))[1])
    prompt, plain, oracle, worker = oracle_worker(tiny_checkpoint, 20, 4)
    oracle.right = True
    sink = ListSink()
    worker.enqueue(request(prompt, 20), sink)
    run_until_done(worker, [sink])
    assert sink.tokens == plain and worker.stats.draft_rounds > 0 and calls == []
    sink = ListSink()
    worker.enqueue(request(prompt, 20, SamplingParams(temperature=0.0, logprobs=True)), sink)
    run_until_done(worker, [sink])
    assert sink.tokens == plain and calls
