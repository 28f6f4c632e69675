#!/usr/bin/env bash
# The prompt-cache scenario benchmark ON the lent H200 (bench/prompt_cache.py): a
# Gemma-4-E4B-shaped and a Qwen3-Next-shaped bf16 checkpoint (random weights;
# mlxcel.testing.bench_checkpoints' "gemma4-e4b", 8.1B parameters, and "qwen3-next-gpu",
# 12.0B: Qwen3-Next-80B-A3B's layers with 64 experts), the four scenarios (answer as text,
# thinking stripped, sub-agent, restart with the disk tier) at a 32k-token prompt, mlxcel vs
# mlx_lm.server. Wheels: ../shared/tools/gpu/fetch-wheels.sh with mlx-lm and mlxcel's
# runtime imports, installed by install-on-device.sh into /tmp/site (bench/README.md).
# Results in $OUT: prompt_cache_gpu.json, prompt_cache_gpu.md, run.log, logs.tgz.
# Knobs: CHECKPOINTS, SIZES (default 32k), REPEATS (default 1), SCENARIOS, DTYPE (build
# the checkpoints in this dtype instead of theirs), CKDIR (where they are built; ~40 GB
# for the two), MAXTOK, MLXCEL_ARGS (default a 32 GiB prompt cache: one 32k-token entry of
# these shapes is ~1 GB, and mlx_lm.server's cache has no byte bound by default), ARGS
# (more bench/prompt_cache.py arguments), MLXCEL_SPAWN (1: start mlxcel's Granian worker
# with the 'spawn' method, serving.py's CUDA workaround).
#   OUT=/tmp/pc-gpu bash bench/gpu/prompt_cache.sh
#   CHECKPOINTS=gemma4-tiny,qwen3-next-tiny SIZES=1k DTYPE=float32 PY=.venv/bin/python \
#     OUT=/tmp/pc-dry bash bench/gpu/prompt_cache.sh                            # CPU dry run
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pc-gpu}
PY=${PY:-python3}
CHECKPOINTS=${CHECKPOINTS:-gemma4-e4b,qwen3-next-gpu}
SIZES=${SIZES:-32k}
REPEATS=${REPEATS:-1}
SCENARIOS=${SCENARIOS:-answer-as-text,thinking-stripped,sub-agent,restart-disk}
DTYPE=${DTYPE:-}
CKDIR=${CKDIR:-/tmp/bench-ckpts}
MAXTOK=${MAXTOK:-8}
ARGS=${ARGS:-}
MLXCEL_ARGS=${MLXCEL_ARGS:---cache-ram 32768}
MLXCEL_SPAWN=${MLXCEL_SPAWN:-0}
. bench/gpu/common.sh  # bench_env, machine
bench_env
[ -n "$DTYPE" ] && EXTRA+=(--dtype "$DTYPE")
{
  machine; df -h "$(dirname "$CKDIR")" | tail -1
  # shellcheck disable=SC2086
  "$PY" bench/prompt_cache.py --families "$CHECKPOINTS" --sizes "$SIZES" \
      --repeats "$REPEATS" --scenarios "$SCENARIOS" --max-tokens "$MAXTOK" \
      --checkpoint-dir "$CKDIR" --log-dir "$OUT/logs" --out "$OUT/prompt_cache_gpu.json" \
      --mlxcel-args "$MLXCEL_ARGS" --fresh "${EXTRA[@]}" $ARGS
} 2>&1 | tee "$OUT/run.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$OUT/logs"
exit 0
