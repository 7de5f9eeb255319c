// How lora_add_jobs (kernels/cpu/lora.h) lays a call's jobs out as the tasks of its two phases,
// for both builds of its loops (lora_loops.h, lora_avx512.cpp): phase 1 takes four of A's rows of
// one x row per task, phase 2 one column tile of Bt (every row of its job) per task, numbered job
// after job, and each job's t is its own [n, rank] block of the scratch.
//
// lora.cpp (the base ISA's flags) makes the plan; the loops only read it. The AVX-512 file must
// not instantiate a template that the base file instantiates too (std::vector's, say): the
// linker keeps one copy, and the AVX-512 one would run on CPUs without it. So the plan is plain
// arrays, and what both files run (the driver below) has internal linkage.
#pragma once

#include <cstdint>

#include "kernels/cpu/lora.h"

namespace shardlm {

struct LoraTaskPlan {
    const int64_t* shrink_end = nullptr;  // per job: the phases' running task totals
    const int64_t* expand_end = nullptr;
    const int64_t* t_at = nullptr;        // per job: where its t starts in the scratch
    int64_t n_jobs = 0;
    bool threaded = false;  // worth a fork: more than a few hundred KB of factors read in all
};

namespace {

// The job of task g of a phase (`end`: its running totals over n jobs), and g's number in it.
inline int64_t lora_task_job(const int64_t* end, int64_t n, int64_t g, int64_t* local) {
    int64_t lo = 0, hi = n;  // the first job whose running total is above g
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (end[mid] > g) hi = mid;
        else lo = mid + 1;
    }
    *local = g - (lo > 0 ? end[lo - 1] : 0);
    return lo;
}

// One parallel region for every job: shrink(job, row, k0, t) for each task of phase 1, one
// barrier, expand(job, tile, t) for each of phase 2 (t: the job's block of the scratch).
template <typename Shrink, typename Expand>
void run_lora_tasks(const LoraJob* jobs, const LoraTaskPlan& p, float* t, Shrink shrink, Expand expand) {
    const int64_t shrinks = p.n_jobs > 0 ? p.shrink_end[p.n_jobs - 1] : 0;
    const int64_t expands = p.n_jobs > 0 ? p.expand_end[p.n_jobs - 1] : 0;
#pragma omp parallel if (p.threaded)
    {
#pragma omp for schedule(static)
        for (int64_t g = 0; g < shrinks; ++g) {
            int64_t q = 0;
            const int64_t j = lora_task_job(p.shrink_end, p.n_jobs, g, &q);
            const int64_t quads = (jobs[j].rank + 3) / 4;
            shrink(jobs[j], q / quads, q % quads * 4, t + p.t_at[j]);
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < expands; ++g) {
            int64_t b = 0;
            const int64_t j = lora_task_job(p.expand_end, p.n_jobs, g, &b);
            expand(jobs[j], b, t + p.t_at[j]);
        }
    }
}

}  // namespace
}  // namespace shardlm
