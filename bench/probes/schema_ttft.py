"""How much time to first token does a structured-output request add once its schema is
in the compile cache (``--mode schema``), and a forced tool call over the same request
with tools left to the model (``--mode tools``)?

Starts the real ``mlxcel-server`` on a bench checkpoint and sends streamed chat requests
one at a time, alternating a plain request and the same request with a ``json_schema``
``response_format`` (compiled once by a first, untimed request), and reports each kind's
median TTFT (request sent -> the chunk carrying the first token's logprobs, so that a first
token with no visible text counts too) and their difference.

    python bench/probes/schema_ttft.py --checkpoint 30m --pairs 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint
from mlxcel.testing.servers import MlxcelServer

SCHEMA = {"type": "object", "properties": {
    "animal": {"type": "string", "maxLength": 16},
    "habitat": {"type": "string", "enum": ["forest", "desert", "ocean", "urban"]},
    "legs": {"type": "integer"}}, "required": ["animal", "habitat", "legs"]}


TOOLS = [{"type": "function", "function": {"name": "describe", "parameters": SCHEMA}}]


def ttft(client: httpx.Client, i: int, schema: dict | None, mode: str = "schema") -> float:
    """``schema``: the constrained variant of the request (None: the plain one)."""
    body = {"messages": [{"role": "user", "content": f"Tell me about animal {i}."}],
            "max_tokens": 4, "stream": True, "temperature": 0, "logprobs": True}
    if mode == "tools":
        body["tools"] = TOOLS
        body["tool_choice"] = "auto" if schema is None else "required"
    elif schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "a", "schema": schema}}
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0].get("logprobs"):  # the first token, seen or not
                return (time.perf_counter() - t0) * 1e3
    raise RuntimeError("no content chunk")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="30m")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--mode", choices=("schema", "tools"), default="schema")
    args = ap.parse_args()
    kw = dict(CHECKPOINTS[args.checkpoint])
    path = bench_checkpoint(kw.pop("shape"), **kw)
    srv = MlxcelServer(["--model", str(path), "--parallel", "1"])
    try:
        with httpx.Client(base_url=srv.base_url, timeout=120) as client:
            ttft(client, -1, SCHEMA, args.mode)  # compiles (and warms the constrained path)
            ttft(client, -2, None, args.mode)
            plain, guided = [], []
            for i in range(args.pairs):
                plain.append(ttft(client, i, None, args.mode))
                guided.append(ttft(client, i, SCHEMA, args.mode))
    finally:
        srv.stop()
    p, g = statistics.median(plain), statistics.median(guided)
    what = "with a cached schema" if args.mode == "schema" else "forced (tool_choice required)"
    print(f"{path.name}, {args.mode}, {args.pairs} pairs: TTFT p50 plain {p:.1f} ms, {what} "
          f"{g:.1f} ms: {g - p:+.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
