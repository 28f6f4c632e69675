"""A decode step's outputs, and handing them to their rows.

A ``Step`` is what the engine queues (``start``) and later reads back: the rows it fed,
their sampled tokens and logprob arrays. ``read_back`` gives each row its token, one bad
row failing alone, and holds the finish events of the rows that finished, so the caller
can store them before the clients act on them (``EngineWorker._settle``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import mlx.core as mx
import structlog

from mlxcel.engine.sequence import Sequence
from mlxcel.types import TokenLogprob

log = structlog.get_logger("mlxcel.engine")


class Step(NamedTuple):
    """One decode step: its rows, sampled tokens and logprob arrays (lazy until ``start``);
    ``top`` is each row's number of top logprobs wanted (-1: none)."""

    rows: list[Sequence]
    sampled: mx.array
    logprobs: tuple[mx.array, ...]
    top: tuple[int, ...] = ()

    def start(self) -> None:
        """Queue the step on the device (on CUDA this encodes its kernels, GIL released)."""
        mx.async_eval(self.sampled, *self.logprobs)


def read_back(step: Step, stats: Any) -> list[Sequence]:
    """Hand ``step``'s tokens to its rows (one bad row fails alone), counting them in
    ``stats`` (``EngineStats``); the rows that finished, whose finish events are held
    (``Sequence.defer_finish``) until the caller releases them."""
    tokens = step.sampled.tolist()
    logprobs = row_logprobs(step, len(tokens)) if step.logprobs else None
    done: list[Sequence] = []
    taken = 0
    for i, seq in enumerate(step.rows):
        if seq.finished:
            continue
        taken += 1
        seq.defer_finish = True
        try:
            seq.accept(tokens[i], logprobs[i] if logprobs is not None
                       and seq.req.sampling.logprobs else None)
        except Exception as exc:
            log.exception("row_failed", request_id=seq.req.request_id)
            seq.finish("error", error=f"generation failed: {exc}")
        if seq.finished:
            done.append(seq)
        else:
            seq.release_finish()
    stats.total_decode_tokens += taken  # before the finish events go out
    stats.sequences_completed += len(done)
    return done


def row_logprobs(step: Any, n: int) -> list[TokenLogprob | None]:
    """Per-row TokenLogprob from a step's logprob arrays (None when none were computed)."""
    if not step.logprobs:
        return [None] * n
    chosen = step.logprobs[0].tolist()
    if len(step.logprobs) == 1:
        return [TokenLogprob(t, c) for t, c in zip(step.sampled.tolist(), chosen, strict=True)]
    ids, vals = step.logprobs[1].tolist(), step.logprobs[2].tolist()
    out = []
    for i, token in enumerate(step.sampled.tolist()):
        k = step.top[i]
        out.append(TokenLogprob(token, chosen[i], tuple(zip(ids[i][:k], vals[i][:k],
                                                             strict=True))))
    return out
