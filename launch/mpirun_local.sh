#!/usr/bin/env bash
# Tensor-parallel run on one node: one rank per GPU (or per core group on a CPU machine).
#   launch/mpirun_local.sh NP generate --model DIR --prompt-ids "1,2,3" [flags]
# Ranks are bound to cores in blocks so their threads do not migrate; --allow-run-as-root is
# added when running as root (containers). Every rank gets the same arguments; rank 0 prints.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
np=${1:?usage: launch/mpirun_local.sh NP SUBCOMMAND [flags]}
shift
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
cores=$(nproc --all)
if [ "$np" -gt "$cores" ]; then
  extra+=(--oversubscribe --bind-to none)
else
  extra+=(--map-by "slot:PE=$(( cores / np ))" --bind-to core)
fi
exec mpirun "${extra[@]}" -np "$np" "$root/launch/rank_env.sh" "$root/build/shardlm" "$@"
