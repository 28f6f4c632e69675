#!/usr/bin/env bash
# GPU serving benchmark, run ON the lent H200 (from the repo root, after the wheels are in
# /tmp/site: see bench/README.md), or on a CPU with a tiny SHAPE to test every step:
#   1. build the random bf16 checkpoint of SHAPE locally (bench/gpu/build_checkpoint.py)
#   2. raw MLX decode loop at batch 1/8/64 on it (bench/gpu/raw_loop.py)
#   3. mlxcel (--parallel 64) then mlx_lm.server, streamed at concurrency 1/8/64
#      (bench/serving.py), compared with each other and with the raw loop
# Results go to $OUT: serving_gpu.json, serving_gpu.md, logs.tgz (server logs) and
# extras.tgz (env.txt, run.log, raw_loop*.json, engine traces). Environment knobs: SHAPE (llama3-8b | gemma4-e4b | tiny | gemma4-tiny |
# skeleton), ARRIVAL (1: the continuous-arrival load instead: concurrency 1 and 64, 2 x C
# requests per level, i.e. 128 at C = 64, where a second wave joins as the first
# finishes; max_tokens 128, targets gpu-arrival, label SHAPE-arrival), OUT, PY, CONC,
# MAXTOK, CKDIR, SERVERS, STEPS (raw loop steps; default MAXTOK), LEVEL_DEADLINE (s;
# default 150, 100 for gemma4-e4b), REQ_CAP (requests per level at most; default 64, i.e.
# 2 x C up to C = 32, then C; 128 with ARRIVAL=1), TARGETS (serving.py --targets; default
# gpu, which is gpu-gemma4 for a gemma4 shape), LABEL, MLXCEL_SPAWN (default 1), TRACE (1:
# each mlxcel pass writes its engine timeline to $OUT/engine_trace-LABEL.jsonl, see MLXCEL_ENGINE_TRACE),
# RAW_CACHES (raw_loop.py --caches; default KVCache,BatchKVCache; KIND+PATH entries time
# an mlxcel attention path too), ALT_ARGS / ALT_LABEL / ALT_CONC (a second mlxcel pass
# with these extra arguments, labelled LABEL-ALT_LABEL, at ALT_CONC; default 64: an A/B),
# ROUNDS (default 1; N > 1 repeats raw loop + mlxcel [+ the A/B pass] N-1 more times,
# labels suffixed -round<N>: on a host whose speed drifts over minutes, compare each
# server pass with the raw loop measured just before it, and take medians over rounds).
# One-question GPU probes are in bench/probes/ (bench/probes/README.md).
#   SHAPE=tiny OUT=/tmp/gpu-test PY=.venv/bin/python bash bench/gpu/run.sh          # CPU dry run
#   SHAPE=gemma4-tiny OUT=/tmp/gpu-g4 PY=.venv/bin/python bash bench/gpu/run.sh    # CPU dry run
#   SHAPE=tiny ARRIVAL=1 OUT=/tmp/gpu-arr PY=.venv/bin/python bash bench/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
SHAPE=${SHAPE:-llama3-8b}
ARRIVAL=${ARRIVAL:-0}
OUT=${OUT:-/tmp/gpu-out}
PY=${PY:-python3}
if [ "$ARRIVAL" = 1 ]; then
  CONC=${CONC:-1,64}; MAXTOK=${MAXTOK:-128}; REQ_CAP=${REQ_CAP:-128}
  TARGETS=${TARGETS:-gpu-arrival}; LABEL=${LABEL:-$SHAPE-arrival}
fi
CONC=${CONC:-1,8,64}
MAXTOK=${MAXTOK:-256}
STEPS=${STEPS:-$MAXTOK}
CKDIR=${CKDIR:-/tmp/bench-ckpts}
SERVERS=${SERVERS:-mlxcel,mlx_lm}
DEADLINE=150; [ "$SHAPE" = gemma4-e4b ] && DEADLINE=100
LEVEL_DEADLINE=${LEVEL_DEADLINE:-$DEADLINE}
REQ_CAP=${REQ_CAP:-64}
TARGETS=${TARGETS:-gpu}
LABEL=${LABEL:-$SHAPE}
TRACE=${TRACE:-0}
RAW_CACHES=${RAW_CACHES:-KVCache,BatchKVCache}
ALT_ARGS=${ALT_ARGS:-}; ALT_LABEL=${ALT_LABEL:-alt}; ALT_CONC=${ALT_CONC:-64}
ROUNDS=${ROUNDS:-1}
MLXCEL_SPAWN=${MLXCEL_SPAWN:-1}   # 1: --mlxcel-spawn (Granian fork after CUDA init fails)
export SERVING_STARTUP_TIMEOUT_S=${SERVING_STARTUP_TIMEOUT_S:-300}
SPAWN=(); [ "$MLXCEL_SPAWN" = 1 ] && SPAWN=(--mlxcel-spawn)
PARALLEL=$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
META=/tmp/mlxcel-meta
"$PY" bench/gpu/mlxcel_meta.py "$META" >/dev/null || exit 1
export PYTHONPATH="$PWD/core/src:$META${PYTHONPATH:+:$PYTHONPATH}"
t0=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - t0 ))s] $*"; }

{
  log "env (SHAPE=$SHAPE ARRIVAL=$ARRIVAL CONC=$CONC MAXTOK=$MAXTOK REQ_CAP=$REQ_CAP PARALLEL=$PARALLEL)"
  {
    nvidia-smi 2>&1 | head -15 || true
    nproc; free -g | head -2
    "$PY" - <<'PY'
import importlib.metadata as m, mlx.core as mx, sys
print("python", sys.version.split()[0], "mlx", mx.__version__, mx.default_device())
for d in ("mlx-lm", "mlxcel", "transformers", "tokenizers", "litestar", "granian", "httpx"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "MISSING")
print("mlxcel plugins:", sorted(e.name for e in m.entry_points(group="mlxcel")))
PY
  } 2>&1 | tee "$OUT/env.txt"

  log "build checkpoint ($SHAPE)"
  CKPT=$("$PY" bench/gpu/build_checkpoint.py --preset "$SHAPE" --cache-dir "$CKDIR" | tail -1)
  [ -d "$CKPT" ] || { log "checkpoint build failed"; exit 1; }
  du -sh "$CKPT"

  # TRACE=1: each mlxcel pass writes its own timeline (a server start truncates its file)
  trace_of() { [ "$TRACE" = 1 ] && echo "$OUT/engine_trace-$1.jsonl"; }
  for round in $(seq 1 "$ROUNDS"); do
    # round 1: every server in SERVERS; later rounds: mlxcel (and the A/B pass) again,
    # each against a raw loop measured just before it, labels suffixed -round<N>
    sfx=""; raw="$OUT/raw_loop.json"; servers="$SERVERS"; fresh=(--fresh)
    if [ "$round" -gt 1 ]; then
      sfx="-round$round"; raw="$OUT/raw_loop$sfx.json"; servers=mlxcel; fresh=()
    fi
    log "raw loop$sfx"
    "$PY" bench/gpu/raw_loop.py --model "$CKPT" --batches "$CONC" --steps "$STEPS" \
      --caches "$RAW_CACHES" --out "$raw" || log "raw loop FAILED"
    RAW=()
    [ -s "$raw" ] && RAW=(--raw-json "$raw")
    log "serving$sfx (servers: $servers)"
    tr=$(trace_of "$LABEL$sfx")
    env ${tr:+MLXCEL_ENGINE_TRACE="$tr"} "$PY" bench/serving.py --model "$CKPT" --label "$LABEL$sfx" --modes defaults \
      --servers "$servers" --concurrency "$CONC" --max-tokens "$MAXTOK" \
      --parallel "$PARALLEL" --level-deadline "$LEVEL_DEADLINE" --requests-cap "$REQ_CAP" \
      "${SPAWN[@]}" "${RAW[@]}" --targets "$TARGETS" --log-dir "$OUT/logs" \
      --out "$OUT/serving_gpu.json" "${fresh[@]}" || log "serving FAILED"
    if [ -n "$ALT_ARGS" ]; then
      log "serving$sfx, mlxcel $ALT_ARGS (label $LABEL-$ALT_LABEL$sfx)"
      tr=$(trace_of "$LABEL-$ALT_LABEL$sfx")
      env ${tr:+MLXCEL_ENGINE_TRACE="$tr"} "$PY" bench/serving.py --model "$CKPT" --label "$LABEL-$ALT_LABEL$sfx" \
        --modes defaults --servers mlxcel --mlxcel-args "$ALT_ARGS" --concurrency "$ALT_CONC" \
        --max-tokens "$MAXTOK" --parallel "$PARALLEL" --level-deadline "$LEVEL_DEADLINE" \
        --requests-cap "$REQ_CAP" "${SPAWN[@]}" "${RAW[@]}" --targets none \
        --log-dir "$OUT/logs-alt" --out "$OUT/serving_gpu.json" || log "alt serving FAILED"
    fi
  done
  log "done"
} 2>&1 | tee "$OUT/run.log"
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls -d logs logs-alt 2>/dev/null) && rm -rf "$OUT/logs" "$OUT/logs-alt"
# the device returns at most 8 files from $OUT: the rest travels as one archive
extras=$(cd "$OUT" && ls env.txt run.log raw_loop*.json engine_trace-*.jsonl 2>/dev/null)
[ -n "$extras" ] && tar czf "$OUT/extras.tgz" -C "$OUT" $extras && (cd "$OUT" && rm -f $extras)
ls -la "$OUT"
