"""Speculative decoding's governors: whether a row drafts, how far, and whether a batch of
its size drafts at all (``mlxcel.engine.speculative`` asks them each step).

* **per row** (``RowGovernor``): a row whose drafter proposes nothing, or whose drafts are
  all rejected, ``MISSES`` rounds running, stops drafting for a while (``BACKOFF`` steps,
  doubling up to ``BACKOFF_MAX``, back to the start after an accepted round), then probes
  again (after rejected drafts, with a one-token draft, and a probe that misses backs off
  again at once). Its draft length starts at ``START_LENGTH`` (a wrong drafter's first
  rounds then cost a few positions, not ``--draft-max`` of them, and a draft model's
  forwards with them) and follows what it accepts: all of a draft accepted doubles the
  next one (up to ``--draft-max``), otherwise the next is one more than was accepted.
  The drafter's record carries over to rows that join: after ``COLD_ROUNDS`` rounds
  running with nothing accepted (any rows), a new row starts as a backed-off row does,
  with the backoff the drafter has reached, so a drafter that is always wrong costs each
  request a probe or two. While the record is that cold, one row drafts per round (the
  first that may, a scout): a probe costs its row's admission to the drafter (a draft
  model prefills the row's context first) and widens the verify forward, so probing
  every row of a large batch would cost that batch-wide; the scout's first accepted
  token ends the cold record and every row drafts again.
* **per batch** (``BatchGovernor``): the seconds per emitted token of verify rounds and of
  plain steps, kept per batch size (powers of two), as running averages. A round is timed
  whole: the wait for the step in flight (whose tokens it counts), the drafting, the verify
  forward and the drafter's commit. Where rounds cost more per token than plain steps, the
  batch stops drafting at that size and the larger ones for ``BATCH_RETRY`` plain steps,
  twice as long each time it is stopped again (up to ``BATCH_RETRY_MAX``). A verdict takes
  ``SAMPLES`` rounds, or ``RETRY_SAMPLES`` for a retry or where rounds cost ``LOPSIDED``
  times a plain step's per token (not one: a row's first round carries its verify
  shape's first use): large batches, MoE models and slow drafters turn speculation off
  by themselves. A round is counted at the batch size its forward ran (rows that finish
  in it included). A step that costs ``STALL`` times its kind's running cost (a verify
  round's first: the plain step's) is a one-off, such as a kernel compiled on a batch
  shape's first use (seconds on CUDA), and is not sampled, ``STALL_SKIPS`` times per
  batch size and kind at most, so that a drafter that is always that slow is still
  judged.
"""

from __future__ import annotations

import time

import structlog

log = structlog.get_logger("mlxcel.engine")

MISSES = 2  # empty or fully rejected rounds in a row before a row backs off
BACKOFF = 8  # steps a row waits before its first probe
BACKOFF_MAX = 256
START_LENGTH = 4  # a new row's first draft length, doubled by each fully accepted round
COLD_ROUNDS = 8  # rounds running with nothing accepted before new rows start backed off
BATCH_RETRY = 64  # plain steps before a batch size that stopped drafting tries again
BATCH_RETRY_MAX = 4096
SAMPLES = 4  # timed steps of each kind before the batch governor compares them
RETRY_SAMPLES = 2  # verify rounds that judge a retry, or rounds that cost LOPSIDED x more
LOPSIDED = 3.0
AVERAGE = 0.25  # weight of the newest sample in the running averages
STALL = 20.0  # a step this many times its kind's running cost is a one-off, not a sample
STALL_SKIPS = 2  # one-offs skipped per batch size and kind


class RowGovernor:
    """One row's drafting state (see the module docstring)."""

    __slots__ = ("backoff", "length", "misses", "probing", "resume_at")

    def __init__(self, draft_max: int, cold_backoff: int = 0) -> None:
        """``cold_backoff``: the drafter's backoff when its recent rounds all missed (0
        when they did not): the row starts as a backed-off row probes."""
        self.length = 1 if cold_backoff else min(draft_max, START_LENGTH)
        self.misses = 0
        self.backoff = max(BACKOFF, cold_backoff)
        self.resume_at = 0
        self.probing = bool(cold_backoff)  # the next miss backs off at once

    def settle(self, step: int, drafted: int, accepted: int, draft_max: int) -> None:
        if drafted and accepted:
            self.misses, self.backoff, self.probing = 0, BACKOFF, False
            self.length = min(draft_max, self.length * 2) if accepted == drafted \
                else max(1, accepted + 1)
            return
        self.misses += 1
        if drafted:
            self.length = max(1, self.length // 2)
        if self.misses >= MISSES or (self.probing and drafted):
            self.misses, self.resume_at = 0, step + self.backoff
            self.backoff = min(BACKOFF_MAX, self.backoff * 2)
            if drafted:  # rejected drafts: the probe after the wait is one token
                self.length, self.probing = 1, True


class BatchGovernor:
    """Seconds per emitted token of verify and plain steps, per batch size bucket."""

    def __init__(self) -> None:
        # (bucket, verify) -> running averages of a step's seconds and emitted tokens, and
        # the samples taken: their ratio weighs each step by its tokens, so one slow round
        # that kept a single token does not outweigh the rounds that kept many
        self.cost: dict[tuple[int, bool], tuple[float, float, int]] = {}
        self.off_until: dict[int, int] = {}
        self.skipped: dict[tuple[int, bool], int] = {}  # one-off steps left out, per key
        self.retry: dict[int, int] = {}  # bucket -> its next pause's length
        self.steps = 0
        self._plain_at: float | None = None
        # when the last step ended (a plain step: when it was queued), and the tokens of a
        # plain step still in flight then, which the next verify round waits for
        self._last: tuple[float, int] | None = None
        self._round_at: float | None = None

    @staticmethod
    def bucket(rows: int) -> int:
        return 1 << max(0, rows - 1).bit_length()

    def allows(self, rows: int) -> bool:
        return self.paused_until(rows) <= self.steps

    def paused_until(self, rows: int) -> int:
        """The step until which a batch of ``rows`` may not draft: a pause at a batch size
        covers the larger ones too (their verify forwards cost more still)."""
        b = self.bucket(rows)
        return max((until for k, until in list(self.off_until.items()) if k <= b), default=0)

    def plain(self, rows: int) -> None:
        """A plain step was queued now: the time since the previous one is a step's cost."""
        now = time.perf_counter()
        self.steps += 1
        if self._plain_at is not None and rows:
            self._note(rows, False, now - self._plain_at, rows)
        self._plain_at = now
        self._last = (now, rows)

    def interrupted(self) -> None:
        """Other work ran (a prefill chunk): the next step's cost starts from then."""
        self._plain_at = self._last = None

    def round_begins(self) -> None:
        """A verify round starts drafting: its start, where no step ended just before."""
        self._round_at = time.perf_counter()

    def verified(self, rows: int, emitted: int, seconds: float | None = None) -> None:
        """A verify round ended now, ``emitted`` tokens kept: its cost is the time since
        the last step ended, with the tokens of the plain step it waited for; after other
        work, since the round began (``round_begins``; ``seconds`` without either)."""
        now = time.perf_counter()
        self.steps += 1
        since, inflight = self._last if self._last is not None else (self._round_at, 0)
        self._plain_at, self._last, self._round_at = None, (now, 0), None
        spent = now - since if since is not None else seconds
        if emitted and spent is not None:
            self._note(rows, True, spent, emitted + inflight)
            self._judge(rows)

    def _note(self, rows: int, verify: bool, seconds: float, tokens: int) -> None:
        key = (self.bucket(rows), verify)
        if self._stalled(key, seconds):
            return
        if key not in self.cost:
            self.cost[key] = (seconds, float(tokens), 1)
            return
        t, k, n = self.cost[key]
        self.cost[key] = (t + AVERAGE * (seconds - t), k + AVERAGE * (tokens - k), n + 1)

    def _stalled(self, key: tuple[int, bool], seconds: float) -> bool:
        """Whether a step of ``seconds`` is a one-off to leave out (module docstring)."""
        ref = self.cost.get(key) or self.cost.get((key[0], False))
        if ref is None or seconds <= STALL * ref[0] or self.skipped.get(key, 0) >= STALL_SKIPS:
            return False
        self.skipped[key] = self.skipped.get(key, 0) + 1
        return True

    def per_token(self, rows: int, verify: bool) -> float | None:
        """The running seconds per emitted token of a batch of ``rows``' verify rounds
        (``verify``) or plain steps; None before the first sample."""
        got = self.cost.get((self.bucket(rows), verify))
        return got[0] / got[1] if got is not None and got[1] else None

    def _judge(self, rows: int) -> None:
        b = self.bucket(rows)
        spec, plain = self.cost.get((b, True)), self.cost.get((b, False))
        if spec is None or plain is None or plain[2] < SAMPLES:
            return
        spec_s, plain_s = self.per_token(rows, True), self.per_token(rows, False)
        need = RETRY_SAMPLES if b in self.retry or spec_s > LOPSIDED * plain_s else SAMPLES
        if spec[2] < need:
            return
        if spec_s <= plain_s:
            self.retry.pop(b, None)
        else:
            pause = self.retry.get(b, BATCH_RETRY)
            self.off_until[b] = self.steps + pause
            self.retry[b] = min(BATCH_RETRY_MAX, pause * 2)
            self.cost.pop((b, True))  # the next try starts its average afresh
            log.info("speculation_paused", batch_rows=b, verify_s_per_token=round(spec_s, 6),
                     plain_s_per_token=round(plain_s, 6))
