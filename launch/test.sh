#!/usr/bin/env bash
# All tests: installs what is missing, builds (with CUDA when nvcc is there), runs every test,
# then rebuilds the parser and tokenizer tests under AddressSanitizer + UndefinedBehaviorSanitizer
# and runs them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/launch/install_deps.sh"

echo "== build ($root/build)"
"$root/launch/build.sh"
echo "== tests"
(cd "$root/build" && OMP_WAIT_POLICY=passive ctest --output-on-failure -j "$(nproc)" --timeout 600)

echo "== parser tests under ASan/UBSan ($root/build-asan)"
asan="$root/build-asan"
[ -f "$asan/build.ninja" ] || cmake -S "$root" -B "$asan" -G Ninja -DSHARDLM_SANITIZE=ON -DSHARDLM_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$asan" -j "$(nproc)" --target test_core test_model test_tokenizer
(cd "$asan" && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L parser -j "$(nproc)")
ASAN_OPTIONS=detect_leaks=1 "$asan/tests/tokenizer/test_tokenizer" --gtest_brief=1
echo "== all tests passed"
