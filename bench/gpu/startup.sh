#!/usr/bin/env bash
# The startup probe (bench/probes/startup.py) ON the device: time-to-ready, the first
# request's TTFT and two bursts of C=64, for this tree ("after") and BEFORE (a source tree
# of the commit to compare with, e.g. `git archive <commit> | tar -x -C /tmp/src-old`), on
# each SHAPE's random bf16 checkpoint (bench/gpu/build_checkpoint.py). Results in $OUT.
#   BEFORE=/tmp/src-old OUT=/tmp/st bash bench/gpu/startup.sh
#   BEFORE=/tmp/src-old SHAPES=tiny PY=.venv/bin/python OUT=/tmp/st bash bench/gpu/startup.sh  # CPU dry run
# Knobs: ORDER (variants in turn), HIDE, KCACHE (MLX's kernel folder, shared by every start;
# outside $OUT, whose files all travel back), ARGS (more mlxcel-server arguments, e.g.
# "--prompt-lookup on" to time the verify shapes' warm-up), TAG (appended to each label) and
# IMPORTTIME=1 (each server's import times, Python's -X importtime, in its log). The servers'
# logs come back in $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/startup}
PY=${PY:-python3}
SHAPES=${SHAPES:-llama3-8b,gemma4-e4b}
BEFORE=${BEFORE:?BEFORE: a source tree of the commit to compare with}
ORDER=${ORDER:-after,before,after}
HIDE=${HIDE:-torch}  # modules the servers run without (see the probe); "" for none
KCACHE=${KCACHE:-/tmp/mlxcel-bench-ptx}
ARGS=${ARGS:-}
TAG=${TAG:-}
if [ "${IMPORTTIME:-0}" = 1 ]; then export PYTHONPROFILEIMPORTTIME=1; fi
. bench/gpu/common.sh  # bench_env, machine
bench_env
machine 2>&1 | tee -a "$OUT/run.log"
for shape in ${SHAPES//,/ }; do
  CKPT=$("$PY" bench/gpu/build_checkpoint.py --preset "$shape" --cache-dir /tmp/bench-ckpts | tail -1)
  "$PY" bench/probes/startup.py --model "$CKPT" --label "$shape$TAG" --order "$ORDER" \
      --variant "after=$PWD/core/src" --variant "before=$BEFORE/core/src" "${EXTRA[@]}" \
      ${HIDE:+--hide "$HIDE"} --kernel-cache "$KCACHE" ${ARGS:+"--mlxcel-args=$ARGS"} \
      --out "$OUT/startup_gpu.json" 2>&1 | tee -a "$OUT/run.log"
done
tar czf "$OUT/logs.tgz" -C /tmp $(cd /tmp && ls -d mlxcel-bench-startup-* 2>/dev/null) 2>/dev/null
exit 0
