"""Where a prefilling row takes checkpoints, and how one is copied out of its caches.

A row whose model has layers that cannot be cut back (``kinds.cuttable``) keeps a copy of
those layers' state at the prompt positions later prompts will share: the boundaries the
chat layer marks (``GenerationRequest.cache_marks``: the end of the system + tools prefix,
the message boundaries of the last turn), every ``interval`` tokens of a long prompt, and
the end of its prompt before generation, all but its last token (the next turn of a
conversation re-sends it, with the answer as text; a retry sends it again). A prefill
chunk ends at each mark.

A mark fewer than ``NEAR`` tokens past the checkpoint the row was restored from is not
taken: ending a chunk there costs a forward pass of its own (every weight read again, a
pass's launches), while that checkpoint already serves a later prompt sharing the mark,
with those few tokens to prefill. A short answer re-sent as text puts the boundary before
the final user turn just past the restored point. By the same rule the prompt's end is
not taken fewer than ``NEAR`` tokens past a mark the row takes past its system prefix, or
past the point it was restored from: the chat layer's last mark (the end of the messages,
before the generation prompt's few tokens) serves the next turn and a retry alike. Where
turns are short, a turn may take no checkpoint at all, and the next one prefills from the
one before: at most ``NEAR`` tokens and a turn more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.engine.cache.kinds import Checkpoint, arrays, cuttable, owned, row_copy

PROMPT_END = "prompt"
NEAR = 64  # tokens past a restored checkpoint within which a mark is not worth a pass


def marks_for(prompt_len: int, cached: int, marks: Sequence[tuple[int, str]],
              interval: int) -> list[tuple[int, str]]:
    """The checkpoints a row whose first ``cached`` tokens came from the cache takes, as
    sorted ``(position, kind)``: a position is a token count, past ``cached`` (by ``NEAR``
    where ``cached`` > 0, a restored checkpoint) and at most ``prompt_len - 1``: the
    prompt's end is taken before its last token, whose own forward then gives the first
    token's logits, so that the same prompt again (a retry) still has a column to compute
    from the checkpoint. Where kinds share a position the first given wins; the prompt's
    end is there unless it lies within ``NEAR`` of the last mark before it (module
    docstring)."""
    end = prompt_len - 1
    start = cached + NEAR if cached else 1
    found: dict[int, str] = {}
    for position, kind in marks:
        if start <= position < end:
            found.setdefault(position, kind)
    if interval > 0:
        for position in range(interval, end, interval):
            if position >= start:
                found.setdefault(position, "interval")
    last = max((p for p, kind in found.items() if kind != "system"), default=cached or None)
    if end > cached and (last is None or end - last >= NEAR):
        found[end] = PROMPT_END
    return sorted(found.items())


def checkpoint(caches: list[Any], row: int, lone: bool, position: int,
               kind: str) -> Checkpoint:
    """Row ``row``'s state now (``position`` tokens in) of the layers that cannot be cut
    back, copied and queued: ``caches`` are a prefill's batch caches, or one row's plain
    ones (``lone``). Extracting a cuttable layer builds a graph that is never run."""
    layers: list[Any | None] = []
    for cache in caches:
        if lone:
            layers.append(None if cuttable(cache) else row_copy(cache))
            continue
        one = cache.extract(row)
        layers.append(None if cuttable(one) else owned(one))
    out = Checkpoint(position, kind, layers)
    import mlx.core as mx

    mx.async_eval(arrays([c for c in layers if c is not None]))
    return out
