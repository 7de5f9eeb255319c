// Element types of tensors on disk and in memory, and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace shardlm {

// U8 is raw bytes on disk (a pre-quantized checkpoint's packed INT4 weights and zero points). I4 is
// never a checkpoint dtype: it names packed 4-bit weight matrices in memory (two per byte, see
// kernels/cpu/weights_view.h), which have no per-element size; dtype_size(I4) throws.
enum class DType : uint8_t { F32, F16, BF16, I8, I32, U8, I4 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "f16", "bf16", "i8", "i32", "u8", "i4"

// IEEE binary16 -> float, exact.
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);  // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
    } else if (man == 0) {
        bits = sign;  // +-0
    } else {
        // subnormal: value = man * 2^-24, normalise it
        float v = float(man) * (1.0f / 16777216.0f);
        std::memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// float -> binary16 with round-to-nearest-even, overflow to inf, NaN kept NaN.
uint16_t f32_to_f16(float f);

inline float bf16_to_f32(uint16_t b) {
    const uint32_t bits = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// float -> bfloat16 with round-to-nearest-even (NaN stays a quiet NaN).
inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1);
    return uint16_t(bits >> 16);
}

// OCP FP8 E4M3 (safetensors' F8_E4M3, "e4m3fn": bias 7, no infinities, S.1111.111 is NaN) ->
// float, exact.
inline float e4m3_to_f32(uint8_t b) {
    const uint32_t sign = uint32_t(b & 0x80) << 24, exp = (b >> 3) & 15u, man = b & 7u;
    uint32_t bits;
    if (exp == 15 && man == 7) {
        bits = sign | 0x7fc00000u;
    } else if (exp != 0) {
        bits = sign | ((exp + 120) << 23) | (man << 20);  // rebias 7 -> 127
    } else {
        const float v = float(man) * (1.0f / 512.0f);  // subnormal: man * 2^-9
        std::memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace shardlm
