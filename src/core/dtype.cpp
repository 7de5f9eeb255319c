#include "core/dtype.h"

#include "core/error.h"

namespace shardlm {

size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::F16: return 2;
        case DType::BF16: return 2;
        case DType::I8: return 1;
        case DType::I32: return 4;
        case DType::U8: return 1;
        case DType::I4: fail("internal: i4 weights are packed two per byte; size them with weight_row_bytes");
    }
    return 0;
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "f32";
        case DType::F16: return "f16";
        case DType::BF16: return "bf16";
        case DType::I8: return "i8";
        case DType::I32: return "i32";
        case DType::U8: return "u8";
        case DType::I4: return "i4";
    }
    return "?";
}

uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {
        // Result is subnormal (or zero): value / 2^-24 rounded to nearest even integer.
        if (ax < 0x33000000u) return sign;  // below half the smallest subnormal
        const uint32_t exp = ax >> 23;
        const uint32_t man = (ax & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - exp;  // man * 2^(exp-150) / 2^-24 = man >> (126-exp)
        uint32_t q = man >> shift;
        const uint32_t rem = man & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) ++q;
        return uint16_t(sign | q);
    }
    // Normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to nearest even.
    uint32_t h = ((ax - 0x38000000u) >> 13);
    const uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
    return uint16_t(sign | h);
}

}  // namespace shardlm
