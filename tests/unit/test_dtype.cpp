#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"

namespace megactx {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even → 1.
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16KnownValues) {
    EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
    EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
    for (float v : {0.0f, 1.0f, -3.140625f, 65504.0f, std::ldexp(1.0f, -20), 0.1f}) {
        EXPECT_NEAR(f16_to_f32(f32_to_f16(v)), v, std::fabs(v) * 1e-3f + 1e-7f) << v;
    }
}

TEST(DType, Fp8E4M3Table) {
    EXPECT_EQ(fp8e4m3_to_f32(0x00), 0.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);        // exp 7, man 0
    EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);      // max finite
    EXPECT_EQ(fp8e4m3_to_f32(0xfe), -448.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
    EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
    EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);  // saturates
    // Every finite code survives a round trip.
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) continue;
        const float v = fp8e4m3_to_f32(static_cast<uint8_t>(c));
        if (v == 0.0f) continue;
        EXPECT_EQ(f32_to_fp8e4m3(v), c) << c;
    }
}

TEST(DType, Fp8E4M3RoundsToNearestEven) {
    // Against a brute-force search over the 127 finite magnitudes, including every midpoint (ties → even).
    std::vector<float> values;
    for (int c = 0; c < 0x7e; ++c) {
        values.push_back((fp8e4m3_to_f32(static_cast<uint8_t>(c)) + fp8e4m3_to_f32(static_cast<uint8_t>(c + 1))) / 2);
    }
    uint32_t x = 12345;
    for (int i = 0; i < 20000; ++i) {
        x = x * 1664525u + 1013904223u;
        values.push_back((static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * (i % 2 ? 900.0f : 0.05f));
    }
    for (float v : values) {
        const float a = std::fabs(v);
        int best = 0;
        float best_err = INFINITY;
        for (int c = 0; c <= 0x7e; ++c) {
            const float err = std::fabs(fp8e4m3_to_f32(static_cast<uint8_t>(c)) - a);
            if (err < best_err || (err == best_err && (c & 1) == 0)) {
                best = c;
                best_err = err;
            }
        }
        if (a >= 448.0f) best = 0x7e;
        ASSERT_EQ(f32_to_fp8e4m3(v), (v < 0 ? 0x80 : 0) | best) << v;
    }
}

TEST(DType, ConvertUnaligned) {
    const uint16_t vals[3] = {f32_to_bf16(1.5f), f32_to_bf16(-0.25f), f32_to_bf16(8.0f)};
    unsigned char buf[7];
    std::memcpy(buf + 1, vals, 6);  // deliberately misaligned
    float out[3];
    convert_to_f32(DType::BF16, buf + 1, out, 3);
    EXPECT_EQ(out[0], 1.5f);
    EXPECT_EQ(out[1], -0.25f);
    EXPECT_EQ(out[2], 8.0f);
}

}  // namespace
}  // namespace megactx
