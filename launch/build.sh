#!/usr/bin/env bash
# Configures and builds shardlm into build/ (or $SHARDLM_BUILD_DIR). CUDA parts are built whenever
# nvcc is found (SHARDLM_CUDA=AUTO); pass -DSHARDLM_CUDA=OFF etc. as extra arguments.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SHARDLM_BUILD_DIR:-$root/build}
jobs=${SHARDLM_JOBS:-$(nproc)}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [ $# -gt 0 ]; then
  cmake "$build" "$@" >/dev/null
fi
cmake --build "$build" -j "$jobs"
