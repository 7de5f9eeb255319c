#!/usr/bin/env bash
# Tensor-parallel scaling: the same model and batch at TP = 1, 2, 4 (ranks on this machine's cores,
# or one per GPU where the engine runs on GPUs), as a markdown table and a PNG plot.
#   bench/scaling.sh [--synthetic NAME | --model DIR] [--tp "1 2 4"] [extra bench flags]
# Beside each measurement it prints the model of it:
#   expected step = weight bytes / TP / bandwidth + all-reduces per step x all-reduce latency
# with the bandwidth measured by the TP=1 run and the latency measured by each run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/launch/build.sh" >/dev/null
bin="$root/build/shardlm"
src=(--synthetic llama3.2-1b)
tps="1 2 4"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model|--synthetic) src=("$1" "$2"); shift 2 ;;
    --tp) tps=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
out="$root/build/scaling"
mkdir -p "$out"
: > "$out/rows.jsonl"
cores=$(nproc)
for tp in $tps; do
  threads=$(( cores / tp > 0 ? cores / tp : 1 ))
  launcher=()
  [ "$tp" -gt 1 ] && launcher=(mpirun --allow-run-as-root --oversubscribe -np "$tp" -x OMP_NUM_THREADS="$threads")
  "${launcher[@]}" "$bin" bench "${src[@]}" --batch 4 --prompt-len 128 --gen 32 -r 2 --threads "$threads" --json \
      "${extra[@]}" | grep '"test":"tg' >> "$out/rows.jsonl"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/rows.jsonl")]
base = rows[0]
step1 = base["avg_ms"] / int(base["test"][2:])
bw = base["memory"]["weights_bytes"] / (step1 / 1e3)  # bytes/s the TP=1 run achieved
print("| TP | weights/rank (MB) | decode ms/token | speed-up | comm bytes/step | all-reduce us | expected ms |")
print("|---:|---:|---:|---:|---:|---:|---:|")
with open(f"{out}/scaling.dat", "w") as dat:
    for r in rows:
        step = r["avg_ms"] / int(r["test"][2:])
        exp = r["memory"]["weights_bytes"] / bw * 1e3 + r["allreduces_per_step"] * r["allreduce_us"] / 1e3
        print(f'| {r["tp"]} | {r["memory"]["weights_bytes"]/1e6:.0f} | {step:.1f} | {step1/step:.2f} | '
              f'{r["comm_bytes_per_step"]:.0f} | {r["allreduce_us"]:.1f} | {exp:.1f} |')
        dat.write(f'{r["tp"]} {step:.3f} {exp:.3f}\n')
PY
if command -v gnuplot >/dev/null; then
  gnuplot <<GP
set terminal png size 640,400
set output "$out/scaling.png"
set xlabel "tensor-parallel ranks"; set ylabel "decode ms/token"; set key top right
plot "$out/scaling.dat" using 1:2 with linespoints title "measured", "" using 1:3 with linespoints title "model"
GP
  echo "plot: $out/scaling.png"
else
  echo "(no plot: apt-get install gnuplot-nox)"
fi
