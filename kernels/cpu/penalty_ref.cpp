#include "kernels/cpu/penalty.h"

namespace shardlm {

// Compiled with -ffp-contract=off (CMakeLists.txt), so the product and the difference below round
// separately on every target, as __fmul_rn and __fsub_rn do in the CUDA kernel.
float penalize(float x, float repetition, float offset) {
    const float scaled = x > 0.0f ? x / repetition : x * repetition;
    return scaled - offset;
}

void apply_penalties_ref(float* logits, int64_t vocab, int32_t id_offset, const PenaltyEntry* entries, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const PenaltyEntry& e = entries[i];
        const int64_t j = int64_t(e.id) - id_offset;
        if (j < 0 || j >= vocab) continue;
        float& x = logits[int64_t(e.row) * vocab + j];
        x = penalize(x, e.repetition, e.offset);
    }
}

}  // namespace shardlm
