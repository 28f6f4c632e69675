"""Distributed serving end to end: two ranks of the real ``mlxcel-server`` on MLX's ring
backend over loopback, started by ``mlxcel-server launch``, against one process serving
the same checkpoint, through the real ``openai`` SDK.

Tensor mode runs a tiny llama (mlx-lm's ``shard``), pipeline mode a tiny deepseek_v3
(mlx-lm's ``pipeline``), both in float32. The tolerance rule (docs/explanation/
distributed.md): greedy outputs are equal token for token; where they are not, the first
token that differs must be one the single process itself nearly tied on (its top two
logprobs within ``TIE``), since a tensor-parallel all-reduce sums in another order.
Pipeline mode computes every layer as one process does and must match exactly.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pytest
from mlxcel.testing import cached_checkpoint
from mlxcel.testing.distributed import DistributedServer
from mlxcel.testing.servers import MlxcelServer

pytestmark = pytest.mark.slow
TIE = 1e-3
CHECKPOINTS = {"tensor": ("llama", {}), "pipeline": ("deepseek_v3", {"hidden_size": 128})}
PROMPTS = ["Say something.", "Count to five, slowly please.", "hi",
           "Write one long sentence about the sea and the wind and the boats.",
           "What is two plus two?", "Name a colour."]
UNIT = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                           "parameters": UNIT}}]


def checkpoint(mode: str, cache) -> str:
    shape, kw = CHECKPOINTS[mode]
    return str(cached_checkpoint(shape, cache, dtype="float32", num_layers=3,
                                 suppress_eos=True, **kw))


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def pair(request, mlxcel_checkpoint_cache, tmp_path_factory):
    mode = request.param
    ckpt = checkpoint(mode, mlxcel_checkpoint_cache)
    args = ["--model", ckpt, "--parallel", "4"]
    single = MlxcelServer(args)
    try:
        dist = DistributedServer([*args, "--distributed", mode],
                                 tmp_path_factory.mktemp(f"dist-{mode}"))
    except BaseException:
        single.stop()
        raise
    yield SimpleNamespace(mode=mode, single=single, dist=dist,
                          servers={"single": single.base_url, "dist": dist.base_url})
    dist.stop()
    single.stop()


def sdk(base: str, asynchronous: bool = False) -> object:
    kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return kind(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def greedy_all(base: str, prompts: list[str], max_tokens: int = 20) -> list:
    """Every prompt at once (more than the slots: rows join and leave mid-batch)."""
    client = sdk(base, asynchronous=True)
    calls = [client.chat.completions.create(
        model="m", messages=ask(p), max_tokens=max_tokens, temperature=0, logprobs=True,
        top_logprobs=2) for p in prompts]
    return [r.choices[0] for r in await asyncio.gather(*calls)]


def assert_same_greedy(one, dist) -> None:
    """Equal token for token, or first parted where the single process nearly tied."""
    a, b = one.logprobs.content, dist.logprobs.content
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.token != y.token:
            top = x.top_logprobs
            assert len(top) == 2 and abs(top[0].logprob - top[1].logprob) < TIE, \
                f"token {i} differs ({x.token!r} vs {y.token!r}) with no near tie"
            return
    assert len(a) == len(b) and one.message.content == dist.message.content


def test_health_and_props_show_the_world(pair):
    health = httpx.get(pair.dist.base_url + "/health", timeout=10).json()
    world = health["distributed"]
    assert health["status"] == "ok" and world["status"] == "ok"
    assert world["world_size"] == 2 and world["mode"] == pair.mode
    assert [r["rank"] for r in world["ranks"]] == [0, 1]
    assert all(r["device"].startswith("cpu@") for r in world["ranks"])
    props = httpx.get(pair.dist.base_url + "/props", timeout=10).json()
    assert props["distributed"]["ranks"] == world["ranks"]
    assert "distributed" not in httpx.get(pair.single.base_url + "/health").json()


def test_concurrent_greedy_outputs_match_one_process(pair):
    one = asyncio.run(greedy_all(pair.single.base_url, PROMPTS))
    dist = asyncio.run(greedy_all(pair.dist.base_url, PROMPTS))
    for a, b in zip(one, dist, strict=True):
        assert a.finish_reason == b.finish_reason == "length"
        assert_same_greedy(a, b)


async def sampled_all(base: str, prompts: list[str]) -> list[str]:
    """Seeded sampling with a repetition penalty (each step then reads the last token
    back before the next is built) for each prompt in turn: a seeded draw is exact only
    for the same logits, and which rows share a batch (padding, a matmul's blocking) moves
    them in the last bits, so concurrent rows, grouped as they happen to arrive, could part
    at a near-tie in either server; the draws themselves are what this compares."""
    client = sdk(base, asynchronous=True)
    out = []
    for i, p in enumerate(prompts):
        r = await client.chat.completions.create(
            model="m", messages=ask(p), max_tokens=16, temperature=0.9, top_p=0.95,
            seed=7 + i, extra_body={"repetition_penalty": 1.3})
        out.append(r.choices[0].message.content)
    return out


def test_seeded_sampling_and_penalties_are_rank_0s(pair):
    one = asyncio.run(sampled_all(pair.single.base_url, PROMPTS[:4]))
    dist = asyncio.run(sampled_all(pair.dist.base_url, PROMPTS[:4]))
    assert len(set(one)) > 1 and dist == one


def active(base: str) -> int:
    return httpx.get(base + "/health", timeout=10).json()["batch"]["active_sequences"]


def test_cancelled_stream_frees_its_slot_and_serving_goes_on(pair):
    client = sdk(pair.dist.base_url)
    stream = client.chat.completions.create(model="m", messages=ask("Go on and on."),
                                            max_tokens=3000, temperature=0, stream=True)
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen >= 3:
            break
    stream.close()
    deadline = time.monotonic() + 20
    while active(pair.dist.base_url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert active(pair.dist.base_url) == 0
    one, dist = (asyncio.run(greedy_all(base, PROMPTS[:2])) for base in
                 (pair.single.base_url, pair.dist.base_url))
    for a, b in zip(one, dist, strict=True):
        assert_same_greedy(a, b)


def two_turns(base: str) -> tuple[list, dict]:
    """A conversation's second turn reuses the first one's KV from the prompt cache."""
    client = sdk(base)
    httpx.post(base + "/v1/cache/reset", timeout=30).raise_for_status()
    first = client.chat.completions.create(model="m", messages=ask(PROMPTS[3]),
                                           max_tokens=16, temperature=0)
    history = [*ask(PROMPTS[3]), {"role": "assistant",
                                  "content": first.choices[0].message.content},
               *ask("And then?")]
    second = client.chat.completions.create(model="m", messages=history, max_tokens=16,
                                            temperature=0)
    stats = httpx.get(base + "/v1/cache/stats", timeout=30).json()
    return [first, second], stats


def test_prompt_cache_reuses_as_one_process_does(pair):
    one, one_stats = two_turns(pair.single.base_url)
    dist, dist_stats = two_turns(pair.dist.base_url)
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in (*one, *dist)]
    assert cached[1] > 0 and cached[:2] == cached[2:]
    assert [r.choices[0].message.content for r in one] == \
        [r.choices[0].message.content for r in dist]
    for key in ("entries", "hits", "inserts"):  # bytes: rank 0's shard of each entry
        assert one_stats[key] == dist_stats[key], key
    assert 0 < dist_stats["bytes"] < one_stats["bytes"]


def constrained(base: str) -> tuple[str, object]:
    client = sdk(base)
    schema = client.chat.completions.create(
        model="m", messages=ask("Which unit?"), max_tokens=60, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "unit", "schema": UNIT}})
    tool = client.chat.completions.create(model="m", messages=ask("Weather in Paris?"),
                                          max_tokens=80, temperature=0, tools=TOOLS,
                                          tool_choice="required")
    return schema.choices[0].message.content, tool.choices[0].message.tool_calls[0]


def test_constraints_and_forced_tool_calls_hold_on_rank_0(pair):
    import json

    one_json, one_call = constrained(pair.single.base_url)
    dist_json, dist_call = constrained(pair.dist.base_url)
    jsonschema.validate(json.loads(dist_json), UNIT)
    jsonschema.validate(json.loads(dist_call.function.arguments), UNIT)
    assert dist_call.function.name == "get_weather"
    assert (dist_json, dist_call.function.arguments) == \
        (one_json, one_call.function.arguments)
