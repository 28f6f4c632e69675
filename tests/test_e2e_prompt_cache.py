"""The prompt cache end to end (issue #29): the real ``mlxcel-server`` on tiny checkpoints
that carry Qwen3's own chat template (tests/chat_templates/qwen3-0.6b-2505.jinja, which
strips earlier ``<think>`` blocks), driven by the real ``openai`` SDK as an agent drives it.

* A 6-turn agent loop (a system prompt of a few hundred tokens, two tools, each answer sent
  back as the SDK returned it, one of them with its reasoning re-sent inside the content)
  reuses the previous turn's prompt from turn 2 on, on a hybrid (recurrent + attention)
  model, a sliding-window model and a plain-KV one; a sub-agent that shares only the
  system prompt and tools reuses that prefix (a ``system`` checkpoint).
* The disk tier keeps a conversation's state across a graceful restart, and
  ``POST /v1/cache/reset`` empties its directory.
* ``cache_prompt: false`` reuses nothing and stores nothing.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from mlxcel.testing import build_checkpoint
from mlxcel.testing.servers import MlxcelServer

pytestmark = pytest.mark.slow
QWEN3 = Path(__file__).parent / "chat_templates" / "qwen3-0.6b-2505.jinja"
SYSTEM = ("You are a careful coding agent working in a Python repository. "
          + " ".join(f"Rule {i}: read before you write, keep changes small, run the tests "
                     f"and explain each step." for i in range(1, 7)))
TOOLS = [{"type": "function", "function": {
    "name": name, "description": what, "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    for name, what in (("read_file", "Read a file of the repository."),
                       ("list_dir", "List a directory of the repository."))]
GREEDY = {"temperature": 0.0, "seed": 7, "max_tokens": 12}
THINK_TURN = 2  # the answer of this turn is re-sent with its reasoning in the content
SLACK = 20  # a hit may leave this many of the previous prompt's tokens to prefill
ENTRY_FILES = (".safetensors", ".json")


def checkpoint(root: Path, shape: str) -> Path:
    ckpt = build_checkpoint(root / shape, shape=shape, template="chatml")
    (ckpt / "chat_template.jinja").write_text(QWEN3.read_text(encoding="utf-8"),
                                              encoding="utf-8")
    return ckpt


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-cache")
    return {shape: checkpoint(root, shape) for shape in ("qwen3_next", "gemma3_text", "qwen3")}


def serve(ckpt: Path, *args: str) -> MlxcelServer:
    return MlxcelServer(["--model", str(ckpt), "--parallel", "2", *args])


def stats(server) -> dict:
    r = httpx.get(server.base_url + "/v1/cache/stats", timeout=30, trust_env=False)
    r.raise_for_status()
    return r.json()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def ask(sdk, messages, **extra):
    r = sdk.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, **GREEDY,
                                    **({"extra_body": extra} if extra else {}))
    details = r.usage.prompt_tokens_details
    return r, r.usage.prompt_tokens, (details.cached_tokens or 0) if details else 0


def question(turn: int, topic: str = "src") -> dict:
    return {"role": "user", "content": f"Step {turn}: what does the {topic}/part{turn} "
                                       f"directory hold, and which file should I read next?"}


REASONING = "The user wants a directory listed; I should call list_dir first."


def with_reasoning(message) -> dict:
    """``message`` as a client that keeps the reasoning in the content re-sends it."""
    return {"role": "assistant",
            "content": f"<think>\n{REASONING}\n</think>\n\n{message.content or ''}"}


def rendered(server, messages) -> str:
    """The prompt ``messages`` render to, as the server renders it."""
    wire = [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m
            for m in messages]
    r = httpx.post(server.base_url + "/apply-template", timeout=30, trust_env=False,
                   json={"model": "tiny", "messages": wire, "tools": TOOLS})
    r.raise_for_status()
    return r.json()["prompt"]


def system_prefix_tokens(server, messages) -> int:
    """The token count of the rendered system + tools prefix of ``messages``' prompt."""
    text = rendered(server, messages)
    cut = text.index("<|im_start|>user")
    assert "# Tools" in text[:cut] and SYSTEM in text[:cut]
    r = httpx.post(server.base_url + "/tokenize", json={"content": text[:cut]}, timeout=30,
                   trust_env=False)
    r.raise_for_status()
    return len(r.json()["tokens"])


def agent_loop(server, turns: int = 6, topic: str = "src") -> list[dict]:
    """Run the loop; per turn: prompt and cached tokens and the cache's stats after it."""
    sdk = client(server)
    messages: list = [{"role": "system", "content": SYSTEM}]
    out = []
    for turn in range(turns):
        messages.append(question(turn, topic))
        if turn == THINK_TURN + 1:  # the template strips the reasoning the client re-sent
            assert REASONING not in rendered(server, messages)
        r, prompt, cached = ask(sdk, messages)
        message = r.choices[0].message
        assert r.choices[0].finish_reason in ("length", "stop", "tool_calls"), r
        out.append({"prompt": prompt, "cached": cached, "stats": stats(server)})
        messages.append(with_reasoning(message) if turn == THINK_TURN else message)
    return out


def check_loop(turns: list[dict], before: dict) -> None:
    assert turns[0]["prompt"] >= 250, "the system prompt and tools are a few hundred tokens"
    assert turns[0]["cached"] == 0, turns[0]
    hits = [before["hits"]] + [t["stats"]["hits"] for t in turns]
    for i in range(1, len(turns)):
        prev, now = turns[i - 1], turns[i]
        assert now["prompt"] > prev["prompt"], (i, turns)
        assert prev["prompt"] - SLACK <= now["cached"] < now["prompt"], \
            (i, prev["prompt"], now["cached"], now["prompt"])
        assert hits[i + 1] == hits[i] + 1, (i, hits)


@pytest.fixture(scope="module")
def hybrid(ckpts):
    srv = serve(ckpts["qwen3_next"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sliding(ckpts):
    srv = serve(ckpts["gemma3_text"])
    yield srv
    srv.stop()


def _loop_and_sub_agent(server, reuse: str) -> None:
    before = stats(server)
    assert before["reuse"] == reuse, before
    turns = agent_loop(server)
    check_loop(turns, before)
    after = turns[-1]["stats"]
    assert after["checkpoints"] > 0 and after["checkpoint_bytes"] > 0, after
    # a chat prompt's end of messages lies a few tokens before its end: that checkpoint
    # serves the next turn, and the prompt's own end is not taken (capture.NEAR)
    assert {"system", "turn"} <= set(after["checkpoint_kinds"]), after
    assert "prompt" not in after["checkpoint_kinds"], after
    kinds = after["hits_by_kind"]
    gained = {k: n - before["hits_by_kind"].get(k, 0) for k, n in kinds.items()
              if n > before["hits_by_kind"].get(k, 0)}
    # a turn reuses a checkpoint (a message boundary) or, where
    # the answer re-sent as text is the very tokens sampled, the whole previous entry
    assert set(gained) <= {"turn", "entry"}, gained
    assert sum(gained.values()) == len(turns) - 1 and "turn" in gained, gained

    # a sub-agent: the same system prompt and tools, another first question
    sub = [{"role": "system", "content": SYSTEM},
           {"role": "user", "content": "List every test module of the repository."}]
    n_system = system_prefix_tokens(server, sub)
    _, prompt, cached = ask(client(server), sub)
    assert 150 <= n_system <= cached < prompt, (n_system, cached, prompt)
    now = stats(server)
    assert now["hits"] == after["hits"] + 1
    assert now["hits_by_kind"].get("system", 0) == kinds.get("system", 0) + 1, now


def test_hybrid_agent_loop_hits_checkpoints(hybrid):
    _loop_and_sub_agent(hybrid, "exact")


def test_sliding_window_agent_loop_hits_checkpoints(sliding):
    _loop_and_sub_agent(sliding, "window")


def test_plain_kv_agent_loop_hits(ckpts):
    srv = serve(ckpts["qwen3"])
    try:
        before = stats(srv)
        assert before["reuse"] == "prefix", before
        turns = agent_loop(srv)
        check_loop(turns, before)
        kinds = turns[-1]["stats"]["hits_by_kind"]
        assert set(kinds) <= {"entry", "prefix"} and sum(kinds.values()) == len(turns) - 1
        assert turns[-1]["stats"]["checkpoints"] == 0  # plain KV is cut, not checkpointed
    finally:
        srv.stop()


def test_cache_prompt_false_reuses_and_stores_nothing(hybrid):
    sdk = client(hybrid)
    messages = [{"role": "system", "content": "Another agent. " + SYSTEM}, question(0, "lib")]
    r, _, cached = ask(sdk, messages)
    assert cached == 0
    messages += [r.choices[0].message, question(1, "lib")]
    before = stats(hybrid)
    _, prompt, cached = ask(sdk, messages, cache_prompt=False)
    assert cached == 0, "cache_prompt: false reused the cache"
    after = stats(hybrid)
    for key in ("inserts", "entries", "bytes", "checkpoints", "checkpoint_bytes", "hits"):
        assert after[key] == before[key], (key, before[key], after[key])
    # the same request with the cache on: the previous turn hits, the refused one stored
    # nothing (so it is not an exact match of this prompt)
    _, again, cached = ask(sdk, messages)
    assert again == prompt and 0 < cached < prompt - SLACK, (cached, prompt)
    assert stats(hybrid)["hits"] == after["hits"] + 1


def entry_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(ENTRY_FILES))


def test_disk_tier_keeps_hits_across_a_restart(ckpts, tmp_path):
    disk = tmp_path / "cache"
    args = ("--cache-disk-dir", str(disk))
    messages: list = [{"role": "system", "content": SYSTEM}]
    first = serve(ckpts["qwen3_next"], *args)
    try:
        assert stats(first)["disk"]["enabled"], stats(first)["disk"]
        for turn in range(2):
            messages.append(question(turn))
            r, prompt, cached = ask(client(first), messages)
            assert (cached > 0) == (turn > 0)
            messages.append(r.choices[0].message)
        assert stats(first)["disk"]["entries"] == 0  # nothing evicted yet: all in memory
    finally:
        first.stop()  # SIGTERM: the engine writes its entries to disk as it shuts down
    assert first.proc.returncode is not None
    assert entry_files(disk), f"no entry written at shutdown:\n{first.log_tail()}"

    second = serve(ckpts["qwen3_next"], *args)
    try:
        start = stats(second)
        assert start["entries"] == 0 and start["disk"]["entries"] >= 1, start
        messages.append(question(2))
        _, now, cached = ask(client(second), messages)
        assert prompt - SLACK <= cached < now, (prompt, cached, now)
        after = stats(second)
        assert after["disk"]["hits"] == 1 and after["hits"] == 1, after

        reset = httpx.post(second.base_url + "/v1/cache/reset", timeout=30, trust_env=False)
        assert reset.status_code == 200 and reset.json()["freed_disk_files"] > 0, reset.text
        assert entry_files(disk) == []
        cleared = stats(second)
        assert cleared["disk"]["entries"] == 0 and cleared["disk"]["bytes"] == 0, cleared
        assert cleared["entries"] == 0
    finally:
        second.stop()
