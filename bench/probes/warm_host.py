"""Probe: what does a warm prompt-cache turn of an agent's ~32k-token conversation cost on
the host, phase by phase, in mlxcel vs what mlx_lm.server does per request?

The workload is ``bench/prompt_cache.py``'s ``answer-as-text`` scenario (its content, its
chatml template with Qwen3's reasoning rule): turn 1 is [system + 8 tools, user]; turn 2
re-sends turn 1's answer as text and a new user turn. Turn 1 runs in full; turn 2 is
timed. mlxcel, in process: the OpenAI body decoded, ``chat.prompt.prompt_input`` (render,
the message-boundary renders of ``chat.cache_marks``, tokenize with spans, token
positions), then an ``EngineWorker`` driven by hand (``mlxcel.testing.engine``): the
prompt-cache lookup (its block hashes apart), the restore (the prefill job's setup),
checkpoint copies, the prefill's forward (model work: reported, not a host phase), join,
decode steps, and the store after the last token (snapshots + insert). mlx_lm.server's
floor, on the same messages: ``apply_chat_template`` (render + tokenize), its
system-segment render + tokenize, ``LRUPromptCache.fetch_nearest_cache`` (the trie walk
apart from the cache's deepcopy) and ``insert_cache``. Medians over ``--repeats`` (each
repeat its own content); the model is a tiny bench checkpoint, so what is left of a turn
is host work.

    .venv/bin/python bench/probes/warm_host.py [--families tiny,gemma4-tiny]
        [--size 32768] [--repeats 5] [--profile]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import hashlib
import inspect
import pstats
import statistics
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
from mlxcel.testing import bench_report

MAX_TOKENS = 8
ROOT = Path(__file__).resolve().parents[2]


# bench/prompt_cache.py: its conversation content and template are this probe's workload
pc = bench_report.harness(ROOT / "bench" / "prompt_cache.py", "bench_prompt_cache")


class Phases:
    """Wall time per label, summed over calls, and call counts."""

    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)
        self.inside: list[str] = []

    def wrap(self, owner: Any, attr: str, label: str, nested: dict[str, str] | None = None
             ) -> None:
        """Time ``owner.attr`` as ``label`` (as ``nested[outer]`` while ``outer`` runs)."""
        fn = getattr(owner, attr)

        def timed(*a: Any, **k: Any) -> Any:
            name = label
            for outer in reversed(self.inside):
                if nested and outer in nested:
                    name = nested[outer]
                    break
            self.inside.append(label)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[name] += time.perf_counter() - t0
                self.n[name] += 1
                self.inside.pop()
        static = isinstance(inspect.getattr_static(owner, attr), staticmethod)
        setattr(owner, attr, staticmethod(timed) if static else timed)

    def take(self) -> dict[str, tuple[float, int]]:
        out = {k: (self.t[k] * 1e3, self.n[k]) for k in self.t}
        self.t.clear()
        self.n.clear()
        return out


_CONVERSATIONS: dict[tuple[bytes, int, str], Any] = {}


def conversation(path: Path, size: int, seed: str) -> Any:
    """The bench's conversation (built once per tokenizer, size and seed)."""
    key = (hashlib.sha256((path / "tokenizer.json").read_bytes()).digest(), size, seed)
    if key not in _CONVERSATIONS:
        r = pc.Renderer(path, pc.qwen3_template())
        _CONVERSATIONS[key] = pc.Conversation(seed, size, r, MAX_TOKENS)
    return _CONVERSATIONS[key]


def body(messages: list[dict], tools: list[dict]) -> bytes:
    return msgspec.json.encode({"model": "m", "messages": messages, "tools": tools,
                                "max_tokens": MAX_TOKENS, "stream": True})


class Mlxcel:
    """One family's engine (a worker on this thread) and chat layer, instrumented."""

    def __init__(self, path: Path, size: int, ph: Phases) -> None:
        import mlxcel.chat.cache_marks as cm
        import mlxcel.chat.prompt as prompt
        import mlxcel.engine.admission as admission
        import mlxcel.engine.cache.prompt_cache as pcache
        import mlxcel.engine.mixed_batch as mixed
        from mlxcel.model.chat_template import ChatTemplate
        from mlxcel.testing.engine import worker_for

        self.worker = worker_for(path, cache=8 << 30, parallel=4, chunk=512)
        ckpt = self.worker.checkpoint
        template = ChatTemplate(pc.qwen3_template(), bos_token=ckpt.tokenizer.bos_token,
                                eos_token=ckpt.tokenizer.eos_token)
        self.template = template
        shim = types.SimpleNamespace(template=template, tokenizer=ckpt.tokenizer,
                                     model=ckpt.model)
        self.engine = types.SimpleNamespace(checkpoint=shim, context_size=4 * size,
                                            cache_marks=self.worker.prompt_cache.reuse.mode
                                            != "prefix")
        self.ph = ph
        ph.wrap(template, "render", "chat.render", {"chat.marks": "chat.marks.render"})
        for name in ("boundaries", "encode_prompt_spans", "encode_prompt", "token_positions"):
            ph.wrap(prompt, name, f"chat.{ {'boundaries': 'marks'}.get(name, name)}")
        ph.wrap(cm, "_render", "chat.marks._render")
        ph.wrap(pcache, "block_hashes", "engine.hashes",
                {"engine.lookup": "engine.lookup.hashes", "engine.insert": "engine.insert.hashes"})
        ph.wrap(pcache.PromptCache, "lookup", "engine.lookup")
        if hasattr(admission, "prompt_hashes"):  # the prompt hashed once, before its lookup
            ph.wrap(admission, "prompt_hashes", "engine.prompt_hashes")
        ph.wrap(pcache.PromptCache, "insert", "engine.insert")
        ph.wrap(mixed, "checkpoint", "engine.checkpoint_copy")
        w = self.worker
        ph.wrap(w, "_store", "engine.store")
        ph.wrap(w, "_decode_step", "engine.decode_steps")
        ph.wrap(w, "_join_prefilled", "engine.join")
        new_job = w._new_job

        def timed_job(group: list) -> Any:
            t0 = time.perf_counter()
            job = new_job(group)
            ph.t["engine.restore"] += time.perf_counter() - t0
            ph.n["engine.restore"] += 1
            ph.wrap(job, "step", "engine.prefill_forward")
            return job
        w._new_job = timed_job

    def prompt(self, raw: bytes) -> Any:
        from mlxcel.chat.prompt import prompt_input
        from mlxcel.dialects.openai.schemas import ChatCompletionRequest
        from mlxcel.dialects.openai.translate import prompt_request

        t0 = time.perf_counter()
        req = prompt_request(msgspec.json.decode(raw, type=ChatCompletionRequest))
        t1 = time.perf_counter()
        out = prompt_input(req, self.engine)
        t2 = time.perf_counter()
        self.ph.t["chat.decode"] += t1 - t0
        self.ph.t["chat.prompt_input"] += t2 - t1
        return out

    def turn(self, prompt: Any) -> tuple[list[int], float, int]:
        """Run a request to its end; its tokens, seconds to the first token, cached."""
        from mlxcel.testing.engine import ListSink, request

        sink = ListSink()
        req = request(prompt.token_ids, MAX_TOKENS, cache_marks=prompt.cache_marks)
        t0 = time.perf_counter()
        self.worker.enqueue(req, sink)
        first = None
        while not sink.done:
            self.worker.step()
            if first is None and sink.tokens:
                first = time.perf_counter() - t0
        self.worker.step()  # the finished row leaves
        return sink.tokens, first, sink.last.usage.cached_tokens


def chat_repeats(m: Mlxcel, conv: Any, answer: str, n: int) -> dict[str, list[float]]:
    """Turn 2's chat phases alone, ``n`` more times (they are short, and the engine's
    phases would only add noise): every phase's time per run."""
    raw = body(conv.turn2(answer), conv.tools)
    out: dict[str, list[float]] = defaultdict(list)
    for _ in range(n):
        m.prompt(raw)
        for label, (ms, _) in m.ph.take().items():
            out[label].append(ms)
    return out


def mlxcel_repeat(m: Mlxcel, conv: Any, profile: cProfile.Profile | None
                  ) -> dict[str, Any]:
    m.worker.prompt_cache.reset()
    tok = m.worker.checkpoint.tokenizer
    p1 = m.prompt(body(conv.turn1(), conv.tools))
    ids, _, _ = m.turn(p1)
    answer = tok.decode(ids)
    m.ph.take()
    raw = body(conv.turn2(answer), conv.tools)
    if profile is not None:
        profile.enable()
    t0 = time.perf_counter()
    p2 = m.prompt(raw)
    chat_s = time.perf_counter() - t0
    _, first, cached = m.turn(p2)
    if profile is not None:
        profile.disable()
    phases = m.ph.take()
    phases["turn.chat_total"] = (chat_s * 1e3, 1)
    phases["turn.engine_first_token"] = (first * 1e3, 1)
    phases["what-if.tail_tokenize"], same = tail_tokenize(m, conv, answer, p2.token_ids)
    return {"phases": phases, "prompt": len(p2.token_ids), "cached": cached,
            "marks": p2.cache_marks, "split_same": same, "answer": answer}


def tail_tokenize(m: Mlxcel, conv: Any, answer: str, ids: Any) -> tuple[tuple[float, int], bool]:
    """What tokenizing turn 2 would cost from turn 1's last special token on (turn 1's
    prompt text is a prefix of turn 2's), and whether turn 1's tokens up to there plus
    that tail's give turn 2's tokens exactly (not a phase mlxcel has: see the results)."""
    from mlxcel.chat.prompt import render_chat
    from mlxcel.dialects.openai.schemas import ChatCompletionRequest
    from mlxcel.dialects.openai.translate import prompt_request

    def text(messages: list[dict]) -> str:
        raw = body(messages, conv.tools)
        req = prompt_request(msgspec.json.decode(raw, type=ChatCompletionRequest))
        return render_chat(req, m.template)

    first, second = text(conv.turn1()), text(conv.turn2(answer))
    cut = first.rfind("<|im_start|>")
    assert cut > 0 and second.startswith(first[:cut + len("<|im_start|>")])
    hf = m.worker.checkpoint.tokenizer.hf
    t0 = time.perf_counter()
    tail = hf.encode(second[cut:], add_special_tokens=False).ids
    dt = (time.perf_counter() - t0) * 1e3
    head = hf.encode(first[:cut], add_special_tokens=False).ids
    return (dt, 1), head + tail == list(ids)


def mlx_lm_repeat(model: Any, tok: Any, conv: Any, answer: str, times: int
                  ) -> dict[str, list[float]]:
    """What mlx_lm.server does per chat request before and after its prefill, ``times``
    times (``cached``: the tokens its lookup found)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache

    tools = conv.tools
    prompt1 = tok.apply_chat_template(conv.turn1(), tools=tools, add_generation_prompt=True)
    cache = make_prompt_cache(model)
    out = []
    for (token, _), _ in zip(generate_step(mx.array(prompt1), model, prompt_cache=cache,
                                           prefill_step_size=2048), range(MAX_TOKENS),
                             strict=False):
        out.append(int(token))
    lru = LRUPromptCache(10)
    lru.insert_cache("m", prompt1 + out[:-1], cache)
    msgs = conv.turn2(answer)
    t: dict[str, list[float]] = defaultdict(list)

    def clock(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        res = fn(*args, **kwargs)
        t[name].append((time.perf_counter() - t0) * 1e3)
        return res

    def segment(prompt: list[int]) -> int:
        sys_tokens = tok.apply_chat_template(msgs[:1] + [{"role": "user", "content": ""}],
                                             tools=tools, add_generation_prompt=False)
        for i, (a, b) in enumerate(zip(sys_tokens, prompt, strict=False)):
            if a != b:
                return i
        return 0

    render = tok.apply_chat_template
    for _ in range(max(1, times)):
        text = clock("render", render, msgs, tools=tools, add_generation_prompt=True,
                     tokenize=False)
        clock("tokenize", tok.encode, text, add_special_tokens=False)
        prompt = clock("render+tokenize", render, msgs, tools=tools,
                       add_generation_prompt=True)
        clock("system segment (render+tokenize)", segment, prompt)
        clock("lookup (trie walk)", lru._trie.search, "m", prompt)
        found, rest = clock("lookup (fetch_nearest_cache)", lru.fetch_nearest_cache, "m",
                            prompt)
    t["cached"].append(len(prompt) - len(rest))
    stored = found if found is not None else make_prompt_cache(model)
    clock("store (insert_cache)", lru.insert_cache, "m", prompt + [1] * 7, copy.copy(stored))
    return t


def fmt_row(label: str, vals: list[float], counts: list[int] | None = None) -> str:
    n = f" (x{statistics.median(counts):g})" if counts and max(counts) > 1 else ""
    return f"  {label:<34} {statistics.median(vals):9.2f} ms{n}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="tiny,gemma4-tiny")
    ap.add_argument("--size", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-mlx-lm", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile turn 2 (last family)")
    ap.add_argument("--chat-repeats", type=int, default=0,
                    help="then turn 2's chat phases alone this many times per repeat")
    args = ap.parse_args()
    from mlxcel.testing.bench_checkpoints import named_checkpoint

    for fam in args.families.split(","):
        path = named_checkpoint(fam)
        ph = Phases()
        m = Mlxcel(path, args.size, ph)
        prof = cProfile.Profile() if args.profile else None
        runs, lm_runs = [], []
        chat: dict[str, list[float]] = defaultdict(list)
        lm = None
        if not args.no_mlx_lm:
            from mlx_lm import load

            lm = load(str(path), tokenizer_config={"chat_template": pc.qwen3_template()})
        for r in range(args.repeats):
            conv = conversation(path, args.size, f"warm-host-{r}")
            rec = mlxcel_repeat(m, conv, prof)
            runs.append(rec)
            for label, times in chat_repeats(m, conv, rec["answer"], args.chat_repeats).items():
                chat[label] += times
            if lm is not None:
                lm_runs.append(mlx_lm_repeat(*lm, conv, rec["answer"], args.chat_repeats))
            print(f"{fam} repeat {r}: prompt {rec['prompt']} cached {rec['cached']} "
                  f"marks {rec['marks']} split tokenization == whole: {rec['split_same']}",
                  flush=True)
        print(f"\n{fam}: mlxcel turn 2, medians of {args.repeats} (ms; xN = calls)")
        for label in sorted({k for rec in runs for k in rec["phases"]}):
            vals = [rec["phases"].get(label, (0.0, 0))[0] for rec in runs]
            counts = [rec["phases"].get(label, (0.0, 0))[1] for rec in runs]
            print(fmt_row(label, vals, counts))
        if chat:
            n = len(chat["chat.prompt_input"])
            print(f"{fam}: turn 2's chat phases alone, medians of {n} (ms)")
            for label in sorted(chat):
                print(fmt_row(label, chat[label]))
        if lm_runs:
            print(f"{fam}: mlx_lm.server's per-request host work, medians (ms)")
            for label in lm_runs[0]:
                vals = [x for t in lm_runs for x in t[label]]
                print(f"  {'cached (tokens)':<34} {statistics.median(vals):9.0f}"
                      if label == "cached" else fmt_row(label, vals))
        m.worker.prompt_cache.reset()
        if prof is not None:
            pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
