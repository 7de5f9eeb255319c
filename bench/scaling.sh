#!/usr/bin/env bash
# Tensor-parallel scaling: the same model and batch at TP = 1, 2, 4 (ranks of this machine under
# mpirun, each with cores/TP OpenMP threads), as a markdown table and a PNG plot (gnuplot-nox).
#   bench/scaling.sh [--synthetic NAME | --model DIR] [--tp "1 2 4"] [--batch 4] [--prompt-len 16]
#                    [--gen 32] [-r 2] [--out DIR] [extra shardlm bench flags, e.g. --weights int8]
# Writes DIR/scaling.md, DIR/scaling.png, DIR/scaling.jsonl (default DIR: bench/results).
# Binary: $SHARDLM_BIN, else $SHARDLM_BUILD_DIR/shardlm (default build/), built first (only the
# shardlm target, $SHARDLM_JOBS jobs) when the build folder is configured.
#
# Beside each measurement it prints the model of it, from the TP=1 run's achieved rate B (bytes
# one decode step reads / step time) and each run's measured all-reduce latency:
#   own devices:  step = bytes per rank / B      + all-reduces per step x latency
#   one node:     step = bytes per rank x TP / B + all-reduces per step x latency
# The first is the promise of TP (each rank has its own memory bandwidth and cores, as GPUs do);
# the second is what ranks that share one machine's memory system and cores can get.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=(--synthetic qwen3-1.7b)
tps="1 2 4"
batch=4 prompt_len=16 gen=32 reps=2
out="$root/bench/results"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model|--synthetic) src=("$1" "$2"); shift 2 ;;
    --tp) tps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --prompt-len) prompt_len=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
build=${SHARDLM_BUILD_DIR:-$root/build}
bin=${SHARDLM_BIN:-$build/shardlm}
if [ -z "${SHARDLM_BIN:-}" ]; then
  if [ -f "$build/build.ninja" ]; then
    cmake --build "$build" --target shardlm -j "${SHARDLM_JOBS:-$(nproc)}" >/dev/null
  else
    SHARDLM_BUILD_DIR=$build "$root/launch/build.sh" >/dev/null
  fi
fi
mkdir -p "$out"
: > "$out/scaling.jsonl"
cores=$(nproc)
export OMP_WAIT_POLICY=passive  # idle OpenMP threads must not spin on cores other ranks need
for tp in $tps; do
  threads=$(( cores / tp > 0 ? cores / tp : 1 ))
  launcher=()
  if [ "$tp" -gt 1 ]; then
    # Open MPI pins ranks to cores when they fit (a rank pinned to a core another process holds
    # stalls every all-reduce) and busy-polls in collectives unless oversubscribed (a polling rank
    # keeps its core from the rank still computing): on a shared machine that made TP=2 steps
    # 2-4x slower, with all-reduces of 1-2 ms instead of ~50 us. Unpinned, yielding ranks instead.
    launcher=(mpirun --allow-run-as-root --oversubscribe -np "$tp" -x OMP_NUM_THREADS="$threads" -x OMP_WAIT_POLICY)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then
      launcher+=(--bind-to none --mca mpi_yield_when_idle 1)
    fi
  fi
  echo "TP=$tp: $tp rank(s) x $threads thread(s)" >&2
  load0=$(cut -d' ' -f1 /proc/loadavg)
  row=$("${launcher[@]}" "$bin" bench "${src[@]}" --batch "$batch" --prompt-len "$prompt_len" --gen "$gen" -r "$reps" \
      --threads "$threads" --json "${extra[@]}" | grep '"test":"tg')
  # Other jobs on the machine take cores from the ranks: keep the load average beside the row.
  echo "${row%\}},\"load_before\":$load0,\"load_after\":$(cut -d' ' -f1 /proc/loadavg)}" >> "$out/scaling.jsonl"
done

cmd="bench/scaling.sh ${src[*]} --tp \"$tps\" --batch $batch --prompt-len $prompt_len --gen $gen -r $reps ${extra[*]}"
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $cores cores, $(free -g | awk '/^Mem:/ {print $2}') GiB"
python3 - "$out" "$cmd" "$machine" "$cores" <<'PY'
import datetime, json, sys
out, cmd, machine, cores = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(l) for l in open(f"{out}/scaling.jsonl")]
steps = int(rows[0]["test"][2:])
def step_ms(r): return r["avg_ms"] / steps
base = rows[0]
assert base["tp"] == 1, "the first TP size must be 1: the model's bandwidth comes from it"
B = base["gbps"] * 1e9  # bytes/s one TP=1 decode step achieved (weights + KV read)
lines = [
    f"TP scaling, {machine}; {datetime.date.today()}, build {base['build_commit']}, {base['device']}, "
    f"weights {base['weights']}, KV {base['kv']}, batch {base['batch']}, decode over {steps} steps.",
    f"Command: `{cmd}`", "",
    "| TP | ranks x threads | memory/rank (MB) | weights/rank (MB) | decode ms/token | speed-up "
    "| comm bytes/step/rank | all-reduces/step | all-reduce (us) | model: own devices (ms) | model: one node (ms) "
    "| load avg before/after |",
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]
with open(f"{out}/.scaling.dat", "w") as dat:
    for r in rows:
        tp, m, s = r["tp"], r["memory"], step_ms(r)
        rank_bytes = r["gbps"] * 1e9 * s / 1e3  # what one rank reads per step
        comm = r["allreduces_per_step"] * r["allreduce_us"] / 1e3
        own, node = rank_bytes / B * 1e3 + comm, rank_bytes * tp / B * 1e3 + comm
        threads = max(cores // tp, 1)
        mem = m["weights_bytes"] + m["kv_cache_bytes"] + m["workspace_bytes"]
        lines.append(f"| {tp} | {tp} x {threads} | {mem/1e6:.0f} | {m['weights_bytes']/1e6:.0f} | "
                     f"{s:.1f} +- {r['stddev_ms']/steps:.1f} | {step_ms(base)/s:.2f} | "
                     f"{r['comm_bytes_per_step']:.0f} | {r['allreduces_per_step']} | {r['allreduce_us']:.1f} | "
                     f"{own:.1f} | {node:.1f} | {r['load_before']:.1f} / {r['load_after']:.1f} |")
        dat.write(f"{tp} {s:.3f} {own:.3f} {node:.3f}\n")
lines += ["", "Memory/rank = weights + KV cache + workspace of rank 0 (its peak RSS, which also holds the "
    f"page cache of the mapped checkpoint and the bandwidth probe's buffer, was {rows[-1]['memory']['peak_bytes']/1e6:.0f} MB "
    f"at TP={rows[-1]['tp']}). Comm bytes: what one rank sends into the all-reduces and the logits all-gather per decode step.",
    f"Model: B = {B/1e9:.1f} GB/s achieved by TP=1 (copy peak measured {base['peak_gbps']:.1f} GB/s); "
    "own devices = bytes per rank / B + all-reduces x latency (each rank with its own bandwidth, as on "
    "GPUs); one node = bytes per rank x TP / B + all-reduces x latency (the ranks share this machine's "
    "memory bandwidth and cores)."]
text = "\n".join(lines) + "\n"
open(f"{out}/scaling.md", "w").write(text)
print(text)
PY
if command -v gnuplot >/dev/null; then
  gnuplot <<GP
set terminal png size 560,360 font ",10"
set output "$out/scaling.png"
set title "shardlm decode step vs tensor-parallel ranks ($cores-core CPU)"
set xlabel "tensor-parallel ranks"; set ylabel "decode ms/token"; set key top left; set yrange [0:*]; set offsets 0, 0, graph 0.2, 0
set xtics ($(echo "$tps" | sed 's/\([0-9]\+\)/"\1" \1/g; s/ "/, "/g'))
plot "$out/.scaling.dat" using 1:2 with linespoints lw 2 title "measured", \
     "" using 1:4 with linespoints dt 2 title "model: one node (shared memory, cores)", \
     "" using 1:3 with linespoints dt 3 title "model: own devices"
GP
  rm -f "$out/.scaling.dat"
  echo "plot: $out/scaling.png" >&2
else
  echo "(no plot: apt-get install gnuplot-nox)" >&2
fi
