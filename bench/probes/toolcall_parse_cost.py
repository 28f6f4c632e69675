"""Probe: what does a builtin JSON-body tool parser cost per generated token?

For each builtin format of ``mlxcel.builtin.toolcalls.json_formats``, a long answer
(a paragraph of content, then 40 calls with nested, escaped, unicode arguments, about
9-12k characters) is fed to a fresh parser in pieces of 1-7 characters (seeded; 4 on
average, about a token's worth of text), then finished. Per-token cost = wall time of
the feeds and ``finish()`` / number of pieces; the median of repeated runs is reported,
with p10-p90. A content-only answer of the same length (Hermes) shows the floor of text
that holds no marker.

Side by side, where mlx-lm 0.32 has a decoder for the format, its one-shot parse of the
finished calls (``mlx_lm.tool_parsers.<name>.parse_tool_call`` per call block, as
``mlx_lm.server`` calls it once the end marker arrives) over the same text, spread over the
same pieces: it streams nothing, so it is a floor for a non-streaming parser, not a peer.

    .venv/bin/python bench/probes/toolcall_parse_cost.py [--repeats 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from mlxcel.builtin.toolcalls import json_formats
from mlxcel.lazy import resolve

CALLS = 40
PROSE = ("Let me look that up for you; I'll check the weather, the flights and the hotels "
         "before I answer. ") * 6


def _args(i: int) -> dict:
    return {"city": ["Paris", "東京", "São Paulo", "Zürich"][i % 4], "days": i % 7 + 1,
            "ratio": 1.5 + i / 100, "filters": {"tags": ["a\"b", "c\\d", "<b>"],
                                                "range": [i, i * 2.5, {"deep": [True, None]}]},
            "note": f"call {i} with some longer free text to make the arguments grow, "
                    f"as a model writing a search query or a code snippet would"}


def _calls() -> list[tuple[str, str]]:
    return [(f"tool_{i % 5}", json.dumps(_args(i), ensure_ascii=False)) for i in range(CALLS)]


def _py(value) -> str:
    return repr(value) if not isinstance(value, dict) else \
        "{" + ", ".join(f"{k!r}: {_py(v)}" for k, v in value.items()) + "}"


def streams() -> dict[str, str]:
    """One long answer per format, written as each family's template writes calls."""
    calls = _calls()
    obj = [f'{{"name": "{n}", "arguments": {a}}}' for n, a in calls]
    return {
        "hermes": PROSE + "".join(f"\n<tool_call>\n{o}\n</tool_call>" for o in obj),
        "hermes (content only)": PROSE * 12,
        "mistral_nemo": PROSE + "[TOOL_CALLS][" + ", ".join(obj) + "]",
        "mistral_bracketed": PROSE + "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in calls),
        "llama3": "<|python_tag|>" + "; ".join(
            f'{{"name": "{n}", "parameters": {a}}}' for n, a in calls),
        "generic_json": "[" + ", ".join(obj) + "]",
        "functionary_v3_1": PROSE + "".join(f"<function={n}>{a}</function>" for n, a in calls),
        "functionary_v3_2": "all\n" + PROSE + "".join(f"\n>>>{n}\n{a}" for n, a in calls),
        "command_r": "<|START_ACTION|>[" + ", ".join(
            f'{{"tool_call_id": "{i}", "tool_name": "{n}", "parameters": {a}}}'
            for i, (n, a) in enumerate(calls)) + "]<|END_ACTION|>",
        "granite": PROSE + "<|tool_call|>[" + ", ".join(obj) + "]",
        "pythonic": "<|tool_call_start|>[" + ", ".join(
            f"{n}(" + ", ".join(f"{k}={_py(v)}" for k, v in _args(i).items()) + ")"
            for i, (n, _) in enumerate(calls)) + "]<|tool_call_end|>",
    }


def pieces(text: str, seed: int = 0) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        step = rng.randint(1, 7)
        out.append(text[i:i + step])
        i += step
    return out


def run_parser(new_parser, cut: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter_ns()
    parser = new_parser(())
    for piece in cut:
        parser.feed(piece, ())
    calls = parser.finish().calls
    return (time.perf_counter_ns() - t0) / 1000, len(calls)


def mlx_lm_reference(name: str, text: str):
    """mlx-lm's decoder run once per call block, as mlx_lm.server would (None: it has
    none for this format)."""
    import importlib

    module = {"hermes": "json_tools", "mistral_bracketed": "mistral",
              "pythonic": "pythonic"}.get(name)
    if module is None:
        return None
    parse = importlib.import_module(f"mlx_lm.tool_parsers.{module}").parse_tool_call
    if name == "hermes":
        blocks = [b.split("</tool_call>")[0] for b in text.split("<tool_call>")[1:]]
    elif name == "mistral_bracketed":
        blocks = text.split("[TOOL_CALLS]")[1:]
    else:
        blocks = [text.removeprefix("<|tool_call_start|>").removesuffix("<|tool_call_end|>")]

    def once() -> float:
        t0 = time.perf_counter_ns()
        for block in blocks:
            parse(block)
        return (time.perf_counter_ns() - t0) / 1000
    return once


def measure(repeats: int) -> list[dict]:
    formats = {f.name: f for f in json_formats.FORMATS}
    rows = []
    for name, text in streams().items():
        new_parser = resolve(formats[name.split(" ")[0]].parser)
        cut = pieces(text)
        per_token, found = [], 0
        for _ in range(repeats):
            us, found = run_parser(new_parser, cut)
            per_token.append(us / len(cut))
        ref = mlx_lm_reference(name, text)
        ref_times = [ref() / len(cut) for _ in range(repeats)] if ref else None
        q = statistics.quantiles(per_token, n=10)
        rows.append({"format": name, "chars": len(text), "pieces": len(cut), "calls": found,
                     "us_per_token": statistics.median(per_token), "p10": q[0], "p90": q[-1],
                     "mlx_lm_us_per_token": ref_times and statistics.median(ref_times)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    rows = measure(args.repeats)
    print("| format | chars | pieces | calls | us/token median | p10-p90 | mlx-lm one-shot |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ref = f"{r['mlx_lm_us_per_token']:.2f}" if r["mlx_lm_us_per_token"] else "none"
        print(f"| {r['format']} | {r['chars']} | {r['pieces']} | {r['calls']} | "
              f"{r['us_per_token']:.2f} | {r['p10']:.2f}-{r['p90']:.2f} | {ref} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
