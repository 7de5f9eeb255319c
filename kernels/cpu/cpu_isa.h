// Instruction-set variants of the CPU kernels. Each vectorised variant lives in its own .cpp built
// with its own -m flags and is only called after a run-time CPU check; `Scalar` always exists so
// tests can hold every variant against the references.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

enum class CpuIsa : uint8_t {
    Auto,    // the best available (or the one named by SHARDLM_CPU_ISA)
    Scalar,  // plain C++, any CPU
    Avx2,    // AVX2 + FMA + F16C (Haswell, Zen 1+)
    Avx512,  // AVX-512 F/DQ/BW/VL + VNNI + FMA + F16C (Ice Lake / Cascade Lake, Zen 4+)
    Amx,     // Avx512 + AVX512-BF16 + AMX-TILE/INT8/BF16 with the OS's permission (Sapphire Rapids+):
             // the prefill GEMMs on tiles (INT8 for W8A8/W4A8, BF16 for W8A16/BF16), the rest as Avx512
};

// Whether a concrete variant runs the AVX-512 kernels (Amx is a superset of Avx512).
inline bool cpu_isa_avx512(CpuIsa isa) { return isa == CpuIsa::Avx512 || isa == CpuIsa::Amx; }

const char* cpu_isa_name(CpuIsa isa);  // "auto", "scalar", "avx2", "avx512", "amx"

// Variants this build and this CPU can run, Scalar first.
const std::vector<CpuIsa>& cpu_isas_available();

// Auto -> the best available one, unless the environment variable SHARDLM_CPU_ISA names an
// available variant (for A/B runs); a concrete variant the CPU lacks is an error.
CpuIsa cpu_isa_resolve(CpuIsa isa);

}  // namespace shardlm
