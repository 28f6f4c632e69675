# shellcheck shell=bash
# What every bench/gpu/*.sh harness but run.sh does before its benchmark, sourced after
# its knobs (OUT, PY, MLXCEL_SPAWN):
#   bench_env [DIST_FOLDER ...]  core's source (and each distribution folder's, e.g.
#       families/vlm) on PYTHONPATH with the entry-point metadata mlxcel finds its plugins
#       by, written by mlxcel_meta.py unless all of them are installed already (a dev
#       venv: a second copy would register each plugin twice); offline Hugging Face,
#       unbuffered output, $OUT made, EXTRA=(--mlxcel-spawn) when MLXCEL_SPAWN=1 (serving.py's
#       CUDA workaround) for the harness to add its own arguments to.
#   machine  the GPU, CPU count and memory, for the head of run.log.

bench_env() {
  local src="$PWD/core/src" folder
  for folder in "$@"; do src="$src:$PWD/$folder/src"; done
  META=
  if ! "$PY" - core "$@" 2>/dev/null <<'PY'
import importlib.metadata as m, sys, tomllib
for folder in sys.argv[1:]:
    with open(f"{folder}/pyproject.toml", "rb") as f:
        m.distribution(tomllib.load(f)["project"]["name"])
PY
  then
    META=$(mktemp -d)
    "$PY" bench/gpu/mlxcel_meta.py "$META" "$@" >/dev/null || exit 1
  fi
  export PYTHONPATH="$src${META:+:$META}${PYTHONPATH:+:$PYTHONPATH}"
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  export SERVING_STARTUP_TIMEOUT_S=${SERVING_STARTUP_TIMEOUT_S:-600}
  mkdir -p "$OUT"
  EXTRA=()
  if [ "${MLXCEL_SPAWN:-0}" = 1 ]; then EXTRA+=(--mlxcel-spawn); fi
}

machine() {
  nvidia-smi 2>&1 | head -15 || true
  nproc; free -g | head -2
}
