#!/usr/bin/env bash
# The speculative-decoding benchmark ON the lent H200 (bench/speculative.py): a
# Llama-3-8B-shaped bf16 target (build_checkpoint.py's llama3-8b), a Llama-3.2-1B-shaped
# random draft with its vocabulary (llama3-1b: unrelated to the target, so almost always
# wrong), the target's first TRUNC layers as a self-draft; mlxcel off / prompt lookup /
# -md draft / -md self at concurrency 1, 8 and 64, mlx_lm.server off / --draft-model at 1;
# first the raw MLX loop at batch 1 on the target, the ceiling of the c = 1 step.
# Wheels as for run.sh (../shared/tools/gpu/fetch-wheels.sh with mlx-lm and mlxcel's
# runtime imports), installed by install-on-device.sh into /tmp/site.
# Results in $OUT: speculative_gpu.json / .md, raw_loop.json, run.log, logs.tgz.
# Knobs: TARGET (llama3-8b), DRAFT (llama3-1b), TRUNC (4), CONFIGS, CONC (1,8,64), MAXTOK
# (128), CKDIR, MLXCEL_SPAWN (1), RAW (1), TRACE (1: each mlxcel server's engine trace in
# logs.tgz).
#   OUT=$OUT bash bench/gpu/speculative.sh
#   TARGET=30m DRAFT=tiny-draft TRUNC=2 CONC=1,8 MAXTOK=32 RAW=0 PY=.venv/bin/python \
#       OUT=/tmp/s bash bench/gpu/speculative.sh                    # CPU dry run
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/spec-gpu}
PY=${PY:-python3}
TARGET=${TARGET:-llama3-8b}
DRAFT=${DRAFT:-llama3-1b}
TRUNC=${TRUNC:-4}
CONFIGS=${CONFIGS:-mlxcel-off,mlxcel-lookup,mlxcel-self,mlxcel-draft,mlx_lm-off,mlx_lm-self,mlx_lm-draft}
CONC=${CONC:-1,8,64}
MAXTOK=${MAXTOK:-128}
CKDIR=${CKDIR:-/tmp/bench-ckpts}
MLXCEL_SPAWN=${MLXCEL_SPAWN:-1}
RAW=${RAW:-1}
TRACE=${TRACE:-0}
. bench/gpu/common.sh  # bench_env, machine
bench_env
[ "$TRACE" = 1 ] && EXTRA+=(--trace)
{
  machine
  if [ "$RAW" = 1 ]; then
    path=$("$PY" bench/gpu/build_checkpoint.py --preset "$TARGET" --cache-dir "$CKDIR" | tail -1)
    "$PY" bench/gpu/raw_loop.py --model "$path" --batches 1 --steps "$MAXTOK" \
        --out "$OUT/raw_loop.json"
  fi
  "$PY" bench/speculative.py --target "$TARGET" --draft-preset "$DRAFT" --truncate "$TRUNC" \
      --configs "$CONFIGS" --concurrency "$CONC" --max-tokens "$MAXTOK" --cache-dir "$CKDIR" \
      --out "$OUT/speculative_gpu.json" "${EXTRA[@]}"
} 2>&1 | tee "$OUT/run.log"
tar czf "$OUT/logs.tgz" -C /tmp $(cd /tmp && ls -d mlxcel-bench-spec-* 2>/dev/null) 2>/dev/null
exit 0
