#!/usr/bin/env bash
# The main job: installs what is missing, builds, and generates.
#   launch/demo.sh                      the shipped KJV model continues "And God said"
#   launch/demo.sh --model DIR [flags]  any Hugging Face checkpoint; flags go to `shardlm generate`
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/launch/install_deps.sh"
"$root/launch/build.sh" >/dev/null
bin="$root/build/shardlm"
"$bin" --version

if [ $# -eq 0 ]; then
  model="$root/launch/models/kjv-small"
  prompt="And God said"
  echo "model: launch/models/kjv-small, a 3M-parameter Llama trained here on the King James Bible"
  echo "       (launch/train/README.md); sampling at temperature 0.8, seed 0"
  echo
  printf '%s' "$prompt"
  "$bin" generate --model "$model" --prompt "$prompt" --max-new-tokens 64 --seed 0 | cat
  echo
  exit 0
fi
"$bin" generate "$@"
