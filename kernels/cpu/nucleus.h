// The weight of a logit for nucleus (top-p) sampling without a top-k limit, as a fixed-point
// integer that the CPU and the GPU compute bit for bit alike, so that a row's total mass can be
// summed on the GPU (exactly, in any order) and the host still draws what it would draw from the
// whole row (runtime/sampler.h).
//
//   w(x) = floor(2^45 * exp((x - mx) / T)),  mx = the row's largest logit; 0 for NaN and for
//   (x - mx) / T <= -32 (below one unit), so a row of fewer than 2^19 logits sums below 2^64.
//
// exp runs on operations IEEE 754 rounds the same everywhere: a double subtraction and division,
// fmas (the rounding to an integer, the reduction with split ln 2, a degree-13 Taylor polynomial,
// error < 1e-17 on |r| <= ln 2 / 2) and a product with an exact power of two. No library exp
// (whose last bit differs between glibc and CUDA), and no product followed by a sum that a
// compiler could fuse differently on the two sides.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

// Inlined wherever it is used, also into the sampler's FMA clone (runtime/sampler.cpp), where its
// fmas become single instructions.
#if defined(__CUDACC__)
#define SHARDLM_NUCLEUS_FN __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define SHARDLM_NUCLEUS_FN __attribute__((always_inline)) inline
#else
#define SHARDLM_NUCLEUS_FN inline
#endif

namespace shardlm {

constexpr int kNucleusBits = 45;
constexpr int64_t kNucleusMaxRow = (int64_t(1) << 19) - 1;  // no row this long overflows the sum

SHARDLM_NUCLEUS_FN uint64_t nucleus_weight(float logit, float mx, float temperature) {
    const double x = (double(logit) - double(mx)) / double(temperature);
    if (!(x > -32.0)) return 0;  // NaN too
    if (x >= 0.0) return uint64_t(1) << kNucleusBits;
    // k = round(x / ln 2): the fma rounds x * (1 / ln 2) + 1.5 * 2^52 once, to an integer.
    const double k = ::fma(x, 0x1.71547652b82fep+0, 0x1.8p52) - 0x1.8p52;
    double r = ::fma(-k, 0x1.62e42fefa39efp-1, x);  // x - k ln 2, ln 2 in two parts
    r = ::fma(-k, 0x1.abc9e3b39803fp-56, r);
    double p = 0x1.6124613a86d09p-33;  // 1/13!
    p = ::fma(p, r, 0x1.1eed8eff8d898p-29);
    p = ::fma(p, r, 0x1.ae64567f544e4p-26);
    p = ::fma(p, r, 0x1.27e4fb7789f5cp-22);
    p = ::fma(p, r, 0x1.71de3a556c734p-19);
    p = ::fma(p, r, 0x1.a01a01a01a01ap-16);
    p = ::fma(p, r, 0x1.a01a01a01a01ap-13);
    p = ::fma(p, r, 0x1.6c16c16c16c17p-10);
    p = ::fma(p, r, 0x1.1111111111111p-7);
    p = ::fma(p, r, 0x1.5555555555555p-5);
    p = ::fma(p, r, 0x1.5555555555555p-3);
    p = ::fma(p, r, 0x1.0p-1);
    p = ::fma(p, r, 1.0);
    p = ::fma(p, r, 1.0);
    // p * 2^(45 + k), k in [-46, 0]: a product with an exact power of two (built from its bits),
    // exact; the conversion truncates, which is floor here.
    const uint64_t two_e = uint64_t(1023 + kNucleusBits + int(k)) << 52;
    double scale;
    memcpy(&scale, &two_e, sizeof(scale));
    return uint64_t(p * scale);
}

// Whether a ranked prefix of weight `cum` completes the nucleus of a row of total weight `total`.
SHARDLM_NUCLEUS_FN bool nucleus_reached(uint64_t cum, uint64_t total, float top_p) {
    return double(cum) >= double(top_p) * double(total);
}

}  // namespace shardlm
