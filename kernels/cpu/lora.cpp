// lora_add_jobs: the run-time choice between the AVX-512 build of the loops (lora_avx512.cpp) and
// the base ISA's.
#include "kernels/cpu/lora.h"

#include <vector>

#include "core/error.h"
#include "kernels/cpu/lora_jobs.h"
#include "kernels/cpu/lora_loops.h"

namespace shardlm {

#if defined(SHARDLM_HAVE_AVX512)
void lora_add_jobs_avx512(const LoraJob* jobs, const LoraTaskPlan& plan, DType factors, float* t);
#endif

void lora_add_jobs(const LoraJob* jobs, int64_t n_jobs, DType factors, float* t, CpuIsa isa) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "lora_add: factors of ", dtype_name(factors));
    // The plan (lora_jobs.h): each job's running task totals and its place in t.
    std::vector<int64_t> ends(3 * size_t(n_jobs));
    int64_t s = 0, e = 0, at = 0, work = 0;
    for (int64_t j = 0; j < n_jobs; ++j) {
        const LoraJob& J = jobs[j];
        SHARDLM_CHECK(J.n >= 0 && J.rank >= 0 && J.in > 0 && J.out > 0 && J.ldy >= J.out, "lora_add: job ", j, ": n ", J.n,
                      " rank ", J.rank, " in ", J.in, " out ", J.out, " ldy ", J.ldy);
        ends[size_t(2 * n_jobs + j)] = at;
        s += J.n * ((J.rank + 3) / 4);
        e += J.rank > 0 ? (J.out + kLoraTile - 1) / kLoraTile : 0;
        at += J.n * J.rank;
        work += J.n * J.rank * (J.in + J.out);
        ends[size_t(j)] = s;
        ends[size_t(n_jobs + j)] = e;
    }
    // Threads pay where the call reads more than a few hundred KB (decode reads A and Bt, 4 *
    // rank * (in + out) bytes a job in f32).
    const LoraTaskPlan plan{ends.data(), ends.data() + n_jobs, ends.data() + 2 * n_jobs, n_jobs, work >= (int64_t(1) << 16)};
#if defined(SHARDLM_HAVE_AVX512)
    if (cpu_isa_avx512(cpu_isa_resolve(isa))) return lora_add_jobs_avx512(jobs, plan, factors, t);
#endif
    (void)isa;
    if (factors == DType::F32) lora_add_jobs_loops<float>(jobs, plan, t);
    else lora_add_jobs_loops<uint16_t>(jobs, plan, t);
}

void lora_add(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
              int64_t out, float* t, float* y, CpuIsa isa) {
    const LoraJob job{x, n, in, a, bt, rank, out, y, out};
    lora_add_jobs(&job, 1, factors, t, isa);
}

}  // namespace shardlm
