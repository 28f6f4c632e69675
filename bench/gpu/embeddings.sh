#!/usr/bin/env bash
# The embeddings benchmark ON the lent H200 (bench/embeddings.py): a BERT-base-shaped and a
# Qwen3-Embedding-0.6B-shaped bf16 embedder, mlxcel vs mlx_vlm.server vs a raw mlx-vlm
# loop, and chat ITL beside an embedding flood. Wheels: ../shared/tools/gpu/fetch-wheels.sh
# with mlx-lm, mlx-vlm (and their runtime imports), installed by install-on-device.sh into
# /tmp/site. Results in $OUT.
#   OUT=/tmp/emb-gpu bash bench/gpu/embeddings.sh
#   PROBE=1 ARGS="--servers mlxcel" OUT=/tmp/emb-gpu bash bench/gpu/embeddings.sh  # + the lane probe
#   CHECKPOINTS=tiny DTYPE=float32 CHAT=tiny PY=.venv/bin/python OUT=/tmp/e bash bench/gpu/embeddings.sh  # CPU dry run
set -uo pipefail
# shellcheck disable=SC2086
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/emb-gpu}
PY=${PY:-python3}
CHECKPOINTS=${CHECKPOINTS:-bert-base,qwen3-emb-0.6b}
DTYPE=${DTYPE:-bfloat16}
CHAT=${CHAT:-30m}
ARGS=${ARGS:-}  # more bench/embeddings.py arguments, e.g. --servers mlxcel
PROBE=${PROBE:-0}  # 1: bench/probes/embedding_lane.py on each checkpoint first (engine only)
. bench/gpu/common.sh  # bench_env, machine
bench_env families/embeddings
if [ "$PROBE" = 1 ]; then
  for c in ${CHECKPOINTS//,/ }; do
    "$PY" bench/probes/embedding_lane.py --checkpoint "$c" --dtype "$DTYPE" \
        --json "$OUT/lane_$c.json" 2>&1 | tee -a "$OUT/probe.log"
  done
fi
"$PY" bench/embeddings.py --checkpoint "$CHECKPOINTS" --dtype "$DTYPE" \
    --chat-checkpoint "$CHAT" --out "$OUT/embeddings_gpu.json" $ARGS 2>&1 | tee "$OUT/run.log"
tar czf "$OUT/logs.tgz" -C /tmp $(cd /tmp && ls -d mlxcel-bench-emb-* 2>/dev/null) 2>/dev/null
exit 0
