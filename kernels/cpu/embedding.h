// Embedding lookup: out[t] = table row ids[t] as f32. Ids are validated by the caller.
#pragma once

#include <cstdint>

#include "kernels/cpu/weights_view.h"

namespace shardlm {

void embedding_ref(const WeightView& table, const int32_t* ids, int64_t n, float* out);

}  // namespace shardlm
