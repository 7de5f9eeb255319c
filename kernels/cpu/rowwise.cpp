// rmsnorm / silu_mul: the run-time choice between the AVX-512 loops (rowwise_avx512.cpp) and the
// plain references.
#include "kernels/cpu/activation.h"
#include "kernels/cpu/rmsnorm.h"

namespace shardlm {

#if defined(SHARDLM_HAVE_AVX512)
void rmsnorm_avx512(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);
void silu_mul_avx512(const float* gate, const float* up, float* y, int64_t n);
#endif

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps, CpuIsa isa) {
#if defined(SHARDLM_HAVE_AVX512)
    if (cpu_isa_avx512(cpu_isa_resolve(isa))) return rmsnorm_avx512(x, w, y, rows, dim, eps);
#endif
    (void)isa;
    rmsnorm_ref(x, w, y, rows, dim, eps);
}

void silu_mul(const float* gate, const float* up, float* y, int64_t n, CpuIsa isa) {
#if defined(SHARDLM_HAVE_AVX512)
    if (cpu_isa_avx512(cpu_isa_resolve(isa))) return silu_mul_avx512(gate, up, y, n);
#endif
    (void)isa;
    silu_mul_ref(gate, up, y, n);
}

}  // namespace shardlm
