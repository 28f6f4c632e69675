"""A constrained row's masks over a speculative draft, read without moving the row.

A verify step checks a row's draft ``d_1 .. d_k`` in one forward; the token the target
picks at position ``j`` must obey the constraint in the state after ``d_1 .. d_j``, as it
would in one-token steps. ``draft_masks`` advances the row's matcher through the draft,
writing the mask of each state, and takes the advances back (``protocol.Rewindable``), so
the row's matcher ends where it began and the row's kept tokens advance it as any token
does. A draft token the constraint forbids ends the draft there: the target's own token
at that position (masked) differs from it, so it would be rejected anyway, and the states
after it do not exist. A token that ends the match (EOS in an accepting state) ends it
too, since nothing may follow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlxcel.engine.constraints.protocol import Rewindable


def drafts_with(matcher: Any) -> bool:
    """Whether a row with ``matcher`` (None: unconstrained) may draft: its constraint can
    be rewound, is active (one that waits for ``guide_after`` starts on text the verify
    step cannot foresee) and has not ended."""
    return matcher is None or (isinstance(matcher, Rewindable) and matcher.active
                               and not matcher.finished)


def allows(row: np.ndarray, token: int) -> bool:
    """Whether the mask ``row`` (``protocol``'s int32 words) allows ``token``."""
    word = token // 32
    return 0 <= word < row.size and bool(int(row.view(np.uint32)[word]) >> (token % 32) & 1)


def draft_masks(matcher: Any, draft: list[int], rows: np.ndarray) -> int:
    """Write the mask of ``matcher``'s state into ``rows[0]`` and the state after
    ``draft[:j]`` into ``rows[j]``, for the longest prefix of ``draft`` the constraint
    allows (at most ``matcher.max_rollback`` tokens); return that prefix's length. The
    matcher is where it was afterwards, even when a mask fails to be written."""
    matcher.write_mask_into(rows[0])
    if not draft:
        return 0
    taken = 0
    try:
        for token in draft[:matcher.max_rollback]:
            if not allows(rows[taken], token) or not matcher.advance(token):
                break
            taken += 1
            if matcher.finished:
                break
            matcher.write_mask_into(rows[taken])
    finally:
        matcher.rollback(taken)
    return taken
