#include "kernels/cpu/embedding.h"

namespace shardlm {

void embedding_ref(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
    for (int64_t t = 0; t < n; ++t) weight_row_to_f32(table, ids[t], out + t * table.cols);
}

}  // namespace shardlm
