"""Qwen3.5's MTP heads (``mtp.*`` inside the target, kind ``mtp``) on tiny random
checkpoints: greedy output is the same with and without them in a batch where some rows
do not draft, ``--spec-type draft-mtp`` without ``-md`` picks them (or says what to
install), a checkpoint without the heads refuses to start, and responses say
``draft_kind`` mtp."""

from __future__ import annotations

import pytest
from mlxcel.drafters.api import DraftOptions, DraftRow
from mlxcel.drafters.select import choose
from mlxcel.engine.config import EngineConfig
from mlxcel.errors import StartupError
from mlxcel.testing.drafting import (
    DraftFlags,
    check_greedy_beside_silent_rows,
    check_server_drafts,
    draft_target,
    registry_with,
)
from mlxcel_drafter_mtp import plugin, qwen3_5


def test_greedy_output_is_the_targets_beside_rows_that_do_not_draft(mtp_target):
    config = EngineConfig(drafter=qwen3_5.new_session, drafter_kind="mtp",
                          prompt_lookup="on", draft_max=3)
    check_greedy_beside_silent_rows(mtp_target, config, "mtp")


def registry(with_mtp: bool):
    return registry_with(plugin) if with_mtp else registry_with()


def test_draft_mtp_without_md_picks_the_heads_inside_a_qwen3_5draft_target(mtp_target):
    target = str(mtp_target)
    for flags in ({"spec_type": "draft-mtp"}, {"draft_kind": "mtp"}):
        picked = choose(DraftFlags(target, **flags), registry(True))
        assert (picked.name, picked.kind, picked.needs_model) == ("qwen3_5-mtp", "mtp", False)
    # -md with a Qwen3.5 checkpoint is a draft model, never the heads
    assert choose(DraftFlags(target, model_draft=target), registry(True)).name == "draft-model"
    assert choose(DraftFlags(target), registry(True)) is None


def test_without_the_distribution_draft_mtp_says_what_to_install(qwen3_5_mtp):
    with pytest.raises(StartupError, match=r"pip install 'mlxcel-drafter-mtp'") as e:
        choose(DraftFlags(str(qwen3_5_mtp), spec_type="draft-mtp"), registry(False))
    assert "\n" not in str(e.value)


def test_draft_mtp_on_a_target_without_heads_it_reads_refuses(tiny_checkpoint):
    with pytest.raises(StartupError, match="MTP heads inside the target, a qwen3"):
        choose(DraftFlags(str(tiny_checkpoint), spec_type="draft-mtp"), registry(True))


def test_a_qwen3_5_checkpoint_without_mtp_weights_refuses_in_one_line(qwen3_5_plain):
    with pytest.raises(StartupError, match="has no mtp.\\* weights") as e:
        qwen3_5.new_session(draft_target(qwen3_5_plain), DraftOptions())
    assert "\n" not in str(e.value)


def test_another_target_refuses_in_one_line(tiny_checkpoint):
    with pytest.raises(StartupError, match="reads no MTP heads inside a 'qwen3' target") as e:
        qwen3_5.new_session(draft_target(tiny_checkpoint), DraftOptions())
    assert "\n" not in str(e.value)


def test_the_server_serves_draft_mtp_and_reports_draft_kind_mtp(qwen3_5_mtp):
    check_server_drafts(qwen3_5_mtp, "mtp", spec_type="draft-mtp")


def test_the_heads_cache_holds_the_confirmed_pairs_at_their_positions(qwen3_5_mtp):
    """After a round that kept 2 of 3 drafts, a row drafts what the heads draft when fed,
    one at a time on a fresh cache, the pairs the target confirmed (and only those), at
    their positions; another row in the same calls keeps its own cache."""
    import mlx.core as mx

    session = qwen3_5.new_session(draft_target(qwen3_5_mtp), DraftOptions())
    head, width = session.head, 64
    mx.random.seed(7)
    h_a, h_b, h_c = (mx.random.normal((k, width)) for k in (1, 3, 1))
    tokens, other = [5, 6, 7, 8, 9, 10], [30, 31, 32]
    first = session.propose([DraftRow(0, tokens, h_a), DraftRow(1, other, h_c)], [3, 2])
    drafts = first[0]
    session.commit([DraftRow(0, tokens + drafts[:2] + [77], h_b)], [2])
    row = DraftRow(0, tokens + drafts[:2] + [77], h_c)
    got = session.propose([row, DraftRow(1, other, h_c)], [3, 2])
    assert got[1] == first[1]  # row 1 committed nothing: the same state, the same drafts

    def step(cache, token, hidden, position):
        embed = head._input_embed(mx.array([[token]], dtype=mx.int32))
        return head._forward_hidden(embed, hidden[None], cache, mx.array([[position]]))

    cache, at = head.make_cache(), len(tokens) - 2
    for i, (tok, hid) in enumerate(zip([tokens[-1], *drafts[:2]],
                                       [h_a, h_b[0:1], h_b[1:2]], strict=True)):
        step(cache, tok, hid, at + i)
    out, tok, hid = [], 77, h_c
    for i in range(3):
        hid = step(cache, tok, hid, at + 3 + i)[0]
        tok = int(mx.argmax(head._lm_head_fn(hid)[..., :session.vocab], axis=-1).item())
        out.append(tok)
    assert got[0] == out
