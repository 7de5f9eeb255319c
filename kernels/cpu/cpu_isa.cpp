#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
#include <cstring>

#if defined(SHARDLM_HAVE_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/error.h"

namespace shardlm {

const char* cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::Auto: return "auto";
        case CpuIsa::Scalar: return "scalar";
        case CpuIsa::Avx2: return "avx2";
        case CpuIsa::Avx512: return "avx512";
        case CpuIsa::Amx: return "amx";
    }
    return "?";
}

namespace {

#if defined(SHARDLM_HAVE_AMX)
// AMX needs the CPU's AMX-TILE, AMX-INT8 and AMX-BF16 (CPUID leaf 7: EDX bits 24, 25, 22) and
// AVX512-BF16 (leaf 7 subleaf 1: EAX bit 5), the OS saving tile state (XCR0 bits 17, 18) and, on
// Linux, this process's permission to use the 8 KB tile data (arch_prctl ARCH_REQ_XCOMP_PERM;
// granted per process, before any thread uses a tile).
bool amx_usable() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const unsigned amx = (1u << 22) | (1u << 24) | (1u << 25);
    if ((d & amx) != amx) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;
    __get_cpuid(1, &a, &b, &c, &d);
    if (!(c & (1u << 27))) return false;  // OSXSAVE: xgetbv is there
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

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
#if defined(SHARDLM_HAVE_AMX)
    if (v.back() == CpuIsa::Avx512 && amx_usable()) v.push_back(CpuIsa::Amx);
#endif
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
