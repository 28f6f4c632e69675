"""What the engine does next, decided in pure Python: no MLX, no model, no device.

Each engine iteration starts from ``schedule(view, limits, tail) -> Plan``: which requests
whose client left are cancelled, whether finished rows leave the batch now, which waiting
requests start prefilling together and with how many tokens per step, whether a group that
finishes prefilling joins the batch or is held to join with the next ones, and whether held
groups join now. The worker executes the plan (``EngineWorker.execute``). Sequences are
anything with ``req.priority``, ``order``, ``solo``, ``finished`` and ``sink.cancelled``;
``tail(seq)`` says how many prompt tokens a sequence still has to compute (after its
prompt-cache hit), so the scheduler's tests run on plain objects.

The rules, and why:

* **Priority.** Waiting requests are taken by priority lane, then arrival (``Sequence``
  orders them so).
* **Groups.** The next waiting requests prefill together, right-aligned, while rows x the
  widest uncached tail (each at most one chunk) fit in the step's token budget, and only
  where rows may be padded together (``grouped``) and neither is ``solo`` (admitted alone
  after its group could not be set up with it, or its group's prefill failed). Rows whose prompt holds media (``media``)
  prefill from input embeddings: they group with media rows only, and only where the
  model's media rows may be padded together (``media_grouped``).
* **Burst budget.** The budget is the prefill chunk, or where ``burst_chunks`` (N) > 1
  (CUDA), a share of N chunks as large as the arrivals' share of the batch: W waiting that
  fit and R rows decoding take ceil(N x W / R) chunks, at most N (all N when nothing
  decodes). A wide group costs less per row than a narrow one, and every group costs the
  running rows a step's wait and the batch a join, so a burst reaches full speed sooner in
  few wide groups, while one request arriving at a full batch still takes a chunk
  (docs/explanation/batching.md, "Bursts").
* **Held groups.** Where ``hold_groups`` (CUDA: every join copies the batch and runs new
  shapes), a prefilled group waits to join with the next ones while the next waiting
  request can start at once and fits one chunk; while rows decode, at most
  ``max_deferred`` groups wait, since each one held costs the held rows a step. Held
  groups join as soon as nothing else starts prefilling.
* **Forks.** The n choices of one request (``engine.fork``) start together: a leader
  takes its followers into its group, where they need slots but no prefill columns (their
  rows copy the leader's when its prefill is done), and a fork waits until it has a slot
  for each of its rows.
* **Lazy leave.** Where ``lazy_leave`` (CUDA: dropping a row copies every other row's
  cache), finished rows stay in the batch until they are the majority or a group joins;
  elsewhere they leave at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_DEFERRED = 8  # prefilled groups held back to join together while rows decode


def aligned(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return -(-n // align) * align


@dataclass(frozen=True)
class Limits:
    """What bounds a plan: slots, the prefill chunk and the device choices that shape
    admission (``EnginePolicy``'s, as the worker applies them to its model)."""

    parallel: int
    prefill_chunk: int
    align: int = 1
    grouped: bool = True
    media_grouped: bool = False
    burst_chunks: int = 1
    hold_groups: bool = False
    lazy_leave: bool = False
    max_deferred: int = MAX_DEFERRED


@dataclass(frozen=True)
class View:
    """The engine's state as the scheduler sees it: ``waiting`` (any order), the batch's
    ``rows`` (finished ones included until they leave), the ``prefilling`` group's
    sequences (None when no group is prefilling) and the ``held`` prefilled groups."""

    waiting: Sequence[Any] = ()
    rows: Sequence[Any] = ()
    prefilling: Sequence[Any] | None = None
    held: Sequence[Sequence[Any]] = ()


@dataclass(frozen=True)
class Plan:
    """``cancel``: sequences to finish as cancelled (their client left). ``leave``: the
    batch's finished rows leave now. ``group``: waiting sequences that start prefilling
    together, in order; ``budget``: that group's prefill tokens per step. ``drop_job``:
    the prefilling group has no live row left and goes. ``hold``: the group prefilling
    after this plan is held, not joined, when it finishes. ``join``: the held groups join
    the batch now."""

    cancel: tuple[Any, ...] = ()
    leave: bool = False
    group: tuple[Any, ...] = ()
    budget: int = 0
    drop_job: bool = False
    hold: bool = False
    join: bool = False
    notes: dict[str, int] = field(default_factory=dict)


def _live(seqs: Sequence[Any]) -> list[Any]:
    return [s for s in seqs if not s.finished and not s.sink.cancelled]


def leave_now(finished: int, total: int, lazy: bool) -> bool:
    """Whether ``finished`` of ``total`` rows leave now (see "Lazy leave")."""
    if not finished:
        return False
    keep = total - finished
    return not (lazy and keep and 2 * keep >= total)


def free_slots(limits: Limits, view: View) -> int:
    """Slots neither decoding nor taken by a prefilled group waiting to join."""
    return limits.parallel - len(_live(view.rows)) - sum(len(_live(g)) for g in view.held)


def budget(limits: Limits, free: int, waiting: int, decoding: int) -> int:
    """Prefill tokens per step for the next group (see "Burst budget")."""
    if limits.burst_chunks <= 1:
        return limits.prefill_chunk
    arriving = min(free, waiting)
    if not decoding:
        return limits.prefill_chunk * limits.burst_chunks
    share = -(-limits.burst_chunks * arriving // decoding)  # ceil(N * W / R)
    return limits.prefill_chunk * max(1, min(limits.burst_chunks, share))


def _pulled(seq: Any, waiting: set[int]) -> bool:
    """Whether ``seq`` follows a waiting leader (``engine.fork``): it starts with it."""
    leader = getattr(seq, "leader", None)
    return leader is not None and id(leader) in waiting


def _with_followers(seq: Any, waiting: set[int]) -> list[Any]:
    return [seq, *(f for f in getattr(seq, "followers", ()) if id(f) in waiting)]


def starters(ordered: Sequence[Any]) -> list[Any]:
    """The waiting sequences that can start a row of a group: all but the followers of a
    waiting leader (see "Forks")."""
    waiting = set(map(id, ordered))
    return [s for s in ordered if not _pulled(s, waiting)]


def form_group(ordered: Sequence[Any], free: int, step_budget: int, limits: Limits,
               tail: Callable[[Any], int]) -> list[Any]:
    """The waiting sequences (``ordered`` by priority, then arrival) that start prefilling
    together (see "Groups" and "Forks")."""
    if not ordered or free <= 0:
        return []
    waiting = set(map(id, ordered))
    heads = starters(ordered)
    group = _with_followers(heads[0], waiting)
    if len(group) > free:  # a fork waits until all of its rows have slots
        return []
    rows = 1  # rows whose prompts are computed
    widest = aligned(tail(heads[0]), limits.align)
    for seq in heads[1:]:
        members = _with_followers(seq, waiting)
        if len(group) + len(members) > free or not limits.grouped or group[0].solo \
                or seq.solo or not _same_feed(group[0], seq, limits):
            break
        width = max(widest, aligned(tail(seq), limits.align))
        if (rows + 1) * min(width, limits.prefill_chunk) > step_budget:
            break
        group += members
        rows += 1
        widest = width
    return group


def _same_feed(first: Any, seq: Any, limits: Limits) -> bool:
    """Whether ``seq`` may prefill in ``first``'s group: both text rows, or both media
    rows of a model whose media rows may be padded together (``media_grouped``)."""
    media = getattr(first, "media", False)
    return media == getattr(seq, "media", False) and (not media or limits.media_grouped)


def hold_group(limits: Limits, next_tail: int | None, free: int, held: int,
               decoding: int) -> bool:
    """Whether a group that has just finished prefilling waits to join with the next
    ones (see "Held groups"): ``next_tail`` is the next waiting sequence's tail (None when
    none waits), ``free`` and ``held`` count the slots and held groups with it held."""
    if not limits.hold_groups or next_tail is None or not limits.grouped or free <= 0:
        return False
    if decoding and held >= limits.max_deferred:
        return False
    return aligned(next_tail, limits.align) <= limits.prefill_chunk


def _row_scan(rows: Sequence[Any]) -> tuple[list[Any], int]:
    """The batch's rows to cancel (client gone, not finished) and how many rows are no
    longer live (finished or cancelled), in one pass: the plan runs every step."""
    cancel: list[Any] = []
    gone = 0
    for s in rows:
        if s.finished:
            gone += 1
        elif s.sink.cancelled:
            gone += 1
            cancel.append(s)
    return cancel, gone


def schedule(view: View, limits: Limits, tail: Callable[[Any], int]) -> Plan:
    """The next iteration's plan (see the module docstring)."""
    row_cancel, gone = _row_scan(view.rows)
    cancel = tuple([*(s for s in view.waiting if s.sink.cancelled and not s.finished),
                    *row_cancel,
                    *(s for s in [*(view.prefilling or ()), *(s for g in view.held for s in g)]
                      if s.sink.cancelled and not s.finished)])
    leave = leave_now(gone, len(view.rows), limits.lazy_leave)
    held = [g for g in view.held if _live(g)]
    job = _live(view.prefilling) if view.prefilling is not None else None
    drop_job = job is not None and not job
    decoding = len(view.rows) - gone
    free = limits.parallel - decoding - sum(len(_live(g)) for g in view.held)
    waiting = _live(view.waiting)
    group: list[Any] = []
    step_budget = 0
    if job:  # one group prefills at a time: only the next waiting one matters (``hold``)
        following = min(waiting, default=None)
    else:
        ordered = sorted(waiting)
        step_budget = budget(limits, free, len(ordered), decoding)
        group = form_group(ordered, free, step_budget, limits, tail)
        taken = set(map(id, group))
        following = next((s for s in starters(ordered) if id(s) not in taken), None)
    prefilling = job or group
    hold = bool(prefilling) and limits.hold_groups and hold_group(
        limits, tail(following) if following is not None else None, free - len(prefilling),
        len(held) + 1, decoding)
    return Plan(cancel=cancel, leave=leave, group=tuple(group), budget=step_budget,
                drop_job=drop_job, hold=hold, join=bool(held) and not prefilling,
                notes={"waiting": len(waiting), "free": free})
