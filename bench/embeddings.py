"""Embeddings throughput and the chat streams beside them: mlxcel vs ``mlx_vlm.server`` vs a
raw mlx-vlm loop, on the same random-weight embedder.

Rules, and why:

- Servers run one at a time, alone, on the same checkpoint, each warmed up first, and each
  level is run once untimed (2C requests of its shape) before it is timed: a GPU compiles
  each new batch shape once, and the bench measures the steady state after that.
- Inputs are ~100 tokens of text, unique per request (no cache can help anyone).
- Levels: concurrency C (closed loop: each client sends its next request when its last one
  ended) x inputs per request N, with C, N in {1, 16}; inputs/s = inputs / level wall time.
- The raw loop is mlx-vlm's model called in a loop on pre-tokenized batches of N inputs (no
  HTTP, no tokenizer): the ceiling a server can approach. mlxcel's ratio to it at C = 16
  measures the lane's dynamic batching and the HTTP path together.
- ITL: chat streams' inter-token latency alone, then while C = 16 clients in another
  process flood the embeddings route, on one mlxcel server holding both models; the ratio
  is the cost of the side jobs to decoding. A stream's ITL is its mean gap, (last token -
  first) / (tokens - 1), and a round's is the median over its streams: a fast model's
  tokens reach the client several per read, so the gaps between reads are mostly ~0 and
  their median says nothing.
- The client decodes each response with msgspec and holds ``level_requests(C)`` requests
  per level: a response carries N x D floats as JSON text (16 x 768 is ~250 kB), which
  Python's json module parses in milliseconds, and a short level is mostly ramp: the
  client must not be what is measured.
- Report ratios and medians, never one absolute time.
- mlxcel runs with ``--engine-trace``; its job lane writes a line per batch, from which
  each timed level gets its batches, items per batch and the median forward, queue wait,
  intake (request to submit) and hand-back (batch end to caller) times (``lane``).
- ``--itl-rounds 0`` skips the ITL part (throughput only).

    python bench/embeddings.py                                # CPU: tiny + 30m BERT
    python bench/embeddings.py --checkpoint bert-base,qwen3-emb-0.6b --dtype bfloat16 \
        --out bench/results/embeddings_gpu.json                # the H200 run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import msgspec
from mlxcel.testing.servers import (
    Server,
    loadavg,
    machine,
    same_blas_env,
    server_argv,
    stream_chat,
    versions,
)

# name -> (kind, dims): the shapes the issue names; random weights, real configs
POSITIONS = {"max_position_embeddings": 512}
SHAPES: dict[str, tuple[str, dict[str, int]]] = {
    "tiny": ("bert", POSITIONS),
    "30m": ("bert", {**POSITIONS, "hidden_size": 512, "num_hidden_layers": 6, "intermediate_size": 2048,
                     "num_attention_heads": 8}),
    "bert-base": ("bert", {**POSITIONS, "hidden_size": 768, "num_hidden_layers": 12,
                           "intermediate_size": 3072, "num_attention_heads": 12}),
    "qwen3-emb-0.6b": ("qwen3", {"hidden_size": 1024, "num_hidden_layers": 28,
                                 "intermediate_size": 3072, "num_attention_heads": 16,
                                 "num_key_value_heads": 8}),
}
WORDS = ("river stone quiet lantern orbit meadow signal copper harbor thread velvet "
         "summit ember glacier pixel canyon willow beacon marble prism").split()


def text(tag: str, i: int, words: int = 18) -> str:
    """~100 tokens of text unique to (tag, i), the unique part first (the bench
    tokenizers split these words into about five pieces each)."""
    body = " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(words))
    return f"{tag} {i} {body}"


def build(label: str, root: pathlib.Path, dtype: str) -> pathlib.Path:
    """The embedder ``label`` names, built in a child process (this one stays MLX-free)."""
    kind, dims = SHAPES[label]
    path = root / f"emb-{label}-{dtype}"
    if not (path / "config.json").exists():
        code = ("import json, sys, pathlib; from mlxcel.testing.side_checkpoints import "
                "build_embedder; build_embedder(pathlib.Path(sys.argv[1]), kind=sys.argv[2], "
                "dtype=sys.argv[3], **json.loads(sys.argv[4]))")
        subprocess.run([sys.executable, "-c", code, str(path), kind, dtype, json.dumps(dims)],
                       check=True)
    return path


RAW = r"""
import json, sys, time, pathlib
import mlx.core as mx
from tokenizers import Tokenizer
from mlx_vlm.embedding_loader import load_embedding_model
path, batches, rounds = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
model = load_embedding_model(path)
tok = Tokenizer.from_file(str(path / "tokenizer.json"))
out = {}
for n in batches:
    texts = [sys.argv[4] + f" raw {i}" for i in range(n)]
    enc = tok.encode_batch(texts)
    width = max(len(e.ids) for e in enc)
    ids = mx.array([e.ids + [0] * (width - len(e.ids)) for e in enc])
    mask = mx.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in enc])
    mx.eval(model(ids, attention_mask=mask).text_embeds)  # warm-up
    t0 = time.perf_counter()
    for _ in range(rounds):
        mx.eval(model(ids, attention_mask=mask).text_embeds)
    out[str(n)] = n * rounds / (time.perf_counter() - t0)
print(json.dumps(out))
"""


def raw_loop(path: pathlib.Path, batches: list[int], rounds: int) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", RAW, str(path), json.dumps(batches),
                           str(rounds), text("raw", 0)], capture_output=True, text=True,
                          env=same_blas_env())
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


class _Reply(msgspec.Struct):
    data: list[Any]


DECODE = msgspec.json.Decoder(_Reply).decode


async def level(base: str, concurrency: int, per_request: int, requests: int,
                tag: str, model: str, fmt: str = "float") -> dict[str, Any]:
    """A closed loop of ``requests`` embeddings requests over ``concurrency`` clients;
    ``fmt``: their ``encoding_format`` (the OpenAI SDK sends ``base64`` by default)."""
    counter = iter(range(requests))
    failures: list[str] = []
    latencies: list[float] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        for i in counter:
            body = {"model": model, "input": [text(tag, i * per_request + k)
                                            for k in range(per_request)]}
            if fmt != "float":
                body["encoding_format"] = fmt
            t0 = time.perf_counter()
            r = await client.post(base + "/v1/embeddings", json=body, timeout=600)
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200 or len(DECODE(r.content).data) != per_request:
                failures.append(f"http_{r.status_code}")

    async with httpx.AsyncClient(trust_env=False) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    done = requests - len(failures)
    return {"concurrency": concurrency, "per_request": per_request, "requests": requests,
            "failures": failures, "inputs_per_s": done * per_request / wall,
            "latency_p50_s": statistics.median(latencies)}


def serve(name: str, argv: list[str], logdir: pathlib.Path, tag: str,
          ready: str, env: dict[str, str] | None = None) -> Server:
    server = Server(name, argv, ready, logdir, tag, env=env)
    server.start()
    server.wait_ready()
    return server


WARMUP = (2, 2, 4)  # C, N, requests: the server's first requests, untimed


def level_requests(c: int) -> int:
    return max(16, 8 * c)


def server_levels(base: str, levels: list[tuple[int, int]], tag: str,
                  model: str, fmt: str = "float") -> list[dict]:
    """Each (C, N) level, run once untimed and then timed, after a warm-up; ``model`` is
    the checkpoint's path, which mlx_vlm.server needs in every request (it keys its
    model cache by it)."""
    asyncio.run(level(base, *WARMUP, f"warm-{tag}", model, fmt))
    out = []
    for c, n in levels:
        asyncio.run(level(base, c, n, 2 * c, f"warm-{tag}-{c}-{n}", model, fmt))
        out.append(asyncio.run(level(base, c, n, level_requests(c), f"{tag}-{c}-{n}", model,
                                     fmt)))
    return out


def _gap_p50(rows: list[dict]) -> float | None:
    """The median time between one batch's start and the next's (the lane's period)."""
    gaps = [(b["t"] - a["t"]) * 1e3 for a, b in zip(rows, rows[1:], strict=False)]
    return round(statistics.median(gaps), 3) if gaps else None


def lane_stats(trace: pathlib.Path, levels: list[tuple[int, int]]) -> list[dict]:
    """Per timed level, its side batches from mlxcel's engine trace. Levels run one after
    another and a batch never spans two, so the lines split by their items: the warm-up's,
    then per level its untimed run's and its timed run's."""
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "side" in r]
    spans = [(None, WARMUP[1] * WARMUP[2])]
    for c, n in levels:
        spans += [(None, 2 * c * n), ((c, n), level_requests(c) * n)]
    out, i = [], 0
    for key, items in spans:
        batch: list[dict] = []
        while i < len(rows) and sum(r["items"] for r in batch) < items:
            batch.append(rows[i])
            i += 1
        if key is None or not batch:
            continue

        def med(field: str, rows: list[dict] = batch) -> float | None:
            values = [r[field] for r in rows if field in r]
            return round(statistics.median(values), 3) if values else None

        out.append({"concurrency": key[0], "per_request": key[1], "batches": len(batch),
                    "items_per_batch": round(sum(r["items"] for r in batch) / len(batch), 2),
                    "forward_ms_p50": med("side_ms"), "read_ms_p50": med("read_ms"),
                    "read_prev_ms_p50": med("read_prev_ms"), "wait_ms_p50": med("wait_ms"),
                    "gap_ms_p50": _gap_p50(batch),
                    "intake_ms_p50": med("intake_ms"), "deliver_ms_p50": med("deliver_ms")})
    return out


def throughput(label: str, path: pathlib.Path, args: argparse.Namespace,
               logdir: pathlib.Path) -> dict[str, Any]:
    levels = [(c, n) for c in args.concurrency for n in args.per_request]
    result: dict[str, Any] = {"label": label, "raw": raw_loop(path, args.per_request,
                                                              args.raw_rounds)}
    trace = logdir / f"{label}-lane.jsonl"
    mlxcel = [sys.executable, "-m", "mlxcel.cli", "--model", str(path),
              "--embedding-batch-size", str(args.batch_size),
              "--embedding-queue-depth", str(2 * max(args.concurrency)),
              "--dtype", args.dtype, "--engine-trace", str(trace)]
    srv = serve("mlxcel", mlxcel, logdir, label, "/health", args.server_env)
    try:
        result["mlxcel"] = server_levels(srv.base, levels, f"{label}-x", str(path),
                                         args.encoding_format)
    finally:
        srv.stop()
    if trace.exists():
        result["lane"] = lane_stats(trace, levels)
    if "mlx_vlm" in args.servers:
        vlm = [sys.executable, "-m", "mlx_vlm.server", "--embedding-model", str(path)]
        srv = serve("mlx_vlm", vlm, logdir, label, "/health", same_blas_env())
        try:
            result["mlx_vlm"] = server_levels(srv.base, levels, f"{label}-v", str(path),
                                              args.encoding_format)
        finally:
            srv.stop()
    return result


async def chat_itl(base: str, streams: int, max_tokens: int, tag: str) -> float:
    body = {"model": "m", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    async with httpx.AsyncClient(trust_env=False, timeout=600) as client:
        recs = await asyncio.gather(*(stream_chat(
            client, base + "/v1/chat/completions",
            {**body, "messages": [{"role": "user", "content": text(tag, i, 20)}]},
            max_tokens) for i in range(streams)))
    itls = [rec["tpot_ms"] for rec in recs if rec.get("tpot_ms")]
    return statistics.median(itls) / 1000


async def flood(base: str, clients: int) -> None:
    """``clients`` closed-loop clients posting 16 inputs each, until cancelled."""
    async def one(client: httpx.AsyncClient, c: int) -> None:
        i = 0
        while True:
            i += 1
            await client.post(base + "/v1/embeddings",
                              json={"input": [text(f"flood{c}", i * 16 + k)
                                              for k in range(16)]})

    async with httpx.AsyncClient(trust_env=False, timeout=600) as client:
        await asyncio.gather(*(one(client, c) for c in range(clients)))


def flood_process(base: str, clients: int) -> None:
    asyncio.run(flood(base, clients))


def itl_with_flood(base: str, streams: int, max_tokens: int) -> float:
    """The chat streams' ITL while another process floods the embeddings route: in the
    measuring client's own event loop, decoding the flood's responses (16 x D floats
    each) would delay its reads of the streams and count as the server's ITL."""
    import multiprocessing

    proc = multiprocessing.get_context("spawn").Process(
        target=flood_process, args=(base, 16), daemon=True)
    proc.start()
    try:
        time.sleep(1.5)  # the interpreter up and the flood running
        return asyncio.run(chat_itl(base, streams, max_tokens, "flooded"))
    finally:
        proc.terminate()
        proc.join(10)


def itl(label: str, path: pathlib.Path, args: argparse.Namespace,
        logdir: pathlib.Path) -> dict[str, Any]:
    from mlxcel.testing.bench_checkpoints import named_checkpoint

    chat = named_checkpoint(args.chat_checkpoint)
    argv, ready = server_argv("mlxcel", chat, parallel=8, extra=[
        "--embedding-model", str(path), "--embedding-batch-size", "16",
        "--embedding-queue-depth", "64", "--engine-trace", str(logdir / f"{label}-itl.jsonl")])
    srv = serve("mlxcel", argv, logdir, f"{label}-itl", ready, args.server_env)
    try:
        asyncio.run(chat_itl(srv.base, 2, 8, "warm"))
        alone = [asyncio.run(chat_itl(srv.base, args.streams, args.max_tokens, f"a{i}"))
                 for i in range(args.itl_rounds)]
        flooded = [itl_with_flood(srv.base, args.streams, args.max_tokens)
                   for _ in range(args.itl_rounds)]
    finally:
        srv.stop()
    a, f = statistics.median(alone), statistics.median(flooded)
    return {"label": label, "streams": args.streams, "itl_alone_ms": a * 1000,
            "itl_flooded_ms": f * 1000, "ratio": f / a}


def render(report: dict[str, Any]) -> str:
    """The markdown table of a report: inputs/s per level, and the ratios to the raw loop
    (at the same inputs per forward) and to mlx_vlm.server."""
    lines = ["| model | C | inputs/request | mlxcel inputs/s | mlx_vlm inputs/s | raw inputs/s "
             "(batch) | mlxcel / raw | mlxcel / mlx_vlm |", "|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        vlm = {(r["concurrency"], r["per_request"]): r for r in run.get("mlx_vlm", [])}
        for r in run["mlxcel"]:
            c, n = r["concurrency"], r["per_request"]
            batch = min(c * n, max(int(k) for k in run["raw"]))
            raw = run["raw"].get(str(batch)) or run["raw"][str(n)]
            other = vlm.get((c, n))
            ratio = f"{r['inputs_per_s'] / other['inputs_per_s']:.2f}" if other else "—"
            lines.append(
                f"| {run['label']} | {c} | {n} | {r['inputs_per_s']:.0f} | "
                f"{other['inputs_per_s'] if other else 0:.0f} | {raw:.0f} ({batch}) | "
                f"{r['inputs_per_s'] / raw:.2f} | {ratio} |"
                + (f" {len(r['failures'])} failed" if r["failures"] else ""))
    lines += ["", "| model | C | inputs/request | batches | items/batch | forward p50 (ms) | "
              "queue wait p50 (ms) | intake p50 (ms) | hand-back p50 (ms) |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {run['label']} | {s['concurrency']} | {s['per_request']} | {s['batches']} "
              f"| {s['items_per_batch']} | {s['forward_ms_p50']} | {s['wait_ms_p50']} | "
              f"{s['intake_ms_p50']} | {s['deliver_ms_p50']} |"
              for run in report["runs"] for s in run.get("lane", [])]
    if not report["itl"]:
        return "\n".join(lines) + "\n"
    lines += ["", "| model | chat streams | ITL p50 alone (ms) | ITL p50 under an embedding "
              "flood (ms) | ratio |", "|---|---|---|---|---|"]
    lines += [f"| {i['label']} | {i['streams']} | {i['itl_alone_ms']:.2f} | "
              f"{i['itl_flooded_ms']:.2f} | {i['ratio']:.2f} |" for i in report["itl"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="tiny,30m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--per-request", default="1,16")
    ap.add_argument("--servers", default="mlxcel,mlx_vlm")
    ap.add_argument("--raw-rounds", type=int, default=20)
    ap.add_argument("--chat-checkpoint", default="tiny")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--itl-rounds", type=int, default=3, help="0: no ITL part")
    ap.add_argument("--batch-size", type=int, default=16, help="mlxcel's --embedding-batch-size")
    ap.add_argument("--encoding-format", default="float", choices=("float", "base64"),
                    help="the requests' encoding_format (the OpenAI SDK's default: base64)")
    ap.add_argument("--mlxcel-pythonpath", default="",
                    help="PYTHONPATH for the mlxcel server (another checkout's sources, "
                         "for a before/after run on one machine)")
    ap.add_argument("--out", default="bench/results/embeddings.json")
    args = ap.parse_args()
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.per_request = [int(x) for x in args.per_request.split(",")]
    args.servers = args.servers.split(",")
    args.server_env = ({**os.environ, "PYTHONPATH": args.mlxcel_pythonpath}
                       if args.mlxcel_pythonpath else None)
    root = pathlib.Path(tempfile.gettempdir()) / "mlxcel-bench-embedders"
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-bench-emb-"))
    report: dict[str, Any] = {"machine": machine(), "versions": versions(),
                              "loadavg_start": loadavg(), "runs": [], "itl": []}
    for label in args.checkpoint.split(","):
        path = build(label, root, args.dtype)
        report["runs"].append(throughput(label, path, args, logdir))
        if args.itl_rounds > 0:
            report["itl"].append(itl(label, path, args, logdir))
        print(json.dumps(report["runs"][-1]), flush=True)
    report["loadavg_end"] = loadavg()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(render(report))
    print(f"wrote {out}; logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
