#!/usr/bin/env bash
# Builds the bundle that bench/gpu_check.sh runs on a lent GPU machine (which has CUDA 13 and a
# driver, but no Boost, ICU, PCRE2, GoogleTest or nlohmann-json, and maybe another glibc).
#   bench/gpu_pack.sh [--build DIR] [--arch 90] [--jobs N] [--also "test_runtime test_cli"]
# Run it HERE (the CPU machine with the CUDA toolkit). It configures a separate build (build-gpu/:
# Release, no MPI, machine code for sm_90 only), builds shardlm and every executable whose name
# says cuda or gpu (test_kernels_cuda, test_cuda_engine, gemv_bench_cuda, ... whichever exist; --also
# adds other executables, e.g. a CPU test suite that has GPU cases), then
# lays out build-gpu/pack/:
#   bin/       the executables
#   lib/       every non-CUDA, non-glibc shared library they need (Boost, ICU, PCRE2, gomp, stdc++, gcc_s)
#   glibc/     this machine's glibc with its loader (ld-linux-x86-64.so.2): run through it where the
#              GPU machine's glibc is older than this one's
#   cuda/      libcudart only, a fallback: the GPU machine's libcuda, libcudart and libcublas(Lt) are used
#   pack.env   what gpu_check.sh needs to know (compiled-in paths, glibc and CUDA versions, binaries)
# and compresses it to build-gpu/gpu-pack.tar.xz: the path to name in the device tool's `carry`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-gpu
arch=90
jobs=${SHARDLM_JOBS:-2}
also=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(realpath -m "$2"); shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --also) also=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--arch 90] [--jobs N] [--also \"NAME ...\"]" >&2; exit 2 ;;
  esac
done
pack=$build/pack
tarball=$build/gpu-pack.tar.xz

echo "== configure $build (sm_$arch, no MPI)"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDLM_MPI=OFF -DSHARDLM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
else
  cmake "$build" -DSHARDLM_MPI=OFF -DSHARDLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
fi

# Executables: "path: CXX_EXECUTABLE_LINKER__name_Release" (or CUDA_...) lines of ninja's target list.
# (gtest_discover_tests adds "tests/test_x[1]_tests.cmake: ..._LINKER__test_x_..." lines: skipped.)
exes() {
  ninja -C "$build" -t targets all | sed -n 's/^\([^:]*\): [A-Z]*_EXECUTABLE_LINKER__\(.*\)_[A-Za-z]*$/\1 \2/p' |
    awk '{ n = $1; sub(/.*\//, "", n); if (n == $2) print $1 }'
}
want='(^|/)shardlm$|cuda|gpu'
for a in $also; do want+="|(^|/)$a\$"; done
mapfile -t paths < <(exes | grep -E "$want" | sort -u)
grep -qx shardlm <<<"$(printf '%s\n' "${paths[@]}")" || { echo "gpu_pack: no shardlm target" >&2; exit 1; }
names=()
for p in "${paths[@]}"; do names+=("$(basename "$p")"); done
echo "== build: ${names[*]}"
# Other workers may be mid-edit on a source file: one retry after a pause.
if ! cmake --build "$build" -j "$jobs" --target "${names[@]}"; then
  echo "gpu_pack: build failed; retrying once in 60 s" >&2
  sleep 60
  cmake --build "$build" -j "$jobs" --target "${names[@]}"
fi

echo "== pack $pack"
rm -rf "$pack" "$tarball"
mkdir -p "$pack/bin" "$pack/lib" "$pack/glibc" "$pack/cuda"
glibc_re='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec|ld-linux-x86-64)\.so'
cuda_re='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvJitLink|libnvrtc|libcupti)\.so'
cuda_needed=()
cudart=""
for p in "${paths[@]}"; do
  cp "$build/$p" "$pack/bin/"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [[ $name =~ $cuda_re ]]; then
      cuda_needed+=("$name")
      [[ $name == libcudart.so* && -f $path ]] && cudart=$path
      continue
    fi
    [ "$path" = "not" ] && { echo "gpu_pack: $p needs $name, not found here" >&2; exit 1; }
    if [[ $name =~ $glibc_re ]]; then continue; fi  # the whole glibc set is copied below
    [ -f "$pack/lib/$name" ] || cp -L "$path" "$pack/lib/$name"
  done < <(ldd "$build/$p")
done
# The whole glibc set, not only what our binaries name: the GPU machine's libcuda and libcublas need
# libdl/libpthread/librt too, and must get them from the same glibc as the loader.
for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 libmvec.so.1; do
  src=$(ldconfig -p | awk -v l="$l" '$1 == l && /x86-64/ && !n++ { print $NF }')
  [ -n "$src" ] && cp -L "$src" "$pack/glibc/$l"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$pack/glibc/ld-linux-x86-64.so.2"
chmod +x "$pack/glibc/ld-linux-x86-64.so.2"
[ -n "$cudart" ] && cp -L "$cudart" "$pack/cuda/"

cuda_needed_list=$(printf '%s\n' "${cuda_needed[@]}" | sort -u | tr '\n' ' ')
nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -n 1)
[ -x "${nvcc:-}" ] || nvcc=/usr/local/cuda/bin/nvcc
cat > "$pack/pack.env" <<EOF
# written by bench/gpu_pack.sh
PACK_BUILT='$(date -u +%Y-%m-%dT%H:%M:%SZ)'
PACK_COMMIT='$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo +dirty)'
PACK_GLIBC='$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')'
PACK_CUDA='$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')'
PACK_ARCH='sm_$arch'
PACK_BINARIES='${names[*]}'
PACK_CUDA_NEEDED='$cuda_needed_list'
# compiled into the test binaries: tests spawn SHARDLM_BIN and read files under SHARDLM_SOURCE_DIR
PACK_SHARDLM_BIN='$build/shardlm'
PACK_SOURCE_DIR='$root'
EOF

echo "== check: the bundle's shardlm through the bundled loader"
"$pack/glibc/ld-linux-x86-64.so.2" --library-path "$pack/glibc:$pack/lib:$pack/cuda:$(dirname "${cudart:-/usr/local/cuda/lib64/x}")" \
  "$pack/bin/shardlm" --version

echo "== compress $tarball"
XZ_OPT="-6 -T${jobs}" tar -C "$build" -cJf "$tarball" pack
echo "bundle: $(du -sh "$pack" | cut -f1) unpacked; $(du -h "$tarball" | cut -f1) compressed ($tarball)"
echo "binaries: ${names[*]}"
echo "CUDA libraries needed from the GPU machine: $cuda_needed_list"
size=$(stat -c %s "$tarball")
if [ "$size" -gt $((50 * 1024 * 1024)) ]; then
  echo "gpu_pack: the bundle is over 50 MiB: the device tool carries 64 MiB with the working tree" >&2
  exit 1
fi
