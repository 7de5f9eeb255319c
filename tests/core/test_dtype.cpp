#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"

using namespace shardlm;

TEST(DType, F16KnownValues) {
    EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);  // overflow -> inf
    EXPECT_EQ(f32_to_f16(5.9604645e-08f), 0x0001);  // smallest subnormal
    EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
    EXPECT_EQ(f16_to_f32(0x0001), 5.9604645e-08f);
}

TEST(DType, F16RoundTripsEveryValue) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_f32(uint16_t(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
}

TEST(DType, F16RoundsToNearestEven) {
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
    // 1 + 3 * 2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
    EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
    // just above half rounds up
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
    // subnormal halfway: 1.5 * 2^-24 -> ties to even 2 * 2^-24
    EXPECT_EQ(f32_to_f16(1.5f * 5.9604645e-08f), 0x0002);
}

TEST(DType, BF16) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even.
    EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = bf16_to_f32(uint16_t(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_bf16(f), h);
    }
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, Sizes) {
    EXPECT_EQ(dtype_size(DType::F32), 4u);
    EXPECT_EQ(dtype_size(DType::BF16), 2u);
    EXPECT_EQ(dtype_size(DType::I8), 1u);
    EXPECT_STREQ(dtype_name(DType::F16), "f16");
}
