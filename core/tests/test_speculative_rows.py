"""Speculation for constrained and penalised rows, per-request draft limits, the governor's
state in /slots and /metrics, and the sampled distribution (chi-squared)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.constraints import ConstraintCompiler
from mlxcel.engine.constraints.speculate import draft_masks, drafts_with
from mlxcel.lazy import resolve
from mlxcel.plugins import load_plugins
from mlxcel.testing.drafting import chi2_independence_p
from mlxcel.testing.engine import ListSink, run_until_done, worker_for
from mlxcel.testing.stub_drafters import KnownOutputs, StubDrafter
from mlxcel.types import GenerationRequest, SamplingParams
from mlxcel.types.constraints import GrammarConstraint, JsonSchemaConstraint
from mlxcel.types.messages import Tool

GREEDY = SamplingParams(temperature=0.0)
_ids = itertools.count()
SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"},
                                           "b": {"type": "string", "maxLength": 6}},
          "required": ["a", "b"]}
GRAMMAR = 'root ::= "x" [0-9a-f]{1,4} ("," [0-9a-f]{1,4}){0,3} "."'
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"]}
TOOLS = (Tool(name="get_weather", definition={"type": "function", "function": {
    "name": "get_weather", "parameters": WEATHER}}),)


class Replay(KnownOutputs):
    """Each row's known output (``refs``: prompt -> tokens, then ``tail``), every
    ``wrong_every``-th token replaced by ``wrong``: drafts that are partly right, partly
    rejected, and for a constrained row partly forbidden."""

    def __init__(self, refs, wrong, wrong_every=4, tail=()):
        super().__init__({p: [*out, *tail] for p, out in refs.items()})
        self.wrong, self.every = wrong, wrong_every

    def draft(self, prompt, done, limit):
        return [self.wrong if (done + k) % self.every == self.every - 1 else t
                for k, t in enumerate(super().draft(prompt, done, limit))]


def gen_request(prompt, max_tokens=40, sampling=GREEDY, **kw):
    return GenerationRequest(request_id=f"r{next(_ids)}",
                             prompt_tokens=tuple(prompt), max_tokens=max_tokens,
                             sampling=sampling, **kw)


def run(checkpoint, reqs, config=None, parallel=8):
    worker = worker_for(checkpoint, parallel=parallel, config=config)
    sinks = []
    for req in reqs:
        sinks.append(ListSink())
        worker.enqueue(req, sinks[-1])
    run_until_done(worker, sinks)
    return sinks, worker


def spec(drafter, **kw):
    return EngineConfig(drafter=drafter, prompt_lookup="on", **kw)


@pytest.fixture(scope="module")
def guides(tiny_checkpoint):
    """The tiny checkpoint's tokenizer and its compiled JSON schema, GBNF grammar and
    forced tool call (the hermes format's grammar)."""
    from mlxcel.model.loader import load_checkpoint

    tok = load_checkpoint(str(tiny_checkpoint), load_plugins().families).tokenizer
    compiler = ConstraintCompiler.for_tokenizer(tok, eos_ids=set(tok.eos_ids))
    fmt = load_plugins().tool_formats.get("hermes")
    return tok, {"json": compiler.compile(JsonSchemaConstraint.from_schema(SCHEMA)),
                 "grammar": compiler.compile(GrammarConstraint(grammar=GRAMMAR)),
                 "tool": compiler.compile(resolve(fmt.grammar)(TOOLS, "required"))}


def mixed_requests(guides, sampled=False):
    """Constrained, penalised and plain rows of one batch (``sampled``: seeded rows at
    temperature 1, which must come out the same too)."""
    _, g = guides
    temp = (lambda seed: SamplingParams(temperature=1.0, seed=seed)) if sampled \
        else (lambda seed: GREEDY)
    pen = {"rep": {"repetition_penalty": 1.5}, "freq": {"frequency_penalty": 0.8,
                                                         "presence_penalty": 0.5},
           "dry": {"dry_multiplier": 0.8, "dry_allowed_length": 1},
           "bias": {"logit_bias": ((9, 4.0), (10, -float("inf")))}}
    reqs = [gen_request([5, 6, 7, 8] * 3, sampling=temp(1), ignore_eos=True)]
    for i, kind in enumerate(("json", "grammar", "tool")):
        reqs.append(gen_request([11 + i, 12, 13], 120, temp(2 + i), guide=g[kind]))
    for i, fields in enumerate(pen.values()):
        sampling = SamplingParams(temperature=1.0 if sampled else 0.0, seed=9 + i, **fields)
        reqs.append(gen_request([20 + i, 21, 22, 20 + i, 21, 22], 30, sampling,
                                ignore_eos=True))
    return reqs


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_constrained_and_penalised_rows_draft_and_keep_their_output(tiny_checkpoint, guides,
                                                                    sampled):
    tok, _ = guides
    reqs = mixed_requests(guides, sampled)
    plain, _ = run(tiny_checkpoint, reqs)
    refs = {r.prompt_tokens: s.tokens for r, s in zip(reqs, plain, strict=True)}
    forbidden = tok.hf.token_to_id("<|im_start|>")  # a special token: never JSON text
    drafter = Replay(refs, forbidden, tail=[min(tok.eos_ids)])
    fast, _ = run(tiny_checkpoint, reqs, spec(drafter, draft_max=6))
    assert [s.tokens for s in fast] == [s.tokens for s in plain]
    assert [s.last.finish_reason for s in fast] == [s.last.finish_reason for s in plain]
    for s in fast:
        usage = s.last.usage
        assert usage.draft_rounds > 0 and 0 < usage.draft_n_accepted < usage.draft_n, usage
    assert [s.last.finish_reason for s in plain[1:4]] == ["stop"] * 3  # the matches ended


def test_a_row_whose_constraint_waits_or_cannot_rewind_does_not_draft(guides):
    from mlxcel.engine.budget import ReasoningBudget

    _, g = guides
    assert drafts_with(None) and drafts_with(g["json"].matcher())
    assert not drafts_with(g["json"].matcher(active=False))  # waits for guide_after
    assert not drafts_with(ReasoningBudget(g["json"].matcher(), 8, "<think>", "</think>",
                                           (1,), True))


@pytest.mark.parametrize("kind", ["json", "grammar", "tool"])
def test_draft_masks_are_each_prefix_state_and_leave_the_matcher_where_it_was(guides, kind):
    """Each position's mask equals a fresh matcher's after the same prefix; a forbidden
    token ends the draft; the matcher ends where it began, EOS included."""
    tok, g = guides
    compiled = g[kind]
    walker = compiled.matcher()
    masks = np.zeros((1, 16), np.int32)
    path = []  # a valid walk: the lowest allowed non-EOS token each step, then EOS
    for _ in range(12):
        walker.write_mask_into(masks[0])
        bits = np.unpackbits(masks[0].view(np.uint8), bitorder="little")
        allowed = [t for t in np.flatnonzero(bits).tolist() if t not in tok.eos_ids]
        if not allowed:
            break
        path.append(allowed[len(path) % len(allowed)])
        assert walker.advance(path[-1])
    forbidden = tok.hf.token_to_id("<|im_start|>")
    matcher = compiled.matcher()
    assert matcher.advance(path[0])
    rows = np.full((len(path) + 1, 16), -1, np.int32)
    draft = path[1:6] + [forbidden] + path[6:]
    assert draft_masks(matcher, draft, rows) == 5
    fresh = compiled.matcher()
    expect = np.zeros(16, np.int32)
    for j, token in enumerate(path[:6]):
        assert fresh.advance(token)
        fresh.write_mask_into(expect)
        assert (rows[j] == expect).all(), j
    assert (rows[6] == -1).all()  # after the forbidden token: nothing written
    again = np.zeros(16, np.int32)
    matcher.write_mask_into(again)
    first = compiled.matcher()
    first.advance(path[0])
    first.write_mask_into(expect)
    assert (again == expect).all() and not matcher.finished
    # an EOS in an accepting state ends the draft and is taken back too
    for token in path[1:]:
        assert matcher.advance(token)
    if matcher.accepting:
        eos = min(tok.eos_ids)
        assert draft_masks(matcher, [eos, path[0]], rows) == 1
        assert not matcher.finished and matcher.accepting


def test_stop_strings_and_logprobs_are_those_of_one_token_steps(tiny_checkpoint):
    """A row whose kept drafts run past a stop string ends at the stop with the same text;
    logprobs (top 3) match one-token steps."""
    prompt = [30, 31, 32, 33, 30, 31]
    free, _ = run(tiny_checkpoint, [gen_request(prompt, 24, ignore_eos=True)])
    text = "".join(e.text for e in free[0].events)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    sampling = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=3)
    req = gen_request(prompt, 24, sampling, ignore_eos=True, stop=(stop,))
    plain, _ = run(tiny_checkpoint, [req])
    drafter = Replay({req.prompt_tokens: free[0].tokens}, 0, wrong_every=1000)
    fast, _ = run(tiny_checkpoint, [req], spec(drafter, draft_max=8))
    (a,), (b,) = plain, fast
    assert b.last.usage.draft_n_accepted > 0
    assert b.last.finish_reason == a.last.finish_reason == "stop"
    assert "".join(e.text for e in b.events) == "".join(e.text for e in a.events)
    la = [lp for e in a.events for lp in e.logprobs]
    lb = [lp for e in b.events for lp in e.logprobs]
    assert [x.token for x in la] == [x.token for x in lb]
    for x, y in zip(la, lb, strict=True):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-3)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]


class Fixed(StubDrafter):
    """Proposes ``n`` tokens (the row's last token again), whatever the limit allows."""

    def __init__(self, n):
        self.n = n

    def propose(self, rows, limits):
        return [[row.tokens[-1]] * min(self.n, limit) for row, limit in zip(rows, limits,
                                                                             strict=True)]


def test_per_request_draft_limits_cap_and_floor_each_row(tiny_checkpoint):
    prompt = [40, 41, 42, 43] * 3
    reqs = [gen_request(prompt, 30, ignore_eos=True, draft_max=0),
            gen_request(prompt + [1], 30, ignore_eos=True, draft_max=2),
            gen_request(prompt + [2], 30, ignore_eos=True, draft_min=7),
            gen_request(prompt + [3], 30, ignore_eos=True)]
    plain, _ = run(tiny_checkpoint, reqs)
    fast, _ = run(tiny_checkpoint, reqs, spec(Fixed(5), draft_max=6))
    assert [s.tokens for s in fast] == [s.tokens for s in plain]
    none, capped, floored, free = (s.last.usage for s in fast)
    assert none.draft_rounds == 0 and none.draft_kind is None
    assert capped.draft_rounds > 0 and capped.draft_n <= 2 * capped.draft_rounds
    assert floored.draft_rounds == 0  # 5 proposed, fewer than its floor of 6 (the cap)
    assert free.draft_rounds > 0 and free.draft_n >= 5  # its first round drafted 5


# -- the sampled distribution --------------------------------------------------------------

@pytest.fixture(scope="module")
def small_vocab(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", mlxcel_checkpoint_cache, vocab_size=300, hidden_size=32,
                             num_layers=1)


def _cells(outputs, top):
    """Each output's first three tokens, each as itself when it is ``top`` else -1."""
    return Counter(tuple(t if t == top else -1 for t in out[:3]) for out in outputs)


@pytest.mark.parametrize("fields", [{}, {"frequency_penalty": 1.5}],
                         ids=["plain", "penalised"])
def test_sampled_outputs_keep_the_target_distribution_chi_squared(small_vocab, fields):
    """Unseeded temperature-1 rows on a 300-token vocabulary, prompt lookup forced on over
    a prompt ending in the run the model repeats: the first three tokens' joint
    distribution (each the run's token or another; the first is never drafted, the next
    two are) with and without speculation agree at p = 0.001. Emitting drafts unchecked would put the run's token everywhere; penalties
    that missed the draft before a position would favour it after itself."""
    from mlxcel.drafters import lookup

    probe, _ = run(small_vocab, [gen_request([5, 6, 7, 8], 12, ignore_eos=True)])
    top = Counter(probe[0].tokens).most_common(1)[0][0]
    prompt = [5, 6, 7, 8] + [top] * 6
    sampling = SamplingParams(temperature=1.0, **fields)
    n = 480
    reqs = [gen_request(prompt, 4, sampling, ignore_eos=True) for _ in range(n)]
    plain, _ = run(small_vocab, reqs, parallel=48)
    fast, _ = run(small_vocab, reqs, spec(lookup.new_session, draft_max=2), parallel=48)
    usage = [s.last.usage for s in fast]
    assert sum(u.draft_rounds for u in usage) >= n // 4
    assert 0 < sum(u.draft_n_accepted for u in usage) < sum(u.draft_n for u in usage)
    a, b = _cells([s.tokens for s in plain], top), _cells([s.tokens for s in fast], top)
    cells = sorted(set(a) | set(b))
    table = [[a[c] for c in cells], [b[c] for c in cells]]
    p = chi2_independence_p(table)
    assert p > 0.001, (a, b)


# -- the governors' state in /slots and /metrics -------------------------------------------

class Wrong(Fixed):
    """Proposes a token the model never picks, so every round is rejected."""

    def propose(self, rows, limits):
        return [[self.n] * limit for limit in limits]


def test_slots_and_metrics_show_each_rows_drafting_and_the_governors(tiny_checkpoint):
    from types import SimpleNamespace

    from mlxcel.dialects.llamacpp.slots import running
    from mlxcel.metrics import MlxcelCollector, RequestCounters

    prompt = list(range(40, 60))
    (plain,), _ = run(tiny_checkpoint, [gen_request(prompt, 60, ignore_eos=True)])
    wrong = next(t for t in range(1000) if t not in plain.tokens)
    worker = worker_for(tiny_checkpoint, parallel=2, config=spec(Wrong(wrong), draft_max=4))
    sinks = [ListSink(), ListSink()]
    worker.enqueue(gen_request(prompt, 60, ignore_eos=True), sinks[0])
    worker.enqueue(gen_request(prompt[1:], 60, ignore_eos=True, draft_max=0), sinks[1])
    for _ in range(40):
        worker.step()
        rows = worker.batch.rows
        if rows and rows[0].drafts.rounds >= 2:
            break
    tok = worker.checkpoint.tokenizer
    spec_state = worker.spec
    drafting, off = (running(s, tok, spec_state, 2) for s in worker.batch.rows)
    state = drafting["draft"]
    assert state["state"] == "backed_off" and state["resume_step"] > state["step"]
    assert state["rounds"] == 2 and state["drafted"] > 0 and state["accepted"] == 0
    assert state["kind"] == "prompt-lookup" and 1 <= state["length"] <= 4
    assert drafting["params"]["speculative.n_max"] == 4
    assert off["draft"]["state"] == "off" and off["params"]["speculative.n_max"] == 0
    assert off["draft"]["rounds"] == 0

    engine = SimpleNamespace(state="ready", parallel=2, active_count=2, queue_depth=0,
                             stats=worker.stats, speculation=spec_state)

    def gauges():
        return {m.name: m.samples[0].value
                for m in MlxcelCollector(RequestCounters(), engine).collect()}

    assert gauges()["mlxcel_draft_paused"] == 0 and gauges()["mlxcel_draft_rows_backed_off"] == 1
    spec_state.governed = True  # the batch governor stops this batch size for a while
    spec_state.batch.off_until[spec_state.batch.bucket(2)] = spec_state.batch.steps + 50
    paused = running(worker.batch.rows[0], tok, spec_state, 2)["draft"]
    assert paused["state"] == "paused" and paused["resume_step"] == paused["step"] + 50
    assert gauges()["mlxcel_draft_paused"] == 1
    run_until_done(worker, sinks)
    assert sinks[0].tokens == plain.tokens


# -- the request fields --------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    from mlxcel.testing.engine import app_client

    with app_client(tiny_checkpoint, prompt_lookup="on", draft_max=6) as c:
        yield c


PROMPT = "alpha beta gamma delta " * 8
ROUTES = [("/completion", {"prompt": PROMPT, "n_predict": 24}),
          ("/completions", {"prompt": PROMPT, "n_predict": 24}),
          ("/v1/completions", {"prompt": PROMPT, "max_tokens": 24}),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                    "max_tokens": 24})]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
@pytest.mark.parametrize("bad", [-1, "4", 2.5, True, 5000])
def test_bad_draft_limits_are_the_dialects_400(client, path, body, bad):
    for field in ("speculative.n_max", "speculative.n_min"):
        r = client.post(path, json={**body, field: bad})
        assert r.status_code == 400, (field, r.text)
        assert field in r.text


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
def test_n_max_zero_drafts_nothing_and_two_caps_each_round(client, path, body):
    base = {**body, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    none = client.post(path, json={**base, "speculative.n_max": 0}).json()
    assert "draft_n" not in none.get("timings", {})
    capped = client.post(path, json={**base, "speculative.n_max": 2,
                                     "speculative.n_min": 9}).json()["timings"]
    assert capped["draft_rounds"] >= 1 and capped["draft_n"] <= 2 * capped["draft_rounds"]
    free = client.post(path, json=base).json()
    assert answer(none) == answer(free) and answer(free)


def answer(body):
    """The generated text of a native, completion or chat completion body."""
    if "content" in body:
        return body["content"]
    choice = body["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]
