#!/usr/bin/env bash
# Installs the system packages mlxcel uses: OpenBLAS (fast BLAS for MLX's CPU backend) and
# ffmpeg (audio formats beyond WAV, MP3 and FLAC: m4a, ogg, opus, webm in; mp3, opus, flac,
# aac out). Debian/Ubuntu as root: apt-get. Elsewhere: a hint.
set -u
need=()
if [ "$(uname -s)" = "Darwin" ]; then
  exit 0
fi
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || [ -e /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3 ] || need+=(libopenblas0-pthread)
command -v ffmpeg >/dev/null 2>&1 || need+=(ffmpeg)
[ ${#need[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  echo "installing system packages: ${need[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/tmp/mlxcel-apt.log 2>&1 \
    || { echo "warning: apt-get install ${need[*]} failed (see /tmp/mlxcel-apt.log); continuing"; exit 0; }
else
  echo "hint: install ${need[*]} with your package manager (a fast CPU backend; audio formats)"
fi
