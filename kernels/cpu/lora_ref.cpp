#include "kernels/cpu/lora.h"

namespace shardlm {

void lora_add_ref(const float* x, int64_t n, int64_t in, const float* a, const float* bt, int64_t rank, int64_t out,
                  float* t, float* y) {
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < rank; ++k) {
            float s = 0;
            for (int64_t c = 0; c < in; ++c) s += x[i * in + c] * a[k * in + c];
            t[i * rank + k] = s;
        }
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < rank; ++k)
            for (int64_t o = 0; o < out; ++o) y[i * out + o] += t[i * rank + k] * bt[k * out + o];
}

}  // namespace shardlm
