#!/usr/bin/env bash
# Stage what every bench/gpu harness needs on the lent GPU machine, in folders that each
# travel with one device call (a call carries at most 64 MiB, the working tree included):
#   .whl/a, .whl/b  MLX's CUDA build (../shared/tools/gpu/fetch-wheels.sh)
#   .whl/c, .whl/d  what the device's image lacks for mlxcel, mlx-vlm's and mlx-audio's
#                   servers, Kokoro's G2P and py-spy, pinned to this venv's versions
#   .whl/e          src.tgz: HEAD's core, families, plugins and bench
# Then, on one warm machine (it stays warm 30 s after a call, so chain the calls):
#   1. carry .whl/a:        mkdir -p /tmp/w && cp .whl/a/* /tmp/w/
#   2. carry .whl/b .whl/e: cp .whl/b/* /tmp/w/ && mkdir -p /tmp/src &&
#                           tar -xzf .whl/e/src.tgz -C /tmp/src
#   3. carry .whl/c:        cp .whl/c/* /tmp/w/
#   4. carry .whl/d:        cp .whl/d/* /tmp/w/ && bash /tmp/src/bench/gpu/install-on-device.sh
#                           && cd /tmp/src && PY=python3 OUT=$OUT bash bench/gpu/<harness>.sh
# with PYTHONPATH=/tmp/site for the harness (install-on-device.sh's target). Usage, from
# the repository root (PY: the venv whose versions the pins take):
#   bash bench/gpu/stage.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
LIMIT=$((46 * 1024 * 1024))  # bytes per folder, leaving room for the working tree

# what the device's image lacks (its package list: the device tool's KINDS.md)
NEED=(
  mlx-lm mlx-vlm mlx-audio
  litestar litestar-htmx msgspec multipart polyfactory Faker granian structlog
  outlines_core llguidance miniaudio ffmpeg-python future sniffio rich-click tzdata
  truststore pydantic pydantic_core annotated-types typing-inspection websockets
  fastapi starlette uvicorn python-multipart opentelemetry-api importlib-metadata
  cryptography cffi pycparser datasets dill multiprocess kernels httpx2 httpcore2
  cachetools termcolor docstring_parser
  misaki espeakng-loader phonemizer-fork segments csvw dlinfo language-tags isodate
  jsonschema jsonschema-specifications referencing rpds-py rdflib rfc3986 uritemplate
  babel addict num2words docopt
  py-spy
)

freeze=$("$PY" -m pip freeze 2>/dev/null || true)
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
pins=()
for name in "${NEED[@]}"; do
  pin=$(echo "$freeze" | while IFS= read -r line; do
    n=${line%%==*}
    if [ "$(norm "$n")" = "$(norm "$name")" ]; then echo "$line"; break; fi
  done)
  pins+=("${pin:-$name}")
done
bash ../shared/tools/gpu/fetch-wheels.sh  # .whl/a and .whl/b (and an empty .whl/c)
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for pin in "${pins[@]}"; do  # one at a time: a pin with no wheel for the device's
  # Python takes the newest one that has (a local build may be newer than the index)
  pip download -q --no-deps "${plat[@]}" -d .whl/c "$pin" 2>/dev/null ||
    pip download -q --no-deps "${plat[@]}" -d .whl/c "${pin%%==*}" 2>/dev/null ||
    pip wheel -q --no-deps -w .whl/c "$pin" 2>/dev/null ||  # a pure-Python sdist
    echo "no wheel for $pin: the device lacks it" >&2
done

# .whl/c holds them all: move wheels into .whl/d until .whl/c fits
mkdir -p .whl/d
size() { du -sb "$1" | cut -f1; }
for f in $(ls -S .whl/c); do
  [ "$(size .whl/c)" -le "$LIMIT" ] && break
  mv ".whl/c/$f" .whl/d/
done

mkdir -p .whl/e
git archive HEAD core families plugins bench | gzip > .whl/e/src.tgz
for d in a b c d e; do
  bytes=$(size ".whl/$d")
  echo ".whl/$d $((bytes / 1024 / 1024)) MiB"
  if [ "$bytes" -gt "$LIMIT" ]; then echo "  over $((LIMIT / 1024 / 1024)) MiB: split it" >&2; fi
done
