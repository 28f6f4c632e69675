"""Speculative decoding's engine side: which rows draft this step, and how many tokens.

A drafting step costs a verify forward over 1 + k tokens per row instead of one, and it
needs the previous step's tokens before it is built (the drafts continue them), so steps
stop overlapping with the host's work. It pays where the drafts are accepted, and two
governors decide where it does (``mlxcel.engine.spec_governors``): one per row, on its
acceptance, and one per batch size, on what rounds cost against plain steps.

Rows with an output constraint (JSON schema, a grammar, a forced tool call) and rows with
penalties or a logit bias draft too: the verify step gives each position the masks and
penalties of the tokens before it (``engine.verify``). A constraint that cannot be rewound
(a plugin's without ``Rewindable``, a reasoning budget's), or that waits for the end of a
reasoning block, keeps its row to one token per step beside the drafting rows, in the same
forward. While a row with media decodes, the batch takes one-token steps.

A row's first token comes from its prompt's own forward (``engine.batch``), as
llama-server's and vLLM's do, so drafting never delays a request's time to first token:
a row may draft from its first step in the batch. A drafter that reads the target's
hidden states waits for a step's forward to give them (the prefill keeps none).

A request's own ``speculative.n_max`` / ``speculative.n_min`` (``GenerationRequest.
draft_max`` / ``draft_min``) cap and floor its drafts within ``--draft-max``; an
``n_max`` of 0 keeps it from drafting.

A drafter that reads the target's hidden states (``DraftSession.needs_hidden``) gets
them from the forward that computed them (``mlxcel.drafters.hidden``): after each decode
step (``plain``) and verify step (``kept``) the engine keeps, per row, a view of the
state at the row's last kept position, and offers the session only rows that have one.
The state is the final norm's output, or the joined outputs of the decoder layers the
session names (``DraftSession.hidden_layers``, DFlash). For any other drafter none of
this runs.
"""

from __future__ import annotations

from typing import Any

import structlog

from mlxcel.drafters import hidden as hidden_states
from mlxcel.drafters.api import DraftOptions, DraftRow, TargetCache
from mlxcel.engine.constraints.speculate import drafts_with
from mlxcel.engine.sequence import Sequence
from mlxcel.engine.spec_governors import (
    BACKOFF,
    BACKOFF_MAX,
    COLD_ROUNDS,
    BatchGovernor,
    RowGovernor,
)

log = structlog.get_logger("mlxcel.engine")


class Speculation:
    """The engine's drafting state: the drafter's session, the governors, the counters."""

    def __init__(self, session: Any, kind: str, options: DraftOptions,
                 governed: bool = True, model: Any = None) -> None:
        """``governed``: the batch governor may stop drafting (``--prompt-lookup auto``).
        ``model``: the target, whose final norm (or the decoder layers the session names)
        is tapped for a session that reads its hidden states."""
        self.session = session
        self.kind = kind
        self.options = options
        self.governed = governed
        self.tap = hidden_states.tap_for(model, session)
        if self.tap is None and getattr(session, "needs_hidden", False):
            from mlxcel.errors import StartupError

            layers = hidden_states.session_layers(session)
            where = "no final norm" if layers is None else f"no decoder layers {layers}"
            raise StartupError(f"the {kind} drafter reads the target's hidden states, "
                               f"and this model has {where} to take them from")
        # per row key: its index in ``hidden`` [B, H], the states at the rows' last kept
        # positions after the latest step (needs_hidden only)
        self.hidden_at: dict[int, int] = {}
        self.hidden: Any = None
        self.rows: dict[int, RowGovernor] = {}
        self.batch = BatchGovernor()
        self.failed = False
        self.rounds = self.drafted = self.accepted = 0  # totals, for /metrics and /slots
        self.cold = 0  # rounds running with nothing accepted, any rows
        self.cold_backoff = 0  # a new row's first backoff once ``cold`` >= COLD_ROUNDS

    def limits(self, seq: Sequence) -> tuple[int, int]:
        """The most and fewest tokens ``seq`` drafts in a round: its request's
        ``draft_max`` / ``draft_min`` within ``--draft-max``, else the server's; the floor
        never above the cap, as llama-server clamps them."""
        req, opts = seq.req, self.options
        cap = opts.draft_max if req.draft_max is None else min(req.draft_max, opts.draft_max)
        floor = opts.draft_min if req.draft_min is None else req.draft_min
        return max(0, cap), max(0, min(floor, cap))

    def eligible(self, seq: Sequence) -> bool:
        """Whether ``seq`` may draft now (see the module docstring)."""
        if seq.finished or seq.req.media is not None or not drafts_with(seq.matcher):
            return False
        if self.limits(seq)[0] < 1:  # speculative.n_max 0
            return False
        if seq.req.max_tokens - seq.generated < 2:  # room for a draft and its bonus token
            return False
        gov = self.rows.get(id(seq))
        return gov is None or gov.resume_at <= self.batch.steps

    def wants(self, rows: list[Sequence]) -> bool:
        """Whether this step should stop to draft: some row may, and the batch allows it."""
        if self.tap is not None:
            self.tap.clear()  # what the next forward records is that step's
        if self.failed or any(s.req.media is not None and not s.finished for s in rows):
            return False  # a media row's decoder shifts its positions: one-token steps only
        if self.governed and not self.batch.allows(sum(not s.finished for s in rows)):
            return False
        return any(self.eligible(s) and self._has_hidden(s) for s in rows)

    def _has_hidden(self, seq: Sequence) -> bool:
        return self.tap is None or id(seq) in self.hidden_at

    def plain(self, rows: list[Sequence]) -> None:
        """A one-token step for ``rows`` was queued (its forward the last the model ran):
        the batch governor's clock, and the rows' hidden states (needs_hidden)."""
        self.batch.plain(len(rows))
        if self.tap is not None:
            self._launched(rows)

    # -- hidden states (needs_hidden) ------------------------------------------------------
    def _launched(self, rows: list[Sequence]) -> None:
        """Keep each row's hidden state at the one position the decode step computed (a
        view of the forward's own)."""
        out = self.tap.take()
        if out is None or out.ndim != 3 or tuple(out.shape[:2]) != (len(rows), 1):
            self.hidden_at, self.hidden = {}, None  # not this step's: no row drafts
            return
        self.hidden_at = {id(s): i for i, s in enumerate(rows)}
        self.hidden = out[:, 0]

    def kept(self, rows: list[Sequence], states: Any, accepted: list[int]) -> None:
        """A verify step's hidden states [B, W, H] (``states``) and each row's kept draft
        count: keep each row's state at its last kept position."""
        if self.tap is None:
            return
        if states is None or states.ndim != 3 or states.shape[0] != len(rows):
            self.hidden_at, self.hidden = {}, None
            return
        import mlx.core as mx

        self.hidden_at = {id(s): i for i, s in enumerate(rows)}
        self.hidden = states[mx.arange(len(rows)), mx.array(accepted)]

    def propose(self, rows: list[Sequence], cache: list[Any] | None = None
                ) -> list[list[int]] | None:
        """Each row's draft ([] for none), or None when no row drafts this step.
        ``cache``: the batch's layer caches, for a session that reads them."""
        self.batch.round_begins()
        self._forget_departed(rows)
        picked = [i for i, s in enumerate(rows) if self.eligible(s) and self._has_hidden(s)]
        if self.cold >= COLD_ROUNDS:  # wrong for every row lately: one row scouts
            picked = picked[:1]
        limits, floors = [], []
        for i in picked:
            seq = rows[i]
            cap, floor = self.limits(seq)
            gov = self.rows.get(id(seq))
            if gov is None:
                gov = self.rows[id(seq)] = RowGovernor(cap, self.cold_backoff)
            room = seq.req.max_tokens - seq.generated - 1
            limits.append(min(max(min(gov.length, cap), floor), room))
            floors.append(max(1, floor))
        try:
            got = self.session.propose([self._row(rows, i, cache) for i in picked], limits)
        except Exception:
            log.exception("drafter_failed", kind=self.kind)
            self.failed = True
            return None
        drafts: list[list[int]] = [[] for _ in rows]
        for i, limit, floor, draft in zip(picked, limits, floors, got, strict=True):
            draft = [int(t) for t in draft[:limit]]
            drafts[i] = draft if len(draft) >= floor else []
        for i in picked:  # rows with nothing to verify count a miss now
            if not drafts[i]:
                self.rows[id(rows[i])].settle(self.batch.steps, 0, 0,
                                              self.limits(rows[i])[0])
        return drafts if any(drafts) else None

    def _row(self, rows: list[Sequence], i: int, cache: list[Any] | None) -> DraftRow:
        seq = rows[i]
        if self.tap is None:
            return DraftRow(id(seq), seq.context)
        at = self.hidden_at[id(seq)]
        return DraftRow(id(seq), seq.context, self.hidden[at:at + 1],
                        TargetCache(cache, i) if cache is not None else None)

    def settle(self, rows: list[Sequence], drafts: list[list[int]], accepted: list[int],
               seconds: float, emitted: int, states: Any = None) -> None:
        """After a verify step: counters, governors, and the session's commit
        (``states``: the verify forward's hidden states [B, W, H], needs_hidden only)."""
        committed = []
        for i, (seq, draft, n) in enumerate(zip(rows, drafts, accepted, strict=True)):
            if not draft:
                continue
            d = seq.drafts
            d.kind, d.rounds, d.drafted, d.accepted = (self.kind, d.rounds + 1,
                                                       d.drafted + len(draft), d.accepted + n)
            self.rounds += 1
            self.drafted += len(draft)
            self.accepted += n
            self.rows[id(seq)].settle(self.batch.steps, len(draft), n, self.limits(seq)[0])
            kept = states[i, :n + 1] if states is not None and self.tap is not None else None
            committed.append((DraftRow(id(seq), seq.context, kept), n))
        if committed:
            try:
                self.session.commit([r for r, _ in committed], [n for _, n in committed])
            except Exception:
                log.exception("drafter_failed", kind=self.kind)
                self.failed = True
        # the drafter's record, which rows that join start from
        hit = any(n for d, n in zip(drafts, accepted, strict=True) if d)
        self.cold = 0 if hit else self.cold + sum(1 for d in drafts if d)
        if hit:
            self.cold_backoff = 0
        elif self.cold >= COLD_ROUNDS:
            self.cold_backoff = min(BACKOFF_MAX, max(BACKOFF, 2 * self.cold_backoff))
        self.batch.verified(len(rows), emitted, seconds)  # the batch its forward ran

    # -- observability (read from the event loop: plain reads, copies of the dicts) --------
    def paused(self, rows: int) -> int:
        """The step until which the batch governor keeps a batch of ``rows`` from drafting
        (0: it does not)."""
        if not self.governed:
            return 0
        until = self.batch.paused_until(rows)
        return until if until > self.batch.steps else 0

    def row_state(self, seq: Sequence, rows: int) -> dict[str, Any]:
        """``seq``'s drafting for ``/slots``: its counters, its limits, and its state:
        ``off`` (it cannot draft: ``n_max`` 0, a constraint that cannot rewind, media),
        ``paused`` (the batch governor stopped the batch's drafting until ``resume_step``),
        ``backed_off`` (its governor waits until ``resume_step``) or ``drafting``, with the
        draft length its governor allows now (``length``). ``step`` is the governors'
        clock (verify and plain steps)."""
        cap, floor = self.limits(seq)
        gov = self.rows.get(id(seq))
        step = self.batch.steps
        state, resume = "drafting", 0
        if self.failed or cap < 1 or seq.req.media is not None or not drafts_with(seq.matcher):
            state = "off"
        elif until := self.paused(rows):
            state, resume = "paused", until
        elif gov is not None and gov.resume_at > step:
            state, resume = "backed_off", gov.resume_at
        d = seq.drafts
        return {"kind": self.kind, "state": state, "step": step, "resume_step": resume,
                "length": min(gov.length, cap) if gov is not None else cap,
                "n_max": cap, "n_min": floor, "rounds": d.rounds, "drafted": d.drafted,
                "accepted": d.accepted}

    def backed_off(self) -> int:
        """Rows whose governor waits before its next probe."""
        step = self.batch.steps
        return sum(1 for gov in list(self.rows.values()) if gov.resume_at > step)

    def _forget_departed(self, rows: list[Sequence]) -> None:
        """Rows that left the batch since the last round lose their state here."""
        live = {id(s) for s in rows if not s.finished}
        keys = [k for k in self.rows if k not in live]
        for k in keys:
            del self.rows[k]
        if keys:
            try:
                self.session.release(keys)
            except Exception:
                log.exception("drafter_failed", kind=self.kind)
                self.failed = True
