"""Prompt-cache checkpoints on every cache kind: a later prompt that shares a boundary of an
earlier one (the system + tools prefix, a message boundary, the prompt's end, an interval)
reuses the state there, gives the logits a cold prefill gives, alone and in a batch, and
misses where the prompts differ.

Float32 checkpoints: a hit's and a cold run's log-probabilities agree to 1e-4
(docs/explanation/batching.md).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from mlxcel.engine.cache.capture import NEAR, marks_for
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.testing.engine import engine_for, request
from mlxcel.types import SamplingParams

KINDS = {  # cache kind -> model_type, all on mlx-lm's batch caches but plain
    "plain": "qwen3",
    "rotating": "gemma3_text",
    "kv-shared": "gemma4_text",
    "recurrent": "qwen3_next",
    "cachelist": "falcon_h1",
}
LOGPROBS = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=4)
rng = random.Random(11)


def tokens(n: int) -> list[int]:
    return [rng.randrange(5, 400) for _ in range(n)]


# an agent conversation: system + tools, an earlier exchange, the final user message, the
# generation prompt; its boundaries as the chat layer marks them
SYSTEM, EARLIER, USER, GEN = tokens(40), tokens(30), tokens(20), tokens(3)
PROMPT = SYSTEM + EARLIER + USER + GEN
MARKS = ((40, "system"), (70, "turn"), (90, "turn"))
# later prompts, each sharing one boundary of PROMPT: (prompt, reused tokens, hit kind)
LATER = {
    # the next turn shares the whole prompt: it hits the end of the messages (the
    # prompt's own end, 2 tokens on, is not taken: capture.NEAR)
    "next-turn": (PROMPT + tokens(12) + tokens(9), 90, "turn"),
    "turn-end": (PROMPT[:90] + tokens(25), 90, "turn"),
    "turn-before-user": (PROMPT[:70] + tokens(30), 70, "turn"),
    "system": (SYSTEM + tokens(35), 40, "system"),
}


def checkpoint(kind, cache_dir):
    return cached_checkpoint(KINDS[kind], cache_dir=cache_dir, dtype="float32")


def engine(path, interval=0, cache_bytes=1 << 28, parallel=2):
    return engine_for(path, parallel, cache=cache_bytes, chunk=32,
                      config=EngineConfig(cache_checkpoint_interval=interval))


async def _collect(eng, req):
    ids, tops, last = [], [], None
    async for event in eng.submit(req):
        ids.extend(event.token_ids)
        tops.extend([(t.token, t.logprob, *t.top) for t in event.logprobs])
        last = event
    return ids, last.usage.cached_tokens, tops


def generate(eng, *prompts, marks=MARKS, max_tokens=3):
    """Each prompt's (tokens, cached tokens, per-token log-probabilities), submitted at once."""
    async def go():
        return await asyncio.gather(*(_collect(eng, request(p, max_tokens, LOGPROBS,
                                                            cache_marks=marks))
                                      for p in prompts))
    return asyncio.run(go())


def cold_run(path, prompt):
    """``prompt``'s (tokens, cached tokens, log-probabilities) on a server with no cache."""
    cold = engine_for(path, 1, chunk=32)
    try:
        return generate(cold, prompt)[0]
    finally:
        cold.shutdown()


def same_logits(a, b):
    """Two runs' log-probabilities, token by token: the same tokens, values to 1e-4."""
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        assert x[0] == y[0]
        assert abs(x[1] - y[1]) < 1e-4
        assert [t for t, _ in x[2:]] == [t for t, _ in y[2:]]
        assert all(abs(p - q) < 1e-4 for (_, p), (_, q) in zip(x[2:], y[2:], strict=True))


@pytest.fixture(scope="module")
def cold_runs(mlxcel_checkpoint_cache):
    """Every later prompt's output on a server with no prompt cache, per kind."""
    found = {}

    def cold(kind):
        if kind not in found:
            eng = engine_for(checkpoint(kind, mlxcel_checkpoint_cache), 1, chunk=32)
            try:
                found[kind] = {name: generate(eng, p)[0] for name, (p, _, _) in LATER.items()}
                found[kind]["interval"] = generate(eng, INTERVAL_LATER)[0]
            finally:
                eng.shutdown()
        return found[kind]
    return cold


INTERVAL_LATER = PROMPT[:35] + tokens(20)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_boundary_hits_with_a_cold_prefills_logits(kind, mlxcel_checkpoint_cache,
                                                        cold_runs):
    path = checkpoint(kind, mlxcel_checkpoint_cache)
    cold = cold_runs(kind)
    eng = engine(path)
    try:
        mode = eng.prompt_cache.stats()["reuse"]
        assert mode == ("prefix" if kind == "plain" else mode)
        for name, (later, reused, hit_kind) in LATER.items():
            eng.prompt_cache.reset()
            assert generate(eng, PROMPT)[0][1] == 0
            ids, cached, tops = generate(eng, later)[0]
            if kind == "plain":  # any block-aligned prefix: no checkpoints needed
                assert cached == reused - reused % 16, name
            else:
                assert cached == reused, name
                stats = eng.prompt_cache.stats()
                assert stats["hits_by_kind"].get(hit_kind, 0) >= 1, (name, stats)
            assert ids == cold[name][0]
            same_logits(tops, cold[name][2])
        stats = eng.prompt_cache.stats()
        if kind == "plain":
            assert stats["checkpoints"] == 0
        else:
            assert stats["checkpoints"] > 0 and stats["checkpoint_bytes"] > 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("kind", ["recurrent", "rotating", "kv-shared", "cachelist"])
def test_interval_checkpoints_and_misses(kind, mlxcel_checkpoint_cache, cold_runs):
    """Every 2 blocks: a prompt that shares 35 tokens (no marked boundary) reuses 32; one
    that differs from the first block on reuses nothing."""
    path = checkpoint(kind, mlxcel_checkpoint_cache)
    eng = engine(path, interval=2)
    try:
        generate(eng, PROMPT, marks=())
        ids, cached, tops = generate(eng, INTERVAL_LATER, marks=())[0]
        assert cached == 32
        assert eng.prompt_cache.stats()["hits_by_kind"].get("interval") == 1
        assert ids == cold_runs(kind)["interval"][0]
        same_logits(tops, cold_runs(kind)["interval"][2])
        _, cached, _ = generate(eng, [1, 2, 3] + PROMPT[3:60], marks=())[0]
        assert cached == 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_hits_in_a_batch_give_what_they_give_alone(kind, mlxcel_checkpoint_cache,
                                                  cold_runs):
    """Two hits at different boundaries and one cold prompt prefill as one group."""
    path = checkpoint(kind, mlxcel_checkpoint_cache)
    cold = cold_runs(kind)
    eng = engine(path, parallel=4)
    try:
        generate(eng, PROMPT)
        runs = generate(eng, LATER["system"][0], LATER["turn-end"][0], LATER["next-turn"][0])
        reused = [40, 90, 90]
        if kind == "plain":
            reused = [n - n % 16 for n in reused]
        assert [r[1] for r in runs] == reused
        for r, name in zip(runs, ("system", "turn-end", "next-turn"), strict=True):
            assert r[0] == cold[name][0]
            same_logits(r[2], cold[name][2])
    finally:
        eng.shutdown()


def test_checkpoints_are_taken_in_a_group_and_honour_cache_prompt(mlxcel_checkpoint_cache):
    """Rows prefilled together each keep their own checkpoints; a request with
    ``cache_prompt: false`` neither reuses nor leaves anything."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    eng = engine(path, parallel=4)
    try:
        other = tokens(40) + tokens(50)
        generate(eng, PROMPT, other, marks=MARKS)
        assert generate(eng, other[:40] + tokens(10), marks=())[0][1] == 40
        assert generate(eng, LATER["system"][0])[0][1] == 40
        assert generate(eng, other[:39] + tokens(10), marks=())[0][1] == 0  # before a mark
        before = eng.prompt_cache.stats()

        async def uncached():
            req = request(LATER["turn-end"][0], 3, LOGPROBS, cache_marks=MARKS,
                          cache_prompt=False)
            return await _collect(eng, req)
        assert asyncio.run(uncached())[1] == 0
        after = eng.prompt_cache.stats()
        assert (after["inserts"], after["lookups"]) == (before["inserts"], before["lookups"])
    finally:
        eng.shutdown()


@pytest.mark.parametrize("kind", ["recurrent", "rotating", "kv-shared", "cachelist"])
def test_eviction_keeps_the_system_checkpoint_longest(kind, mlxcel_checkpoint_cache):
    """Under a budget of under two conversations, a third evicts by value: the oldest
    conversation shrinks to its system checkpoint instead of leaving, so a sub-agent
    sharing only the system prompt still hits."""
    path = checkpoint(kind, mlxcel_checkpoint_cache)
    def conversation():  # its prompt's end past NEAR of the system checkpoint it hits
        return SYSTEM + tokens(80) + tokens(3)

    probe = engine(path)
    try:
        generate(probe, conversation(), marks=((40, "system"),))
        one = probe.prompt_cache.stats()["bytes"]
    finally:
        probe.shutdown()
    eng = engine(path, cache_bytes=int(one * 1.6))
    try:
        for _ in range(3):
            generate(eng, conversation(), marks=((40, "system"),))
        stats = eng.prompt_cache.stats()
        assert stats["shrinks"] >= 1 and stats["bytes"] <= int(one * 1.6)
        assert generate(eng, SYSTEM + tokens(20), marks=())[0][1] == 40
    finally:
        eng.shutdown()


def no_extract_merge(rows):
    """A family's ``batch_cache`` factory whose batch caches cannot copy a row out."""
    from mlxcel.engine.mixed_batch import merge_rows

    caches = merge_rows(rows)
    for c in caches:
        c.extract = None  # calling it raises, as a cache class without ``extract`` would
    return caches


def test_a_cache_that_cannot_be_copied_out_costs_checkpoints_not_answers(
        mlxcel_checkpoint_cache, cold_runs):
    from mlxcel.engine.cache.prompt_cache import PromptCache
    from mlxcel.testing.engine import with_family

    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    eng = engine_for(with_family(path, batch_cache=f"{__name__}:no_extract_merge"), 2,
                     cache=PromptCache(1 << 28), chunk=32)
    try:
        assert eng.worker.ready.wait(60) and eng.worker.path == "mixed"
        ids, _, tops = generate(eng, LATER["system"][0])[0]
        assert ids == cold_runs("recurrent")["system"][0]
        assert eng.prompt_cache.stats()["checkpoints"] == 0
    finally:
        eng.shutdown()


def test_a_conversation_keeps_one_entry_when_answers_come_back_as_text(
        mlxcel_checkpoint_cache):
    """Each turn re-sends the answer re-rendered (here: other tokens than were sampled)
    and hits the previous turn's checkpoint: the previous entry is superseded, its
    checkpoints adopted, so the cache holds one entry for the conversation."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    eng = engine(path)
    try:
        prompt, previous = SYSTEM + tokens(20) + tokens(3), None
        for _ in range(4):
            _, cached, _ = generate(eng, prompt, marks=((40, "system"),))[0]
            assert cached == (0 if previous is None else len(previous) - 1)
            # the answer as text, and a turn longer than NEAR: each turn takes its end
            previous, prompt = prompt, prompt + tokens(40) + tokens(30)
        stats = eng.prompt_cache.stats()
        assert stats["entries"] == 1 and stats["superseded"] == 3
        assert stats["checkpoint_kinds"].get("system") == 1
        # the first turn's system checkpoint survived the turns: a sub-agent hits it
        assert generate(eng, SYSTEM + tokens(9), marks=())[0][1] == 40
    finally:
        eng.shutdown()


def test_a_retry_hits_the_prompts_end_and_a_marked_conversation_its_last_mark(
        mlxcel_checkpoint_cache):
    """With no chat marks (a raw completion) the prompt's end is taken before its last
    token, so the same prompt again reuses all but that token and gives the cold
    logits. With them, the end of the messages serves instead (the prompt's end lies
    within ``NEAR`` of it), a conversation's turns supersede one another there, and no
    ``prompt`` checkpoint is taken."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    want = cold_run(path, PROMPT)
    eng = engine(path)
    try:
        generate(eng, PROMPT, marks=())
        ids, cached, tops = generate(eng, PROMPT, marks=())[0]
        assert cached == len(PROMPT) - 1
        assert ids == want[0]
        same_logits(tops, want[2])
        assert eng.prompt_cache.stats()["hits_by_kind"].get("prompt") == 1
        eng.prompt_cache.reset()
        prompt, marks, before = PROMPT, MARKS, 0
        for turn in range(3):
            _, cached, _ = generate(eng, prompt, marks=marks)[0]
            assert cached == (0 if turn == 0 else before - len(GEN))
            before = len(prompt)
            answer, user = tokens(40), tokens(30)  # the end of the messages: past NEAR
            marks = ((40, "system"), (len(prompt) + len(answer), "turn"),
                     (len(prompt) + len(answer) + len(user), "turn"))
            prompt = prompt + answer + user + GEN
        stats = eng.prompt_cache.stats()
        assert stats["entries"] == 1 and stats["superseded"] == 2
        assert "prompt" not in stats["checkpoint_kinds"]
    finally:
        eng.shutdown()


@pytest.mark.parametrize("kind", ["plain", "kv-shared"])
def test_stored_entries_hash_as_their_tokens_do(kind, mlxcel_checkpoint_cache):
    """The engine hashes a prompt once, at its lookup, and its store extends those
    hashes (``PromptCache.insert``'s ``known``): every entry's index is still the hash
    chain of its own tokens, after a cold turn and after a hit."""
    from mlxcel.engine.cache.entries import block_hashes

    eng = engine(checkpoint(kind, mlxcel_checkpoint_cache))
    try:
        generate(eng, PROMPT)
        _, cached, _ = generate(eng, LATER["next-turn"][0])[0]
        assert cached > 0
        entries = list(eng.prompt_cache._entries.values())
        assert entries
        for entry in entries:
            assert entry.hashes == block_hashes(entry.tokens, None, entry.digests)
    finally:
        eng.shutdown()


def test_a_mark_just_past_a_restored_checkpoint_is_not_taken():
    """Ending a chunk a few tokens past the restored checkpoint would cost a pass for
    nothing that checkpoint does not already give; a cold row keeps every mark."""
    assert marks_for(200, 0, ((3, "system"), (100, "turn")), 0) == [
        (3, "system"), (100, "turn"), (199, "prompt")]
    assert marks_for(200, 93, ((95, "turn"), (93 + NEAR - 1, "turn"),
                               (93 + NEAR, "turn")), 0) == [(93 + NEAR, "turn")]
    assert marks_for(200, 10, (), 32) == [(96, "interval"), (128, "interval"),
                                          (160, "interval"), (192, "interval")]
    # the prompt's end within NEAR of the last mark, or of the restored point: not taken
    assert marks_for(200, 0, ((3, "system"), (196, "turn")), 0) == [(3, "system"),
                                                                    (196, "turn")]
    assert marks_for(200, 199 - NEAR + 1, (), 0) == []
    assert marks_for(200, 199 - NEAR, (), 0) == [(199, "prompt")]


def test_a_turn_sharing_a_skipped_mark_reuses_the_checkpoint_before_it(
        mlxcel_checkpoint_cache):
    """A short answer re-sent as text puts the next turn's boundary 6 tokens past its hit:
    no checkpoint there, so a prompt that shares it reuses the one before, and answers as
    a cold prefill does."""
    path = checkpoint("recurrent", mlxcel_checkpoint_cache)
    answer, user = tokens(3), tokens(20)
    second = PROMPT + answer + user + GEN
    at = len(PROMPT) + len(answer)
    marks = (*MARKS, (at, "turn"), (len(second) - len(GEN), "turn"))
    third = second[:at] + tokens(25)
    want = cold_run(path, third)
    eng = engine(path)
    try:
        generate(eng, PROMPT)
        assert generate(eng, second, marks=marks)[0][1] == 90
        ids, cached, tops = generate(eng, third, marks=marks)[0]
        assert cached == 90
        assert ids == want[0]
        same_logits(tops, want[2])
    finally:
        eng.shutdown()
