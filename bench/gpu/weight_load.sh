#!/usr/bin/env bash
# The weight-load probe (bench/probes/weight_load.py) ON the device, on SHAPE's random bf16
# checkpoint (bench/gpu/build_checkpoint.py): every variant at THREADS (default 8), then the
# threaded ones at each of MORE (default 4,16). Results in $OUT/weight_load_T.json, run.log.
#   OUT=$OUT/wl bash bench/gpu/weight_load.sh
#   SHAPE=tiny PY=.venv/bin/python OUT=/tmp/wl bash bench/gpu/weight_load.sh  # CPU dry run
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/weight-load}
PY=${PY:-python3}
SHAPE=${SHAPE:-llama3-8b}
THREADS=${THREADS:-8}
MORE=${MORE:-4,16}
REPEATS=${REPEATS:-2}
. bench/gpu/common.sh  # bench_env, machine
bench_env
{
  machine
  CKPT=$("$PY" bench/gpu/build_checkpoint.py --preset "$SHAPE" --cache-dir /tmp/bench-ckpts | tail -1)
  "$PY" bench/probes/weight_load.py --checkpoint "$CKPT" --threads "$THREADS" \
      --repeats "$REPEATS" --out "$OUT/weight_load_$THREADS.json"
  for t in ${MORE//,/ }; do
    "$PY" bench/probes/weight_load.py --checkpoint "$CKPT" --threads "$t" --repeats 1 \
        --variants threads,mlxcel --out "$OUT/weight_load_$t.json"
  done
} 2>&1 | tee "$OUT/run.log"
exit 0
