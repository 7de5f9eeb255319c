#!/usr/bin/env bash
# The mission's table, measured in one run: batch 4, 512 tokens of context.
#   bench/mission_table.sh [--synthetic NAME | --model DIR] [--gen N] [extra bench flags]
# Rows: "FP16 baseline" recomputes the whole sequence every step (--no-kv-cache) with plain
# attention (--attention naive); "INT8" the same with INT8 weights; "+KV cache" decodes from the
# (INT8) KV cache; "+FlashAttention" swaps in the tiled attention (split-KV decode on the GPU).
# Extra flags go to every row, e.g. --device cuda. SHARDLM_BIN runs a given binary (the GPU check's
# bundle) instead of building build/shardlm.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${SHARDLM_BIN:-}" ]; then
  bin=$SHARDLM_BIN
else
  "$root/launch/build.sh" >/dev/null
  bin="$root/build/shardlm"
fi
src=(--synthetic qwen3-1.7b)
gen=8
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model|--synthetic) src=("$1" "$2"); shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
common=("${src[@]}" --batch 4 --prompt-len $((512 - gen)) --gen "$gen" -r 1 --json "${extra[@]}")
row() {  # name, flags...
  local name=$1; shift
  "$bin" bench "${common[@]}" "$@" | python3 -c '
import json, sys
name = sys.argv[1]
rows = {r["test"].rstrip("0123456789"): r for r in map(json.loads, sys.stdin)}
pp, tg = rows["pp"], rows["tg"]
m = pp["memory"]
mem = (m["weights_bytes"] + m["kv_cache_bytes"] + m["workspace_bytes"]) / 1e9
ms_pp, ms_tok, dev = pp["avg_ms"], tg["avg_ms"] / int(sys.argv[2]), tg["device"]
print(f"| {name} | {mem:.2f} | {ms_pp:.0f} | {ms_tok:.1f} | {dev} |")
' "$name" "$gen"
}
echo "# $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads, $("$bin" --version | head -1), flags: ${extra[*]:-none}"
echo "| row | memory (GB) | prefill (ms) | decode (ms/token) | device |"
echo "|---|---:|---:|---:|---|"
row "FP16 baseline" --weights fp16 --kv fp16 --no-kv-cache --attention naive
row "INT8" --weights int8 --kv fp16 --no-kv-cache --attention naive
row "+KV cache" --weights int8 --kv int8 --attention naive
row "+FlashAttention" --weights int8 --kv int8 --attention flash
