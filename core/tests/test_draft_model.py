"""The draft-model drafter (``-md``): its batched session, exact output in the batch, the
vocabulary check, the flags, and the startup exactness probe."""

from __future__ import annotations

import mlx.core as mx
import msgspec
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlxcel.drafters import model as draft_model
from mlxcel.drafters.api import DraftOptions, DraftRow
from mlxcel.engine import spec_probe
from mlxcel.engine.config import EngineConfig
from mlxcel.errors import StartupError
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.conformance import check_drafter
from mlxcel.testing.draft_checkpoints import draft_pair
from mlxcel.testing.drafting import draft_target
from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for

SESSION = "mlxcel.drafters.model:new_session"
PROMPTS = [[5, 6, 7, 8, 9, 10], [20, 21, 22], list(range(30, 61)), [100, 200, 100],
           [7, 7, 7, 7], [300, 301]]


@pytest.fixture(scope="module")
def pair(mlxcel_checkpoint_cache):
    """(target, draft): the draft is the target's first layers (high acceptance)."""
    return draft_pair(mlxcel_checkpoint_cache)


@pytest.fixture(scope="module")
def stranger(mlxcel_checkpoint_cache):
    """Another random model with the target's tokenizer (low acceptance)."""
    return cached_checkpoint("qwen3", mlxcel_checkpoint_cache, num_layers=2, seed=7,
                             suppress_eos=True)


def draft_config(draft, **kw) -> EngineConfig:
    return EngineConfig(drafter=SESSION, drafter_kind="draft", model_draft=str(draft), **kw)


def run(target, config, prompts, max_tokens=24, stagger=True, parallel=8):
    """Each prompt's greedy tokens and usage; rows join one step apart and ask for
    different lengths, so they also leave at different times."""
    worker = worker_for(target, parallel=parallel, config=config)
    sinks = []
    for i, prompt in enumerate(prompts):
        sink = ListSink()
        worker.enqueue(request(prompt, max_tokens + 3 * i), sink)
        sinks.append(sink)
        if stagger:
            worker.step()
    run_until_done(worker, sinks)
    return [s.tokens for s in sinks], [s.last.usage for s in sinks]


def greedy(model, context, n):
    """The draft model's own greedy continuation, one token per forward."""
    cache = make_prompt_cache(model)
    y, out = mx.array([context]), []
    for _ in range(n):
        t = int(mx.argmax(model(y, cache)[0, -1]).item())
        out.append(t)
        y = mx.array([[t]])
    return out


# -- the session -----------------------------------------------------------------------------

def test_batched_drafts_are_the_draft_models_greedy_tokens_as_rows_join_and_leave(pair):
    target, draft = pair
    model, _, _ = draft_model.load_draft(str(draft))
    assert draft_model.batchable(model)
    batched = draft_model.BatchedDraft(model, 512)
    rounds = [  # (rows, limits): contexts grow, diverge from the drafts, rows come and go
        ([DraftRow(i, p) for i, p in enumerate(PROMPTS[:4])], [4, 3, 2, 5]),
        ([DraftRow(i, p + [9, 8]) for i, p in enumerate(PROMPTS[:4]) if i != 0], [4, 0, 2]),
        ([DraftRow(0, PROMPTS[0] + [1]), DraftRow(3, PROMPTS[3] + [9, 8, 7, 6, 5]),
          DraftRow(4, PROMPTS[4])], [3, 6, 2]),
        # row 3's key comes back with another context (a new row that got a departed key)
        ([DraftRow(3, PROMPTS[5] * 3), DraftRow(4, PROMPTS[4] + [2])], [4, 3]),
    ]
    for n, (rows, limits) in enumerate(rounds):
        got = batched.propose(rows, limits)
        want = [greedy(model, r.tokens, k) if k else [] for r, k in zip(rows, limits,
                                                                        strict=True)]
        assert got == want, f"round {n}"
        if n == 1:
            batched.release([2])  # row 2 left the batch
            assert 2 not in batched.covered and len(batched.order) == 3
    batched.release(list(batched.covered))
    assert batched.cache is None and not batched.order


def test_the_row_by_row_session_drafts_the_same_tokens(pair):
    _, draft = pair
    model, _, _ = draft_model.load_draft(str(draft))
    rows = [DraftRow(i, p) for i, p in enumerate(PROMPTS)]
    limits = [4, 3, 2, 5, 1, 4]
    batched = draft_model.BatchedDraft(model, 512).propose(rows, limits)
    by_row = draft_model.RowDraft(model, 512)
    assert by_row.propose(rows, limits) == batched
    later = [DraftRow(r.key, r.tokens + d[:1]) for r, d in zip(rows, batched, strict=True)]
    assert by_row.propose(later, limits) == [greedy(model, r.tokens, k)
                                             for r, k in zip(later, limits, strict=True)]


def test_the_draft_model_passes_the_drafter_conformance(pair):
    target, draft = pair

    def new_session(t, options):
        return draft_model.new_session(t, msgspec.structs.replace(options, model=str(draft)))

    usages = check_drafter(new_session, target, kind="draft")
    assert sum(u.draft_n_accepted for u in usages) > 0
    assert all(u.draft_kind == "draft" for u in usages if u.draft_rounds)


# -- exact output in the batch ---------------------------------------------------------------

@pytest.mark.parametrize("which", ["truncated", "stranger"])
def test_greedy_output_is_the_same_with_and_without_the_draft_model(pair, stranger, which):
    target, draft = pair
    drafter = draft if which == "truncated" else stranger
    plain, _ = run(target, None, PROMPTS)
    fast, usages = run(target, draft_config(drafter, draft_max=4, prompt_lookup="on"), PROMPTS)
    assert fast == plain
    assert all(u.draft_kind == "draft" and u.draft_n > 0 for u in usages)
    rate = sum(u.draft_n_accepted for u in usages) / sum(u.draft_n for u in usages)
    if which == "truncated":
        assert rate > 0.5
    else:
        assert rate < 0.5


def test_one_row_alone_is_exact_too(pair):
    target, draft = pair
    plain, _ = run(target, None, PROMPTS[2:3], max_tokens=40, parallel=1)
    fast, usages = run(target, draft_config(draft), PROMPTS[2:3], max_tokens=40, parallel=1)
    assert fast == plain and usages[0].draft_rounds > 0


# -- startup checks --------------------------------------------------------------------------

def test_a_draft_with_another_vocabulary_is_refused(pair, mlxcel_checkpoint_cache):
    target, _ = pair
    bigger = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, vocab_size=640)
    with pytest.raises(StartupError, match="vocabulary size 512 .target. vs 640 .draft."):
        draft_model.new_session(draft_target(target), DraftOptions(model=str(bigger)))
    other = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, template="llama3")
    with pytest.raises(StartupError, match="tokenizer differs") as info:
        draft_model.new_session(draft_target(target), DraftOptions(model=str(other)))
    assert "\n" not in str(info.value)


def test_a_draft_that_cannot_load_is_one_line(pair, tmp_path):
    target, _ = pair
    with pytest.raises(StartupError, match="cannot load the draft model|not a model directory"):
        draft_model.new_session(draft_target(target), DraftOptions(model=str(tmp_path)))
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(StartupError, match="cannot load the draft model") as info:
        draft_model.new_session(draft_target(target), DraftOptions(model=str(tmp_path)))
    assert "\n" not in str(info.value)


def test_the_engine_refuses_a_bad_draft_at_setup(pair, mlxcel_checkpoint_cache):
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.testing.engine import _load

    target, _ = pair
    bigger = cached_checkpoint("qwen3", mlxcel_checkpoint_cache, vocab_size=640)
    worker = EngineWorker(_load(target), parallel=2, prefill_chunk=64,
                          config=draft_config(bigger))
    assert not worker.setup()
    assert "vocabulary size" in worker.error and "\n" not in worker.error


def test_md_picks_the_draft_model_over_prompt_lookup(pair):
    from mlxcel.engines import engine_config
    from mlxcel.options import build_parser
    from mlxcel.settings import Settings

    target, draft = pair
    plugins = load_plugins()
    for flag in ("-md", "--model-draft", "--draft-model", "--spec-draft-model"):
        args = build_parser().parse_args(["-m", str(target), flag, str(draft)])
        config = engine_config(Settings(**vars(args)), plugins)
        assert (config.drafter, config.drafter_kind) == (SESSION, "draft")
        assert config.model_draft == str(draft) and config.prompt_lookup == "auto"
        assert not config.draft_force
    args = build_parser().parse_args(["-m", str(target), "--draft-force"])
    config = engine_config(Settings(**vars(args)), plugins)
    assert config.drafter_kind == "prompt-lookup" and config.draft_force


# -- the exactness probe ---------------------------------------------------------------------

def skewed(model):
    """``model`` (a loaded target), changed so that a forward of 2 to 5 tokens over a
    non-empty cache (a verify step's shape, never a decode step's) prefers another token
    at its second position: what a verify kernel that rounds differently would do on a
    near tie. Its class is swapped for a subclass, so everything else stays the model's."""
    base = type(model)

    def call(self, inputs, cache=None, *args, **kw):
        logits = base.__call__(self, inputs, cache, *args, **kw)
        offset = getattr(cache[0], "offset", 0) if cache else 0
        if 2 <= inputs.shape[1] <= 5 and isinstance(offset, int) and offset > inputs.shape[1]:
            bump = mx.zeros(logits.shape).at[:, 1, 3].add(1e4)
            logits = logits + bump.astype(logits.dtype)
        return logits

    model.__class__ = type(f"Skewed{base.__name__}", (base,), {"__call__": call})
    return model


def test_the_probe_passes_an_exact_pairing_and_refuses_an_inexact_one(pair):
    target, draft = pair
    t = draft_target(target)
    options = DraftOptions(model=str(draft))
    session = draft_model.new_session(t, options)
    result = spec_probe.probe(t.model, t.tokenizer, session, options)
    assert result.exact and result.drafted > 0 and result.accepted > 0
    assert result.plain == spec_probe.plain_tokens(t.model, spec_probe.prompt_ids(t.tokenizer),
                                                   spec_probe.NEW_TOKENS)
    skew = skewed(load_checkpoint(str(target), load_plugins().families).model)
    bad = spec_probe.probe(skew, t.tokenizer, session, options)
    assert not bad.exact
    with pytest.raises(StartupError, match="inexact.*--draft-force"):
        spec_probe.check_pairing(skew, t.tokenizer, session, options, "draft", force=False)
    spec_probe.check_pairing(skew, t.tokenizer, session, options, "draft", force=True)


def test_the_engine_refuses_an_inexact_pairing_unless_forced(pair):
    from mlxcel.engine.worker import EngineWorker

    target, draft = pair
    families = load_plugins().families

    def skewed_load():
        ckpt = load_checkpoint(str(target), families)
        skewed(ckpt.model)
        return ckpt

    refused = EngineWorker(skewed_load, parallel=2, prefill_chunk=64,
                           config=draft_config(draft), policy=None)
    assert not refused.setup() and "--draft-force" in refused.error
    forced = EngineWorker(skewed_load, parallel=2, prefill_chunk=64,
                          config=draft_config(draft, draft_force=True))
    assert forced.setup(), forced.error
    assert forced.spec is not None and forced.spec.kind == "draft"


def test_the_draft_computes_in_the_targets_dtype(pair):
    from mlxcel.backend import model_dtype

    target, draft = pair
    t = draft_target(target, dtype="float16")
    session = draft_model.new_session(t, DraftOptions(model=str(draft)))
    want = model_dtype(t.model.model)
    assert want == "float16"
    stored, _, _ = draft_model.load_draft(str(draft))
    assert model_dtype(session.model) == want
    assert model_dtype(stored) == "bfloat16"  # as saved: only the session's copy is cast


def test_verify_numerics_decide_whether_prompt_lookup_is_on_by_default(pair):
    """Prompt lookup, on by default, stays off where a verify forward rounds differently
    from a one-token step; ``--prompt-lookup on`` still serves it there."""
    from mlxcel.engine.worker import EngineWorker

    target, _ = pair
    families = load_plugins().families
    t = draft_target(target)
    assert spec_probe.verify_deviation(t.model, t.tokenizer) <= spec_probe.TOLERANCE
    skew = skewed(load_checkpoint(str(target), families).model)
    assert spec_probe.verify_deviation(skew, t.tokenizer) > spec_probe.TOLERANCE

    def load(skew: bool):
        def go():
            ckpt = load_checkpoint(str(target), families)
            if skew:
                skewed(ckpt.model)
            return ckpt
        return go

    def lookup(mode: str) -> EngineConfig:
        return EngineConfig(drafter="mlxcel.drafters.lookup:new_session",
                            drafter_kind="prompt-lookup", prompt_lookup=mode)

    for skew, mode, on in ((False, "auto", True), (True, "auto", False), (True, "on", True)):
        worker = EngineWorker(load(skew), parallel=2, prefill_chunk=64, config=lookup(mode))
        assert worker.setup(), worker.error
        assert (worker.spec is not None) is on, (skew, mode)
