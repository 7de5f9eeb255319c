#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/topk.h"

namespace shardlm {

void topk_ref(const float* x, int64_t n, int64_t k, float* vals, int32_t* ids) {
    SHARDLM_CHECK(n >= 1 && n <= INT32_MAX, "topk_ref: row of ", n, " values");
    SHARDLM_CHECK(k >= 1 && k <= n, "topk_ref: k = ", k, " for a row of ", n);
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    // topk_before is a strict total order on (value, index) (NaN handled explicitly there), so
    // partial_sort's result is the unique answer.
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [x](int32_t i, int32_t j) { return topk_before(x[i], i, x[j], j); });
    for (int64_t i = 0; i < k; ++i) {
        ids[i] = order[size_t(i)];
        vals[i] = x[order[size_t(i)]];
    }
}

}  // namespace shardlm
