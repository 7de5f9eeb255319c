#!/usr/bin/env bash
# The GPU check of a lent GPU machine (issue 6): in under 8 minutes on one H200 it unpacks the bundle
# made by bench/gpu_pack.sh, runs every GPU test binary, compares GPU and CPU greedy tokens, runs
# compute-sanitizer (memcheck) on short generations, benchmarks the Qwen3-1.7B shape with synthetic
# weights (batch 1 and 4, prompt 512, 128 new tokens; fp16 / int8 / int8 + int8 KV; CUDA graphs on and
# off; A/B runs of the tuning switches: SHARDLM_PREFILL_TC, _GEMM_STAGE, _FUSED_ROPE, _FUSED_NORM,
# _GEMV_GRID, _PDL), runs the same shape in plain PyTorch FP16 (bench/torch_baseline.py), the GEMV bandwidth bench,
# the mission table, `shardlm serve` over HTTP (serve-http), the prefix cache's host tier (conversations),
# `shardlm embed` (embed), the GEMV with each rows-per-group choice (gemv-r) and, last and where the
# runtime allows it, Nsight Compute's counters of the decode GEMV (ncu-gemv) and each kernel's time
# in a decode step and a prefill, INT8 and FP16 (ncu-step-*), and writes under $OUT:
#   gpu_check.md         the report: benchmark table (with shardlm / PyTorch ratios), tests, steps
#   gpu_check.jsonl      every step's status, every benchmark row (shardlm bench --json rows, tagged)
#   gpu_check.log        every step's log, cut to its first 100 and last 200 lines
#   gpu_check_logs.tar.gz  the full logs and the gtest JSON files
#
#   bench/gpu_check.sh [--pack DIR|TARBALL] [--out DIR] [--budget SECONDS]     on the GPU machine
#   bench/gpu_check.sh --dry-run [--pack DIR|TARBALL] [--out DIR]               here, without a GPU
#   --only REGEX runs only the steps whose names match, besides env, version, prepare and models
#   (e.g. --only 'bench-b1|torch' for a short rerun).
#
# Every step has its own time limit and log, a failing step does not stop the others, and steps
# that would start after --budget seconds (default 450) are reported as skipped; the exit status is 0
# only when no step failed. --dry-run uses build/'s binaries (or the bundle with --pack), tiny
# shapes and --device cpu, so that every step's plumbing runs here; steps that need a GPU report
# "skip: no GPU". Flags that the binaries do not know make their steps fail, never silently vanish.
# Expected on one H200, in seconds: setup, env and version 10; each test binary 10-60; models and
# tokens 10; each sanitizer run 30-60; prepare (3.4 GB checkpoint, in the background during the tests)
# 30-60; each of the 24 bench runs 5-10; torch 40-60; gemv 10-20; mission 20-40: 5 to 6 minutes.
# Run through the device tool, from the repository root:
#   run(command="bench/gpu_check.sh", carry=["build-gpu/gpu-pack.tar.xz"], timeout_s=540)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dry=0
pack=""
out=${OUT:-}
budget=${GPU_CHECK_BUDGET:-450}
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --pack) pack=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--dry-run] [--pack DIR|TARBALL] [--out DIR] [--budget SECONDS] [--only REGEX]" >&2; exit 2 ;;
  esac
done
if [ "$dry" = 0 ] && [ -z "$pack" ]; then
  if [ -d build-gpu/pack/bin ]; then pack=build-gpu/pack; else pack=build-gpu/gpu-pack.tar.xz; fi
fi
[ -n "$out" ] || out=$root/build/gpu_check_out
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/gpu_check.jsonl" "$out/gpu_check.md" "$out/gpu_check.log" "$out/gpu_check_logs.tar.gz"
work=$(mktemp -d /tmp/gpu_check.XXXXXX)
mkdir -p "$work/logs" "$work/bin"
t_start=$(date +%s)
jsonl=$out/gpu_check.jsonl
: > "$jsonl"

# Shapes: the issue's on the GPU; tiny and quick on the CPU.
if [ "$dry" = 1 ]; then
  DEV=cpu SYN=tiny PL=16 GEN=4 REPS=1 SERVE_REQ=8 SERVE_BATCH=1,4 SERVE_SHARED=8 CONV=4 CONV_BATCH=2
else
  DEV=cuda SYN=qwen3-1.7b PL=512 GEN=128 REPS=3 SERVE_REQ=64 SERVE_BATCH=8,32 SERVE_SHARED=128 CONV=64 CONV_BATCH=8
fi
export SHARDLM_CACHE=${SHARDLM_CACHE:-/tmp/shardlm-cache}
export OMP_WAIT_POLICY=passive
PY=$(command -v /usr/bin/python3 || command -v python3)  # helpers: standard library only (not a slow pyenv shim)
# PyTorch's python: the GPU image's venv, else the first python here that imports torch.
PYT=python3
for p in /opt/torch/.venv/bin/python3 python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then PYT=$p; break; fi
done

record() {  # NAME STATUS SECONDS NOTE
  "$PY" "$root/bench/gpu_report.py" status "$jsonl" "$1" "$2" "$3" "$4"
  printf '   %-4s %6.1fs  %s\n' "$2" "$3" "$4"
  [ "$2" = fail ] && echo "$1" >> "$work/failed"
  return 0
}

# step NAME LIMIT FUNCTION ARGS...: the function runs in its own bash under `timeout`, its output in
# logs/NAME.log. Exit 0: pass (note: its last "note: " line); 77: skip (reason: its "skip: " line).
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$only" ] && ! [[ $name =~ ^(env|version|prepare|models)$ || $name =~ $only ]]; then
    record "$name" skip 0 "not selected (--only $only)" > /dev/null
    return 0
  fi
  local left=$((budget - ($(date +%s) - t_start) - 15))
  if [ "$left" -lt 5 ]; then
    echo "== $name"
    record "$name" skip 0 "not started: the ${budget} s budget is spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log=$work/logs/$name.log t0 rc status note secs
  echo "== $name (limit ${limit} s)"
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" bash -c '"$@"' _ "$@" > "$log" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=pass; note=$(sed -n 's/^note: //p' "$log" | tail -n 1) ;;
    77) status=skip; note=$(sed -n 's/^skip: //p' "$log" | tail -n 1) ;;
    124|137) status=fail; note="timed out after ${limit} s; last line: $(grep -v '^$' "$log" | tail -n 1 | cut -c1-200)" ;;
    *) status=fail; note="exit $rc: $(grep -v '^$' "$log" | tail -n 1 | cut -c1-300)" ;;
  esac
  record "$name" "$status" "$secs" "$note"
}

# ---------------------------------------------------------------- setup (in this shell)
echo "== setup"
setup_t0=$(date +%s.%N)
setup_note=""
setup_fail=""
unpack() {  # TARBALL -> build-gpu/pack
  local dest=$root/build-gpu
  mkdir -p "$dest"
  rm -rf "$dest/pack"
  tar -C "$dest" -xJf "$1" 2>/dev/null ||
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$dest"
}
if [ -n "$pack" ]; then
  case "$pack" in
    *.tar.xz|*.txz|*.tar.gz|*.tgz)
      if [ -f "$pack" ]; then unpack "$pack" && pack=$root/build-gpu/pack; else setup_fail="no bundle at $pack (run bench/gpu_pack.sh here and carry it)"; fi ;;
  esac
  [ -d "$pack/bin" ] || setup_fail=${setup_fail:-"no bundle at $pack"}
  [ -d "$pack" ] && pack=$(cd "$pack" && pwd)
fi

# Directories holding a library: the loader cache, the usual CUDA and driver folders, python's wheels.
lib_dirs_candidates() {
  ldconfig -p 2>/dev/null | awk '/x86-64/ { sub(/\/[^\/]*$/, "", $NF); print $NF }' | sort -u
  local d
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
           /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
           /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
    [ -d "$d" ] && echo "$d"
  done
  for p in "$PYT" python3; do
    command -v "$p" >/dev/null || continue
    for sp in $("$p" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      for d in "$sp"/nvidia/cu13/lib "$sp"/nvidia/*/lib "$sp"/torch/lib; do [ -d "$d" ] && echo "$d"; done
    done
  done
}
mapfile -t cand < <(lib_dirs_candidates)
find_lib() { local d; for d in "${cand[@]}"; do [ -e "$d/$1" ] && { echo "$d"; return 0; }; done; return 1; }
cuda_dirs=()
missing_libs=()
needed="libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13"
if [ -n "$pack" ] && [ -f "$pack/pack.env" ]; then
  # shellcheck disable=SC1091
  . "$pack/pack.env"
  needed="libcuda.so.1 ${PACK_CUDA_NEEDED:-}"
fi
for l in $needed; do
  if ! find_lib "$l" >/dev/null; then  # last resort: a bounded search of the usual roots
    f=$(timeout 20 find /usr /opt /lib /lib64 -maxdepth 7 -name "$l" 2>/dev/null | head -n 1)
    [ -n "$f" ] && cand+=("$(dirname "$f")")
  fi
  if d=$(find_lib "$l"); then
    [[ " ${cuda_dirs[*]} " == *" $d "* ]] || cuda_dirs+=("$d")
  else
    missing_libs+=("$l")
  fi
done
# libcudart: the bundle's copy when the machine has none.
if [ -n "$pack" ] && [[ " ${missing_libs[*]} " == *" libcudart.so"* ]] && ls "$pack"/cuda/libcudart.so* >/dev/null 2>&1; then
  cuda_dirs+=("$pack/cuda")
  setup_note+="libcudart from the bundle; "
fi
cuda_path=$(IFS=:; echo "${cuda_dirs[*]}")
[ ${#missing_libs[@]} -gt 0 ] && setup_note+="not found: ${missing_libs[*]}; "

# The loader: the machine's own when its glibc is at least the bundle's, else the bundled one.
sys_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
mode=native
if [ -n "$pack" ]; then
  newest=$(printf '%s\n%s\n' "${sys_glibc:-0}" "${PACK_GLIBC:-99}" | sort -V | tail -n 1)
  if [ "$newest" = "${sys_glibc:-0}" ]; then mode=system; else mode=bundled; fi
  mode=${GPU_CHECK_LOADER:-$mode}
fi
wrap() {  # NAME REAL_PATH: $work/bin/NAME runs it with the bundle's libraries
  local w=$work/bin/$1
  {
    echo '#!/bin/sh'
    echo "# gpu_check wrapper ($mode)"
    case $mode in
      native) echo "exec '$2' \"\$@\"" ;;
      system) echo "LD_LIBRARY_PATH='$pack/lib${cuda_path:+:$cuda_path}'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
              echo 'export LD_LIBRARY_PATH'
              echo "exec '$2' \"\$@\"" ;;
      bundled) echo "exec '$pack/glibc/ld-linux-x86-64.so.2' --library-path '$pack/glibc:$pack/lib${cuda_path:+:$cuda_path}' '$2' \"\$@\"" ;;
    esac
  } > "$w"
  chmod +x "$w"
}
if [ -n "$pack" ] && [ -d "$pack/bin" ]; then
  for b in "$pack"/bin/*; do wrap "$(basename "$b")" "$b"; done
elif [ -z "$pack" ]; then
  [ -x build/shardlm ] && wrap shardlm "$root/build/shardlm"
  while read -r b; do wrap "$(basename "$b")" "$root/$b"; done < <(
    find build -maxdepth 3 -type f -perm -u+x \( -name '*cuda*' -o -name '*gpu*' \) ! -name '*.so' ! -name '*.a' \
      ! -path '*/CMakeFiles/*' 2>/dev/null | sort)
fi
[ -x "$work/bin/shardlm" ] || setup_fail=${setup_fail:-"no shardlm binary (build/ or the bundle)"}

# The test binaries spawn the shardlm compiled into them (SHARDLM_BIN) and read files under the
# source folder compiled into them (SHARDLM_SOURCE_DIR): make both paths work on this machine.
if [ -n "$pack" ] && [ -n "${PACK_SOURCE_DIR:-}" ]; then
  if [ "$(readlink -f "$PACK_SOURCE_DIR" 2>/dev/null)" != "$root" ]; then
    if [ ! -e "$PACK_SOURCE_DIR" ]; then
      mkdir -p "$(dirname "$PACK_SOURCE_DIR")" && ln -s "$root" "$PACK_SOURCE_DIR" &&
        setup_note+="linked $PACK_SOURCE_DIR -> $root; "
    else
      setup_note+="$PACK_SOURCE_DIR is another folder: tests reading source files may fail; "
    fi
  fi
  target=$PACK_SHARDLM_BIN
  if [ -e "$target" ] && ! grep -q 'gpu_check wrapper' "$target" 2>/dev/null; then
    setup_note+="$target is a real binary: tests spawn it; "
  elif mkdir -p "$(dirname "$target")" 2>/dev/null && cp "$work/bin/shardlm" "$target"; then
    setup_note+="wrapper at $target; "
  else
    setup_note+="cannot write $target: tests that spawn shardlm fail; "
  fi
fi
export SHARDLM_BIN=$work/bin/shardlm SHARDLM_SOURCE_DIR=$root  # for tests that read them at run time
BIN=$work/bin
setup_secs=$(awk -v a="$setup_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
setup_note+="loader $mode (glibc here ${sys_glibc:-?}, bundle ${PACK_GLIBC:--}); CUDA libraries from ${cuda_path:-nowhere}"
if [ -n "$setup_fail" ]; then record setup fail "$setup_secs" "$setup_fail; $setup_note"; else record setup pass "$setup_secs" "$setup_note"; fi
export root work out jsonl dry DEV SYN PL GEN REPS SERVE_REQ SERVE_BATCH SERVE_SHARED CONV CONV_BATCH PY PYT BIN pack mode

# ---------------------------------------------------------------- step bodies (exported)
skip() { echo "skip: $*"; exit 77; }
have_gpu() { [ "$dry" = 0 ]; }

s_env() {
  date -u
  uname -a
  echo "glibc: $(getconf GNU_LIBC_VERSION)"
  [ -f "$pack/pack.env" ] && cat "$pack/pack.env"
  echo "wrappers:"; head -n 5 "$BIN/shardlm"
  echo "python: $PYT $("$PYT" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  local smi
  smi=$(command -v nvidia-smi || ls /usr/local/nvidia/bin/nvidia-smi 2>/dev/null)
  if [ -z "$smi" ]; then
    have_gpu && { echo "no nvidia-smi"; exit 1; }
    skip "no GPU (no nvidia-smi)"
  fi
  "$smi" || exit 1
  "$smi" --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  echo "note: $("$smi" --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
}

s_version() {
  local v missing="" sub flag
  v=$("$BIN/shardlm" --version) || exit 1
  echo "$v"
  for sub in bench generate; do
    "$BIN/shardlm" "$sub" --help > "$work/help_$sub.txt" 2>&1 || true
    cat "$work/help_$sub.txt"
    for flag in --device --no-cuda-graph --attention; do
      grep -q -- "$flag" "$work/help_$sub.txt" || missing+=" $sub $flag,"
    done
  done
  if have_gpu && ! grep -q 'cuda(' <<<"$v"; then missing+=" the CUDA backend,"; fi
  [ -z "$missing" ] || { echo "missing:${missing%,}"; exit 1; }
  echo "note: $(tr '\n' ' ' <<<"$v")"
}

s_test() {  # BINARY
  local b=$1 rc
  "$BIN/$b" --gtest_color=no --gtest_output="json:$work/logs/$b.json"
  rc=$?
  [ -f "$work/logs/$b.json" ] || { echo "no gtest JSON (exit $rc)"; exit 1; }
  local summary
  summary=$("$PY" "$root/bench/gpu_report.py" gtest "$jsonl" "$b" "$work/logs/$b.json" "$([ "$dry" = 0 ] && echo 1 || echo 0)") || rc=1
  echo "$summary"
  echo "note: $summary"
  exit $rc
}

s_models() {  # the small checkpoints of the tokens and sanitizer steps
  "$BIN/shardlm" make-model --preset tiny-qwen3 --dtype fp32 --out "$work/tiny32" &&
    "$BIN/shardlm" make-model --preset tiny-qwen3 --dtype bf16 --out "$work/tiny16" &&
    "$BIN/shardlm" make-model --preset tiny --dtype bf16 --out "$work/tiny128" &&
    echo "note: tiny-qwen3 fp32 and bf16 checkpoints, tiny (128-column multiples) bf16"
}

cpu_vs_dev() {  # NAME LABEL FLAGS...: the tiny fp32 model's tokens on the CPU and on $DEV, compared
  local name=$1 label=$2
  shift 2
  local args=(generate --model "$work/tiny32" --prompt-ids "1,2,3;4,5,6,7,8,9,10" --weights fp32 --kv fp32 --json "$@")
  echo "-- $label on $DEV"
  "$BIN/shardlm" "${args[@]}" --device cpu > "$work/tok_cpu_$name.json" &&
    "$BIN/shardlm" "${args[@]}" --device "$DEV" > "$work/tok_dev_$name.json" &&
    "$PY" "$root/bench/gpu_report.py" tokens "$work/tok_cpu_$name.json" "$work/tok_dev_$name.json"
}

s_tokens() {  # greedy tokens of the GPU backend == the CPU backend's, fp32 and fp16, graphs on and off; top-p
  local w g rc=0 args
  [ -f "$work/tiny32/config.json" ] || { echo "no model (models step failed)"; exit 1; }
  for w in fp32 fp16; do
    args=(generate --model "$work/tiny32" --prompt-ids "1,2,3;4,5,6,7,8,9,10" --max-new-tokens 16 --temperature 0
          --weights "$w" --kv "$w" --json)
    "$BIN/shardlm" "${args[@]}" --device cpu > "$work/tok_cpu_$w.json" || { rc=1; continue; }
    for g in "" --no-cuda-graph; do
      echo "-- $w ${g:-graphs} on $DEV"
      "$BIN/shardlm" "${args[@]}" --device "$DEV" $g > "$work/tok_dev_$w$g.json" &&
        "$PY" "$root/bench/gpu_report.py" tokens "$work/tok_cpu_$w.json" "$work/tok_dev_$w$g.json" || rc=1
    done
  done
  # Top-p alone, sampled (fp32): the GPU hands back candidates and the row's integer mass
  # (kernels/cuda/nucleus.cu), the CPU samples whole rows; the same draws unless a logit's last-bit
  # difference moves one across a boundary (odds ~1e-6 per token).
  cpu_vs_dev topp "fp32 top-p 0.9 without top-k, sampled" --max-new-tokens 16 --temperature 0.9 --top-k 0 \
    --top-p 0.9 --seed 5 || rc=1
  # --context-overflow slide: 40 tokens through a context of 16, the KV cache shifted on the
  # device (kernels/cuda/kv_shift.cu) as on the CPU.
  cpu_vs_dev slide "fp32 greedy through context shifts" --max-new-tokens 40 --temperature 0 --ctx 16 \
    --context-overflow slide || rc=1
  # Token penalties (kernels/cuda/penalty.cu on the device's logits) and min-p, greedy and sampled.
  cpu_vs_dev penalties "fp32 greedy with repetition/frequency/presence penalties" --max-new-tokens 24 \
    --temperature 0 --repetition-penalty 1.3 --frequency-penalty 0.4 --presence-penalty 0.2 --penalty-last-n 16 || rc=1
  cpu_vs_dev penalties-minp "fp32 top-k sampled with penalties and min-p" --max-new-tokens 24 --temperature 1.1 \
    --top-k 40 --min-p 0.05 --seed 7 --repetition-penalty 1.3 --frequency-penalty 0.4 || rc=1
  # Continuous batching: the second prompt waits for the first's slot (--batch 1) and prefills in
  # chunks of 3; --logprobs takes whole rows instead of the device's candidates.
  cpu_vs_dev queued "fp32 greedy, two prompts through one slot, with logprobs" --max-new-tokens 12 \
    --temperature 0 --batch 1 --prefill-chunk 3 --logprobs 2 || rc=1
  # Speculative decoding: proposals verified in chunks of several tokens, a logits row each
  # (replayed from graphs from a step shape's second step on); greedy, and sampled with a seed.
  cpu_vs_dev speculate "fp32 greedy with --speculate 4 (prompt lookup)" --max-new-tokens 40 --temperature 0 \
    --speculate 4 || rc=1
  cpu_vs_dev speculate-sampled "fp32 top-k sampled with --speculate 4" --max-new-tokens 40 --temperature 0.8 \
    --top-k 40 --seed 4 --speculate 4 || rc=1
  # A draft model (the tiny model drafting for itself): a second engine in the process proposes.
  cpu_vs_dev speculate-draft "fp32 greedy with --speculate 4 --draft-model (itself)" --max-new-tokens 40 \
    --temperature 0 --speculate 4 --draft-model "$work/tiny32" || rc=1
  # Logit bias and --min-new-tokens through the device's penalty kernel, sampled from candidates.
  cpu_vs_dev bias "fp32 top-k sampled with logit bias and --min-new-tokens" --max-new-tokens 24 --temperature 0.9 \
    --top-k 40 --seed 3 --logit-bias 5=4 --logit-bias 9=-3 --min-new-tokens 8 || rc=1
  # JSON mode (--json-object) on the shipped model, which has a tokenizer: the masks are made on
  # the host over whole rows; sampled, with speculation.
  local js=(generate --model "$root/launch/models/kjv-small" --prompt-ids "5,6,7;8,9" --max-new-tokens 30 --json-object
            --temperature 0.8 --seed 3 --speculate 3 --json)
  echo "-- JSON mode on $DEV"
  "$BIN/shardlm" "${js[@]}" --device cpu > "$work/tok_cpu_json.json" &&
    "$BIN/shardlm" "${js[@]}" --device "$DEV" > "$work/tok_dev_json.json" &&
    "$PY" "$root/bench/gpu_report.py" tokens "$work/tok_cpu_json.json" "$work/tok_dev_json.json" || rc=1
  # Structured output (--json-schema): a schema with required keys in order, an enum and a
  # bounded string.
  printf '%s' '{"type": "object", "properties": {"verse": {"type": "integer"}, "book": {"enum": ["Genesis", "Exodus"]},
    "text": {"type": "string", "maxLength": 20}}, "required": ["verse", "book", "text"]}' > "$work/verse_schema.json"
  local ss=(generate --model "$root/launch/models/kjv-small" --prompt-ids "5,6,7;8,9" --max-new-tokens 60
            --json-schema "$work/verse_schema.json" --temperature 0.8 --seed 4 --json)
  echo "-- JSON schema on $DEV"
  "$BIN/shardlm" "${ss[@]}" --device cpu > "$work/tok_cpu_schema.json" &&
    "$BIN/shardlm" "${ss[@]}" --device "$DEV" > "$work/tok_dev_schema.json" &&
    "$PY" "$root/bench/gpu_report.py" tokens "$work/tok_cpu_schema.json" "$work/tok_dev_schema.json" || rc=1
  # --prompt-cache: a second run loads the first's keys and values from the file (device -> host
  # -> file -> host -> device: Engine::save_kv / load_kv) and gives the CPU's tokens.
  local pc=(generate --model "$work/tiny32" --prompt-ids "$(seq -s, 1 24)" --max-new-tokens 12 --temperature 0
            --weights fp32 --kv fp32 --json)
  echo "-- --prompt-cache on $DEV"
  rm -f "$work/dev_prompts.kv"
  "$BIN/shardlm" "${pc[@]}" --device cpu > "$work/tok_cpu_pc.json" &&
    "$BIN/shardlm" "${pc[@]}" --device "$DEV" --prompt-cache "$work/dev_prompts.kv" > /dev/null &&
    "$BIN/shardlm" "${pc[@]}" --device "$DEV" --prompt-cache "$work/dev_prompts.kv" > "$work/tok_dev_pc.json" &&
    "$PY" "$root/bench/gpu_report.py" tokens "$work/tok_cpu_pc.json" "$work/tok_dev_pc.json" &&
    "$PY" -c 'import json, sys
c = json.load(open(sys.argv[1]))["results"][0]["cached_tokens"]
print(f"--prompt-cache: {c} of 24 prompt tokens loaded from the file")
sys.exit(0 if c == 23 else 1)' "$work/tok_dev_pc.json" || rc=1
  [ $rc = 0 ] && echo "note: $DEV tokens == cpu tokens (fp32, fp16; graphs on and off; top-p sampled; context shifts; penalties, min-p; queued prompts, logprobs; speculation greedy and sampled; logit bias, min tokens; JSON mode; JSON schema; --prompt-cache)"
  exit $rc
}

s_embed() {  # shardlm embed: the tiny fp32 model's vectors on $DEV == the CPU's (every pooling), then the
             # bench shape's throughput (16 inputs of --prompt-len tokens, 16 slots; fp16 and int8)
  [ -f "$work/tiny32/config.json" ] || { echo "no model (models step failed)"; exit 1; }
  local p rc=0 dir=$SHARDLM_CACHE/$SYN-bf16 w ids
  for p in last mean cls; do
    local args=(embed --model "$work/tiny32" --prompt-ids "1,2,3;4,5,6,7,8,9,10;11" --batch 2 --prefill-chunk 3
                --pooling "$p" --no-normalize --json)
    echo "-- $p pooling on $DEV"
    "$BIN/shardlm" "${args[@]}" --device cpu > "$work/emb_cpu_$p.json" &&
      "$BIN/shardlm" "${args[@]}" --device "$DEV" > "$work/emb_dev_$p.json" &&
      "$PY" -c '
import json, sys
a, b = (json.load(open(f))["data"] for f in sys.argv[1:3])
d = max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u["embedding"], v["embedding"]))
print(f"max |cpu - dev| = {d:.2e}")
sys.exit(0 if len(a) == len(b) == 3 and d < 1e-3 else 1)' "$work/emb_cpu_$p.json" "$work/emb_dev_$p.json" || rc=1
  done
  [ $rc = 0 ] || exit 1
  [ -f "$dir/config.json" ] || { echo "no checkpoint (prepare step failed)"; exit 1; }
  ids=$("$PY" -c 'import random, sys; random.seed(5); n = int(sys.argv[1]); print(";".join(",".join(str(random.randrange(10, 500)) for _ in range(n)) for _ in range(16)))' "$PL")
  for w in fp16 int8; do
    echo "shardlm embed --model $dir --device $DEV --weights $w --batch 16 --prompt-ids <16 x $PL ids> --json"
    "$BIN/shardlm" embed --model "$dir" --device "$DEV" --weights "$w" --batch 16 --prompt-ids "$ids" --json \
      > "$work/logs/embed_$w.json" || exit 1
  done
  echo "note: $("$PY" -c '
import json, sys
out = []
for w in ("fp16", "int8"):
    j = json.load(open(sys.argv[1] + "/embed_" + w + ".json"))
    ms, n = j["embed_ms"], j["tokens"]
    out.append(f"{w} {n / ms * 1000:.0f} tokens/s ({ms:.1f} ms)")
print("vectors equal the CPU (last/mean/cls); 16 x " + sys.argv[2] + " tokens: " + ", ".join(out))' "$work/logs" "$PL")"
}

s_sanitize() {  # EXTRA FLAGS...: memcheck on a short generation (batch of 2 of different lengths)
  # Sampled (the default temperature 0.8, top-k 40): the GPU top-k selection runs too. The model:
  # $SANITIZE_MODEL, else the tiny bf16 Qwen3.
  local model=${SANITIZE_MODEL:-$work/tiny16}
  local args=(generate --model "$model" --prompt-ids "1,2,3;4,5,6,7,8" --max-new-tokens 8 --seed 3
              --device "$DEV" "$@")
  [ -f "$model/config.json" ] || { echo "no model $model (models step failed)"; exit 1; }
  if ! have_gpu; then
    "$BIN/shardlm" "${args[@]}" || exit 1  # the plumbing, without the sanitizer
    skip "no GPU (the same generate ran on the CPU)"
  fi
  memcheck "$*" "${args[@]}"
}

memcheck() {  # LABEL then shardlm's arguments: the command under compute-sanitizer's memcheck
  local label=$1 cs
  shift
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
       /opt/nvidia/*/compute-sanitizer /opt/nvidia/*/*/compute-sanitizer 2>/dev/null | head -n 1)
  [ -n "$cs" ] || { echo "compute-sanitizer not found"; exit 1; }
  "$cs" --version | tail -n 1
  "$cs" --tool memcheck --error-exitcode 99 --target-processes all "$BIN/shardlm" "$@"
  local rc=$?
  [ $rc = 0 ] && echo "note: memcheck clean ($label)"
  exit $rc
}

s_sanitize_lora() {  # memcheck on bench --adapter: the LoRA kernels eagerly (prefill) and in graphs (decode),
                     # batches of 1 and 3, on the tiny shape with a rank-4 adapter on every layer matrix
  local dir=$SHARDLM_CACHE/tiny-lora4
  [ -f "$dir/adapter_config.json" ] || "$BIN/shardlm" make-model --preset tiny --lora-rank 4 --out "$dir" || exit 1
  local args=(bench --synthetic tiny --device "$DEV" --prompt-len 16 --gen 4 -r 1 --batch 1,3 --adapter "$dir")
  if ! have_gpu; then
    "$BIN/shardlm" "${args[@]}" || exit 1
    skip "no GPU (the same bench ran on the CPU)"
  fi
  memcheck "bench --adapter" "${args[@]}"
}

s_prepare() {  # the synthetic checkpoint bench --synthetic uses (written once; 3.4 GB for qwen3-1.7b)
  local dir=$SHARDLM_CACHE/$SYN-bf16
  if [ -f "$dir/config.json" ]; then echo "note: $dir exists"; exit 0; fi
  mkdir -p "$SHARDLM_CACHE"
  rm -rf "$dir.tmp"
  "$BIN/shardlm" make-model --preset "$SYN" --dtype bf16 --shards 4 --seed 1 --out "$dir.tmp" && mv "$dir.tmp" "$dir" &&
    echo "note: wrote $dir ($(du -sh "$dir" | cut -f1))"
}

s_bench() {  # NAME BATCH WEIGHTS KV GRAPHS(1|0) [EXTRA...]
  local name=$1 b=$2 w=$3 kv=$4 g=$5
  shift 5
  local flags=(--batch "$b" --weights "$w" --kv "$kv")
  [ "$g" = 0 ] && flags+=(--no-cuda-graph)
  flags+=("$@")
  echo "shardlm bench --synthetic $SYN --device $DEV --prompt-len $PL --gen $GEN -r $REPS --json ${flags[*]}"
  "$BIN/shardlm" bench --synthetic "$SYN" --device "$DEV" --prompt-len "$PL" --gen "$GEN" -r "$REPS" --json "${flags[@]}" \
    > "$work/logs/$name.rows" || exit 1
  cat "$work/logs/$name.rows"
  "$PY" "$root/bench/gpu_report.py" rows "$jsonl" "$name" shardlm "$g" "${flags[*]}" < "$work/logs/$name.rows" || exit 1
  echo "note: $("$PY" -c '
import json, sys
rows = {r["test"][:2]: r for r in map(json.loads, open(sys.argv[1])) if not r.get("ablate")}
pp, tg = rows["pp"], rows["tg"]
print("prefill %.1f ms, decode %.3f ms/token, %.0f GB/s" % (pp["avg_ms"], tg["avg_ms"] / int(tg["test"][2:]), tg["gbps"]))
' "$work/logs/$name.rows")"
}

s_bench_ablate() {  # LIST then s_bench's arguments: s_bench with --ablate LIST (the CUDA engine only)
  local list=$1
  shift
  if ! have_gpu; then  # the CPU engine refuses the flag: check that it says so
    "$BIN/shardlm" bench --synthetic "$SYN" --device cpu --prompt-len "$PL" --gen "$GEN" -r 1 --ablate "$list" 2>&1 |
      grep "measures the CUDA engine" || exit 1
    skip "no GPU"
  fi
  s_bench "$@" --ablate "$list"
}

s_bench_nopdl() {  # s_bench without programmatic dependent launch: the A/B of kernels/cuda/launch.h
  SHARDLM_PDL=0 s_bench "$@"
}

s_bench_lora() {  # NAME: int8 rows with every sequence under a rank-16 adapter on all 196 layer matrices
  # (make-model --lora-rank: BF16 factors beside INT8 weights, 35 MB a step), against the int8 rows
  # without (bench-int8-int8-graph): what choosing adapters per request costs a decode step.
  local dir=$SHARDLM_CACHE/$SYN-lora16
  [ -f "$dir/adapter_config.json" ] || "$BIN/shardlm" make-model --preset "$SYN" --lora-rank 16 --out "$dir" || exit 1
  s_bench "$1" 1,4 int8 int8 1 --adapter "$dir"
}

s_bench_with() {  # "VAR=VALUE ..." then s_bench's arguments: the A/B runs of the decode tuning variables
  local vars=$1
  shift
  echo "with $vars"
  env $vars bash -c 's_bench "$@"' s_bench "$@"
}

s_serve() {  # bench --requests: continuous batching against static batches and with the prefix cache (a shared
             # system prompt), the same requests in one run
  local args=(bench --synthetic "$SYN" --device "$DEV" --requests "$SERVE_REQ" --batch "$SERVE_BATCH"
              --prompt-len "$PL" --gen "$GEN" --shared-prefix "$SERVE_SHARED" --weights int8 --kv int8 -r 1 --json)
  echo "shardlm ${args[*]}"
  "$BIN/shardlm" "${args[@]}" > "$work/logs/serve.rows" || exit 1
  cat "$work/logs/serve.rows"
  echo "note: $("$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = []
for r in rows:
    out.append("%s b%d %.0f tok/s (%d steps, %d prefilled, TTFT p50 %.0f ms, TPOT %.2f ms)" % (
        r["test"], r["batch"], r["tokens_per_s"], r["steps"], r["prefilled_tokens"], r["ttft_ms_p50"], r["tpot_ms_mean"]))
print("; ".join(out))
' "$work/logs/serve.rows")"
}

s_conversations() {  # bench --conversations: second turns of more conversations than slots, without the
                     # prefix cache, with the slots' alone and with its host tier (PCIe saves and loads)
  local args=(bench --synthetic "$SYN" --device "$DEV" --conversations "$CONV" --batch "$CONV_BATCH"
              --prompt-len "$PL" --gen 16 --weights int8 --kv int8 -r 1 --json)
  echo "shardlm ${args[*]}"
  "$BIN/shardlm" "${args[@]}" > "$work/logs/conversations.rows" || exit 1
  cat "$work/logs/conversations.rows"
  echo "note: $("$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("; ".join("%s b%d %.0f ms (%d prefilled, %d loads, TTFT p50 %.0f ms)" % (
    r["test"], r["batch"], r["avg_ms"], r["prefilled_tokens"], r["host_loads"], r["ttft_ms_p50"]) for r in rows))
' "$work/logs/conversations.rows")"
}

s_serve_http() {  # shardlm serve on the device over HTTP (bench/serve_check.py): texts == CPU generate's, echo scores
  "$PY" "$root/bench/serve_check.py" --bin "$BIN/shardlm" --model "$root/launch/models/kjv-small" --device "$DEV"
}

s_speculate() {  # generate --speculate 4 against plain greedy decoding on the bench shape (random weights: its
                 # greedy text falls into repeats, lookup's favourable case), batch 1 and 4, INT8 + INT8 KV
  local dir=$SHARDLM_CACHE/$SYN-bf16 b k p
  [ -f "$dir/config.json" ] || { echo "no checkpoint (prepare step failed)"; exit 1; }
  local ids
  ids=$("$PY" -c 'import random; random.seed(3); print(";".join(",".join(str(random.randrange(10, 500)) for _ in range(64)) for _ in range(4)))')
  for b in 1 4; do
    p=$ids
    [ "$b" = 1 ] && p=${ids%%;*}
    # k: proposals per sequence; "4u": 4 without the step's token limit (--speculate-max-tokens 0,
    # the behaviour before 2026-12-04 evening, for the A/B of the default limit of 8)
    for k in 0 4 4u; do
      local extra=()
      [ "$k" = 4u ] && extra=(--speculate-max-tokens 0)
      echo "shardlm generate --model $dir --device $DEV --weights int8 --kv int8 --batch $b --max-new-tokens $GEN --temperature 0 --speculate ${k%u} ${extra[*]}"
      "$BIN/shardlm" generate --model "$dir" --device "$DEV" --weights int8 --kv int8 --prompt-ids "$p" \
        --max-new-tokens "$GEN" --temperature 0 --speculate "${k%u}" "${extra[@]}" --json > "$work/logs/spec_b${b}_k$k.json" || exit 1
    done
  done
  echo "note: $("$PY" -c '
import json, sys
out = []
for b in (1, 4):
    for k in ("4", "4u"):
        a, s = (json.load(open("%s/spec_b%d_k%s.json" % (sys.argv[1], b, kk))) for kk in ("0", k))
        ta, ts = a["timings"], s["timings"]
        same = [x["tokens"] == y["tokens"] for x, y in zip(a["results"], s["results"])]
        out.append("b%d%s: %d -> %d steps, %.0f -> %.0f ms (%.2fx), %d/%d accepted, tokens equal %d/%d" % (
            b, " unlimited" if k == "4u" else "", ta["decode_steps"], ts["decode_steps"], ta["total_ms"], ts["total_ms"],
            ta["total_ms"] / max(ts["total_ms"], 1e-9), ts["accepted_tokens"], ts["draft_tokens"], sum(same), len(same)))
print("; ".join(out))
' "$work/logs")"
}

s_torch() {
  local args=(--batch 1,4 --prompt-len "$PL" --gen "$GEN" -r "$REPS")
  have_gpu || args+=(--device cpu --shape tiny --graphs off)
  echo "$PYT bench/torch_baseline.py ${args[*]}"
  PYTHONUNBUFFERED=1 "$PYT" "$root/bench/torch_baseline.py" "${args[@]}" > "$work/logs/torch.rows" || exit 1
  cat "$work/logs/torch.rows"
  if grep -q '"skipped"' "$work/logs/torch.rows"; then
    have_gpu && { echo "PyTorch is missing on the GPU machine"; exit 1; }
    skip "$(sed -n 's/.*"skipped": "\(.*\)"}/\1/p' "$work/logs/torch.rows")"
  fi
  "$PY" "$root/bench/gpu_report.py" rows "$jsonl" torch torch 1 "${args[*]}" < "$work/logs/torch.rows" || exit 1
  echo "note: $(grep -c . "$work/logs/torch.rows") rows"
}

s_gemv() {
  [ -x "$BIN/gemv_bench_cuda" ] || skip "no gemv_bench_cuda binary (target not built)"
  have_gpu || { "$BIN/gemv_bench_cuda" --help || true; skip "no GPU"; }
  "$BIN/gemv_bench_cuda" 20 | tee "$work/logs/gemv.out"
  local rc=${PIPESTATUS[0]}
  echo "note: $(grep -v '^$' "$work/logs/gemv.out" | tail -n 1 | cut -c1-200)"
  exit "$rc"
}

s_gemv_r() {  # the decode GEMVs (W8A16 and W8A8) with their rows per group forced to 1, 2 and 4 (SHARDLM_GEMV_R), n <= 2
  [ -x "$BIN/gemv_bench_cuda" ] || skip "no gemv_bench_cuda binary (target not built)"
  have_gpu || skip "no GPU"
  local r
  for r in 1 2 4; do
    SHARDLM_GEMV_R=$r "$BIN/gemv_bench_cuda" 20 > "$work/logs/gemv-r$r.out" || exit 1
  done
  # | shape | rows x cols | weights | n | us | GB/s | ...: one line per (shape, weights, n <= 2)
  awk -F'|' '
    FNR == 1 { r++ }
    /^## / { sect = $0 }
    sect ~ /gemv_cuda/ && NF > 8 && $5 + 0 >= 1 && $5 + 0 <= 2 {
      k = $2 "|" $3 "|" $4 "|" $5; if (!(k in seen)) { seen[k] = 1; keys[++n] = k }
      us[k, r] = $6 + 0; gb[k, r] = $7 + 0
    }
    END {
      print "| shape | rows x cols | weights | n | R=1 us (GB/s) | R=2 us (GB/s) | R=4 us (GB/s) |"
      print "|---|---|---|---|---:|---:|---:|"
      for (i = 1; i <= n; i++) {
        k = keys[i]; line = "|" k "|"
        for (j = 1; j <= 3; j++) line = line sprintf(" %.1f (%d) |", us[k, j], gb[k, j])
        print line
      }
    }' "$work/logs/gemv-r1.out" "$work/logs/gemv-r2.out" "$work/logs/gemv-r4.out" | tee "$work/logs/gemv-r.md"
  echo "note: $(grep -c '^| [a-z]' "$work/logs/gemv-r.md") shapes x weights x n compared"
}

find_ncu() {  # Nsight Compute's CLI: on PATH or in the usual install folders
  command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 | grep .
}

s_ncu() {  # hardware counters of the INT8 and f16 decode GEMV (where the runtime lets ncu read them)
  [ -x "$BIN/gemv_bench_cuda" ] || skip "no gemv_bench_cuda binary"
  have_gpu || skip "no GPU"
  local ncu
  ncu=$(find_ncu) || skip "ncu not found"
  # The first launches of each gemv_vec_kernel variant: the 2048x2048 shapes at n = 1 (f16, i8).
  "$ncu" --clock-control none --kernel-name regex:gemv_vec_kernel --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats "$BIN/gemv_bench_cuda" 3 > "$work/logs/ncu.out" 2>&1
  local rc=$?
  if grep -qE "ERR_NVGPUCTRPERM|not supported|No kernels were profiled" "$work/logs/ncu.out"; then
    tail -n 5 "$work/logs/ncu.out"
    skip "ncu cannot read the counters here"
  fi
  cat "$work/logs/ncu.out"
  [ $rc = 0 ] && echo "note: ncu sections of $(grep -c 'gemv_vec_kernel<' "$work/logs/ncu.out") gemv launches in logs/ncu.out"
  exit $rc
}

s_ncu_step() {  # NAME FLAGS...: each kernel's time in one decode step and one prefill (ncu, one kernel at a time)
  local name=$1
  shift
  have_gpu || skip "no GPU"
  local ncu
  ncu=$(find_ncu) || skip "ncu not found"
  # Warm-up prefill and decode step, then the timed prefill and decode step (--gen 1 -r 1): ~1100
  # launches. Eager (no graphs), so every kernel is a stream launch; caches are not flushed.
  "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --launch-count 4000 "$BIN/shardlm" bench --synthetic "$SYN" --device "$DEV" --prompt-len "$PL" --gen 1 -r 1 \
    --batch 1 --no-cuda-graph "$@" > "$work/logs/$name.csv" 2> "$work/logs/$name.err"
  local rc=$?
  tail -n 5 "$work/logs/$name.err"
  if grep -qE "ERR_NVGPUCTRPERM|not supported|No kernels were profiled" "$work/logs/$name.csv" "$work/logs/$name.err"; then
    skip "ncu cannot read the counters here"
  fi
  [ $rc = 0 ] || exit $rc
  "$PY" "$root/bench/gpu_report.py" kernels "$work/logs/$name.csv" > "$work/logs/$name.md" || exit 1
  { echo "### batch 1, prompt $PL, $*"; echo; cat "$work/logs/$name.md"; echo; } | tee -a "$work/logs/kernels.md"
  echo "note: $(grep -m1 '^total:' "$work/logs/$name.md")"
}

s_mission() {
  if ! grep -q 'SHARDLM_BIN' "$root/bench/mission_table.sh"; then
    echo "bench/mission_table.sh runs launch/build.sh and build/shardlm: it needs a SHARDLM_BIN override to run the bundle"
    exit 1
  fi
  SHARDLM_BIN=$BIN/shardlm "$root/bench/mission_table.sh" --synthetic "$SYN" --device "$DEV" | tee "$work/logs/mission.md"
  local rc=${PIPESTATUS[0]}
  echo "note: $(grep -c '^| ' "$work/logs/mission.md") table lines"
  exit "$rc"
}
export -f skip have_gpu find_ncu cpu_vs_dev s_env s_version s_test s_models s_tokens s_sanitize memcheck s_sanitize_lora s_prepare s_bench s_bench_lora s_bench_ablate s_bench_nopdl s_bench_with s_serve s_serve_http s_conversations s_speculate s_embed s_torch s_gemv s_ncu s_ncu_step s_gemv_r s_mission

# ---------------------------------------------------------------- the steps
step env 30 s_env
step version 30 s_version
# The 3.4 GB synthetic checkpoint is written on the CPU while the GPU runs the tests.
step prepare 240 s_prepare > "$work/prepare.out" 2>&1 &
prepare_pid=$!
for t in $(cd "$BIN" && ls | grep -E '^test_' | sort); do
  step "$t" 150 s_test "$t"
done
step models 60 s_models
step tokens 90 s_tokens
wait "$prepare_pid"
cat "$work/prepare.out"
# Batch 1 and 4 on one loaded model per precision (--batch 1,4): the loads, not the runs, cost.
for prec in "fp16 fp16" "int8 fp16" "int8 int8"; do
  set -- $prec
  step "bench-$1-$2-graph" 90 s_bench "bench-$1-$2-g1" 1,4 "$1" "$2" 1
done
# Where an FP16 decode step's time goes with graphs and PDL on (the report's "Marginal cost" table):
# the same steps again without each kernel class (bench --ablate), whose time saved is that class's
# share of the step, overlap included (Nsight Compute's per-kernel times below are each kernel alone).
step bench-fp16-fp16-graph-ablate 90 s_bench_ablate qkv,attention,o,mlp,lm_head,qkv+attention+o+mlp \
  bench-fp16-fp16-g1-ablate 1,4 fp16 fp16 1
# Most wanted first: a --budget run stops starting steps when its time is spent (rerun the rest
# with --only). The kernel-level views (gemv-r, ncu-step) come before the comparisons that change
# little from run to run (PyTorch, naive attention, the mission table).
step bench-w8a8-int8-graph 90 s_bench bench-w8a8-int8-g1 1,4 w8a8 int8 1
# INT4 layers (AWQ-style, group 128, interleaved) with the INT8 lm_head: 1.10 GB read per step
# against INT8's 1.73 GB (2026-12-04: 1.239 / 2.307 ms/token at batch 1 / 4, bound by the GEMV's
# dequantization).
step bench-int4-int8-graph 90 s_bench bench-int4-int8-g1 1,4 int4 int8 1
# The same 4-bit weights with INT8 activations (W4A8: __dp4a decode GEMV; prefill on FP16 tensor
# cores over the dequantized activations and codes).
step bench-w4a8-int8-graph 90 s_bench bench-w4a8-int8-g1 1,4 w4a8 int8 1
# LoRA adapters chosen per request (kernels/cuda/lora.h) on the INT8 rows.
step bench-int8-int8-graph-lora 90 s_bench_lora bench-int8-int8-g1-lora
# Prefill attention on the FP32 pipes (SHARDLM_PREFILL_TC=0) against the default rows above, whose
# prefill runs on tensor cores (kernels/cuda/attention.h): the report's "Prefill attention" table.
step bench-int8-int8-graph-prefill-fp32 90 s_bench_with SHARDLM_PREFILL_TC=0 "bench-int8-int8-g1-prefill-fp32" 1,4 int8 int8 1
# INT8 prefill with each matrix dequantized on a side stream while the product before it runs
# (SHARDLM_GEMM_STAGE=1, kernels/cuda/gemm.h): the report's "staged ahead" table against the
# int8 rows above (the dequantization was ~18% of an INT8 pp512, session 6).
step bench-int8-int8-graph-gemm-stage 90 s_bench_with SHARDLM_GEMM_STAGE=1 "bench-int8-int8-g1-gemm-stage" 1,4 int8 int8 1
# Decode alternatives to the defaults (the report's "Decode alternatives" table): a block per row
# tile instead of the persistent GEMV grid (kernels/cuda/gemv.h), the RoPE prologue as its own
# kernel instead of inside the split-KV attention (kernels/cuda/attention.h), and the norms and
# residual adds as kernels of their own instead of inside the GEMVs (GemvFuse, gemv.h). (The defaults won
# these on 2026-12-04; the L2 prefetch of the next matrices lost by 1-11%, the tensor-core decode
# GEMV by 5-26% at batch 4, 47-51% at batch 1, and the split-KV merge done by the last split block
# instead of a merge kernel by 1-4%: all three were removed.)
for prec in "int8 int8" "fp16 fp16"; do
  set -- $prec
  step "bench-$1-$2-graph-tiles" 90 s_bench_with SHARDLM_GEMV_GRID=tiles "bench-$1-$2-g1-tiles" 1,4 "$1" "$2" 1
  step "bench-$1-$2-graph-separate-rope" 90 s_bench_with SHARDLM_FUSED_ROPE=0 "bench-$1-$2-g1-separate-rope" 1,4 "$1" "$2" 1
  step "bench-$1-$2-graph-norm-kernels" 90 s_bench_with SHARDLM_FUSED_NORM=0 "bench-$1-$2-g1-norm-kernels" 1,4 "$1" "$2" 1
done
# Memcheck over the alternatives, and over the default fused RoPE with top-p alone (the nucleus
# mass kernel, kernels/cuda/nucleus.cu).
step sanitize-fused-rope 90 s_sanitize --weights int8 --kv int8 --top-k 0 --top-p 0.9
step sanitize-separate-rope 90 env SHARDLM_FUSED_ROPE=0 bash -c 's_sanitize "$@"' s_sanitize --weights int8 --kv int8
step sanitize-tiles 90 env SHARDLM_GEMV_GRID=tiles bash -c 's_sanitize "$@"' s_sanitize --kv int8
step sanitize-norm-kernels 90 env SHARDLM_FUSED_NORM=0 bash -c 's_sanitize "$@"' s_sanitize --weights int8 --kv int8
step gemv 60 s_gemv
step sanitize-lora 90 s_sanitize_lora
step sanitize-graph 90 s_sanitize --kv int8 --repetition-penalty 1.2 --frequency-penalty 0.3 --min-p 0.02
# Serving throughput (continuous batching vs static batches) and
# memcheck over queued prompts whose chunks ride with decode tokens.
step serve-int8-int8 90 s_serve
# The HTTP server on the device: concurrent requests, streaming, prefix
# cache, echo scoring.
step serve-http 90 s_serve_http
# The prefix cache's host tier (serve --cache-ram): multi-turn chat through fewer slots.
step conversations 90 s_conversations
# Speculative decoding: batch 1 and 4, with and without prompt lookup (verify steps replay graphs).
step speculate 90 s_speculate
# Embeddings (shardlm embed): GPU vectors against the CPU's, and the bench shape's throughput.
step embed 90 s_embed
step sanitize-queued 90 s_sanitize --kv int8 --batch 1 --prefill-chunk 2 --logprobs 3 --json
step gemv-r 90 s_gemv_r
step ncu-step-int8 150 s_ncu_step ncu-step-int8 --weights int8 --kv int8
step ncu-step-int4 150 s_ncu_step ncu-step-int4 --weights int4 --kv int8
step sanitize-w8a8 90 s_sanitize --weights w8a8
step sanitize-int4 90 s_sanitize --weights int4 --group-size 32 --kv int8
# 128-column groups on a model whose matrices are 128-column multiples: interleaved INT4.
step sanitize-int4-interleaved 90 env SANITIZE_MODEL="$work/tiny128" bash -c 's_sanitize "$@"' s_sanitize \
  --weights int4 --group-size 128 --kv int8
step sanitize-w4a8 90 s_sanitize --weights w4a8 --group-size 32 --kv int8
step bench-fp16-fp16-graph-nopdl 90 s_bench_nopdl bench-fp16-fp16-g1-nopdl 1,4 fp16 fp16 1
step bench-int8-int8-nograph 90 s_bench bench-int8-int8-g0 1,4 int8 int8 0
step ncu-step-fp16 150 s_ncu_step ncu-step-fp16 --weights fp16 --kv fp16
step torch 120 s_torch
step bench-b4-fp16-naive-attention 60 s_bench bench-b4-naive 4 fp16 fp16 1 --attention naive
step mission 120 s_mission
step sanitize-nograph 90 s_sanitize --weights int8 --no-cuda-graph
step ncu-gemv 90 s_ncu

# ---------------------------------------------------------------- report
{
  echo "# shardlm GPU check, $(date -u +%Y-%m-%d\ %H:%M) UTC"
  echo
  smi=$(command -v nvidia-smi || ls /usr/local/nvidia/bin/nvidia-smi 2>/dev/null)
  gpu=$([ -n "$smi" ] && "$smi" --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)
  echo "- machine: ${gpu:-no GPU}$([ "$dry" = 1 ] && echo ' (DRY RUN: CPU binaries, tiny shapes)'), $(nproc) cores, glibc ${sys_glibc:-?}"
  echo "- build: $("$BIN/shardlm" --version 2>/dev/null | tr '\n' ' ')${PACK_COMMIT:+(bundle $PACK_COMMIT, built $PACK_BUILT, CUDA $PACK_CUDA, $PACK_ARCH)}"
  echo "- shape: --synthetic $SYN, prompt $PL, gen $GEN, -r $REPS; loader $mode; $(($(date +%s) - t_start)) s in all"
} > "$work/header.md"
"$PY" "$root/bench/gpu_report.py" table "$jsonl" "$work/header.md" > "$out/gpu_check.md"
for f in gemv.out gemv-r.md mission.md kernels.md ncu.out; do
  [ -s "$work/logs/$f" ] || continue
  { echo; echo "## ${f%.*}"; echo; [ "${f%.md}" = "$f" ] && echo '```'; cat "$work/logs/$f"; [ "${f%.md}" = "$f" ] && echo '```'; } >> "$out/gpu_check.md"
done
for f in $(ls -tr "$work/logs"/*.log); do
  echo "=============== $(basename "$f" .log)"
  if [ "$(wc -l < "$f")" -gt 300 ]; then head -n 100 "$f"; echo "[... cut: logs tarball ...]"; tail -n 200 "$f"; else cat "$f"; fi
done > "$out/gpu_check.log"
tar -C "$work" -czf "$out/gpu_check_logs.tar.gz" logs
echo
cat "$out/gpu_check.md"
failed=$(cat "$work/failed" 2>/dev/null | tr '\n' ' ')
rm -rf "$work"
[ -z "$failed" ] || { echo "gpu_check: failed: $failed" >&2; exit 1; }
