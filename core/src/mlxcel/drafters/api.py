"""Drafter contract: what proposes tokens for the engine's speculative verify steps.

A ``Drafter`` names a kind of proposal (prompt lookup, a draft model, MTP heads, DFlash)
and the ``"module:attr"`` of ``new_session(target: DraftTarget, options: DraftOptions) ->
DraftSession``, imported when the engine starts with that drafter. The engine thread owns
the session and calls it between decode steps:

* ``propose(rows, limits)``: for each ``DraftRow`` (a row's stable ``key`` and its
  ``tokens``, prompt then output, ending with the token the next step feeds), at most
  ``limits[i]`` token ids that the drafter expects to follow; an empty list means the row
  decodes one token as usual. Proposals are guesses: the engine verifies every drafting
  row of the batch in one forward and keeps, per row, the longest prefix that the target
  model itself would have produced (greedy: its argmax; sampled: its own draw at each
  position, so the output keeps the target's distribution exactly).
* ``commit(rows, accepted)``: how many of each row's proposed tokens were kept (a draft
  model rolls its own cache back to them).
* ``release(keys)``: rows that left the batch; their state goes.

A session whose class sets ``needs_hidden = True`` (MTP heads, assistants, DFlash) also
reads the target's own state; a session without it costs the engine nothing more. In
``propose``, each row then carries ``hidden`` ([1, H]: the target's last hidden state,
the final norm's output that its LM head reads, at the position that gave the row's
last token) and ``cache`` (``TargetCache``: the target's layer caches, holding every
token of the row but the last, and the row's index in them; read only); a row for which
the engine has no hidden state yet (it joined the batch since the last step) is not
offered. In ``commit``, each row's ``hidden`` is [n + 1, H]: the states at its kept
positions, the last one that of its new last token (``cache`` is None there). The engine
takes the state from the verify or decode forward that computed it: a view of it, no
copy (``mlxcel.drafters.hidden``).

A session that also sets ``hidden_layers`` (a tuple of the target's decoder layer
indices: DFlash's ``target_layer_ids``) reads those layers' outputs instead of the final
norm's: ``hidden`` is then [1, k * H] in ``propose`` and [n + 1, k * H] in ``commit``, the
k layers' outputs joined on the last axis in the order given, at the same positions.
The attribute may be set per instance (it depends on the drafter's checkpoint); an
index past the target's layers refuses to start.

``propose`` must not change ``tokens``. A session that raises fails only the step's
speculation: the engine logs it once, stops drafting with that session, and decodes on.
What a drafter must pass: ``mlxcel.testing.conformance.check_drafter``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import msgspec

# what ``timings.draft_kind`` may say (the spec's names)
DRAFT_KINDS: tuple[str, ...] = ("prompt-lookup", "draft", "mtp", "dflash")


class Drafter(msgspec.Struct, frozen=True, kw_only=True):
    """``kind``: one of ``DRAFT_KINDS``, what responses report. ``needs_model``: the
    drafter takes a checkpoint of its own (``-md`` / ``--model-draft``). ``model_types``:
    the draft checkpoints' ``config.json`` ``model_type``s it serves: ``-md`` with such a
    checkpoint picks it (``mlxcel.drafters.select``)."""

    name: str
    kind: str
    session: str  # "module:attr" of new_session(target, options) -> DraftSession
    needs_model: bool = False
    model_types: tuple[str, ...] = ()


class DraftOptions(msgspec.Struct, frozen=True, kw_only=True):
    """``draft_max`` / ``draft_min``: the most and fewest tokens a row drafts in one round
    (``--draft-max``, ``--draft-min``; fewer than ``draft_min`` proposed: none are
    verified). ``model``: the draft checkpoint (``--model-draft``), for drafters that
    need one. ``block_size``: the verify width a block drafter uses (``--draft-block-size``,
    0: its own)."""

    draft_max: int = 16
    draft_min: int = 0
    model: str | None = None
    block_size: int = 0


class DraftTarget(NamedTuple):
    """What a session may read of the target: its model and tokenizer (a draft model's
    vocabulary must match it) and the checkpoint's path and config."""

    model: Any
    tokenizer: Any
    path: str
    config: dict[str, Any]


class TargetCache(NamedTuple):
    """The target's layer caches as the engine decodes on them (a batch's, or one row's
    own) and the row's ``index`` in them (``mlxcel.drafters.target.row_kv`` reads one
    row's keys and values out of any kind)."""

    layers: list[Any]
    index: int


class DraftRow(NamedTuple):
    """One drafting row: ``key`` is stable while the row stays in the batch; ``tokens``
    its context (read only). ``hidden`` and ``cache``: for sessions that set
    ``needs_hidden`` only (the module docstring), else None."""

    key: int
    tokens: list[int]
    hidden: Any = None
    cache: TargetCache | None = None


class DraftSession(Protocol):
    needs_hidden: bool  # optional: absent is False
    hidden_layers: tuple[int, ...] | None  # optional: absent is the final norm's output

    def propose(self, rows: list[DraftRow], limits: list[int]) -> list[list[int]]: ...

    def commit(self, rows: list[DraftRow], accepted: list[int]) -> None: ...

    def release(self, keys: list[int]) -> None: ...
