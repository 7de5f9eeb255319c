// lora_add: the run-time choice between the AVX-512 build of the loops (lora_avx512.cpp) and
// the base ISA's.
#include "kernels/cpu/lora.h"

#include "core/error.h"
#include "kernels/cpu/lora_loops.h"

namespace shardlm {

#if defined(SHARDLM_HAVE_AVX512)
void lora_add_avx512(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
                     int64_t out, float* t, float* y);
#endif

void lora_add(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
              int64_t out, float* t, float* y, CpuIsa isa) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "lora_add: factors of ", dtype_name(factors));
#if defined(SHARDLM_HAVE_AVX512)
    if (cpu_isa_avx512(cpu_isa_resolve(isa))) return lora_add_avx512(x, n, in, a, bt, factors, rank, out, t, y);
#endif
    (void)isa;
    if (factors == DType::F32)
        lora_add_loops(x, n, in, static_cast<const float*>(a), static_cast<const float*>(bt), rank, out, t, y);
    else
        lora_add_loops(x, n, in, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(bt), rank, out, t, y);
}

}  // namespace shardlm
