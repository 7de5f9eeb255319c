#!/usr/bin/env bash
# All tests: installs what is missing, builds (with CUDA when nvcc is there), runs every test,
# runs the serve tests against the CLI compiled with AddressSanitizer, then builds the parser and
# tokenizer tests, and the CUDA kernels and engine for the CPU CUDA emulator (tests/cuda_emu, when
# the CUDA headers are there), under AddressSanitizer + UndefinedBehaviorSanitizer and runs the
# parsers' tests, then runs the GPU tests on the emulator, plain and under the sanitizers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Each step's header says when it began, so a slow CI run shows where its time went.
step() { echo "== $* [at ${SECONDS} s]"; }
"$root/launch/install_deps.sh"

step "build ($root/build)"
"$root/launch/build.sh"
step "tests"
(cd "$root/build" && OMP_WAIT_POLICY=passive ctest --output-on-failure -j "$(nproc)" --timeout 600)

# The serve tests once more against the CLI compiled with AddressSanitizer (its own files; the
# libraries are the build's): a use after scope or free in serve's HTTP handler threads ends the
# server and fails its test (~4 min to build, 1 to run on 2 cores). Reports go to
# build/asan-cli.<pid>, printed on failure; leaks too, but for Open MPI's under mpirun
# (launch/lsan.supp; the full unwinder, so that their stacks reach Open MPI's libraries).
step "serve tests against the CLI under ASan ($root/build)"
cmake --build "$root/build" -j "$(nproc)" --target shardlm_asan_cli
rm -f "$root/build"/asan-cli.*
if ! (cd "$root/build" && OMP_WAIT_POLICY=passive SHARDLM_TEST_CLI="$root/build/shardlm_asan_cli" \
      ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:protect_shadow_gap=0:log_path=$root/build/asan-cli" \
      LSAN_OPTIONS="suppressions=$root/launch/lsan.supp:print_suppressions=0" \
      tests/test_cli --gtest_filter='Serve.*' --gtest_brief=1); then
  cat "$root/build"/asan-cli.* 2>/dev/null >&2 || true
  echo "shardlm: the serve tests failed against the CLI built with ASan (build/shardlm_asan_cli)" >&2
  exit 1
fi
if ls "$root/build"/asan-cli.* >/dev/null 2>&1; then  # a report from a process whose test still passed
  cat "$root/build"/asan-cli.* >&2
  echo "shardlm: AddressSanitizer reported errors in the CLI (build/shardlm_asan_cli) under the serve tests" >&2
  exit 1
fi

# One more build under ASan + UBSan (build-asan/, no MPI): the parser and tokenizer tests, and where
# the CUDA headers are, the CUDA kernels and engine compiled for the emulator (their device
# allocations are exact-size heap blocks there, so a kernel's out-of-bounds access of device memory
# is reported, also where the engine sizes the buffers). One build for both, since they share the
# libraries: two took ~25 of CI's minutes on 2 cores, one takes ~14.
have_cuda_headers=0
if [ -f /usr/local/cuda/include/cuda_runtime.h ] || command -v nvcc >/dev/null; then have_cuda_headers=1; fi
asan="$root/build-asan"
asan_targets=(test_core test_model test_tokenizer test_json)
emu_flag=OFF
if [ "$have_cuda_headers" = 1 ]; then
  emu_flag=ON
  asan_targets+=(test_kernels_cuda test_cuda_engine test_cuda_emu)
fi
step "parser tests under ASan/UBSan ($asan)"
cmake -S "$root" -B "$asan" -G Ninja -DSHARDLM_SANITIZE=ON -DSHARDLM_CUDA=OFF -DSHARDLM_CUDA_EMU=$emu_flag \
  -DSHARDLM_MPI=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$asan" -j "$(nproc)" --target "${asan_targets[@]}"
(cd "$asan" && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L parser -j "$(nproc)")
ASAN_OPTIONS=detect_leaks=1 "$asan/tests/tokenizer/test_tokenizer" --gtest_brief=1

# The GPU tests without a GPU: kernels/cuda/*.cu compiled as C++ and run by the emulator, in both
# schedule orders (CTest label cuda_emu). Needs only the CUDA headers (cuda_runtime.h, cublas_v2.h).
emu="$root/build-emu"
if [ "$have_cuda_headers" = 1 ]; then
  step "CUDA tests on the CPU CUDA emulator ($emu)"
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
  # The same tests once more under ASan + UBSan, forward order only, one test per process so that
  # CTest keeps both cores busy to the end (whole binaries split in two shards left one core idle
  # for minutes behind the attention tests).
  step "CUDA kernel and engine tests on the emulator under ASan/UBSan ($asan)"
  if ! (cd "$asan" && OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive ASAN_OPTIONS=detect_leaks=1 \
        ctest --output-on-failure -L cuda_emu -E '[.]reverse$' -j "$(nproc)" --timeout 1800); then
    echo "shardlm: the CUDA tests above failed under ASan/UBSan on the CPU CUDA emulator ($asan)" >&2
    exit 1
  fi
else
  step "CUDA emulator tests skipped: no CUDA headers (/usr/local/cuda/include)"
fi
echo "== all tests passed [${SECONDS} s]"
