#include <algorithm>

#include "kernels/cpu/dot_tile.h"
#include "kernels/cpu/matmul.h"

namespace shardlm {

void dot_tile_scalar(const float* x, int64_t xs, int nt, const void* w, DType wt, int64_t cols, float* out) {
    for (int t = 0; t < nt; ++t) out[t] = 0.0f;
    for (int64_t i = 0; i < cols; ++i) {
        float wi;
        switch (wt) {
            case DType::F16: wi = f16_to_f32(static_cast<const uint16_t*>(w)[i]); break;
            case DType::BF16: wi = bf16_to_f32(static_cast<const uint16_t*>(w)[i]); break;
            default: wi = static_cast<const float*>(w)[i]; break;
        }
        for (int t = 0; t < nt; ++t) out[t] += x[t * xs + i] * wi;
    }
}

namespace {

struct Dispatch {
    DotTileFn fn;
    const char* name;
};

Dispatch pick() {
#if defined(SHARDLM_HAVE_AVX2)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return {dot_tile_avx2, "avx2"};
#endif
    return {dot_tile_scalar, "scalar"};
}

// Resolved once; the CPU does not change under us.
const Dispatch& dispatch() {
    static const Dispatch d = pick();
    return d;
}

// Blocking: a block of kRowBlock weight rows stays in L1/L2 while kTokBlock activation rows stream
// past it, so prefill reads each weight n/kTokBlock times instead of n/kTile times.
constexpr int64_t kRowBlock = 16;
constexpr int64_t kTokBlock = 64;

}  // namespace

const char* matmul_isa() { return dispatch().name; }

void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
    const DotTileFn fn = dispatch().fn;
    const size_t esize = dtype_size(w.dtype);
    const int64_t row_blocks = (w.rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static)
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
        const int64_t r0 = rb * kRowBlock, r1 = std::min(w.rows, r0 + kRowBlock);
        for (int64_t t0 = 0; t0 < n; t0 += kTokBlock) {
            const int64_t t1 = std::min(n, t0 + kTokBlock);
            for (int64_t r = r0; r < r1; ++r) {
                const void* wr = static_cast<const uint8_t*>(w.data) + size_t(r * w.cols) * esize;
                const float b = bias ? bias[r] : 0.0f;
                for (int64_t t = t0; t < t1; t += kTile) {
                    const int nt = int(std::min<int64_t>(kTile, t1 - t));
                    float out[kTile];
                    fn(x + t * w.cols, w.cols, nt, wr, w.dtype, w.cols, out);
                    for (int k = 0; k < nt; ++k) y[(t + k) * w.rows + r] = out[k] + b;
                }
            }
        }
    }
}

}  // namespace shardlm
