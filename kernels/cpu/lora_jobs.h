// How lora_add_jobs (kernels/cpu/lora.h) lays a call's jobs out as the tasks of its two phases,
// for both builds of its loops (lora_loops.h, lora_avx512.cpp): phase 1 takes four of A's rows of
// one x row per task, phase 2 one column tile of Bt (every row of its job) per task, numbered job
// after job, and each job's t is its own [n, rank] block of the scratch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/lora.h"

namespace shardlm {

struct LoraTasks {
    std::vector<int64_t> shrink_end, expand_end, t_at;  // per job: the tasks' running totals, t's offset
    bool threaded = false;  // worth a fork: more than a few hundred KB of factors read in all

    LoraTasks(const LoraJob* jobs, int64_t n_jobs) : shrink_end(size_t(n_jobs)), expand_end(size_t(n_jobs)), t_at(size_t(n_jobs)) {
        int64_t s = 0, e = 0, t = 0, work = 0;
        for (int64_t j = 0; j < n_jobs; ++j) {
            const LoraJob& J = jobs[j];
            t_at[size_t(j)] = t;
            s += J.n * ((J.rank + 3) / 4);
            e += J.rank > 0 ? (J.out + kLoraTile - 1) / kLoraTile : 0;
            t += J.n * J.rank;
            work += J.n * J.rank * (J.in + J.out);
            shrink_end[size_t(j)] = s;
            expand_end[size_t(j)] = e;
        }
        // Threads pay where the call reads more than a few hundred KB (decode reads A and Bt, 4 *
        // rank * (in + out) bytes a job in f32).
        threaded = work >= (int64_t(1) << 16);
    }
    int64_t shrink_tasks() const { return shrink_end.empty() ? 0 : shrink_end.back(); }
    int64_t expand_tasks() const { return expand_end.empty() ? 0 : expand_end.back(); }
    // The job of task g of a phase (`end`: its running totals) and g's number within that job.
    static std::pair<int64_t, int64_t> find(const std::vector<int64_t>& end, int64_t g) {
        const int64_t j = int64_t(std::upper_bound(end.begin(), end.end(), g) - end.begin());
        return {j, g - (j > 0 ? end[size_t(j - 1)] : 0)};
    }
};

}  // namespace shardlm
