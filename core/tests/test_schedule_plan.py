"""The scheduler alone: plans from fake sequences, with no MLX, model or engine thread."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from mlxcel.engine.scheduler import (
    Limits,
    View,
    budget,
    form_group,
    hold_group,
    leave_now,
    schedule,
)

_order = iter(range(10**6))


class Seq:
    """What the scheduler reads of a sequence."""

    def __init__(self, tail=10, priority=1, solo=False, finished=False, cancelled=False,
                 media=False):
        self.req = SimpleNamespace(priority=priority)
        self.order = next(_order)
        self.tail, self.solo, self.finished = tail, solo, finished
        self.media = media
        self.sink = SimpleNamespace(cancelled=cancelled)

    def __lt__(self, other):
        return (self.req.priority, self.order) < (other.req.priority, other.order)


def tail(seq):
    return seq.tail


def plan(limits=None, **view):
    return schedule(View(**view), limits or Limits(parallel=8, prefill_chunk=64), tail)


def test_importing_the_scheduler_imports_no_mlx():
    code = ("import sys, mlxcel.engine.scheduler; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlx'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_priority_lane_first_then_arrival():
    late_urgent = [Seq(), Seq(), Seq(priority=0)]
    p = plan(waiting=late_urgent)
    assert p.group[0] is late_urgent[2] and list(p.group[1:]) == late_urgent[:2]


def test_groups_fit_the_token_budget_and_free_slots():
    waiting = [Seq(tail=20) for _ in range(5)]
    p = plan(waiting=waiting)  # 3 x 20 <= 64 < 4 x 20
    assert len(p.group) == 3 and p.budget == 64
    p = plan(Limits(parallel=2, prefill_chunk=64), waiting=waiting)
    assert len(p.group) == 2  # two slots
    p = plan(Limits(parallel=8, prefill_chunk=64), waiting=waiting, rows=[Seq()] * 7)
    assert len(p.group) == 1  # one slot left
    assert plan(Limits(parallel=1, prefill_chunk=64), waiting=waiting,
                rows=[Seq()]).group == ()


def test_a_long_tail_takes_one_chunk_and_prefills_alone():
    waiting = [Seq(tail=500), Seq(tail=5)]
    assert len(plan(waiting=waiting).group) == 1  # 2 x min(500, 64) > 64


def test_solo_rows_and_ungrouped_models_prefill_one_per_group():
    assert len(plan(waiting=[Seq(solo=True), Seq()]).group) == 1
    assert len(plan(waiting=[Seq(), Seq(solo=True)]).group) == 1
    ungrouped = Limits(parallel=8, prefill_chunk=64, grouped=False)
    assert len(plan(ungrouped, waiting=[Seq(tail=2) for _ in range(4)]).group) == 1


def test_media_rows_group_with_media_rows_only_where_the_model_allows():
    waiting = [Seq(media=True), Seq(media=True), Seq(), Seq(media=True)]
    grouped = Limits(parallel=8, prefill_chunk=64, media_grouped=True)
    assert list(plan(grouped, waiting=waiting).group) == waiting[:2]  # stops at text
    assert list(plan(Limits(parallel=8, prefill_chunk=64), waiting=waiting).group) \
        == waiting[:1]  # each media row alone
    text_first = [Seq(), Seq(media=True), Seq()]
    assert list(plan(grouped, waiting=text_first).group) == text_first[:1]


def test_alignment_widens_every_tail():
    waiting = [Seq(tail=3) for _ in range(6)]
    assert len(plan(Limits(parallel=8, prefill_chunk=64, align=32), waiting=waiting)
               .group) == 2  # each tail counts 32 columns


def test_burst_budget_grows_with_arrivals_per_decoding_row():
    burst = Limits(parallel=16, prefill_chunk=16, burst_chunks=8)
    assert budget(burst, free=15, waiting=10, decoding=0) == 128  # nothing decodes: all 8
    assert budget(burst, free=15, waiting=10, decoding=5) == 128  # ceil(8 x 10 / 5) > 8
    assert budget(burst, free=15, waiting=1, decoding=63) == 16  # one arrives at a full batch
    assert budget(burst, free=15, waiting=10, decoding=40) == 32  # ceil(8 x 10 / 40) = 2
    assert budget(burst, free=3, waiting=10, decoding=40) == 16  # only 3 fit: ceil(24 / 40)
    assert budget(Limits(parallel=16, prefill_chunk=16), 15, 10, 1) == 16
    waiting = [Seq(tail=11) for _ in range(10)]
    assert len(form_group(sorted(waiting), 15, 128, burst, tail)) == 10


def test_cancelled_sequences_are_cancelled_and_free_their_slots():
    gone_waiting, gone_row = Seq(cancelled=True), Seq(cancelled=True)
    live = Seq()
    p = plan(Limits(parallel=2, prefill_chunk=64), waiting=[gone_waiting, live],
             rows=[gone_row, Seq()])
    assert set(map(id, p.cancel)) == {id(gone_waiting), id(gone_row)}
    assert p.group == (live,) and p.leave  # the cancelled row's slot takes the live one
    done = Seq(finished=True, cancelled=True)  # already finished: nothing to cancel
    assert plan(rows=[done]).cancel == ()


def test_a_prefilling_group_with_no_live_row_goes_and_admission_resumes():
    job = [Seq(cancelled=True), Seq(cancelled=True)]
    nxt = Seq()
    p = plan(waiting=[nxt], prefilling=job)
    assert p.drop_job and p.group == (nxt,)
    busy = plan(waiting=[nxt], prefilling=[Seq()])
    assert not busy.drop_job and busy.group == ()  # one group prefills at a time


def test_lazy_leave_keeps_finished_rows_until_they_are_the_majority():
    assert leave_now(1, 8, lazy=False) and not leave_now(0, 8, lazy=False)
    assert not leave_now(3, 8, lazy=True) and not leave_now(4, 8, lazy=True)
    assert leave_now(5, 8, lazy=True) and leave_now(8, 8, lazy=True)
    rows = [Seq(finished=True)] + [Seq() for _ in range(3)]
    assert plan(rows=rows).leave
    assert not plan(Limits(parallel=8, prefill_chunk=64, lazy_leave=True), rows=rows).leave


def test_held_groups_wait_for_the_next_one_that_fits_a_chunk():
    cuda = Limits(parallel=16, prefill_chunk=16, hold_groups=True, max_deferred=2)
    assert hold_group(cuda, next_tail=11, free=4, held=1, decoding=0)
    assert not hold_group(cuda, next_tail=40, free=4, held=1, decoding=0)  # several chunks
    assert not hold_group(cuda, next_tail=None, free=4, held=1, decoding=0)  # none waits
    assert not hold_group(cuda, next_tail=11, free=0, held=1, decoding=0)  # no slot for it
    assert hold_group(cuda, next_tail=11, free=4, held=5, decoding=0)  # nothing decodes
    assert not hold_group(cuda, next_tail=11, free=4, held=2, decoding=3)  # bounded
    assert not hold_group(Limits(parallel=16, prefill_chunk=16), 11, 4, 1, 0)
    # the prefilling group is held while another small request waits; held ones join as
    # soon as nothing prefills
    p = plan(cuda, waiting=[Seq(tail=11)], prefilling=[Seq()])
    assert p.hold and not p.join
    p = plan(cuda, held=[[Seq()]])
    assert p.join and not p.hold and p.group == ()
