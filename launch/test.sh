#!/usr/bin/env bash
# All tests: installs what is missing, builds (with CUDA when nvcc is there), runs every test,
# runs the serve tests against the CLI compiled with AddressSanitizer, then rebuilds the parser and
# tokenizer tests under AddressSanitizer + UndefinedBehaviorSanitizer
# and runs them, then builds the CUDA kernels and engine for the CPU CUDA emulator (tests/cuda_emu,
# when the CUDA headers are there) and runs their GPU tests on it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/launch/install_deps.sh"

echo "== build ($root/build)"
"$root/launch/build.sh"
echo "== tests"
(cd "$root/build" && OMP_WAIT_POLICY=passive ctest --output-on-failure -j "$(nproc)" --timeout 600)

# The serve tests once more against the CLI compiled with AddressSanitizer (its own files; the
# libraries are the build's): a use after scope or free in serve's HTTP handler threads ends the
# server and fails its test (~4 min to build, 1 to run on 2 cores). Reports go to
# build/asan-cli.<pid>, printed on failure; leaks too, but for Open MPI's under mpirun
# (launch/lsan.supp; the full unwinder, so that their stacks reach Open MPI's libraries).
echo "== serve tests against the CLI under ASan ($root/build)"
cmake --build "$root/build" -j "$(nproc)" --target test_serve_asan
rm -f "$root/build"/asan-cli.*
if ! (cd "$root/build" && OMP_WAIT_POLICY=passive \
      ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:protect_shadow_gap=0:log_path=$root/build/asan-cli" \
      LSAN_OPTIONS="suppressions=$root/launch/lsan.supp:print_suppressions=0" tests/test_serve_asan --gtest_brief=1); then
  cat "$root/build"/asan-cli.* 2>/dev/null >&2 || true
  echo "shardlm: the serve tests failed against the CLI built with ASan (build/shardlm_asan_cli)" >&2
  exit 1
fi
if ls "$root/build"/asan-cli.* >/dev/null 2>&1; then  # a report from a process whose test still passed
  cat "$root/build"/asan-cli.* >&2
  echo "shardlm: AddressSanitizer reported errors in the CLI (build/shardlm_asan_cli) under the serve tests" >&2
  exit 1
fi

echo "== parser tests under ASan/UBSan ($root/build-asan)"
asan="$root/build-asan"
[ -f "$asan/build.ninja" ] || cmake -S "$root" -B "$asan" -G Ninja -DSHARDLM_SANITIZE=ON -DSHARDLM_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$asan" -j "$(nproc)" --target test_core test_model test_tokenizer test_json
(cd "$asan" && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L parser -j "$(nproc)")
ASAN_OPTIONS=detect_leaks=1 "$asan/tests/tokenizer/test_tokenizer" --gtest_brief=1

# The GPU tests without a GPU: kernels/cuda/*.cu compiled as C++ and run by the emulator, in both
# schedule orders (CTest label cuda_emu). Needs only the CUDA headers (cuda_runtime.h, cublas_v2.h).
emu="$root/build-emu"
if [ -f /usr/local/cuda/include/cuda_runtime.h ] || command -v nvcc >/dev/null; then
  echo "== CUDA tests on the CPU CUDA emulator ($emu)"
  [ -f "$emu/build.ninja" ] || cmake -S "$root" -B "$emu" -G Ninja -DSHARDLM_CUDA=OFF -DSHARDLM_CUDA_EMU=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  targets=(test_kernels_cuda test_cuda_engine test_cuda_emu)
  # The CUDA engine under tensor parallelism (MPI as its data plane on the emulator), where MPI is.
  ninja -C "$emu" -t targets all | grep '^test_tp_cuda:' >/dev/null && targets+=(test_tp_cuda)
  cmake --build "$emu" -j "$(nproc)" --target "${targets[@]}"
  if ! (cd "$emu" && OMP_WAIT_POLICY=passive ctest --output-on-failure -L cuda_emu -j "$(nproc)" --timeout 900); then
    echo "shardlm: the CUDA tests above failed on the CPU CUDA emulator (tests/cuda_emu, $emu), not on a GPU;" \
         "SHARDLM_EMU_ORDER=reverse reruns a binary in the reversed schedule" >&2
    exit 1
  fi
  # The kernel and engine tests once more under ASan + UBSan (forward order; ~6 min on 2 cores,
  # one gtest shard per core): device allocations are exact-size heap blocks there, so any kernel's
  # out-of-bounds access of device memory is reported, also where the engine sizes the buffers.
  emu_asan="$root/build-emu-asan"
  echo "== CUDA kernel and engine tests on the emulator under ASan/UBSan ($emu_asan)"
  [ -f "$emu_asan/build.ninja" ] || cmake -S "$root" -B "$emu_asan" -G Ninja -DSHARDLM_CUDA=OFF -DSHARDLM_CUDA_EMU=ON \
    -DSHARDLM_MPI=OFF -DSHARDLM_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$emu_asan" -j "$(nproc)" --target test_kernels_cuda test_cuda_engine
  shards=$(nproc)
  for bin in test_kernels_cuda test_cuda_engine; do
    pids=()
    for ((i = 0; i < shards; ++i)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 \
        "$emu_asan/tests/$bin" --gtest_brief=1 >"$emu_asan/$bin.shard$i.log" 2>&1 &
      pids+=($!)
    done
    for ((i = 0; i < shards; ++i)); do
      if ! wait "${pids[$i]}"; then
        cat "$emu_asan/$bin.shard$i.log" >&2
        echo "shardlm: $bin failed under ASan/UBSan on the CPU CUDA emulator ($emu_asan, shard $i of $shards)" >&2
        exit 1
      fi
      tail -n 1 "$emu_asan/$bin.shard$i.log"
    done
  done
else
  echo "== CUDA emulator tests skipped: no CUDA headers (/usr/local/cuda/include)"
fi
echo "== all tests passed"
