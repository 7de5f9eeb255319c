#!/bin/sh
# The objects built with -mavx2 / -mavx512* / -mamx* flags (kernels/cpu/*_avx2.cpp, *_avx512.cpp,
# *_amx.cpp) must define no symbol the linker merges across files: an inline function with external
# linkage (a member of Buffer or std::vector, a template instantiation) is emitted weak in every
# object that uses it, and the linker keeps one copy for the whole program. If it keeps the AVX-512
# one, a base-ISA caller runs AVX-512 code on a CPU without it (SIGILL). Kernels take their scratch
# from kernels/cpu/scratch.h instead, and keep their helpers in anonymous namespaces.
# usage: check_isa_objects.sh NM LIBRARY
set -eu
nm_bin=$1
lib=$2
# nm -A on an archive prints "archive:member.o:address TYPE symbol"; W/V are weak, u unique.
bad=$("$nm_bin" -A --defined-only "$lib" |
      awk '$1 ~ /_(avx2|avx512|amx)\.cpp\.o:/ && $2 ~ /^[WVu]$/ && $3 != "DW.ref.__gxx_personality_v0" {
               sub(/:[0-9a-f]*$/, "", $1); n = split($1, p, ":"); print p[n] " " $3 }')
if [ -n "$bad" ]; then
    echo "$lib: ISA-specific objects define symbols the linker may share with base-ISA code:" >&2
    echo "$bad" | while read -r obj sym; do
        echo "  $obj: $(echo "$sym" | c++filt 2>/dev/null || echo "$sym")" >&2
    done
    exit 1
fi
count=$("$nm_bin" -A --defined-only "$lib" | awk '$1 ~ /_(avx2|avx512|amx)\.cpp\.o:/' | wc -l)
echo "$lib: ISA-specific objects checked ($count defined symbols), none shared"
