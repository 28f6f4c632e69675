"""The Qwen3.5 MTP drafter passes mlxcel's drafter conformance on a tiny target whose
checkpoint carries random ``mtp.*`` heads."""

from mlxcel.testing.conformance import check_drafter
from mlxcel_drafter_mtp import qwen3_5


def test_the_qwen3_5_heads_pass_the_drafter_conformance(mtp_target):
    usages = check_drafter(qwen3_5.new_session, mtp_target, kind="mtp")
    assert sum(u.draft_rounds for u in usages) > 0
    assert all(u.draft_kind == "mtp" for u in usages if u.draft_rounds)
