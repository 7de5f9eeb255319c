#!/usr/bin/env bash
# The main job: installs what is missing, builds, and generates.
#   launch/demo.sh                      a built-in tiny model (random weights) generates from token ids
#   launch/demo.sh --model DIR [flags]  any Hugging Face checkpoint; flags go to `shardlm generate`
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/launch/install_deps.sh"
"$root/launch/build.sh" >/dev/null
bin="$root/build/shardlm"
"$bin" --version

if [ $# -eq 0 ]; then
  model="$root/build/demo-model"
  [ -f "$model/config.json" ] || "$bin" make-model --preset tiny --out "$model"
  echo "NOTE: no trained model ships yet; this is the built-in tiny Qwen3-shaped model with RANDOM"
  echo "      weights, so the ids below are noise that only shows the pipeline runs end to end."
  echo "      Run a real checkpoint with: launch/demo.sh --model DIR --prompt-ids '...'"
  set -- --model "$model" --prompt-ids "1,15,27,300,42;1,7,7,99" --max-new-tokens 16 --temperature 0
fi
"$bin" generate "$@"
