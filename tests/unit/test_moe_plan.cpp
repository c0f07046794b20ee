// The few-token FP8 MoE path choice (src/backend/cuda/moe_plan.h), without a GPU: the automatic rule against the
// crossovers measured on the H200 (bench_gemm --moe-tokens), and the fixed threshold.
#include <gtest/gtest.h>

#include "backend/cuda/moe_plan.h"

using megactx::moe_plan::expected_distinct_experts;
using megactx::moe_plan::grouped_max_active;
using megactx::moe_plan::kOnDeviceMaxTokens;
using megactx::moe_plan::moe_path;
using megactx::moe_plan::MoePath;

TEST(MoePlan, ExpectedDistinctExperts) {
    EXPECT_DOUBLE_EQ(expected_distinct_experts(1, 8, 256), 8.0);
    EXPECT_NEAR(expected_distinct_experts(8, 8, 256), 57.4, 0.1);  // measured draws: 61 (bench_gemm)
    EXPECT_NEAR(expected_distinct_experts(16, 8, 256), 102.0, 0.1);  // measured: 102
    EXPECT_DOUBLE_EQ(expected_distinct_experts(5, 4, 4), 4.0);      // every expert chosen by every token
    EXPECT_DOUBLE_EQ(expected_distinct_experts(0, 8, 256), 0.0);
}

TEST(MoePlan, DeviceBoundFollowsTheMeasuredCrossover) {
    // 8 tokens that drew 60 experts ran faster per choice, 10 tokens that drew 69 faster grouped.
    EXPECT_LT(grouped_max_active(8, 8), 60);
    EXPECT_GE(grouped_max_active(10, 8), 69);
    // Tokens that share all their experts always group.
    for (int64_t n = 3; n <= kOnDeviceMaxTokens; ++n) EXPECT_GE(grouped_max_active(n, 8), 8) << n;
}

TEST(MoePlan, AutomaticPaths) {
    // GLM-5.2: 256 experts, 8 per token.
    EXPECT_EQ(moe_path(1, 8, 256, 0), MoePath::kPerChoice);
    EXPECT_EQ(moe_path(2, 8, 256, 0), MoePath::kPerChoice);
    for (int64_t n = 3; n <= kOnDeviceMaxTokens; ++n) EXPECT_EQ(moe_path(n, 8, 256, 0), MoePath::kOnDevice) << n;
    for (int64_t n = kOnDeviceMaxTokens + 1; n <= 32; ++n) EXPECT_EQ(moe_path(n, 8, 256, 0), MoePath::kGrouped) << n;
    // The bound: at 6 tokens a uniform draw lies clearly above the grouped bound (per choice usually picked), at 8 it
    // sits on it (a coin flip, and the conditional node costs more than per choice then wins).
    EXPECT_GT(expected_distinct_experts(6, 8, 256), static_cast<double>(grouped_max_active(6, 8)) + 0.5);
    EXPECT_NEAR(expected_distinct_experts(8, 8, 256), static_cast<double>(grouped_max_active(8, 8)), 1.0);
    // The glm52-shape preset (4 experts, 2 per token): from 3 tokens the 4 experts are within the bound, so grouped
    // without a device choice (measured faster from 3 tokens, 5262b0d).
    EXPECT_EQ(moe_path(2, 2, 4, 0), MoePath::kPerChoice);
    for (int64_t n = 3; n <= 32; ++n) EXPECT_EQ(moe_path(n, 2, 4, 0), MoePath::kGrouped) << n;
}

TEST(MoePlan, FixedThreshold) {
    EXPECT_EQ(moe_path(2, 8, 256, 3), MoePath::kPerChoice);
    EXPECT_EQ(moe_path(3, 8, 256, 3), MoePath::kGrouped);
    EXPECT_EQ(moe_path(1, 8, 256, 1), MoePath::kGrouped);
    EXPECT_EQ(moe_path(32, 2, 4, 33), MoePath::kPerChoice);  // above the few-token limit: grouping off
}
