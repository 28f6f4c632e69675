"""Gemma 4's assistant drafter (``gemma4_assistant``, kind ``mtp``) on tiny random
checkpoints: it passes the drafter conformance, greedy output is the same with and
without it in a batch where some rows do not draft, responses say ``draft_kind`` mtp,
and ``-md`` with an assistant checkpoint picks it (or says what to install)."""

from __future__ import annotations

import msgspec
import pytest
from mlxcel.drafters.select import choose
from mlxcel.engine.config import EngineConfig
from mlxcel.errors import StartupError
from mlxcel.testing.conformance import check_drafter
from mlxcel.testing.drafting import (
    PROMPTS,
    DraftFlags,
    check_greedy_beside_silent_rows,
    check_server_drafts,
    draft_target,
    registry_with,
)
from mlxcel_family_gemma4 import mtp

pytest.importorskip("mlx_vlm")  # the mtp extra (tox installs it with the vision extra)



def factory(assistant):
    """``mtp.new_session`` with ``-md`` set to ``assistant``."""
    def new_session(target, options):
        return mtp.new_session(target, msgspec.structs.replace(options, model=str(assistant)))

    return new_session




def test_the_assistant_passes_the_drafter_conformance(gemma4_checkpoint, gemma4_assistant):
    usages = check_drafter(factory(gemma4_assistant), gemma4_checkpoint, kind="mtp")
    assert sum(u.draft_rounds for u in usages) > 0
    assert all(u.draft_kind == "mtp" for u in usages if u.draft_rounds)


def test_greedy_output_is_the_targets_beside_rows_that_do_not_draft(gemma4_checkpoint,
                                                                     gemma4_assistant):
    config = EngineConfig(drafter=factory(gemma4_assistant), drafter_kind="mtp",
                          prompt_lookup="on", draft_max=4)
    check_greedy_beside_silent_rows(gemma4_checkpoint, config, "mtp")


def registry(with_family: bool):
    from mlxcel_family_gemma4 import plugin

    return registry_with(plugin) if with_family else registry_with()


def test_md_with_an_assistant_checkpoint_picks_the_mtp_drafter(gemma4_assistant,
                                                               gemma4_checkpoint):
    md = str(gemma4_assistant)
    for flags in ({}, {"draft_kind": "mtp"}, {"spec_type": "draft-mtp"}):
        picked = choose(DraftFlags(model_draft=md, **flags), registry(True))
        assert (picked.name, picked.kind) == ("gemma4-assistant", "mtp")
    other = DraftFlags(model_draft=str(gemma4_checkpoint))
    assert choose(other, registry(True)).name == "draft-model"
    assert choose(DraftFlags(), registry(True)) is None


@pytest.mark.parametrize(("flags", "says"), [
    (DraftFlags(draft_kind="dflash"), "-md / --model-draft"),
    (DraftFlags(spec_type="draft-mtp"), "MTP heads inside the target"),
    (DraftFlags(draft_kind="dflash", spec_type="draft-mtp"), "ask for different drafters"),
])
def test_a_kind_without_its_checkpoint_refuses_to_start(flags, says):
    with pytest.raises(StartupError, match=says):
        choose(flags, registry(True))


def test_without_the_family_an_assistant_says_what_to_install(gemma4_assistant):
    md = str(gemma4_assistant)
    with pytest.raises(StartupError, match=r"pip install 'mlxcel-family-gemma4\[mtp\]'") as e:
        choose(DraftFlags(model_draft=md), registry(False))
    assert "\n" not in str(e.value)
    with pytest.raises(StartupError, match="drafts as mtp, not dflash"):
        choose(DraftFlags(model_draft=md, draft_kind="dflash"), registry(True))


def test_the_server_serves_md_assistant_and_reports_draft_kind_mtp(gemma4_checkpoint,
                                                                    gemma4_assistant):
    check_server_drafts(gemma4_checkpoint, "mtp", model_draft=str(gemma4_assistant))


def test_an_assistant_for_another_target_refuses_to_start(tiny_checkpoint, gemma4_assistant):
    from mlxcel.drafters.api import DraftOptions

    target = draft_target(tiny_checkpoint)  # qwen3
    with pytest.raises(StartupError, match="not Gemma 4") as e:
        mtp.new_session(target, DraftOptions(model=str(gemma4_assistant)))
    assert "\n" not in str(e.value)


def test_a_rows_drafts_from_a_batch_are_those_it_drafts_alone(gemma4_checkpoint,
                                                             gemma4_assistant):
    """Rows of different lengths merged into mlx-lm's batch caches (left-padded, the
    window rotated) draft what each drafts on its own caches: the keys and values and the
    hidden state handed over are the row's own."""
    import mlx.core as mx
    from mlxcel.drafters.api import DraftOptions, DraftRow, TargetCache
    from mlxcel.drafters.hidden import tap
    from mlxcel.engine.mixed_batch import merge_rows
    from mlxcel.engine.spec_probe import make_caches

    target = draft_target(gemma4_checkpoint)
    session = mtp.new_session(target, DraftOptions(model=str(gemma4_assistant)))
    states = tap(target.model)
    alone, caches, hidden = [], [], []
    for key, prompt in enumerate(PROMPTS[:3]):
        cache = make_caches(target.model)
        target.model(mx.array([prompt[:-1]], dtype=mx.uint32), cache)
        hidden.append(states.take()[0, -1:])
        caches.append(cache)
        alone += session.propose([DraftRow(key, prompt, hidden[-1], TargetCache(cache, 0))],
                                 [4])
    batch = merge_rows(caches)
    rows = [DraftRow(k, p, h, TargetCache(batch, k))
            for k, (p, h) in enumerate(zip(PROMPTS[:3], hidden, strict=True))]
    assert session.propose(rows, [4, 4, 4]) == alone
    assert all(len(d) == 4 for d in alone)
