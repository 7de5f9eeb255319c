// lora_add_jobs: the run-time choice between the AVX-512 build of the loops (lora_avx512.cpp) and
// the base ISA's.
#include "kernels/cpu/lora.h"

#include "core/error.h"
#include "kernels/cpu/lora_loops.h"

namespace shardlm {

#if defined(SHARDLM_HAVE_AVX512)
void lora_add_jobs_avx512(const LoraJob* jobs, int64_t n_jobs, DType factors, float* t);
#endif

void lora_add_jobs(const LoraJob* jobs, int64_t n_jobs, DType factors, float* t, CpuIsa isa) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "lora_add: factors of ", dtype_name(factors));
    for (int64_t j = 0; j < n_jobs; ++j)
        SHARDLM_CHECK(jobs[j].n >= 0 && jobs[j].rank >= 0 && jobs[j].in > 0 && jobs[j].out > 0 && jobs[j].ldy >= jobs[j].out,
                      "lora_add: job ", j, ": n ", jobs[j].n, " rank ", jobs[j].rank, " in ", jobs[j].in, " out ",
                      jobs[j].out, " ldy ", jobs[j].ldy);
#if defined(SHARDLM_HAVE_AVX512)
    if (cpu_isa_avx512(cpu_isa_resolve(isa))) return lora_add_jobs_avx512(jobs, n_jobs, factors, t);
#endif
    (void)isa;
    if (factors == DType::F32) lora_add_jobs_loops<float>(jobs, n_jobs, t);
    else lora_add_jobs_loops<uint16_t>(jobs, n_jobs, t);
}

void lora_add(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
              int64_t out, float* t, float* y, CpuIsa isa) {
    const LoraJob job{x, n, in, a, bt, rank, out, y, out};
    lora_add_jobs(&job, 1, factors, t, isa);
}

}  // namespace shardlm
