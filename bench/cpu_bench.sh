#!/usr/bin/env bash
# CPU prefill/decode benchmark of one model (default: a synthetic Qwen3-1.7B-shaped checkpoint,
# written once to build/bench-qwen3-1.7b; ~4 GB of disk).
#   bench/cpu_bench.sh [--model DIR] [extra `shardlm bench` flags, e.g. --batch 4 --prompt-len 128 --gen 32]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/launch/build.sh" >/dev/null
bin="$root/build/shardlm"
model=""
if [ "${1:-}" = "--model" ]; then model=$2; shift 2; fi
if [ -z "$model" ]; then
  model="$root/build/bench-qwen3-1.7b"
  [ -f "$model/config.json" ] || "$bin" make-model --preset qwen3-1.7b --out "$model" --shards 4
fi
echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads"
"$bin" --version | tail -1
"$bin" bench --model "$model" "$@"
