#include "kernels/cpu/lora.h"

#include "core/error.h"

namespace shardlm {

void lora_add_ref(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
                  int64_t out, float* t, float* y) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "lora_add_ref: factors of ", dtype_name(factors));
    auto at = [factors](const void* p, int64_t i) {
        return factors == DType::F32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    };
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < rank; ++k) {
            float s = 0;
            for (int64_t c = 0; c < in; ++c) s += x[i * in + c] * at(a, k * in + c);
            t[i * rank + k] = s;
        }
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < rank; ++k)
            for (int64_t o = 0; o < out; ++o) y[i * out + o] += t[i * rank + k] * at(bt, lora_bt_index(k, o, rank, out));
}

}  // namespace shardlm
