"""Probe: what does adapting a conversation to its template's caps add to a request's
render time?

For each real template in tests/chat_templates, the matrix's longest conversation
(``long_agent_session.json``: a system prompt, three tools, six rounds of parallel calls
with reasoning and results, then a booking) is rendered many times two ways, from the
same typed request:

* before: the messages as template dicts straight into the template (the render path
  before the adaptation layer; it fails on templates that need adapting, reported so);
* after: ``mlxcel.chat.prompt.render_chat``, which adapts to the probed caps first.

Reported per template and over all: median and p99 of each, the ratio of medians, and the
one-time probe at startup. Rendering runs per request, before tokenizing, never per
token.

    .venv/bin/python bench/probes/template_render.py [--repeats 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import msgspec
from mlxcel.chat.prompt import render_chat, template_message
from mlxcel.dialects.openai.schemas import ChatCompletionRequest
from mlxcel.dialects.openai.translate import prompt_request
from mlxcel.errors import InvalidRequest
from mlxcel.model.chat_template import ChatTemplate

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "chat_templates"


def _times(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1e3)
    return out


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    sources = tomllib.loads((FIXTURES / "SOURCES.toml").read_text(encoding="utf-8"))
    body = json.loads((FIXTURES / "long_agent_session.json").read_text())
    request = prompt_request(msgspec.convert({"model": "x", **body}, ChatCompletionRequest))
    definitions = [t.definition for t in request.tools]
    rows, before_all, after_all = [], [], []
    for name, entry in sorted(sources.items()):
        source = (FIXTURES / entry["file"]).read_bytes().decode("utf-8")
        started = time.perf_counter()
        template = ChatTemplate(source, bos_token=entry.get("bos_token"),
                                eos_token=entry.get("eos_token"))
        _ = template.caps
        probe_ms = (time.perf_counter() - started) * 1e3
        messages = [template_message(m) for m in request.messages]

        def before(template=template, messages=messages) -> str:
            return template.render(messages, tools=definitions)

        try:
            before()
            b = _times(before, args.repeats)
        except Exception as exc:  # noqa: BLE001 - the old path's failures are the point
            b, failed = [], type(exc).__name__
        else:
            failed = None
        try:
            render_chat(request, template)
        except InvalidRequest as exc:  # the template's own refusal (Llama 3.x: one call)
            rows.append({"template": name, "probe_ms": round(probe_ms, 2),
                         "after_refused": exc.message})
            continue
        a = _times(lambda template=template: render_chat(request, template), args.repeats)
        before_all += b
        after_all += a
        rows.append({"template": name, "probe_ms": round(probe_ms, 2),
                     "before_p50_ms": round(statistics.median(b), 3) if b else None,
                     "before_p99_ms": round(_p99(b), 3) if b else None,
                     "before_failed": failed,
                     "after_p50_ms": round(statistics.median(a), 3),
                     "after_p99_ms": round(_p99(a), 3),
                     "ratio_p50": round(statistics.median(a) / statistics.median(b), 2)
                     if b else None})
    print(f"{'template':28s} {'probe':>7s} {'before p50/p99':>16s} {'after p50/p99':>16s} ratio")
    for r in rows:
        if "after_refused" in r:
            print(f"{r['template']:28s} {r['probe_ms']:7.1f} refused: {r['after_refused']}")
            continue
        before = (f"{r['before_p50_ms']:.2f}/{r['before_p99_ms']:.2f}" if r["before_p50_ms"]
                  else f"fails: {r['before_failed']}")
        print(f"{r['template']:28s} {r['probe_ms']:7.1f} {before:>16s} "
              f"{r['after_p50_ms']:.2f}/{r['after_p99_ms']:.2f} {r['ratio_p50'] or '-'}")
    ratios = [r["ratio_p50"] for r in rows if r.get("ratio_p50")]
    summary = {"templates": len(rows),
               "refused": sum(1 for r in rows if "after_refused" in r),
               "before_fails": sum(1 for r in rows if r.get("before_failed")),
               "after_p50_ms": round(statistics.median(after_all), 3),
               "after_p99_ms": round(_p99(after_all), 3),
               "before_p50_ms": round(statistics.median(before_all), 3),
               "before_p99_ms": round(_p99(before_all), 3),
               "median_ratio_p50": round(statistics.median(ratios), 2),
               "probe_p50_ms": round(statistics.median(r["probe_ms"] for r in rows), 1),
               "probe_max_ms": round(max(r["probe_ms"] for r in rows), 1)}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
