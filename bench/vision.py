"""Image chat: mlxcel vs ``mlx_vlm.server`` on the same random-weight VLM (issue #30's bench),
a raw mlx-vlm loop as the ceiling (``--raw``, the GPU run), and the fetch policy's cost.

Rules, and why:

- Servers run one at a time, alone, on the same checkpoint, each warmed up first (two image
  requests). mlxcel gets ``--parallel`` = the highest concurrency; ``mlx_vlm.server`` its
  own defaults (one GPU thread running mlx-vlm's ``BatchGenerator``, continuous batching with
  no sequence bound, vision-feature cache of 20) plus its prompt cache (``APC_ENABLED=1``,
  disk tier off), which it leaves off by default while mlxcel's is on. ``--rounds R``: R
  passes per server in turn (mlxcel, mlx_vlm, mlxcel, ...); per level the pass with the
  median aggregate tok/s is reported, the others beside it (a shared machine drifts).
- A request is one 448x448 PNG (a gradient with shapes, pixels seeded per request) as a
  base64 data URI in an OpenAI ``image_url`` part, then a short question; ``max_tokens`` 64,
  temperature 0, streamed with ``include_usage``. Both servers get the same bodies.
- Every request of a level has its own image (seeded by level and index), so neither the
  vision cache nor the prompt cache helps; levels and warm-up use different seeds.
- Levels: concurrency C (closed loop: each client sends its next request when its last one
  ended), N = max(4, 2 C) requests. Per level: aggregate tok/s (tokens produced / level
  wall time), TTFT p50, ITL p50 (gaps between content chunks), failures by kind (a 501 is
  "not supported": image input refused), dropped connections; ratio mlxcel / mlx_vlm.
- Repeated image: the same image and question sent twice, the second after the first
  ended; TTFT(second) / TTFT(first) per server, the median over ``--repeats`` images.
- The checkpoint (``SHAPES``) is built by ``mlxcel.testing.vlm_checkpoints`` (tokenizer,
  template, processor files of a tiny ``build_vlm``), then re-initialised at its shape with an
  untied lm_head whose rows for EOS, special, partial-UTF-8 and whitespace-only tokens (and
  any id past the tokenizer) are zero, as ``bench_checkpoints`` does for text: greedy decoding
  on random weights never stops early and every token is one content chunk on both servers.
  The processor keeps the real model's pixel bounds, so the 448x448 image is 256 image tokens.
- Fetch policy: ``mlxcel.media.fetch.fetch`` of the PNG from a loopback HTTP server (policy
  with ``allow_private``, which loopback needs: the guard still resolves and dials the
  address it resolved) vs a plain ``httpx`` GET (a fresh client each, as the fetch makes),
  medians; and the address check alone (``resolve`` + ``is_public``) on a public IP literal.
- Report ratios and medians, never one absolute time.

    python bench/vision.py                              # CPU: the tiny Qwen2-VL
    python bench/vision.py --checkpoint qwen2.5-vl-7b --dtype bfloat16 --raw \\
        --out bench/results/vision_gpu.json            # the H200 run (bench/gpu/vision.sh)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import hashlib
import http.server
import io
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
from mlxcel.testing import bench_report
from mlxcel.testing.servers import (
    Server,
    loadavg,
    machine,
    same_blas_env,
    server_argv,
    spawn_env,
    stream_chat,
)

QUESTION = "What is in this picture? Describe it briefly."
SIDE = 448
# the real Qwen2-VL / Qwen2.5-VL processors' pixel bounds: 448x448 stays 32x32 patches
PIXELS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384}
# name -> (recipe, tokenizer vocab, config.json overrides, vision_config overrides)
SHAPES: dict[str, tuple[str, int, dict[str, Any], dict[str, Any]]] = {
    "qwen2-vl-tiny": ("qwen2_vl", 512, {}, {}),
    "qwen2.5-vl-tiny": ("qwen2_5_vl", 512, {}, {}),
    "qwen2-vl-7b": ("qwen2_vl", 8192, {
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "max_position_embeddings": 32768, "max_window_layers": 28,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, {
        "depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "hidden_size": 3584}),
    "qwen2.5-vl-7b": ("qwen2_5_vl", 8192, {
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "max_position_embeddings": 128000, "max_window_layers": 28,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, {
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "out_hidden_size": 3584, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2}),
}
TARGETS = [("c=1 aggregate tok/s mlxcel/mlx_vlm", ">=", 1.0),
           ("c=8 aggregate tok/s mlxcel/mlx_vlm", ">=", 2.0),
           ("mlxcel requests dropped or failed", "<=", 0),
           ("mlxcel TTFT repeated / first image", "<=", 0.3)]

BUILD = r"""
import json, pathlib, shutil, sys
import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_vlm.utils import update_module_configs
from mlxcel.testing import vlm_checkpoints as vc
from mlxcel.testing.bench_checkpoints import unclean_ids
from mlxcel.testing.vlm_recipes import RECIPES
out, recipe, vocab, dtype = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
text, vision, pixels = (json.loads(a) for a in sys.argv[5:8])
tmp = out.with_name(out.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
vc.build_vlm(tmp, recipe, dtype=dtype, vocab_size=vocab)  # tokenizer, template, processor
cfg = json.loads((tmp / "config.json").read_text())
cfg.update(text, tie_word_embeddings=False)
cfg["vision_config"].update(vision)
(tmp / "config.json").write_text(json.dumps(cfg, indent=2))
pre = json.loads((tmp / "preprocessor_config.json").read_text())
(tmp / "preprocessor_config.json").write_text(json.dumps({**pre, **pixels}, indent=2))
# vlm_checkpoints.init_model, one parameter evaluated at a time (a 7B model in bf16 stays
# near its own size while built)
cls = vc._model_class(cfg)
conf = json.loads(json.dumps(cfg))
for part in ("text_config", "vision_config", "audio_config"):
    conf.setdefault(part, {})
mc = update_module_configs(cls.ModelConfig.from_dict(conf), cls, conf,
                           ["text", "vision", "perceiver", "projector", "audio"])
mx.random.seed(0)
model = cls.Model(mc)
model.set_dtype(getattr(mx, dtype))
for key, value in tree_flatten(model.parameters()):
    new = value + (vc.NOISE * mx.random.normal(value.shape)).astype(value.dtype)
    mx.eval(new)
    model.update(tree_unflatten([(key, new)]))
head = model.language_model.lm_head
bad = unclean_ids(tmp / "tokenizer.json") + list(range(vocab, cfg["vocab_size"]))
mask = mx.ones((head.weight.shape[0], 1), dtype=head.weight.dtype)
mask[mx.array(bad)] = 0
head.weight = head.weight * mask
mx.eval(head.weight)
vc._save(model, tmp, RECIPES[recipe])
shutil.rmtree(out, ignore_errors=True)
tmp.rename(out)
print(json.dumps({"params": sum(v.size for _, v in tree_flatten(model.parameters())),
                  "suppressed": len(bad)}))
"""


def build(label: str, root: pathlib.Path, dtype: str) -> pathlib.Path:
    """The checkpoint ``label`` names, built once in a child process (this one stays
    MLX-free)."""
    recipe, vocab, text, vision = SHAPES[label]
    path = root / f"vlm-{label}-{dtype}"
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, "-c", BUILD, str(path), recipe, str(vocab), dtype,
                        json.dumps(text), json.dumps(vision), json.dumps(PIXELS)], check=True)
    return path


def png(seed: int, side: int = SIDE) -> bytes:
    """A ``side`` x ``side`` PNG: a gradient with a few shapes, all placed by ``seed``."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side] / side
    a, b, c = rng.random(3)
    rgb = np.stack([(x + a) % 1, (y + b) % 1, ((x + y) / 2 + c) % 1], -1) * 255
    img = Image.fromarray(rgb.astype("uint8"))
    draw = ImageDraw.Draw(img)
    for k in range(6):
        x0, y0 = (int(v) for v in rng.integers(0, side - 64, 2))
        x1, y1 = x0 + int(rng.integers(24, 160)), y0 + int(rng.integers(24, 160))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if k % 2 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def seed_of(tag: str, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{tag}/{i}".encode()).digest()[:8], "big")


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def body(model: str, uri: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": uri}},
                {"type": "text", "text": QUESTION}]}]}


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(900, connect=30))


DROPPED = ("dropped", "read_timeout", "connect_timeout", "connect_refused")


async def level(base: str, model: str, concurrency: int, requests: int, tag: str,
                max_tokens: int) -> dict[str, Any]:
    """A closed loop of ``requests`` image chats over ``concurrency`` clients."""
    uris = [data_uri(png(seed_of(tag, i))) for i in range(requests)]  # before the clock

    def one(c: httpx.AsyncClient, i: int):
        return stream_chat(c, base + "/v1/chat/completions", body(model, uris[i], max_tokens),
                           max_tokens)

    async with client() as c:
        recs, wall = await bench_report.closed_loop(c, concurrency, requests, one)
    return summarize(recs, concurrency, requests, wall)


def summarize(recs: list[dict[str, Any]], concurrency: int, requests: int,
              wall: float) -> dict[str, Any]:
    errors = collections.Counter(r["error"] for r in recs if r["error"])
    ttfts = [r["ttft_s"] * 1e3 for r in recs if "ttft_s" in r]
    gaps = [g for r in recs for g in r.get("gaps_ms", ())]
    tokens = sum(r["completion_tokens"] for r in recs)
    out: dict[str, Any] = {
        "concurrency": concurrency, "requests": requests, "wall_s": round(wall, 3),
        "tokens": tokens, "agg_tok_s": tokens / wall if wall else 0.0,
        "ttft_p50_ms": statistics.median(ttfts) if ttfts else None,
        "itl_p50_ms": statistics.median(gaps) if gaps else None,
        "failures": dict(errors), "dropped": sum(errors[k] for k in DROPPED),
        "prompt_tokens": next((r["prompt_tokens"] for r in recs if r["prompt_tokens"]), None),
        "supported": errors.get("http_501", 0) < len(recs)}
    details = [r["detail"] for r in recs if r.get("detail")]
    if details:
        out["detail"] = details[0]
    return out


async def repeat(base: str, model: str, repeats: int, max_tokens: int,
                 tag: str) -> dict[str, Any]:
    """The same image and question twice, the second after the first ended; per image
    TTFT(second) / TTFT(first), and the second's cached prompt tokens."""
    pairs = []
    async with client() as c:
        for k in range(repeats):
            b = body(model, data_uri(png(seed_of(tag, k))), max_tokens)
            url = base + "/v1/chat/completions"
            first = await stream_chat(c, url, b, max_tokens)
            second = await stream_chat(c, url, b, max_tokens)
            if "ttft_s" not in first or "ttft_s" not in second:
                pairs.append({"error": first["error"] or second["error"],
                              "detail": first.get("detail") or second.get("detail")})
                continue
            pairs.append({"ttft_first_ms": first["ttft_s"] * 1e3,
                          "ttft_second_ms": second["ttft_s"] * 1e3,
                          "ratio": second["ttft_s"] / first["ttft_s"],
                          "cached_tokens": second["cached_tokens"],
                          "prompt_tokens": second["prompt_tokens"]})
    ratios = [p["ratio"] for p in pairs if "ratio" in p]
    return {"pairs": pairs, "ratio_p50": statistics.median(ratios) if ratios else None}



def run_server(name: str, path: pathlib.Path, args: argparse.Namespace,
               logdir: pathlib.Path, label: str) -> dict[str, Any]:
    if name == "mlxcel":
        extra = args.mlxcel_args.split()
        if args.trace:  # the engine's timeline, one file per pass, in the log folder
            extra += ["--engine-trace", str(logdir / f"{label}.trace.jsonl")]
        argv, ready = server_argv("mlxcel", path, parallel=max(args.concurrency), extra=extra)
        env = spawn_env(logdir) if args.mlxcel_spawn else None
    else:
        argv, ready = [sys.executable, "-m", "mlx_vlm.server", "--model", str(path)], "/health"
        env = {**(same_blas_env() or os.environ), "APC_ENABLED": "1", "APC_DISK_ENABLED": "0"}
    out: dict[str, Any] = {"loadavg_before": loadavg()}
    srv = Server(name, argv, ready, logdir, label, env=env)
    startup = srv.launch()
    out.update(argv=" ".join(srv.argv), startup_s=round(startup, 2))
    model, tag = str(path), label  # the same images on both servers
    try:
        out["warmup"] = asyncio.run(level(srv.base, model, 2, 2, f"warm-{tag}", 8))
        out["levels"] = {}
        for c in args.concurrency:
            n = max(4, 2 * c) if args.requests is None else args.requests
            out["levels"][str(c)] = lv = asyncio.run(
                level(srv.base, model, c, n, f"{tag}-c{c}", args.max_tokens))
            print(f"{label} {name} c={c}: {json.dumps(lv)}", flush=True)
        spy = sampling(srv, logdir / f"{label}.spy.json") if args.py_spy and \
            name == "mlxcel" else None
        try:
            out["repeat"] = asyncio.run(repeat(srv.base, model, args.repeats,
                                               args.max_tokens, f"rep-{tag}"))
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
                spy.wait(timeout=60)
        print(f"{label} {name} repeat: {json.dumps(out['repeat'])}", flush=True)
    finally:
        out["alive_at_end"] = srv.alive()
        out["log_notes"] = srv.log_grep("APC")
        srv.stop()
    out["loadavg_after"] = loadavg()
    return out


def sampling(srv: Server, out: pathlib.Path) -> subprocess.Popen[bytes]:
    """``py-spy record`` of the server's processes (Granian's worker is a child) and all
    their threads, idle ones too, into a speedscope file: where a request's time goes on
    the host, the engine thread's waits included."""
    assert srv.proc is not None
    spy = subprocess.Popen(["py-spy", "record", "--subprocesses", "--threads", "--idle",
                            "--rate", "250", "--format", "speedscope", "--output", str(out),
                            "--pid", str(srv.proc.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # attached before the first request
    return spy


def merge(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's passes as one: per level the pass with the median aggregate tok/s;
    the repeat pairs of every pass."""
    out = {"passes": passes, "levels": {}, "argv": passes[0]["argv"]}
    for c in passes[0]["levels"]:
        lvs = sorted((p["levels"][c] for p in passes), key=lambda lv: lv["agg_tok_s"])
        out["levels"][c] = {**lvs[(len(lvs) - 1) // 2],
                            "agg_tok_s_all": [lv["agg_tok_s"] for lv in lvs]}
    pairs = [q for p in passes for q in p["repeat"]["pairs"]]
    ratios = [q["ratio"] for q in pairs if "ratio" in q]
    out["repeat"] = {"pairs": pairs, "ratio_p50": statistics.median(ratios) if ratios else None}
    return out


RAW = r"""
import json, sys, time
import mlx.core as mx
from mlx_vlm.generate import batch_generate, stream_generate
from mlx_vlm.prompt_utils import apply_chat_template
from mlx_vlm.utils import load
path, images, batches, max_tokens, q = sys.argv[1], json.loads(sys.argv[2]), \
    json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model, processor = load(path)
prompt = apply_chat_template(processor, model.config, q, num_images=1)
out, used = {}, 0

def take(n):
    global used
    used += n
    return images[used - n:used]

for n in batches:
    rows = []
    for rnd in range(3):  # the first is the warm-up
        imgs = take(n)
        t0 = time.perf_counter()
        if n == 1:
            first, toks = None, 0
            for r in stream_generate(model, processor, prompt, image=imgs,
                                     max_tokens=max_tokens, temperature=0.0):
                first = first or time.perf_counter()
                toks = r.generation_tokens
            ttft = (first - t0) * 1e3
        else:
            res = batch_generate(model, processor, images=imgs, prompts=[q] * n,
                                 max_tokens=max_tokens)  # greedy: no sampler given
            toks, ttft = res.stats.generation_tokens, None
        wall = time.perf_counter() - t0
        if rnd:
            rows.append({"tok_s": toks / wall, "tokens": toks, "ttft_ms": ttft})
    rows.sort(key=lambda r: r["tok_s"])
    out[str(n)] = rows[len(rows) // 2]
print(json.dumps(out))
"""


def raw_loop(path: pathlib.Path, batches: list[int], max_tokens: int,
             imgdir: pathlib.Path) -> dict[str, Any]:
    """mlx-vlm's own loops, no HTTP: ``stream_generate`` at batch 1, ``batch_generate`` at
    batch B (images grouped by shape), each image new; tok/s = tokens / wall of one call."""
    paths = []
    for i in range(3 * sum(batches)):
        p = imgdir / f"raw-{i}.png"
        p.write_bytes(png(seed_of("raw", i)))
        paths.append(str(p))
    proc = subprocess.run([sys.executable, "-c", RAW, str(path), json.dumps(paths),
                           json.dumps(batches), str(max_tokens), QUESTION],
                          capture_output=True, text=True, env=same_blas_env())
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a: Any) -> None:
        pass


def fetch_cost(imgdir: pathlib.Path, rounds: int) -> dict[str, Any]:
    """Median ms of mlxcel's fetch vs a plain httpx GET of one PNG from loopback, and of the
    address check alone on a public IP literal."""
    from mlxcel.media import addresses
    from mlxcel.media.fetch import FetchPolicy, fetch

    (imgdir / "img.png").write_bytes(png(seed_of("fetch", 0)))
    handler = lambda *a: _Quiet(*a, directory=str(imgdir))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/img.png"
    policy = FetchPolicy(allow_private=True)

    tls = httpx.create_ssl_context()  # built once, as the fetch's is (tens of ms each)

    async def plain() -> int:
        async with httpx.AsyncClient(trust_env=False, verify=tls) as c:
            return len((await c.get(url)).content)

    shared: list[httpx.AsyncClient] = []

    async def kept() -> int:
        return len((await shared[0].get(url)).content)

    async def guarded() -> int:
        return len((await fetch(url, policy, "messages[0].content[0]")).data)

    async def check() -> bool:
        ips = await addresses.resolve("93.184.216.34", 443)
        return all(addresses.is_public(ip) for ip in ips)

    async def timed(fn: Any, n: int) -> list[float]:
        await fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    async def main() -> dict[str, Any]:
        a, b, k = [], [], []
        shared.append(httpx.AsyncClient(trust_env=False))
        for _ in range(max(1, rounds // 10)):  # interleaved, so drift hits all alike
            a += await timed(plain, 10)
            b += await timed(guarded, 10)
            k += await timed(kept, 10)
        await shared[0].aclose()
        c = await timed(check, 10 * rounds)
        return {"bytes": await plain(), "plain_httpx_ms": statistics.median(a),
                "mlxcel_fetch_ms": statistics.median(b),
                "difference_ms": statistics.median(b) - statistics.median(a),
                "keepalive_httpx_ms": statistics.median(k),
                "address_check_ms": statistics.median(c), "rounds": len(a)}

    try:
        return asyncio.run(main())
    finally:
        httpd.shutdown()


def _f(v: float | None, nd: int = 1) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def targets(run: dict[str, Any]) -> list[dict[str, Any]]:
    x, v = run.get("mlxcel", {}), run.get("mlx_vlm", {})
    xl, vl = x.get("levels", {}), v.get("levels", {})
    cs = sorted(xl, key=int)
    agg = [bench_report.ratio(xl[c]["agg_tok_s"], vl.get(c, {}).get("agg_tok_s")) for c in cs]
    failed = [sum(lv["failures"].values()) for p in x.get("passes", []) for lv in
              p["levels"].values()]
    values = [agg[0] if cs else None, agg[-1] if len(cs) > 1 else None,
              sum(failed) if failed else None, x.get("repeat", {}).get("ratio_p50")]
    return bench_report.judge_targets(TARGETS, values)


def _row(c: str, s: str, lv: dict[str, Any]) -> str:
    fails = ", ".join(f"{k} {n}" for k, n in lv["failures"].items()) or "0"
    spread = "/".join(f"{t:.0f}" for t in lv.get("agg_tok_s_all", ()))
    return (f"| {c} | {lv['requests']} | {s} | {lv['tokens']} | {_f(lv['agg_tok_s'])}"
            f"{f' ({spread})' if '/' in spread else ''} | {_f(lv['ttft_p50_ms'])} | "
            f"{_f(lv['itl_p50_ms'], 2)} | "
            f"{fails if lv['supported'] else 'not supported (501)'} | {lv['dropped']} |")


def render(report: dict[str, Any]) -> str:
    lines = [bench_report.machine_line(report), ""]
    for run in report["runs"]:
        lines += [f"### {run['label']} ({run['dtype']})", "",
                  "| C | N | server | tokens | agg tok/s (passes) | TTFT p50 ms | ITL p50 ms | "
                  "failures | dropped |", "|---|---|---|---|---|---|---|---|---|"]
        servers = [s for s in ("mlxcel", "mlx_vlm") if s in run]
        for c in sorted({c for s in servers for c in run[s]["levels"]}, key=int):
            lines += [_row(c, s, run[s]["levels"][c]) for s in servers
                      if c in run[s]["levels"]]
            if len(servers) == 2 and all(c in run[s]["levels"] for s in servers):
                a, b = (run[s]["levels"][c] for s in servers)
                r = [_f(bench_report.ratio(a[k], b[k]), 2) for k in ("agg_tok_s", "ttft_p50_ms",
                                                        "itl_p50_ms")]
                lines.append(f"| {c} | | **mlxcel / mlx_vlm** | | **{r[0]}** | {r[1]} | "
                             f"{r[2]} | | |")
        raw = run.get("raw")
        if raw and "error" not in raw:
            x = run.get("mlxcel", {}).get("levels", {})
            lines += ["", "Raw mlx-vlm loop (no HTTP): " + "; ".join(
                f"batch {n}: {_f(r['tok_s'])} tok/s, mlxcel c={n} / raw "
                f"{_f(bench_report.ratio(x.get(n, {}).get('agg_tok_s'), r['tok_s']), 2)}"
                for n, r in raw.items())]
        lines += ["", "| server | repeated image: TTFT first ms | second ms | second / first "
                  "(p50) | cached tokens (second) |", "|---|---|---|---|---|"]
        for s in servers:
            ok = [p for p in run[s]["repeat"]["pairs"] if "ratio" in p]
            med = [_f(statistics.median(p[k] for p in ok) if ok else None)
                   for k in ("ttft_first_ms", "ttft_second_ms")]
            cached = sorted({f"{p['cached_tokens']}/{p['prompt_tokens']}" for p in ok})
            lines.append(f"| {s} | {med[0]} | {med[1]} | "
                         f"{_f(run[s]['repeat']['ratio_p50'], 2)} | {', '.join(cached)} |")
        lines += ["", "| target | value | bound | met |", "|---|---|---|---|"]
        lines += [f"| {t['target']} | {_f(t['value'], 2)} | {t['bound']} | "
                  f"{'yes' if t['met'] else 'NO'} |" for t in run["targets"]]
        lines.append("")
    fc = report.get("fetch")
    if fc:
        lines += ["Fetch policy, per remote image (one 448x448 PNG from loopback, medians over "
                  f"{fc['rounds']}): mlxcel fetch {fc['mlxcel_fetch_ms']:.2f} ms, plain httpx "
                  f"GET (a fresh client each, as the fetch makes) {fc['plain_httpx_ms']:.2f} ms: "
                  f"**{fc['difference_ms']:+.2f} ms**; over one kept-alive client "
                  f"{fc['keepalive_httpx_ms']:.2f} ms; the address check alone (public IP "
                  f"literal) {fc['address_check_ms'] * 1e3:.0f} µs.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="qwen2-vl-tiny", help=",".join(SHAPES))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=None, help="per level (max(4, 2C))")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="passes per server, in turn")
    ap.add_argument("--servers", default="mlxcel,mlx_vlm")
    ap.add_argument("--mlxcel-args", default="")
    ap.add_argument("--mlxcel-spawn", action="store_true")
    ap.add_argument("--py-spy", action="store_true",
                    help="py-spy records each mlxcel pass's repeated-image requests")
    ap.add_argument("--trace", action="store_true",
                    help="write each mlxcel pass's engine trace into the log folder")
    ap.add_argument("--raw", action="store_true", help="the raw mlx-vlm loop (GPU)")
    ap.add_argument("--fetch-rounds", type=int, default=50, help="0: skip")
    ap.add_argument("--checkpoint-dir", default=str(pathlib.Path(tempfile.gettempdir())
                                                   / "mlxcel-bench-vlm"))
    ap.add_argument("--out", default="bench/results/vision.json")
    args = ap.parse_args()
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-bench-vision-"))
    report: dict[str, Any] = {"machine": machine(),
                              "versions": bench_report.bench_versions("mlx-vlm",
                                                                      "mlxcel-family-vlm"),
                              "loadavg_start": loadavg(), "max_tokens": args.max_tokens,
                              "image": f"{SIDE}x{SIDE} PNG, data URI", "question": QUESTION,
                              "runs": []}
    for label in args.checkpoint.split(","):
        path = build(label, pathlib.Path(args.checkpoint_dir), args.dtype)
        run: dict[str, Any] = {"label": label, "checkpoint": str(path), "dtype": args.dtype,
                               "config": json.loads((path / "config.json").read_text())}
        if args.raw:
            run["raw"] = raw_loop(path, args.concurrency, args.max_tokens, logdir)
            print(f"{label} raw: {json.dumps(run['raw'])}", flush=True)
        names = [n for n in args.servers.split(",") if n]
        passes: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        for r in range(args.rounds):  # servers in turn, so drift hits both alike
            for name in names:
                passes[name].append(run_server(name, path, args, logdir, f"{label}-r{r}"))
                # each pass saved as it ends: a run cut off by a time limit keeps its part
                out.with_suffix(".partial.json").write_text(json.dumps(
                    report | {"partial": run | {"passes": passes}}, indent=1))
        for name in names:
            run[name] = merge(passes[name])
        run["targets"] = targets(run)
        report["runs"].append(run)
    if args.fetch_rounds:
        report["fetch"] = fetch_cost(logdir, args.fetch_rounds)
    report["loadavg_end"] = loadavg()
    bench_report.write_report(pathlib.Path(args.out), report, render(report), logdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
