// lora_add: the run-time choice between the AVX-512 build of the loops (lora_avx512.cpp) and
// the base ISA's.
#include "kernels/cpu/lora.h"

#include "kernels/cpu/lora_loops.h"

namespace shardlm {

#if defined(SHARDLM_HAVE_AVX512)
void lora_add_avx512(const float* x, int64_t n, int64_t in, const float* a, const float* bt, int64_t rank, int64_t out,
                     float* t, float* y);
#endif

void lora_add(const float* x, int64_t n, int64_t in, const float* a, const float* bt, int64_t rank, int64_t out, float* t,
              float* y, CpuIsa isa) {
#if defined(SHARDLM_HAVE_AVX512)
    if (cpu_isa_avx512(cpu_isa_resolve(isa))) return lora_add_avx512(x, n, in, a, bt, rank, out, t, y);
#endif
    (void)isa;
    lora_add_loops(x, n, in, a, bt, rank, out, t, y);
}

}  // namespace shardlm
