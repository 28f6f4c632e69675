"""Speech: Whisper transcription and Kokoro synthesis, mlxcel vs mlx-audio's own server
(``python -m mlx_audio.server``) on the same random-weight checkpoints (issue #31's bench).

Rules, and why:

- Servers run one at a time, alone, on the same checkpoint, each warmed up first (its first
  request loads the model on mlx-audio's server); ``--rounds R`` passes per server in turn
  (mlxcel, mlx-audio, mlxcel, ...), and per level the pass with the median rate is reported,
  the others beside it (a shared machine drifts). mlxcel serves the checkpoint with ``-m``
  (audio-only); mlx-audio's server takes the checkpoint's path as each request's ``model``.
- Whisper: a 30 s, 16 kHz WAV of harmonic tone bursts and pauses over faint noise (seeded
  per request; every level sends new clips, the same ones to both servers), multipart as
  the OpenAI SDK sends it, ``response_format`` verbose_json, no language (both detect it).
  Levels: concurrency C (closed loop), N = max(4, 2 C) requests; real-time factor = audio
  seconds transcribed / level wall seconds; failures, and requests whose text is not the
  checkpoint's script (the two servers did not do the same work).
- The Whisper checkpoint (``build_whisper``) is ``whisper_checkpoints``' random model with
  a scripted decoder: the rows of the token embedding (tied to the output) that the script
  uses are orthogonal and long, and each decoder position's embedding points at the next
  token of ``<|en|> <|transcribe|> <|0.00|> w1 .. wN <|29.00|> <|endoftext|>`` (N distinct
  word tokens, 96 by default: ~30 s of speech). Greedy decoding is then certain (mean
  log-probability 0, no fallback, no silence skip) and ends the window with one segment,
  as real Whisper does on a 30 s clip of speech, on both servers' timestamp rules; random
  weights otherwise fall back through every temperature (mlxcel) or emit NaN-scored token
  0 (mlx-audio's rules), which is neither realistic nor the same work on both.
- Modes: ``defaults`` (each server as it starts: mlxcel's Whisper in float32 on a CPU with
  a fast BLAS, mlx-audio's always in float16) and ``same-dtype`` (mlxcel ``--dtype float16``);
  on a GPU both are float16 and ``defaults`` is the only mode.
- Kokoro: a 200-character French text of four sentences, voice ``ff_siwis``, wav; both
  servers then phonemize with misaki's espeak-ng G2P (mlx-audio's English G2P needs spaCy's
  model, which a server here does not have). Per repeat one whole request (mlx-audio
  ``stream`` false; mlxcel, which always streams, without ``stream_format``) and one
  streamed one (mlx-audio ``stream`` true, which sends a WAV per text segment; mlxcel
  ``stream_format`` audio). Real-time factor = audio seconds / wall seconds of the whole
  request; first audio byte = the first byte past a WAV header; medians over ``--repeats``.
- mlx-audio's server as shipped (0.6.2) does not run on a CPU-only MLX: its inference thread
  asks for a GPU stream and dies, and every request then hangs. On such an MLX the bench
  gives it a ``sitecustomize`` that answers that one call with a CPU stream; its import of
  ``webrtcvad`` (used only by ``/v1/realtime``) gets a stub module when the package is not
  installed. Both servers compute on the BLAS mlxcel gives itself (``same_blas_env``).
- Report ratios and medians, never one absolute time.

    python bench/audio.py                              # CPU: the tiny checkpoints
    python bench/audio.py --whisper large-v3-turbo --kokoro 82m --modes defaults \\
        --out bench/results/audio_gpu.json             # the H200 run (bench/gpu/audio.sh)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import json
import os
import pathlib
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import wave
import zlib
from typing import Any

import httpx
from mlxcel.testing import bench_report
from mlxcel.testing.servers import (
    Server,
    loadavg,
    machine,
    same_blas_env,
    spawn_env,
)

RATE = 16000
CLIP_S = 30.0
WHISPER: dict[str, dict[str, int]] = {  # hf_config's size arguments
    "tiny": {"text_ctx": 448},
    "large-v3-turbo": {"d_model": 1280, "layers": 32, "decoder_layers": 4, "heads": 20,
                       "n_mels": 128, "text_ctx": 448},
}
KOKORO = ("tiny", "82m")  # kokoro_checkpoints' defaults, KOKORO_82M
TEXT = ("Le vent du soir glisse sur la mer. Les pêcheurs rentrent au port avec leurs filets "
        "pleins. Sur le quai, une vieille femme attend son fils, une lanterne à la main. "
        "Demain, ils repartiront avant l'aube.")
VOICE, LANG = "ff_siwis", "f"
TARGETS = [("whisper c=1 RTF mlxcel/mlx-audio", ">=", 1.0),
           ("whisper c=4 RTF mlxcel/mlx-audio", ">=", 1.5),
           ("mlxcel whisper requests failed or off-script", "<=", 0),
           ("kokoro mlxcel first audio byte / whole synthesis", "<=", 0.5)]

BUILD_WHISPER = r"""
import json, sys, pathlib, shutil
import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer
from mlxcel.testing.whisper_checkpoints import build_whisper
out, dims, n, dtype = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tmp = out.with_name(out.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
build_whisper(tmp, layout="hf", **dims)
vocab = Tokenizer.from_file(str(tmp / "tokenizer.json")).get_vocab()
eot = vocab["<|endoftext|>"]
words = sorted(i for t, i in vocab.items() if i < eot and t[:1] == "\u0120" and t[1:].isalpha()
               and t[1:].islower() and len(t) >= 5)
rng = np.random.default_rng(0)
script = [int(w) for w in rng.choice(words, n, replace=False)]
seq = [vocab["<|startoftranscript|>"], vocab["<|en|>"], vocab["<|transcribe|>"],
       vocab["<|0.00|>"], *script, vocab["<|29.00|>"], eot]
f = tmp / "model.safetensors"
w = dict(mx.load(str(f)))
emb = np.array(w["model.decoder.embed_tokens.weight"].astype(mx.float32))
pos = np.array(w["model.decoder.embed_positions.weight"].astype(mx.float32))
d = emb.shape[1]
targets = sorted(set(seq[1:]))
q = rng.standard_normal((len(targets), d))
if len(targets) <= d:
    q = np.linalg.qr(q.T)[0].T
q /= np.linalg.norm(q, axis=1, keepdims=True)
emb[targets] = 8.0 * d ** 0.5 * q
for p in range(len(seq) - 1):
    pos[p] = 4.0 * emb[seq[p + 1]]
cast = getattr(mx, dtype)
w = {k: v.astype(cast) for k, v in w.items()}
w["model.decoder.embed_tokens.weight"] = mx.array(emb).astype(cast)
w["model.decoder.embed_positions.weight"] = mx.array(pos).astype(cast)
mx.save_safetensors(str(f), w, metadata={"format": "pt"})
cfg = json.loads((tmp / "config.json").read_text())
(tmp / "config.json").write_text(json.dumps({**cfg, "torch_dtype": dtype}, indent=2))
from mlx_audio.stt.models.whisper.decoding import DecodingOptions, decode
from mlx_audio.stt.utils import load_model
model = load_model(str(tmp))  # mlx-audio's own loader (float16); the decoder on random
text = model._processor.tokenizer.decode(script).strip()  # encoder features: cheap anywhere
dims = model.dims
feats = mx.random.normal((1, dims.n_audio_ctx, dims.n_audio_state)).astype(mx.float16)
got = decode(model, feats, DecodingOptions())[0]
if got.language != "en" or list(got.tokens) != seq[3:-1] or got.avg_logprob < -0.01 \
        or got.no_speech_prob > 0.01 or got.compression_ratio > 2.4:
    raise SystemExit(f"the scripted decoder did not decode its script: {got.language} "
                     f"{got.avg_logprob} {got.compression_ratio} {got.text[:80]!r}")
(tmp / "script.json").write_text(json.dumps({"tokens": seq, "text": text}))
shutil.rmtree(out, ignore_errors=True)
tmp.rename(out)
"""

BUILD_KOKORO = r"""
import json, sys, pathlib, shutil
import mlx.core as mx
from mlxcel.testing.kokoro_checkpoints import KOKORO_82M, WEIGHTS_FILE, build_kokoro
out, shape, dtype = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
tmp = out.with_name(out.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
build_kokoro(tmp, **(KOKORO_82M if shape == "82m" else {}))
if dtype != "float32":
    f = str(tmp / WEIGHTS_FILE)
    mx.save_safetensors(f, {k: v.astype(getattr(mx, dtype)) for k, v in mx.load(f).items()},
                        metadata={"format": "mlx"})
shutil.rmtree(out, ignore_errors=True)
tmp.rename(out)
"""


def build(kind: str, label: str, root: pathlib.Path, dtype: str, words: int) -> pathlib.Path:
    """The checkpoint ``label`` names, built once in a child process (this one stays
    MLX-free)."""
    if kind == "whisper":
        path = root / f"whisper-{label}-{dtype}-{words}w"
        argv = [BUILD_WHISPER, str(path), json.dumps(WHISPER[label]), str(words), dtype]
    else:
        path = root / f"kokoro-{label}-{dtype}"
        argv = [BUILD_KOKORO, str(path), label, dtype]
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, "-c", *argv], check=True)
    return path


def clip(seed: int, seconds: float = CLIP_S) -> bytes:
    """``seconds`` of 16 kHz mono WAV: harmonic bursts of 0.1-0.4 s (120-300 Hz, four
    partials, a sine envelope) with pauses, over faint noise; all placed by ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.01 * rng.standard_normal(len(t))
    at = 0.0
    while at < seconds:
        dur, f0 = rng.uniform(0.1, 0.4), rng.uniform(120, 300)
        m = (t >= at) & (t < at + dur)
        tt = t[m]
        x[m] += 0.3 * np.sin(np.pi * (tt - at) / dur) * sum(
            np.sin(2 * np.pi * f0 * k * tt) / k for k in range(1, 5))
        at += dur + rng.uniform(0.02, 0.3)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def wav_seconds(data: bytes) -> float:
    """Seconds of audio in ``data``: one WAV, or several one after another (mlx-audio's
    stream); a data size left open (0 or 0xFFFFFFFF, mlxcel's stream) runs to the end."""
    pos, total = 0, 0.0
    while data[pos:pos + 4] == b"RIFF":
        at, rate, width, size = pos + 12, 1, 2, None
        while at + 8 <= len(data):
            cid, n = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
            if cid == b"fmt ":
                ch, rate, _, _, bits = struct.unpack("<HIIHH", data[at + 10:at + 24])
                width = ch * bits // 8
            if cid == b"data":
                size = len(data) - at - 8 if n in (0, 0xFFFFFFFF) else n
                break
            at += 8 + n + (n & 1)
        if size is None:
            break
        total += size / width / rate
        pos = at + 8 + size
    return total


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(1800, connect=30))


async def transcribe(c: httpx.AsyncClient, base: str, model: str, audio: bytes,
                     script: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"error": None}
    try:
        r = await c.post(base + "/v1/audio/transcriptions",
                         files={"file": ("clip.wav", audio, "audio/wav")},
                         data={"model": model, "response_format": "verbose_json"})
        if r.status_code != 200:
            rec.update(error=f"http_{r.status_code}", detail=r.text[:300])
        else:
            body = r.json()
            segs = body.get("segments") or []
            rec.update(segments=len(segs), language=body.get("language"),
                       temperatures=sorted({s.get("temperature") for s in segs}),
                       on_script=(body.get("text") or "").strip() == script)
    except (httpx.HTTPError, ValueError, OSError) as exc:
        rec.update(error=f"client_{type(exc).__name__}", detail=str(exc)[:300])
    rec["wall_s"] = time.perf_counter() - t0
    return rec


async def whisper_level(base: str, model: str, script: str, concurrency: int, requests: int,
                        tag: str) -> dict[str, Any]:
    """A closed loop of ``requests`` transcriptions over ``concurrency`` clients."""
    clips = [clip(zlib.crc32(f"{tag}/{i}".encode())) for i in range(requests)]  # before the clock
    async with client() as c:
        recs, wall = await bench_report.closed_loop(
            c, concurrency, requests, lambda c, i: transcribe(c, base, model, clips[i], script))
    ok = [r for r in recs if r["error"] is None]
    failures: dict[str, int] = {}
    for r in recs:
        if r["error"]:
            failures[r["error"]] = failures.get(r["error"], 0) + 1
    out = {"concurrency": concurrency, "requests": requests, "wall_s": round(wall, 3),
           "rtf": len(ok) * CLIP_S / wall, "failures": failures,
           "off_script": sum(not r["on_script"] for r in ok),
           "latency_p50_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
           "temperatures": sorted({t for r in ok for t in r["temperatures"]}),
           "segments": sorted({r["segments"] for r in ok})}
    details = [r["detail"] for r in recs if r.get("detail")]
    if details:
        out["detail"] = details[0]
    return out


async def speak(c: httpx.AsyncClient, base: str, body: dict[str, Any]) -> dict[str, Any]:
    """One speech request, timed at the client: first byte, first audio byte (past the
    first WAV header), whole wall, audio seconds."""
    rec: dict[str, Any] = {"error": None}
    t0 = time.perf_counter()
    data = bytearray()
    try:
        async with c.stream("POST", base + "/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                rec.update(error=f"http_{r.status_code}",
                           detail=(await r.aread())[:300].decode(errors="replace"))
            else:
                async for part in r.aiter_raw():
                    now = time.perf_counter() - t0
                    rec.setdefault("first_byte_s", now)
                    data += part
                    if len(data) > 44:
                        rec.setdefault("first_audio_s", now)
    except (httpx.HTTPError, OSError) as exc:
        rec.update(error=f"client_{type(exc).__name__}", detail=str(exc)[:300])
    rec["wall_s"] = time.perf_counter() - t0
    rec["audio_s"] = wav_seconds(bytes(data)) if rec["error"] is None else 0.0
    if rec["error"] is None and not rec["audio_s"]:
        rec["error"] = "no_audio"
    return rec


async def kokoro_run(name: str, base: str, model: str, text: str,
                     repeats: int) -> dict[str, Any]:
    common = {"model": model, "input": text, "voice": VOICE, "response_format": "wav"}
    if name == "mlx_audio":
        whole, streamed = {**common, "lang_code": LANG}, {**common, "lang_code": LANG,
                                                          "stream": True}
    else:
        whole, streamed = common, {**common, "stream_format": "audio"}
    rows: dict[str, list[dict[str, Any]]] = {"whole": [], "streamed": []}
    async with client() as c:
        await speak(c, base, whole)  # warm-up
        for _ in range(repeats):
            rows["whole"].append(await speak(c, base, whole))
            rows["streamed"].append(await speak(c, base, streamed))
    out: dict[str, Any] = {"runs": rows}
    for kind, recs in rows.items():
        ok = [r for r in recs if r["error"] is None]
        out[kind] = {k: statistics.median(r[k] for r in ok) if ok else None
                     for k in ("wall_s", "audio_s", "first_byte_s", "first_audio_s")}
        out[kind]["rtf"] = statistics.median(r["audio_s"] / r["wall_s"] for r in ok) \
            if ok else None
        out[kind]["failures"] = len(recs) - len(ok)
    w, s = out["whole"]["wall_s"], out["streamed"]["first_audio_s"]
    out["first_audio_over_whole"] = s / w if s and w else None
    return out


def shim_env(logdir: pathlib.Path) -> dict[str, str]:
    """mlx-audio's server environment: mlxcel's BLAS, offline, and on a CPU-only MLX the
    GPU-stream shim (module docstring); a webrtcvad stub where it is not installed."""
    site = logdir / "mlx-audio-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import mlx.core as mx\n"
        "if not mx.is_available(mx.gpu):\n"
        "    _new_stream = mx.new_stream\n"
        "    mx.new_stream = lambda d: _new_stream(mx.cpu if d == mx.gpu else d)\n")
    if importlib.util.find_spec("webrtcvad") is None:
        (site / "webrtcvad.py").write_text(
            "class Vad:\n    def __init__(self, *a, **k):\n"
            "        raise RuntimeError('webrtcvad stub (bench/audio.py)')\n")
    env = {**(same_blas_env() or os.environ), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env



def start(name: str, path: pathlib.Path, mode: str, args: argparse.Namespace,
          logdir: pathlib.Path, tag: str) -> tuple[Server, float]:
    if name == "mlxcel":
        argv = [sys.executable, "-m", "mlxcel.cli", "--model", str(path),
                *(["--dtype", "float16"] if mode == "same-dtype" else []),
                *args.mlxcel_args.split()]
        ready, env = "/health", spawn_env(logdir) if args.mlxcel_spawn else None
    else:
        argv = [sys.executable, "-m", "mlx_audio.server", "--log-dir",
                str(logdir / "mlx-audio-logs")]
        ready, env = "/v1/models", shim_env(logdir)
    srv = Server(name, argv, ready, logdir, tag, env=env)
    return srv, srv.launch()


def run_pass(kind: str, name: str, path: pathlib.Path, mode: str, args: argparse.Namespace,
             logdir: pathlib.Path, tag: str, seeds: str) -> dict[str, Any]:
    """One server started, warmed, measured and stopped; ``seeds`` names the clips (the
    same on every pass of every server)."""
    out: dict[str, Any] = {"loadavg_before": loadavg()}
    srv, startup = start(name, path, mode, args, logdir, f"{tag}-{kind}")
    out.update(argv=" ".join(srv.argv), startup_s=round(startup, 2))
    model = str(path)
    try:
        if kind == "whisper":
            script = json.loads((path / "script.json").read_text())["text"]
            out["warmup"] = asyncio.run(whisper_level(srv.base, model, script, 2, 2,
                                                      f"warm-{tag}"))
            out["levels"] = {}
            for c in args.concurrency:
                lv = asyncio.run(whisper_level(srv.base, model, script, c, max(4, 2 * c),
                                               f"c{c}-{seeds}"))
                out["levels"][str(c)] = lv
                print(f"{tag} {name} whisper c={c}: {json.dumps(lv)}", flush=True)
        else:
            out["kokoro"] = asyncio.run(kokoro_run(name, srv.base, model, args.text,
                                                   args.repeats))
            print(f"{tag} {name} kokoro: {json.dumps({k: v for k, v in out['kokoro'].items() if k != 'runs'})}",  # noqa: E501
                  flush=True)
    finally:
        out["alive_at_end"] = srv.alive()
        srv.stop()
    out["loadavg_after"] = loadavg()
    return out


def merge(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's passes as one: per level (or for Kokoro) the pass with the median
    rate, the rates of all passes beside it."""
    out: dict[str, Any] = {"passes": passes, "argv": passes[0]["argv"]}
    if "levels" in passes[0]:
        out["levels"] = {}
        for c in passes[0]["levels"]:
            lvs = sorted((p["levels"][c] for p in passes), key=lambda lv: lv["rtf"])
            out["levels"][c] = {**lvs[(len(lvs) - 1) // 2], "rtf_all": [lv["rtf"] for lv in lvs]}
    else:
        ks = sorted((p["kokoro"] for p in passes), key=lambda k: k["whole"]["rtf"] or 0)
        out["kokoro"] = {**ks[(len(ks) - 1) // 2],
                         "rtf_all": [k["whole"]["rtf"] for k in ks]}
    return out


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    w = next((r for r in report["whisper"] if r["mode"] == "defaults"), None)
    k = report["kokoro"][0] if report["kokoro"] else None
    values: list[float | None] = [None, None, None]
    if w and "mlxcel" in w:
        xl, al = w["mlxcel"]["levels"], w.get("mlx_audio", {}).get("levels", {})
        cs = sorted(xl, key=int)
        values[0] = bench_report.ratio(xl[cs[0]]["rtf"], al.get(cs[0], {}).get("rtf"))
        values[1] = bench_report.ratio(xl[cs[-1]]["rtf"], al.get(cs[-1], {}).get("rtf")) \
            if len(cs) > 1 else None
        values[2] = sum(sum(lv["failures"].values()) + lv["off_script"]
                        for p in w["mlxcel"]["passes"] for lv in p["levels"].values())
    values.append(k["mlxcel"]["kokoro"]["first_audio_over_whole"]
                  if k and "mlxcel" in k else None)
    return bench_report.judge_targets(TARGETS, values)


def _f(v: float | None, nd: int = 2) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def render(report: dict[str, Any]) -> str:
    lines = [bench_report.machine_line(report), ""]
    for run in report["whisper"]:
        lines += [f"### Whisper {run['label']} ({run['dtype']} checkpoint, mode "
                  f"{run['mode']}): 30 s clip, real-time factor", "",
                  "| C | N | server | RTF (passes) | latency p50 s | failures | off-script | "
                  "temperatures | segments |", "|---|---|---|---|---|---|---|---|---|"]
        servers = [s for s in ("mlxcel", "mlx_audio") if s in run]
        for c in sorted({c for s in servers for c in run[s]["levels"]}, key=int):
            for s in servers:
                lv = run[s]["levels"][c]
                spread = "/".join(f"{v:.1f}" for v in lv["rtf_all"])
                fails = ", ".join(f"{k} {n}" for k, n in lv["failures"].items()) or "0"
                lines.append(f"| {c} | {lv['requests']} | {s} | {lv['rtf']:.2f} ({spread}) | "
                             f"{_f(lv['latency_p50_s'])} | {fails} | {lv['off_script']} | "
                             f"{lv['temperatures']} | {lv['segments']} |")
            if len(servers) == 2:
                a, b = (run[s]["levels"][c] for s in servers)
                lines.append(f"| {c} | | **mlxcel / mlx-audio** | **{_f(bench_report.ratio(a['rtf'], b['rtf']))}"
                             f"** | {_f(bench_report.ratio(a['latency_p50_s'], b['latency_p50_s']))} | | | | |")
        lines.append("")
    for run in report["kokoro"]:
        lines += [f"### Kokoro {run['label']} ({run['dtype']}): {len(report['text'])} "
                  f"characters, voice {VOICE}", "",
                  "| server | whole: RTF (passes) | whole wall s | audio s | streamed: first "
                  "byte s | first audio byte s | first audio / whole | failures |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in ("mlxcel", "mlx_audio"):
            if s not in run:
                continue
            k = run[s]["kokoro"]
            w, st = k["whole"], k["streamed"]
            spread = "/".join(f"{v:.2f}" for v in k["rtf_all"] if v is not None)
            lines.append(f"| {s} | {_f(w['rtf'])} ({spread}) | {_f(w['wall_s'])} | "
                         f"{_f(w['audio_s'])} | {_f(st['first_byte_s'])} | "
                         f"{_f(st['first_audio_s'])} | {_f(k['first_audio_over_whole'])} | "
                         f"{w['failures'] + st['failures']} |")
        if "mlxcel" in run and "mlx_audio" in run:
            a, b = run["mlxcel"]["kokoro"], run["mlx_audio"]["kokoro"]
            lines.append(f"| **mlxcel / mlx-audio** | **{_f(bench_report.ratio(a['whole']['rtf'], b['whole']['rtf']))}"
                         f"** | | | | {_f(bench_report.ratio(a['streamed']['first_audio_s'], b['streamed']['first_audio_s']))} | | |")  # noqa: E501
        lines.append("")
    lines += ["| target | value | bound | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {_f(t['value'])} | {t['bound']} | "
              f"{'yes' if t['met'] else 'NO'} |" for t in report["targets"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--whisper", default="tiny", help=f"{','.join(WHISPER)} or '' (skip)")
    ap.add_argument("--kokoro", default="tiny", help=f"{','.join(KOKORO)} or '' (skip)")
    ap.add_argument("--whisper-dtype", default="float32")
    ap.add_argument("--kokoro-dtype", default="float32")
    ap.add_argument("--words", type=int, default=96, help="the Whisper script's word tokens")
    ap.add_argument("--modes", default="defaults,same-dtype")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeats", type=int, default=3, help="Kokoro requests of each kind")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--rounds", type=int, default=3, help="passes per server, in turn")
    ap.add_argument("--servers", default="mlxcel,mlx_audio")
    ap.add_argument("--mlxcel-args", default="")
    ap.add_argument("--mlxcel-spawn", action="store_true")
    ap.add_argument("--checkpoint-dir", default=str(pathlib.Path(tempfile.gettempdir())
                                                   / "mlxcel-bench-audio"))
    ap.add_argument("--out", default="bench/results/audio.json")
    args = ap.parse_args()
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    names = [n for n in args.servers.split(",") if n]
    root = pathlib.Path(args.checkpoint_dir)
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-bench-audio-"))
    dists = ("mlx-audio", "mlxcel-family-whisper", "mlxcel-family-kokoro", "misaki")
    report: dict[str, Any] = {"machine": machine(),
                              "versions": bench_report.bench_versions(*dists),
                              "loadavg_start": loadavg(), "text": args.text, "voice": VOICE,
                              "clip_s": CLIP_S, "words": args.words, "whisper": [],
                              "kokoro": []}
    jobs = [("whisper", label, args.whisper_dtype, mode) for label in args.whisper.split(",")
            if label for mode in args.modes.split(",")]
    jobs += [("kokoro", label, args.kokoro_dtype, "defaults")
             for label in args.kokoro.split(",") if label]
    for kind, label, dtype, mode in jobs:
        path = build(kind, label, root, dtype, args.words)
        run: dict[str, Any] = {"label": label, "dtype": dtype, "mode": mode,
                               "checkpoint": str(path)}
        passes: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        # mlx-audio has one dtype: a same-dtype run compares with its defaults passes
        prior = {n: x[n] for x in report[kind] if mode != "defaults" and x["label"] == label
                 and x["mode"] == "defaults" for n in ("mlx_audio",) if n in x}
        for r in range(args.rounds):  # servers in turn, so drift hits both alike
            for name in names:
                if name in prior:
                    passes[name] = prior[name]["passes"]
                    continue
                passes[name].append(run_pass(kind, name, path, mode, args, logdir,
                                             f"{label}-{mode}-r{r}", label))
        for name in names:
            if passes[name]:
                run[name] = merge(passes[name])
        report[kind].append(run)
    report["loadavg_end"] = loadavg()
    report["targets"] = targets(report)
    bench_report.write_report(pathlib.Path(args.out), report, render(report), logdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
