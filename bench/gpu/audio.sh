#!/usr/bin/env bash
# The speech benchmark ON the lent H200 (bench/audio.py): a whisper-large-v3-turbo-shaped
# float16 checkpoint (random weights with the bench's scripted decoder, built on the device:
# d_model 1280, 32 encoder / 4 decoder layers, 20 heads, 128 mels, text context 448, the
# multilingual vocabulary; ~0.8B parameters, ~1.6 GB) and a Kokoro-82M-shaped bfloat16 one
# (kokoro_checkpoints.KOKORO_82M, ~82M parameters), mlxcel vs mlx-audio's own server:
# Whisper's real-time factor at concurrency 1 and 4 on a 30 s clip, Kokoro's on a
# 200-character text and its first audio byte when streamed. Both are float16 Whisper on a
# GPU, so the only mode is `defaults`.
# Wheels: ../shared/tools/gpu/fetch-wheels.sh with what the device lacks for mlxcel (as
# for run.sh: litestar, granian, msgspec, structlog, mlx-lm, ...) and for the speech side:
# mlx-audio==0.6.2 and its server's and Kokoro's runtime imports, as read in this repo's
# venv (fastapi, starlette, pydantic, pydantic-core, annotated-types, typing-inspection,
# uvicorn, python-multipart, miniaudio, cffi, misaki==0.9.4, espeakng-loader,
# phonemizer-fork, segments, csvw, dlinfo, language-tags, isodate, jsonschema,
# jsonschema-specifications, referencing, rpds-py, rdflib, rfc3986, uritemplate, babel,
# addict, num2words, docopt; webrtcvad may be left out: the bench stubs it; check with
# `python3 -c 'import mlx_audio.server, misaki.espeak'` there first),
# installed by install-on-device.sh into /tmp/site. Results in $OUT: audio_gpu.json,
# audio_gpu.md, run.log, logs.tgz.
# Knobs: WHISPER (large-v3-turbo), KOKORO (82m), WDTYPE (float16), KDTYPE (bfloat16),
# MODES (defaults), CONC (1,4), ROUNDS (passes per server, in turn; 1), REPEATS (Kokoro
# requests of each kind; 3), WORDS (the Whisper script's tokens; 96), CKDIR (where the
# checkpoints are built), MLXCEL_SPAWN (1: Granian's worker started with 'spawn', the CUDA
# workaround of serving.py), ARGS (more bench/audio.py arguments).
#   MLXCEL_SPAWN=1 OUT=$OUT bash bench/gpu/audio.sh
#   WHISPER=tiny KOKORO=tiny WDTYPE=float32 KDTYPE=float32 WORDS=24 REPEATS=1 \
#       PY=.venv/bin/python OUT=/tmp/a bash bench/gpu/audio.sh      # CPU dry run (~1 min)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/audio-gpu}
PY=${PY:-python3}
WHISPER=${WHISPER:-large-v3-turbo}
KOKORO=${KOKORO:-82m}
WDTYPE=${WDTYPE:-float16}
KDTYPE=${KDTYPE:-bfloat16}
MODES=${MODES:-defaults}
CONC=${CONC:-1,4}
ROUNDS=${ROUNDS:-1}
REPEATS=${REPEATS:-3}
WORDS=${WORDS:-96}
CKDIR=${CKDIR:-/tmp/bench-audio-ckpts}
MLXCEL_SPAWN=${MLXCEL_SPAWN:-0}
ARGS=${ARGS:-}
. bench/gpu/common.sh  # bench_env, machine
bench_env families/whisper families/kokoro
{
  machine
  # shellcheck disable=SC2086
  "$PY" bench/audio.py --whisper "$WHISPER" --kokoro "$KOKORO" --whisper-dtype "$WDTYPE" \
      --kokoro-dtype "$KDTYPE" --modes "$MODES" --concurrency "$CONC" --rounds "$ROUNDS" \
      --repeats "$REPEATS" --words "$WORDS" --checkpoint-dir "$CKDIR" \
      --out "$OUT/audio_gpu.json" "${EXTRA[@]}" $ARGS
} 2>&1 | tee "$OUT/run.log"
LOGS=$(sed -n 's|^wrote .*; logs in /tmp/||p' "$OUT/run.log" | tail -1)
[ -n "$LOGS" ] && tar czf "$OUT/logs.tgz" -C /tmp --exclude=mlx-audio-site --exclude=spawn-site "$LOGS"
exit 0
