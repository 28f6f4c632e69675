#!/usr/bin/env bash
# The image-chat benchmark ON the lent H200 (bench/vision.py): a Qwen2.5-VL-7B-shaped bf16
# checkpoint (random weights, built on the device: hidden 3584, 28 layers, 28/4 heads,
# intermediate 18944, vocab 152064 untied; vision depth 32, hidden 1280, window attention
# with full attention at blocks 7/15/23/31; ~8.3B parameters, ~17 GB), mlxcel vs
# mlx_vlm.server at concurrency 1 and 8, the raw mlx-vlm loop (stream_generate at batch 1,
# batch_generate at batch 8) as the ceiling, the repeated-image TTFT and the fetch policy's
# cost. Wheels: ../shared/tools/gpu/fetch-wheels.sh with mlx-lm, mlx-vlm (and their runtime
# imports), installed by install-on-device.sh into /tmp/site. Results in $OUT:
# vision_gpu.json, vision_gpu.md, run.log, logs.tgz.
# Knobs: CHECKPOINTS, DTYPE, CONC (default 1,8), MAXTOK (64), REPEATS (3), ROUNDS (passes
# per server, in turn; 1), CKDIR (where the checkpoint is built), RAW (1: the raw loop),
# MLXCEL_SPAWN (1: Granian's worker started with 'spawn', serving.py's CUDA workaround),
# TRACE (1: each mlxcel pass's engine trace in logs.tgz), ARGS (more bench/vision.py
# arguments), PY_SPY (1: py-spy records mlxcel's repeated-image requests, into logs.tgz;
# py-spy on PATH).
#   MLXCEL_SPAWN=1 OUT=$OUT bash bench/gpu/vision.sh
#   CHECKPOINTS=qwen2.5-vl-tiny DTYPE=float32 PY=.venv/bin/python OUT=/tmp/v bash bench/gpu/vision.sh  # CPU dry run
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/vision-gpu}
PY=${PY:-python3}
CHECKPOINTS=${CHECKPOINTS:-qwen2.5-vl-7b}
DTYPE=${DTYPE:-bfloat16}
CONC=${CONC:-1,8}
MAXTOK=${MAXTOK:-64}
REPEATS=${REPEATS:-3}
ROUNDS=${ROUNDS:-1}
CKDIR=${CKDIR:-/tmp/bench-vlm-ckpts}
RAW=${RAW:-1}
MLXCEL_SPAWN=${MLXCEL_SPAWN:-0}
ARGS=${ARGS:-}
TRACE=${TRACE:-0}
PY_SPY=${PY_SPY:-0}
. bench/gpu/common.sh  # bench_env, machine
bench_env families/vlm
[ "$RAW" = 1 ] && EXTRA+=(--raw)
[ "$TRACE" = 1 ] && EXTRA+=(--trace)
[ "$PY_SPY" = 1 ] && EXTRA+=(--py-spy)
{
  machine
  # shellcheck disable=SC2086
  "$PY" bench/vision.py --checkpoint "$CHECKPOINTS" --dtype "$DTYPE" --concurrency "$CONC" \
      --max-tokens "$MAXTOK" --repeats "$REPEATS" --rounds "$ROUNDS" --checkpoint-dir "$CKDIR" \
      --out "$OUT/vision_gpu.json" "${EXTRA[@]}" $ARGS
} 2>&1 | tee "$OUT/run.log"
LOGS=$(sed -n 's|^wrote .*; logs in /tmp/||p' "$OUT/run.log" | tail -1)
[ -n "$LOGS" ] && tar czf "$OUT/logs.tgz" -C /tmp --exclude='*.png' --exclude=spawn-site "$LOGS"
exit 0
