#include "kernels/cpu/gather.h"

namespace shardlm {

void gather_columns(const float* x, int64_t T, int64_t part_cols, int64_t parts, const int32_t* order, int64_t width,
                    float* out) {
    const int64_t part_stride = T * part_cols;  // between two parts' blocks
#pragma omp parallel for schedule(static) if (T * width >= (int64_t(1) << 15))
    for (int64_t t = 0; t < T; ++t) {
        const float* row = x + t * part_cols;
        float* o = out + t * width;
        // (No division where there is one part: a division per element made a decode step's gather
        // of a row ~3x slower, 8.2 against 2.9 us on a Qwen3-1.7B-shaped layer.)
        if (parts == 1) {
            for (int64_t j = 0; j < width; ++j) o[j] = row[order[j]];
        } else {
            for (int64_t j = 0; j < width; ++j) {
                const int64_t c = order[j];
                o[j] = row[(c / part_cols) * part_stride + c % part_cols];
            }
        }
    }
}

}  // namespace shardlm
