#!/usr/bin/env bash
# Per-rank wrapper: `mpirun ... launch/rank_env.sh build/shardlm generate ...`.
# Maps the node-local rank to one GPU (CUDA_VISIBLE_DEVICES, so each rank sees its GPU as device 0)
# and gives each rank an equal share of the node's cores for its OpenMP threads.
set -euo pipefail
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-0}}}
local_size=${OMPI_COMM_WORLD_LOCAL_SIZE:-${SLURM_NTASKS_PER_NODE:-${MPI_LOCALNRANKS:-1}}}
local_size=${local_size%%(*}  # Slurm may write "4(x2)"
if [ -z "${CUDA_VISIBLE_DEVICES:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$ngpu" -gt 0 ] && export CUDA_VISIBLE_DEVICES=$((local_rank % ngpu))
fi
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  threads=$(( $(nproc --all) / local_size ))
  export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
fi
# Idle OpenMP threads spin a bounded while, then sleep (README, "OpenMP's wait policy"): libgomp's
# default spin stalls every parallel region once another process takes a core, and passive waits
# pay a futex wake-up per region.
if [ -z "${OMP_WAIT_POLICY:-}" ] && [ -z "${GOMP_SPINCOUNT:-}" ]; then
  export GOMP_SPINCOUNT=10000
fi
exec "$@"
