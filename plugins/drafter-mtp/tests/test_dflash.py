"""DFlash drafters (``-md`` a DFlash checkpoint, kind ``dflash``) on tiny random
checkpoints (qwen3, and Gemma 4 with its sliding windows and shared keys and values):
greedy output is the target's in a batch whose rows join, leave and sometimes do not
draft; a drafter that agrees with its target has every draft kept, in
blocks of ``--draft-block-size``; the flags pick it and refuse what does not fit."""

from __future__ import annotations

import pytest
from mlxcel.drafters.api import DraftOptions, DraftRow
from mlxcel.drafters.select import choose
from mlxcel.engine.config import EngineConfig
from mlxcel.errors import StartupError
from mlxcel.testing.conformance import check_drafter
from mlxcel.testing.drafting import (
    SILENT,
    DraftFlags,
    check_greedy_beside_silent_rows,
    check_server_drafts,
    draft_target,
    registry_with,
    run_mixed,
)
from mlxcel_drafter_mtp import dflash, plugin


def config(draft, **more) -> EngineConfig:
    return EngineConfig(drafter=dflash.new_session, drafter_kind="dflash", prompt_lookup="on",
                        model_draft=str(draft), **{"draft_max": 3, **more})


def test_the_dflash_drafter_passes_the_drafter_conformance(tiny_checkpoint, dflash_draft):
    def new_session(target, options):
        return dflash.new_session(target, DraftOptions(draft_max=options.draft_max,
                                                       model=str(dflash_draft)))

    usages = check_drafter(new_session, tiny_checkpoint, kind="dflash")
    assert sum(u.draft_rounds for u in usages) > 0
    assert all(u.draft_kind == "dflash" for u in usages if u.draft_rounds)


def test_greedy_output_is_the_targets_beside_rows_that_do_not_draft(tiny_checkpoint,
                                                                     dflash_draft):
    check_greedy_beside_silent_rows(tiny_checkpoint, config(dflash_draft), "dflash")


def test_a_gemma4_target_with_its_dflash_drafter_keeps_its_greedy_output(
        gemma4_dflash_pair):
    target, draft = gemma4_dflash_pair
    picked = choose(DraftFlags(str(target), model_draft=str(draft),
                               spec_type="draft-dflash"), registry())
    assert picked.name == "dflash"
    check_greedy_beside_silent_rows(target, config(draft), "dflash")


@pytest.mark.parametrize(("block", "widest"), [(0, 3), (3, 2)])
def test_a_drafter_that_agrees_has_every_draft_kept_in_blocks(constant_pair, block, widest):
    """The checkpoint's block width is 4 (3 drafts a round), ``--draft-block-size 3`` 2."""
    target, draft = constant_pair
    plain, _, _ = run_mixed(target)
    fast, usages, worker = run_mixed(target, config(draft, draft_max=8,
                                                    draft_block_size=block))
    assert fast == plain
    assert not worker.spec.failed
    for i, usage in enumerate(usages):
        if i in SILENT:
            assert usage.draft_rounds == 0
            continue
        assert usage.draft_n > 0 and usage.draft_n_accepted == usage.draft_n, (i, usage)
        assert usage.draft_n <= widest * usage.draft_rounds
        assert usage.draft_n > (widest - 1) * usage.draft_rounds  # full blocks, mostly


def test_the_context_is_the_confirmed_states_in_order(tiny_checkpoint, dflash_draft):
    """A row's drafts are what the drafter drafts on a fresh cache fed, block by block:
    the state before its first block, then the states its commit kept, then (after a
    token decoded without drafting) the state before its last token; a second row in the
    same calls keeps a cache of its own."""
    import mlx.core as mx

    session = dflash.new_session(draft_target(tiny_checkpoint),
                                 DraftOptions(model=str(dflash_draft)))
    head, width = session.head, 128  # two target layers of 64
    mx.random.seed(7)
    h_a, h_b, h_c, h_d, h_e = (mx.random.normal((k, width)) for k in (1, 3, 1, 1, 1))
    tokens, other = [5, 6, 7, 8, 9, 10], [30, 31, 32]
    first = session.propose([DraftRow(0, tokens, h_a), DraftRow(1, other, h_c)], [3, 2])
    assert [len(d) for d in first] == [3, 2]
    kept = tokens + first[0][:2] + [77]
    session.commit([DraftRow(0, kept, h_b)], [2])
    got = session.propose([DraftRow(0, kept, h_b[2:]), DraftRow(1, other + [33], h_e)],
                          [3, 2])
    session.commit([DraftRow(0, kept + [got[0][0], 90], h_b[:2])], [1])
    later = kept + [got[0][0], 90, 91]
    third = session.propose([DraftRow(0, later, h_d)], [3])[0]

    def pick(logits):
        return mx.argmax(logits[..., :session.vocab], axis=-1)

    mine, its = head.make_cache(), head.make_cache()
    want = [head.draft_block(tokens[-1], h_a[None], mine, 4, pick),
            head.draft_block(77, h_b[None], mine, 4, pick),
            head.draft_block(91, mx.concatenate([h_b[:2], h_d])[None], mine, 4, pick),
            head.draft_block(32, h_c[None], its, 3, pick),
            head.draft_block(33, h_e[None], its, 3, pick)]
    assert [first[0], got[0], third, first[1], got[1]] == [w[0].tolist() for w in want]


def registry(with_plugin: bool = True):
    return registry_with(plugin) if with_plugin else registry_with()


def test_md_with_a_dflash_checkpoint_picks_the_dflash_drafter(tiny_checkpoint, dflash_draft):
    target, draft = str(tiny_checkpoint), str(dflash_draft)
    for flags in ({}, {"spec_type": "draft-dflash"}, {"draft_kind": "dflash"}):
        picked = choose(DraftFlags(target, model_draft=draft, **flags), registry())
        assert (picked.name, picked.kind, picked.needs_model) == ("dflash", "dflash", True)
    with pytest.raises(StartupError, match="drafts as dflash, not mtp"):
        choose(DraftFlags(target, model_draft=draft, spec_type="draft-mtp"), registry())


def test_without_the_distribution_a_dflash_checkpoint_says_what_to_install(
        tiny_checkpoint, dflash_draft):
    with pytest.raises(StartupError, match=r"pip install 'mlxcel-drafter-mtp'") as e:
        choose(DraftFlags(str(tiny_checkpoint), model_draft=str(dflash_draft)),
               registry(False))
    assert "\n" not in str(e.value)


def test_draft_dflash_with_another_checkpoint_refuses(tiny_checkpoint):
    target = str(tiny_checkpoint)
    with pytest.raises(StartupError, match="no installed dflash drafter serves model_type "
                                           "'qwen3'") as e:
        choose(DraftFlags(target, model_draft=target, spec_type="draft-dflash"), registry())
    assert "\n" not in str(e.value)
    with pytest.raises(StartupError, match="needs its checkpoint: -md"):
        choose(DraftFlags(target, spec_type="draft-dflash"), registry())
    # -md a qwen3 checkpoint without --spec-type stays a draft model
    assert choose(DraftFlags(target, model_draft=target), registry()).name == "draft-model"
    with pytest.raises(StartupError, match="not a DFlash checkpoint") as e:
        dflash.new_session(draft_target(tiny_checkpoint), DraftOptions(model=target))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("changes", "says"), [
    ({"num_target_layers": 4, "dflash_config": {"mask_token_id": 3,
                                                "target_layer_ids": [0, 3]}},
     r"drafts for a target of 4 layers \(it reads layers \[0, 3\]\); this target has 2"),
    ({"dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2]}},
     r"reads layers \[0, 2\]\); this target has 2"),
    ({"vocab_size": 256}, "vocabulary size 256 \\(draft\\) vs 512 \\(target\\)"),
    ({"hidden_size": 32}, "hidden size 32 \\(draft\\) vs 64 \\(target\\)"),
])
def test_a_drafter_for_another_target_refuses_in_one_line(tiny_checkpoint, tmp_path,
                                                          changes, says):
    from dflash_fixtures import with_dflash

    draft = with_dflash(tmp_path / "draft", tiny_checkpoint, **changes)
    with pytest.raises(StartupError, match=says) as e:
        dflash.new_session(draft_target(tiny_checkpoint), DraftOptions(model=str(draft)))
    assert "\n" not in str(e.value)


def test_a_dflash_checkpoint_with_another_tokenizer_refuses(tiny_checkpoint, tmp_path,
                                                            mlxcel_checkpoint_cache):
    from dflash_fixtures import with_dflash
    from mlxcel.testing.checkpoint import cached_checkpoint

    llama = cached_checkpoint("llama", mlxcel_checkpoint_cache)
    draft = with_dflash(tmp_path / "draft", tiny_checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (draft / name).write_bytes((llama / name).read_bytes())
    with pytest.raises(StartupError, match="its tokenizer differs from the target's") as e:
        dflash.new_session(draft_target(tiny_checkpoint), DraftOptions(model=str(draft)))
    assert "\n" not in str(e.value)


def test_a_block_of_one_refuses(tiny_checkpoint, dflash_draft):
    with pytest.raises(StartupError, match="--draft-block-size 1"):
        dflash.new_session(draft_target(tiny_checkpoint),
                           DraftOptions(model=str(dflash_draft), block_size=1))


def test_the_server_serves_draft_dflash_and_reports_draft_kind_dflash(constant_pair):
    target, draft = constant_pair
    check_server_drafts(target, "dflash", model_draft=str(draft), spec_type="draft-dflash")
