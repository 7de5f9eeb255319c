// Top-k of a row of logits, the one definition shared by the CPU sampler and the CUDA kernel
// (kernels/cuda/topk.h): the k first elements under "value descending, then index ascending",
// where NaN comes after every number (-inf included) and -0.0 equals +0.0 (so they tie by index).
// A total order on (value, index), so the answer is unique whatever the algorithm.
#pragma once

#include <cmath>
#include <cstdint>

namespace shardlm {

// True when (a, ia) comes before (b, ib). Spelled out for NaN: every comparison with NaN is false,
// so a plain `a > b` would make the order depend on where the NaNs sit.
inline bool topk_before(float a, int32_t ia, float b, int32_t ib) {
    const bool na = std::isnan(a), nb = std::isnan(b);
    if (na != nb) return nb;          // a number comes before a NaN
    if (!na && a != b) return a > b;  // -0.0 == +0.0 here, so signed zeros fall through to the index
    return ia < ib;
}

// The k first elements of x[0..n) in that order: vals[i] = x[ids[i]] (bit for bit, NaN payloads
// and the sign of zero kept), for i < k. Requires 1 <= k <= n < 2^31.
void topk_ref(const float* x, int64_t n, int64_t k, float* vals, int32_t* ids);

}  // namespace shardlm
