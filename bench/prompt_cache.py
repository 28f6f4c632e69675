"""Prompt cache in agent scenarios: warm / cold TTFT of the prompts an agent sends, mlxcel
vs ``mlx_lm.server`` on the same checkpoint, for plain-KV, sliding-window and hybrid
(recurrent + attention) models (issue #29).

Rules, and why:

- Content: an agent's long system prompt with 8 tools (OpenAI ``tools``; the template
  renders them into the system turn), tool-output-like user turns, sized so that a
  scenario's warm prompt is about ``--sizes`` tokens. Every server gets the same messages
  (deterministic per repeat, each repeat its own content), streamed, temperature 0,
  ``--max-tokens`` tokens (mlxcel also ``ignore_eos``; the bench checkpoints never sample
  EOS anyway).
- Template: both servers render one template, the bundled chatml with Qwen3's rule that
  assistant turns before the last user query lose their ``<think>`` block (``mlxcel
  --chat-template-file``, ``mlx_lm.server --chat-template``): the bundled chatml keeps
  them, and mlxcel's chat layer drops them itself, so without it the two would differ.
- Scenarios (warm = the scenario's prompt, cold = the same prompt with a fresh id at the
  very start of the system prompt, so that nothing but the template's first tokens is
  shared; each reported as warm ms, cold ms, warm / cold):
  1. ``answer-as-text``: turn 1 [system+tools, user]; turn 2 re-sends turn 1's answer
     text as the assistant turn, then a new user turn.
  2. ``thinking-stripped``: the same on a conversation of its own, the assistant turn
     re-sent as ``<think>..</think>`` + the answer, which the template drops.
  3. ``sub-agent``: after turn 1 of scenario 1's conversation (and its turn 2), a new
     conversation with the same system+tools and another first user turn.
  4. ``restart-disk`` (mlxcel only): a server with ``--cache-disk-dir`` takes turn 1,
     stops (SIGTERM, waited for), starts again on the same directory, takes turn 2 of
     scenario 1's kind.
  Per server and repeat: scenarios 1-3 in that order, then their cold prompts (last, so
  that they do not evict what a warm prompt needs from a small cache first). Each server
  start is followed by one short request of unrelated content (first-request costs).
- Servers run one at a time: mlxcel, then mlxcel with the disk tier (twice), then mlx_lm,
  which gets the BLAS mlxcel preloads on a Linux CPU (OpenBLAS; ``--mlx-lm-own-blas``: not).
- Dtype: on a CPU the checkpoints are built in float32 (``--dtype auto``): mlxcel computes
  in float32 there whatever the checkpoint's dtype, and mlx_lm.server computing bf16 on a
  CPU is several times slower, which would flatter its warm / cold ratio (the fixed cost of
  a request weighs less against a slower cold prefill). On a GPU, the checkpoint's own.
- Reported per family x size x scenario: medians over ``--repeats`` of warm ms, cold ms,
  warm / cold (the median of each repeat's ratio) and cached tokens
  (``usage.prompt_tokens_details.cached_tokens``); targets met / missed: mlxcel warm /
  cold <= 0.1 (restart-disk <= 0.2) and <= mlx_lm's; memory: ``GET /v1/cache/stats``
  around the first turn 1 (checkpoint and entry bytes per 1k prompt tokens).

    python bench/prompt_cache.py            # 30m, gemma4-30m-512, qwen3-next-30m; 4k, 16k
    python bench/prompt_cache.py --quick    # tiny checkpoints, 1k, 1 repeat (< 3 min)
    python bench/prompt_cache.py --families qwen3-next-30m --sizes 4k --repeats 1 \
        --scenarios answer-as-text,restart-disk --out /tmp/pc.json

Results go to ``--out`` (JSON; one entry per family, a re-run replaces it; ``--quick``
defaults to /tmp) and the markdown next to it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import pathlib
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint, checkpoint_info
from mlxcel.testing.bench_report import fmt, ratio
from mlxcel.testing.servers import (
    Server,
    loadavg,
    machine,
    same_blas_env,
    server_argv,
    versions,
)
from mlxcel.testing.templates import template_text

SCENARIOS = ("answer-as-text", "thinking-stripped", "sub-agent", "restart-disk")
MLXCEL_ONLY = ("restart-disk",)
REASONING = (
    "The failing test names the {n} module. Its fixture builds a {a} {n2} before the worker "
    "starts, so the retry path never runs. I should read the scheduler first, then grep for "
    "every caller of the fixture, and only then propose a patch."
)

# -- template ---------------------------------------------------------------------------
# The bundled chatml template keeps every assistant turn's <think> block. Qwen3's own
# template keeps only those after the last real user query (the "rolling checkpoint"
# rule mlxcel's chat layer applies too); this is chatml with that rule, so that
# mlx_lm.server and mlxcel render the same prompt from the same messages.
_QUERY_SCAN = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
"""  # noqa: E501
_LOOP = "{%- for message in messages %}\n"
_KEEP = "{%- if reasoning_content %}"


def qwen3_template() -> str:
    """chatml.jinja with Qwen3's rule: earlier turns' reasoning is not rendered."""
    src = template_text("chatml")
    if src.count(_LOOP) != 1 or src.count(_KEEP) != 1:
        raise RuntimeError("chatml.jinja changed: update bench/prompt_cache_scenarios.py")
    src = src.replace(_LOOP, _QUERY_SCAN + _LOOP)
    return src.replace(_KEEP, "{%- if reasoning_content and loop.index0 > ns.last_query_index %}")


class Renderer:
    """The template rendered here (as transformers renders it) and counted with the
    checkpoint's tokenizer: sizes the system prompt before any server runs."""

    def __init__(self, checkpoint: pathlib.Path, template: str):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        def raise_exception(msg: str) -> None:
            raise jinja2.exceptions.TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda v, **k: json.dumps(v, ensure_ascii=False, **k)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(template)
        self.tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))

    def render(self, messages: list[dict[str, str]], tools: list[dict]) -> str:
        return self.template.render(messages=messages, tools=tools, add_generation_prompt=True)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def prompt_tokens(self, messages: list[dict[str, str]], tools: list[dict]) -> int:
        return self.count(self.render(messages, tools))

    def tools_for(self, size: int) -> list[dict[str, Any]]:
        """The wordiest tools that take at most 30% of a ``size``-token prompt."""
        bare = self.prompt_tokens([{"role": "system", "content": "x"}], [])
        for level in range(4, 0, -1):
            t = tools(level)
            if self.prompt_tokens([{"role": "system", "content": "x"}], t) - bare <= 0.3 * size:
                return t
        return tools(0)


# -- content ----------------------------------------------------------------------------
NOUNS = (
    "parser config cache scheduler tokenizer buffer socket worker queue router handler "
    "session index manifest registry sampler decoder encoder batch slot ledger harbor meadow "
    "lantern falcon glacier orchid copper marble kettle quartz violet ember window thread "
    "signal packet module fixture backend frontend plugin template budget metric"
).split()
VERBS = (
    "parses loads stores flushes rejects retries schedules decodes encodes merges splits "
    "validates caches evicts streams reads writes updates resolves checks builds"
).split()
ADJS = (
    "stale partial empty nested cached remote local quiet broken slow fast shared strict "
    "lazy eager missing valid unique"
).split()
TOOL_NAMES = (
    "run_tests", "grep", "read_file", "write_file", "list_dir", "git_diff", "run_linter",
    "web_search",
)


def _sentence(rng: random.Random) -> str:
    return (
        f"The {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
        f"{rng.choice(NOUNS)} {rng.choice(('before', 'after', 'while', 'unless', 'because'))} "
        f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
        f"{rng.randint(2, 999)} {rng.choice(NOUNS)}s."
    )


def _output_line(rng: random.Random) -> str:
    w = lambda: rng.choice(NOUNS)  # noqa: E731
    return rng.choice((
        f"tests/test_{w()}.py::test_{w()}_{w()} {rng.choice(('PASSED', 'FAILED', 'SKIPPED'))}",
        f"src/{w()}/{w()}.py:{rng.randint(1, 900)}:    self.{w()} = {w()}_{w()}()",
        f"{rng.randint(10, 9999):>5} src/{w()}/{w()}_{w()}.py",
        f"src/{w()}.py:{rng.randint(1, 500)}:{rng.randint(1, 80)}: E{rng.randint(100, 999)} "
        f"{rng.choice(ADJS)} {w()}",
        _sentence(rng),
    ))


def tools(level: int = 4) -> list[dict[str, Any]]:
    """The agent's 8 tools (OpenAI function format), as wordy as ``level`` (4: three
    sentences per tool and a sentence per parameter ... 0: a title and a bare parameter);
    one level is the same in every conversation of a size."""
    rng = random.Random("tools")
    out = []
    for name in TOOL_NAMES:
        n_params = 3 if level else 1
        props = {}
        for i in range(n_params):
            prop: dict[str, str] = {"type": rng.choice(("string", "integer", "boolean"))}
            if level >= 2:
                prop["description"] = _sentence(rng)
            props[f"{rng.choice(NOUNS)}_{i}"] = prop
        sentences = " ".join(_sentence(rng) for _ in range(max(0, min(3, level - 1))))
        out.append({
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name.replace('_', ' ').capitalize()}. {sentences}".strip(),
                "parameters": {"type": "object", "properties": props,
                               "required": sorted(props)[:1]},
            },
        })
    return out


def _pieces(rng: random.Random, n: int) -> list[str]:
    """System-prompt material: headings, rules, repository notes."""
    out = []
    for i in range(n):
        if i % 12 == 0:
            out.append(f"\n## {rng.choice(ADJS).capitalize()} {rng.choice(NOUNS)} rules\n")
        elif i % 5 == 0:
            out.append(f"- {_output_line(rng)}\n")
        else:
            out.append(_sentence(rng) + " ")
    return out


def user_message(rng: random.Random, r: Renderer, tokens: int) -> str:
    lines = [f"Tool result ({rng.choice(TOOL_NAMES)}):"]
    while r.count("\n".join(lines)) < tokens:
        lines.append(_output_line(rng))
    lines.append(f"What next? {_sentence(rng)}")
    return "\n".join(lines)


def system_id(rng: random.Random) -> str:
    return f"[id {rng.getrandbits(32):08x}]"


class Conversation:
    """One conversation's content: a system prompt sized so that its turn-2 prompt (system
    + tools, user, a ``answer_tokens`` answer, user) is about ``size`` tokens, and the
    user messages the scenarios send after it."""

    def __init__(self, seed: str, size: int, r: Renderer, answer_tokens: int):
        rng = random.Random(seed)
        self.tools = r.tools_for(size)
        user_tokens = max(32, size // 32)
        # turn 1, turn 2, the sub-agent's first turn
        self.user = [user_message(rng, r, user_tokens) for _ in range(3)]
        self.reasoning = REASONING.format(n=rng.choice(NOUNS), a=rng.choice(ADJS),
                                          n2=rng.choice(NOUNS))
        head = (
            f"{system_id(rng)} You are a coding agent working in a Python repository. Call "
            "one tool at a time, read its output carefully, think before you act and answer "
            "briefly.\n"
        )
        pieces = _pieces(rng, max(64, size // 4))
        answer = " ".join(["word"] * answer_tokens)

        def total(n: int) -> int:
            msgs = [{"role": "system", "content": head + "".join(pieces[:n])},
                    {"role": "user", "content": self.user[0]},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": self.user[1]}]
            return r.prompt_tokens(msgs, self.tools)

        while total(len(pieces)) < size:
            pieces += _pieces(rng, len(pieces))
        lo, hi = 0, len(pieces)
        while lo < hi:  # the most pieces that stay within size
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if total(mid) <= size else (lo, mid - 1)
        self.system = head + "".join(pieces[:lo]).rstrip()

    def sys(self) -> dict[str, str]:
        return {"role": "system", "content": self.system}

    def turn1(self) -> list[dict[str, str]]:
        return [self.sys(), {"role": "user", "content": self.user[0]}]

    def turn2(self, answer: str, think: bool = False) -> list[dict[str, str]]:
        content = f"<think>\n{self.reasoning}\n</think>\n\n{answer}" if think else answer
        return [*self.turn1(), {"role": "assistant", "content": content},
                {"role": "user", "content": self.user[1]}]

    def sub_agent(self) -> list[dict[str, str]]:
        return [self.sys(), {"role": "user", "content": self.user[2]}]


def cold(messages: list[dict[str, str]], rng: random.Random) -> list[dict[str, str]]:
    """The same prompt with a fresh id at the very start of the system prompt: it shares
    no cached block with anything sent before (only the template's first tokens)."""
    sys_msg = dict(messages[0])
    sys_msg["content"] = system_id(rng) + sys_msg["content"][len("[id 00000000]"):]
    return [sys_msg, *messages[1:]]


# -- client -----------------------------------------------------------------------------
def chat(base: str, server: str, messages: list[dict[str, str]], tool_list: list[dict],
         max_tokens: int, read_timeout: float) -> dict[str, Any]:
    """One streamed greedy chat completion: TTFT (request sent -> first content chunk),
    the answer's text, prompt and cached tokens, or an error name."""
    body: dict[str, Any] = {
        "messages": messages, "tools": tool_list, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    if server == "mlxcel":
        body["ignore_eos"] = True
    rec: dict[str, Any] = {"error": None, "ttft_ms": None, "text": "", "prompt_tokens": None,
                           "cached_tokens": None}
    tmo = httpx.Timeout(connect=10.0, read=read_timeout, write=60.0, pool=read_timeout)
    t0 = time.perf_counter()
    usage, done = None, False
    try:
        with httpx.Client(timeout=tmo, trust_env=False) as client, client.stream(
            "POST", base + "/v1/chat/completions", json=body
        ) as resp:
            if resp.status_code != 200:
                rec["error"] = f"http_{resp.status_code}"
                rec["detail"] = resp.read()[:300].decode(errors="replace")
                return rec
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    rec["error"], rec["detail"] = "stream_error", str(chunk["error"])[:300]
                    return rec
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        if rec["ttft_ms"] is None:
                            rec["ttft_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
                        rec["text"] += text
    except (httpx.HTTPError, ValueError, OSError) as exc:
        rec["error"], rec["detail"] = type(exc).__name__, str(exc)[:300]
        return rec
    rec["total_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["completion_tokens"] = usage.get("completion_tokens")
        rec["cached_tokens"] = int((usage.get("prompt_tokens_details") or {})
                                   .get("cached_tokens") or 0)
    if not done:
        rec["error"] = "no_done"
    elif rec["ttft_ms"] is None:
        rec["error"] = "no_content"
    return rec


def cache_stats(base: str) -> dict[str, Any] | None:
    try:
        r = httpx.get(base + "/v1/cache/stats", timeout=10.0, trust_env=False)
        return r.json() if r.status_code == 200 else {"status": r.status_code}
    except (httpx.HTTPError, ValueError):
        return None


def stop_gracefully(srv: Any, timeout_s: float = 120.0) -> float:
    """SIGTERM to the server's group and wait for it (a disk tier may write on the way
    out), SIGKILL only after ``timeout_s``; the seconds it took."""
    t = time.perf_counter()
    if srv.proc is not None and srv.proc.poll() is None:
        try:
            os.killpg(srv.proc.pid, signal.SIGTERM)
            srv.proc.wait(timeout=timeout_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    srv.stop()
    return round(time.perf_counter() - t, 2)


def dir_usage(path: pathlib.Path) -> dict[str, int]:
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


# -- scenarios against one server -------------------------------------------------------
class Client:
    """Sends a conversation's requests to one server and keeps every record."""

    def __init__(self, base: str, server: str, max_tokens: int, read_timeout: float,
                 log: Any = print):
        self.base, self.server = base, server
        self.max_tokens, self.read_timeout, self.log = max_tokens, read_timeout, log

    def send(self, what: str, messages: list[dict[str, str]], tool_list: list[dict]) -> dict:
        rec = chat(self.base, self.server, messages, tool_list, self.max_tokens,
                   self.read_timeout)
        rec["what"] = what
        self.log(
            f"    {self.server:<7} {what:<28} prompt {rec.get('prompt_tokens')!s:>6} cached "
            f"{rec.get('cached_tokens')!s:>6} TTFT {rec.get('ttft_ms')!s:>9} ms"
            + (f"  ERROR {rec['error']} {rec.get('detail', '')}" if rec["error"] else ""),
            flush=True,
        )
        return rec


def warm_up(c: Client, r: Renderer) -> dict:
    """One short request of unrelated content (kernels, first-request costs)."""
    conv = Conversation("warm-up", 1024, r, c.max_tokens)
    return c.send("warm-up", conv.turn1(), conv.tools)


def _pair(warm: dict, cold_rec: dict) -> dict[str, Any]:
    return {"warm": warm, "cold": cold_rec}


def run_chat_scenarios(c: Client, convs: dict[str, Conversation], scenarios: list[str],
                       rng: random.Random, probe: Any = None) -> dict[str, Any]:
    """Scenarios 1-3 of one repeat on a running server. Order: main conversation turn 1,
    its next turn (answer as text), the sub-agent, the thinking conversation's turns 1
    and 2, then the cold prompts (last, so that they do not push the warm prompts' cached
    prefixes out of a small cache before they are used). ``probe`` (mlxcel's cache stats)
    is read before and after the first turn 1: what one prompt stores."""
    out: dict[str, Any] = {}
    warm: dict[str, tuple[dict, list[dict[str, str]], list[dict]]] = {}
    main, think = convs["main"], convs["think"]
    if {"answer-as-text", "sub-agent"} & set(scenarios):
        if probe:
            out["stats_before_turn1"] = probe()
        t1 = c.send("main turn 1", main.turn1(), main.tools)
        out["main_turn1"] = t1
        if probe:
            time.sleep(0.5)  # the entry is stored as the stream ends
            out["stats_after_turn1"] = probe()
        if "answer-as-text" in scenarios:
            msgs = main.turn2(t1["text"])
            warm["answer-as-text"] = (c.send("answer-as-text warm", msgs, main.tools), msgs,
                                      main.tools)
        if "sub-agent" in scenarios:
            msgs = main.sub_agent()
            warm["sub-agent"] = (c.send("sub-agent warm", msgs, main.tools), msgs, main.tools)
    if "thinking-stripped" in scenarios:
        t1 = c.send("thinking turn 1", think.turn1(), think.tools)
        out["thinking_turn1"] = t1
        msgs = think.turn2(t1["text"], think=True)
        warm["thinking-stripped"] = (c.send("thinking-stripped warm", msgs, think.tools), msgs,
                                     think.tools)
    for name, (w, msgs, tl) in warm.items():
        out[name] = _pair(w, c.send(f"{name} cold", cold(msgs, rng), tl))
    return out


# -- one family -------------------------------------------------------------------------
ROOT = pathlib.Path(__file__).resolve().parent.parent
FAMILIES = ("30m", "gemma4-30m-512", "qwen3-next-30m")
QUICK_FAMILIES = ("tiny", "gemma4-tiny", "qwen3-next-tiny")
BOUND = {"restart-disk": 0.2}  # warm / cold targets; 0.1 for the others


def parse_size(s: str) -> int:
    s = s.strip().lower()
    return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)


def slim(rec: dict[str, Any]) -> dict[str, Any]:
    """A record without the answer's text (kept only as long as a later turn needs it)."""
    return {k: v for k, v in rec.items() if k != "text"}


class Family:
    """One checkpoint's servers: their argv, a log folder, the renderer that sizes prompts."""

    def __init__(self, args: argparse.Namespace, path: pathlib.Path, label: str,
                 logdir: pathlib.Path):
        self.args, self.path, self.label, self.logdir = args, path, label, logdir
        self.template = qwen3_template()
        self.template_file = logdir / "qwen3-chatml.jinja"
        self.template_file.write_text(self.template)
        self.r = Renderer(path, self.template)
        cfg = json.loads((path / "config.json").read_text())
        self.model_ctx = int(cfg.get("max_position_embeddings") or 4096)
        self.need_ctx = 0  # set per size: the longest prompt + room

    def fit(self, convs: list[dict[str, Conversation]]) -> None:
        answer = " ".join(["word"] * self.args.max_tokens)
        longest = max(self.r.prompt_tokens(c.turn2(answer, think=True), c.tools)
                      for conv in convs for c in conv.values())
        self.need_ctx = max(2048, int(longest * 1.1) + 2 * self.args.max_tokens + 256)

    def argv(self, name: str, size: int, extra: list[str] = ()) -> tuple[list[str], str]:
        a = self.args
        if name == "mlx_lm":
            ex = ["--chat-template", self.template, *shlex.split(a.mlx_lm_args)]
            return server_argv("mlx_lm", self.path, extra=ex)
        ex = ["--chat-template-file", str(self.template_file)]
        if self.need_ctx > self.model_ctx:  # mlxcel refuses a prompt past a slot's context
            ex += ["--ctx-size", str(self.need_ctx * a.parallel)]
        return server_argv("mlxcel", self.path, a.parallel, None,
                           [*ex, *shlex.split(a.mlxcel_args), *extra])

    def show(self, argv: list[str]) -> str:
        return shlex.join(argv).replace(shlex.quote(self.template), "<qwen3-chatml template>")

    def client(self, srv: Server, name: str) -> Client:
        return Client(srv.base, name, self.args.max_tokens, self.args.read_timeout)

    def start(self, name: str, argv: list[str], ready: str, tag: str,
              out: dict[str, Any], key: str = "") -> Server:
        env = None
        if name == "mlx_lm" and not self.args.mlx_lm_own_blas:
            env = same_blas_env()
            out["same_blas"] = bool(env)
        if name.startswith("mlxcel") and self.args.mlxcel_spawn:
            # Granian forks its worker after the parent may have initialised CUDA (seen on
            # the H200); a sitecustomize selecting 'spawn' works around it (serving.py's)
            site = self.logdir / "spawn-site"
            site.mkdir(exist_ok=True)
            (site / "sitecustomize.py").write_text(
                "import multiprocessing\nmultiprocessing.set_start_method('spawn', force=True)\n")
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        srv = Server(name, argv, ready, self.logdir, tag, env, cwd=ROOT)
        out["argv"] = self.show(srv.argv)
        out[f"loadavg_before{key}"] = loadavg()
        srv.start()
        try:
            out[f"startup_s{key}"] = round(srv.wait_ready(), 2)
            out[f"warmup{key}"] = slim(warm_up(self.client(srv, name.split("-")[0]), self.r))
        except BaseException:
            out[f"log{key}"] = str(srv.log_path)
            srv.stop()
            raise
        return srv

    def run_chat(self, name: str, size: int, convs: list[dict[str, Conversation]],
                 scenarios: list[str]) -> dict[str, Any]:
        """Scenarios 1-3 on one server, every repeat."""
        argv, ready = self.argv(name, size)
        out: dict[str, Any] = {"repeats": []}
        srv = None
        try:
            srv = self.start(name, argv, ready, f"{self.label}-{size}", out)
            c = self.client(srv, name)
            rng = random.Random(f"cold-{self.label}-{size}-{name}")
            for i, conv in enumerate(convs):
                probe = (lambda: cache_stats(srv.base)) if name == "mlxcel" and i == 0 else None
                rep = run_chat_scenarios(c, conv, scenarios, rng, probe)
                out["repeats"].append(_strip_texts(rep))
                if not srv.alive():
                    raise RuntimeError(f"{name} died:\n{srv.log_tail()}")
            if name == "mlxcel":
                out["cache_stats"] = cache_stats(srv.base)
        except Exception as exc:  # recorded; the other servers still run
            out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"  {name} FAILED: {out['error'][:600]}", file=sys.stderr, flush=True)
        finally:
            if srv is not None:
                srv.stop()
                out["log"] = str(srv.log_path)
            out["loadavg_after"] = loadavg()
        return out

    def run_disk(self, size: int, convs: list[dict[str, Conversation]]) -> dict[str, Any]:
        """Scenario 4: turn 1 on a server with a disk tier, a restart, turn 2."""
        d = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-pc-disk-"))
        extra = ["--cache-disk-dir", str(d)]
        if self.args.cache_disk_bytes:
            extra += ["--cache-disk-bytes", str(self.args.cache_disk_bytes)]
        argv, ready = self.argv("mlxcel", size, extra)
        out: dict[str, Any] = {"repeats": [{} for _ in convs]}
        rng = random.Random(f"cold-{self.label}-{size}-disk")
        try:
            for life in (1, 2):
                srv = None
                try:
                    srv = self.start(f"mlxcel-disk{life}", argv, ready, f"{self.label}-{size}",
                                     out, f"_{life}")
                    c = self.client(srv, "mlxcel")
                    out[f"stats_start_{life}"] = cache_stats(srv.base)
                    for rep, conv in zip(out["repeats"], convs, strict=True):
                        disk = conv["disk"]
                        if life == 1:
                            rep["turn1"] = c.send("restart-disk turn 1", disk.turn1(), disk.tools)
                            continue
                        msgs = disk.turn2(rep["turn1"]["text"])
                        w = c.send("restart-disk warm", msgs, disk.tools)
                        rep["restart-disk"] = {"warm": slim(w), "cold": slim(
                            c.send("restart-disk cold", cold(msgs, rng), disk.tools))}
                    out[f"stats_end_{life}"] = cache_stats(srv.base)
                finally:
                    if srv is not None:
                        out[f"stop_s_{life}"] = stop_gracefully(srv)
                        out[f"log_{life}"] = str(srv.log_path)
                    out[f"disk_after_{life}"] = dir_usage(d)
                    out[f"loadavg_after_{life}"] = loadavg()
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"  mlxcel-disk FAILED: {out['error'][:600]}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        for rep in out["repeats"]:
            if "turn1" in rep:
                rep["turn1"] = slim(rep["turn1"])
        return out


def _strip_texts(rep: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in rep.items():
        if isinstance(v, dict) and "warm" in v:
            out[k] = {"warm": slim(v["warm"]), "cold": slim(v["cold"])}
        elif isinstance(v, dict) and "what" in v:
            out[k] = slim(v)
        else:
            out[k] = v
    return out


# -- summary ----------------------------------------------------------------------------
def med(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def row_for(servers: dict[str, Any], scenario: str) -> dict[str, Any]:
    row: dict[str, Any] = {"scenario": scenario}
    for name in ("mlxcel", "mlx_lm"):
        if scenario in MLXCEL_ONLY:
            src = servers.get("mlxcel-disk") if name == "mlxcel" else None
        else:
            src = servers.get(name)
        if src is None:
            row[name] = None
            continue
        pairs = [rep[scenario] for rep in src.get("repeats", ()) if scenario in rep]
        ok = [p for p in pairs if not p["warm"]["error"] and not p["cold"]["error"]]
        row[name] = {
            "warm_ms": med([p["warm"]["ttft_ms"] for p in ok]),
            "cold_ms": med([p["cold"]["ttft_ms"] for p in ok]),
            "ratio": med([ratio(p["warm"]["ttft_ms"], p["cold"]["ttft_ms"]) for p in ok]),
            "ratios": [ratio(p["warm"]["ttft_ms"], p["cold"]["ttft_ms"]) for p in ok],
            "cached_tokens": med([p["warm"]["cached_tokens"] for p in ok]),
            "cold_cached_tokens": med([p["cold"]["cached_tokens"] for p in ok]),
            "prompt_tokens": med([p["warm"]["prompt_tokens"] for p in ok]),
            "n": len(ok),
            "errors": [f"{x['what']}: {x['error']}" for p in pairs for x in p.values()
                       if x["error"]] or ([src["error"][:200]] if src.get("error") else []),
        }
    row["warm_mlxcel_vs_mlx_lm"] = ratio((row["mlxcel"] or {}).get("warm_ms"),
                                         (row["mlx_lm"] or {}).get("warm_ms"))
    bound = BOUND.get(scenario, 0.1)
    mine = (row["mlxcel"] or {}).get("ratio")
    theirs = (row["mlx_lm"] or {}).get("ratio")
    row["targets"] = [{"target": f"mlxcel warm/cold <= {bound}", "short": f"<= {bound}",
                       "value": mine, "met": mine is not None and mine <= bound}]
    if scenario not in MLXCEL_ONLY:
        row["targets"].append({"target": "mlxcel warm/cold <= mlx_lm's", "short": "<= mlx_lm",
                               "value": theirs,
                               "met": None not in (mine, theirs) and mine <= theirs})
    return row


MEM_KEYS = ("checkpoints", "checkpoint_bytes", "entries", "bytes")


def memory(servers: dict[str, Any]) -> dict[str, Any] | None:
    """Checkpoint and entry bytes that mlxcel's first turn 1 added, per 1k prompt tokens."""
    reps = (servers.get("mlxcel") or {}).get("repeats") or [{}]
    before, after = reps[0].get("stats_before_turn1"), reps[0].get("stats_after_turn1")
    tokens = (reps[0].get("main_turn1") or {}).get("prompt_tokens")
    if not (isinstance(before, dict) and isinstance(after, dict) and tokens):
        return None
    delta = {k: after[k] - before[k] for k in MEM_KEYS
             if isinstance(after.get(k), int | float) and isinstance(before.get(k), int | float)}
    out: dict[str, Any] = {"prompt_tokens": tokens, "added": delta}
    for k in ("checkpoint_bytes", "bytes"):
        if k in delta:
            out[f"{k}_per_1k_tokens"] = round(delta[k] * 1000 / tokens)
    return out


def summarize(size_entry: dict[str, Any], scenarios: list[str]) -> None:
    size_entry["rows"] = [row_for(size_entry["servers"], s) for s in scenarios]
    size_entry["memory"] = memory(size_entry["servers"])


# -- report -----------------------------------------------------------------------------
def _cell(x: dict[str, Any] | None, key: str, nd: int = 0) -> str:
    if x is None:
        return "n/a"
    if x.get("n") == 0 and x.get("errors"):
        return "err"
    return fmt(x.get(key), nd)


def _met(t: dict[str, Any]) -> str:
    return "met" if t["met"] else "**missed**"


def _stats_line(st: Any) -> str:
    if not isinstance(st, dict):
        return "-"
    keys = ("entries", "bytes", "checkpoints", "checkpoint_bytes", "hits", "lookups",
            "evictions_lru", "hits_by_kind", "disk")
    return ", ".join(f"{k} {json.dumps(st[k])}" for k in keys if k in st) or json.dumps(st)[:300]


def _sizes(doc: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Each (entry, prompt size's results) of a report, in order."""
    for e in doc["entries"]:
        yield from ((e, se) for se in e["sizes"].values())


def render_md(doc: dict[str, Any]) -> str:
    L = [
        "# Prompt cache in agent scenarios: warm / cold TTFT, mlxcel vs mlx_lm.server",
        "",
        "An agent's prompts (a long system prompt with 8 tools, tool-output-like user turns; "
        "the same messages to both servers, one template for both: chatml with Qwen3's rule "
        "that earlier turns lose their `<think>` block), streamed, temperature 0. "
        "Scenarios: `answer-as-text` (turn 2 re-sends turn 1's answer as text), "
        "`thinking-stripped` (the same with a `<think>` block the template drops), "
        "`sub-agent` (a new conversation sharing only system + tools), `restart-disk` "
        "(mlxcel with `--cache-disk-dir`: turn 1, restart, turn 2). Warm = the scenario's "
        "prompt; cold = the same prompt with a fresh id at the very start of the system "
        "prompt (nothing shared). TTFT = request sent -> first content chunk; medians over "
        "the repeats (each its own content); warm/cold = the median of each repeat's ratio; "
        "cached = `usage.prompt_tokens_details.cached_tokens`. Targets: mlxcel warm/cold "
        "<= 0.1 (restart-disk <= 0.2) and <= mlx_lm.server's. `bench/README.md` has the "
        "method; `bench/prompt_cache.py` the code.",
        "",
        "| family | prompt | scenario | mlxcel warm/cold | mlx_lm warm/cold "
        "| warm ms mlxcel / mlx_lm | targets |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for e, se in _sizes(doc):
        for row in se.get("rows", ()):
            L.append(
                f"| {e['label']} | {fmt((row['mlxcel'] or {}).get('prompt_tokens'))} "
                f"| {row['scenario']} | {_cell(row['mlxcel'], 'ratio', 3)} "
                f"| {_cell(row['mlx_lm'], 'ratio', 3)} "
                f"| {fmt(row.get('warm_mlxcel_vs_mlx_lm'), 2)} | "
                + "; ".join(f"{t.get('short', t['target'])}: {_met(t)}" for t in row["targets"]) + " |"
            )
    L += [
        "",
        "Memory (mlxcel): what the first turn 1 of a run added to `/v1/cache/stats`, per 1k "
        "prompt tokens.",
        "",
        "| family | prompt | checkpoints added | checkpoint KiB / 1k tokens "
        "| entry KiB / 1k tokens |",
        "|---|---:|---:|---:|---:|",
    ]
    for e, se in _sizes(doc):
        mem = se.get("memory") or {}
        kib = [fmt(mem[k] / 1024, 1) if mem.get(k) is not None else "n/a"
               for k in ("checkpoint_bytes_per_1k_tokens", "bytes_per_1k_tokens")]
        L.append(f"| {e['label']} | {fmt(mem.get('prompt_tokens'))} "
                 f"| {fmt((mem.get('added') or {}).get('checkpoints'))} "
                 f"| {kib[0]} | {kib[1]} |")
    L.append("")
    for e in doc["entries"]:
        ck, m, s = e["checkpoint"], e["machine"], e["settings"]
        L += [
            f"## {e['label']} ({ck['model_type']} h{ck['hidden_size']} "
            f"L{ck['num_hidden_layers']} V{ck['vocab_size']}, {ck['params'] / 1e6:.1f}M "
            f"params, {ck['torch_dtype']})",
            "",
            f"{e['date']}; {m.get('gpu') or str(m['nproc']) + ' CPUs (' + m['cpu'] + ')'}, "
            f"{m['platform']}; max_tokens {s['max_tokens']}; "
            "versions " + ", ".join(f"{k} {v}" for k, v in e["versions"].items()) + ".",
            "",
        ]
        for size, se in e["sizes"].items():
            rp = se.get("repeats", s["repeats"])
            L += [f"### ~{size} tokens ({rp} repeat{'s' if rp != 1 else ''})", ""]
            for name, v in se["servers"].items():
                la = " -> ".join(str(v.get(k)) for k in sorted(v) if k.startswith("loadavg"))
                ready = ", ".join(f"{v[k]}s" for k in sorted(v) if k.startswith("startup_s"))
                L.append(f"- {name}: `{v.get('argv', '')}` (ready in {ready or '?'}; 1-min "
                         f"load average {la})"
                         + ("; OpenBLAS preloaded as mlxcel does" if v.get("same_blas") else "")
                         + (f"; **failed**: {v['error'][:300]}" if v.get("error") else ""))
            L += [
                "",
                "| scenario | prompt tokens | mlxcel warm ms | cold ms | warm/cold | cached "
                "| mlx_lm warm ms | cold ms | warm/cold | cached | targets |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            ]
            for row in se.get("rows", ()):
                a, b = row["mlxcel"], row["mlx_lm"]
                L.append(
                    f"| {row['scenario']} | {_cell(a, 'prompt_tokens')} | {_cell(a, 'warm_ms')} "
                    f"| {_cell(a, 'cold_ms')} | {_cell(a, 'ratio', 3)} "
                    f"| {_cell(a, 'cached_tokens')} | {_cell(b, 'warm_ms')} "
                    f"| {_cell(b, 'cold_ms')} | {_cell(b, 'ratio', 3)} "
                    f"| {_cell(b, 'cached_tokens')} | "
                    + "; ".join(f"{t.get('short', t['target'])}: {_met(t)}" for t in row["targets"]) + " |"
                )
            errs = [f"{row['scenario']} {n}: {', '.join(row[n]['errors'][:3])}"
                    for row in se.get("rows", ()) for n in ("mlxcel", "mlx_lm")
                    if row[n] and row[n]["errors"]]
            L += [""] + [f"- errors: {x}" for x in errs]
            mem = se.get("memory")
            if mem:
                ck = mem.get("checkpoint_bytes_per_1k_tokens")
                L.append(
                    f"- memory (mlxcel, what the first turn 1 of {mem['prompt_tokens']} tokens "
                    f"added to `/v1/cache/stats`: {json.dumps(mem['added'])}): checkpoints "
                    + (f"**{ck / 1024:.1f} KiB**" if ck is not None else "n/a (no "
                       "checkpoint_bytes)")
                    + " per 1k prompt tokens; entries "
                    + fmt(mem.get("bytes_per_1k_tokens") and mem["bytes_per_1k_tokens"] / 1024, 1)
                    + " KiB per 1k")
            st = (se["servers"].get("mlxcel") or {}).get("cache_stats")
            L.append(f"- mlxcel `GET /v1/cache/stats` at the end: {_stats_line(st)}")
            dk = se["servers"].get("mlxcel-disk")
            if dk:
                L.append(
                    f"- restart-disk: stop {dk.get('stop_s_1')}s, then on disk "
                    f"{json.dumps(dk.get('disk_after_1'))}; stats after the restart: "
                    f"{_stats_line(dk.get('stats_start_2'))}; at the end: "
                    f"{_stats_line(dk.get('stats_end_2'))}")
            c = se.get("code") or e.get("code") or {}
            L += [
                f"- run {se.get('date', e['date'])}: `{se.get('command', e['command'])}` (this "
                f"size took {se.get('total_s', e.get('total_s'))}s; code: HEAD {c.get('head')}"
                + (f", uncommitted diff sha256 {c['diff_sha256']} over {c['dirty_files']} files"
                   if c.get("diff_sha256") else "") + ")",
                "",
            ]
        L += [f"- {n}" for n in e.get("notes", ())] + ([""] if e.get("notes") else [])
    return "\n".join(L).rstrip() + "\n"


def save(out: pathlib.Path, entry: dict[str, Any], fresh: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    old: list[dict[str, Any]] = []
    if out.exists() and not fresh:
        with contextlib.suppress(ValueError, OSError):
            old = [e for e in json.loads(out.read_text()).get("entries", []) if "sizes" in e]
    for e in old:  # a run of other sizes of the same family: keep those
        if e["label"] == entry["label"]:
            for se in e["sizes"].values():
                for k in ("date", "command", "code", "total_s"):
                    se.setdefault(k, e.get(k))
                se.setdefault("repeats", e["settings"]["repeats"])
            sizes = {**e["sizes"], **entry["sizes"]}
            entry = {**entry, "sizes": {k: sizes[k] for k in sorted(sizes, key=int)}}
    doc = {
        "benchmark": "prompt_cache_scenarios",
        "updated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "entries": [e for e in old if e["label"] != entry["label"]] + [entry],
    }
    out.write_text(json.dumps(doc, indent=1, default=lambda o: None) + "\n")
    out.with_suffix(".md").write_text(render_md(doc))


def code_state() -> dict[str, Any]:
    """HEAD and a digest of the uncommitted diff (results taken on a dirty tree)."""

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    diff = git("diff", "HEAD")
    return {
        "head": git("rev-parse", "--short", "HEAD").strip(),
        "dirty_files": len(git("status", "--short").splitlines()),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:12] if diff else None,
    }


# -- main -------------------------------------------------------------------------------
def run_family(args: argparse.Namespace, name: str, sizes: list[int], scenarios: list[str],
               servers: list[str], logdir: pathlib.Path, out: pathlib.Path,
               command: str) -> dict[str, Any]:
    if args.model:
        path, label = pathlib.Path(args.model).resolve(), args.label or name
    else:
        kw = dict(CHECKPOINTS[name])
        if args.dtype == "auto":  # float32 on a CPU: what mlxcel computes in there too
            import mlx.core as mx

            if mx.default_device() == mx.cpu:
                kw["dtype"] = "float32"
        elif args.dtype != "none":
            kw["dtype"] = args.dtype
        path = bench_checkpoint(kw.pop("shape"), cache_dir=args.checkpoint_dir, **kw)
        label = args.label or name
    fam = Family(args, path, label, logdir)
    entry: dict[str, Any] = {
        "label": label, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command, "checkpoint": checkpoint_info(path),
        "settings": {k: getattr(args, k) for k in (
            "repeats", "max_tokens", "parallel", "mlxcel_args", "mlx_lm_args",
            "cache_disk_bytes", "dtype", "mlxcel_spawn", "mlx_lm_own_blas")}
        | {"scenarios": scenarios, "temperature": 0.0},
        "versions": versions(), "machine": machine(), "code": code_state(),
        "notes": args.note, "sizes": {},
    }
    t0 = time.perf_counter()
    chat_scen = [s for s in scenarios if s not in MLXCEL_ONLY]
    for size in sizes:
        convs = [{k: Conversation(f"r{i}-{size}-{k}", size, fam.r, args.max_tokens)
                  for k in ("main", "think", "disk")} for i in range(args.repeats)]
        fam.fit(convs)
        print(f"== {label} ~{size} tokens ({path})", flush=True)
        se: dict[str, Any] = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "command": command,
            "code": code_state(), "repeats": args.repeats, "servers": {}}
        entry["sizes"][str(size)] = se
        t_size = time.perf_counter()
        for srv in servers:
            if chat_scen:
                se["servers"][srv] = fam.run_chat(srv, size, convs, chat_scen)
            if srv == "mlxcel" and "restart-disk" in scenarios:
                se["servers"]["mlxcel-disk"] = fam.run_disk(size, convs)
            summarize(se, scenarios)
            se["total_s"] = round(time.perf_counter() - t_size, 1)
            entry["total_s"] = round(time.perf_counter() - t0, 1)
            save(out, entry, args.fresh)
        for row in se["rows"]:
            print(f"  {row['scenario']:<18} warm/cold mlxcel "
                  f"{_cell(row['mlxcel'], 'ratio', 3):>6} (warm {_cell(row['mlxcel'], 'warm_ms')}"
                  f" / cold {_cell(row['mlxcel'], 'cold_ms')} ms, cached "
                  f"{_cell(row['mlxcel'], 'cached_tokens')}), mlx_lm "
                  f"{_cell(row['mlx_lm'], 'ratio', 3):>6}: "
                  + "; ".join(f"{t['target']} {'met' if t['met'] else 'MISSED'}"
                              for t in row["targets"]), flush=True)
        if se.get("memory"):
            print(f"  memory: {json.dumps(se['memory'])}", flush=True)
        args.fresh = False  # one family's entry is in; later ones merge
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny checkpoints, ~1k tokens, 1 repeat, results in /tmp (smoke)")
    ap.add_argument("--families", default=None,
                    help=f"bench checkpoint names (default {','.join(FAMILIES)})")
    ap.add_argument("--model", default=None, help="serve this checkpoint directory instead")
    ap.add_argument("--label", default=None)
    ap.add_argument("--sizes", default=None, help="prompt tokens, e.g. 4k,16k (default)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--servers", default="mlxcel,mlx_lm")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--dtype", default="auto",
                    help="build the checkpoints in this dtype; auto (default): float32 on a "
                    "CPU (both servers then compute in float32, as mlxcel does there anyway), "
                    "the checkpoint's own on a GPU; none: the checkpoint's own")
    ap.add_argument("--checkpoint-dir", default=None,
                    help="build them here (default $MLXCEL_CACHE_DIR/bench-checkpoints)")
    ap.add_argument("--mlx-lm-own-blas", action="store_true",
                    help="do not give mlx_lm.server the BLAS mlxcel preloads on a Linux CPU")
    ap.add_argument("--mlxcel-spawn", action="store_true",
                    help="start mlxcel's Granian worker with the 'spawn' method (CUDA)")
    ap.add_argument("--parallel", type=int, default=4, help="mlxcel --parallel (its default)")
    ap.add_argument("--mlxcel-args", default="")
    ap.add_argument("--mlx-lm-args", default="")
    ap.add_argument("--cache-disk-bytes", type=int, default=None)
    ap.add_argument("--read-timeout", type=float, default=900.0)
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--out", default=None,
                    help="default bench/results/prompt_cache.json (--quick: /tmp/...)")
    ap.add_argument("--fresh", action="store_true", help="drop other entries in --out")
    ap.add_argument("--note", action="append", default=[], help="a line for the report")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    families = (args.families or ",".join(QUICK_FAMILIES if args.quick else FAMILIES)).split(",")
    sizes = [parse_size(s) for s in (args.sizes or ("1k" if args.quick else "4k,16k")).split(",")]
    args.repeats = args.repeats or (1 if args.quick else 3)
    scenarios = [s for s in args.scenarios.split(",") if s]
    servers = [s for s in args.servers.split(",") if s]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s}; expected some of {','.join(SCENARIOS)}")
    for f in families:
        if f not in CHECKPOINTS and not args.model:
            ap.error(f"unknown checkpoint {f}; expected one of {','.join(sorted(CHECKPOINTS))}")
    out = pathlib.Path(args.out or ("/tmp/mlxcel-prompt-cache-quick.json" if args.quick
                                    else "bench/results/prompt_cache.json"))
    if not out.is_absolute():
        out = ROOT / out
    logdir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="mlxcel-prompt-cache-"))
    logdir.mkdir(parents=True, exist_ok=True)
    cmd_args = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--fresh"]
    command = shlex.join(["python", "bench/prompt_cache.py", *cmd_args])
    t0 = time.perf_counter()
    entries = [run_family(args, f, sizes, scenarios, servers, logdir, out, command)
               for f in (families[:1] if args.model else families)]
    targets = [t for e in entries for se in e["sizes"].values() for row in se.get("rows", ())
               for t in row["targets"]]
    print(f"\ntargets met: {sum(t['met'] for t in targets)} of {len(targets)}; wrote {out} and "
          f"{out.with_suffix('.md')} in {time.perf_counter() - t0:.0f}s; logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
