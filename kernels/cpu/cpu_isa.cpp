#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace shardlm {

const char* cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::Auto: return "auto";
        case CpuIsa::Scalar: return "scalar";
        case CpuIsa::Avx2: return "avx2";
        case CpuIsa::Avx512: return "avx512";
    }
    return "?";
}

namespace {

std::vector<CpuIsa> detect() {
    std::vector<CpuIsa> v = {CpuIsa::Scalar};
#if defined(SHARDLM_HAVE_AVX2)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    if (avx2) v.push_back(CpuIsa::Avx2);
#if defined(SHARDLM_HAVE_AVX512)
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
        v.push_back(CpuIsa::Avx512);
#endif
#endif
    return v;
}

bool available(CpuIsa isa) {
    for (CpuIsa a : cpu_isas_available())
        if (a == isa) return true;
    return false;
}

CpuIsa pick_best() {
    if (const char* env = std::getenv("SHARDLM_CPU_ISA")) {
        for (CpuIsa a : cpu_isas_available())
            if (std::strcmp(env, cpu_isa_name(a)) == 0) return a;
    }
    return cpu_isas_available().back();
}

}  // namespace

// Resolved once; the CPU does not change under us.
const std::vector<CpuIsa>& cpu_isas_available() {
    static const std::vector<CpuIsa> v = detect();
    return v;
}

CpuIsa cpu_isa_resolve(CpuIsa isa) {
    if (isa == CpuIsa::Auto) {
        static const CpuIsa best = pick_best();
        return best;
    }
    SHARDLM_CHECK(available(isa), "CPU kernel variant ", cpu_isa_name(isa), " is not available on this CPU/build");
    return isa;
}

}  // namespace shardlm
