// The few-token FP8 MoE path choice (src/backend/cuda/moe_plan.h), without a GPU: the automatic rule against the
// crossovers measured on the H200 (bench_gemm --moe-tokens), and the fixed threshold.
#include <gtest/gtest.h>

#include "backend/cuda/moe_plan.h"

using megactx::moe_plan::expected_distinct_experts;
using megactx::moe_plan::grouped_by_expert;

TEST(MoePlan, ExpectedDistinctExperts) {
    EXPECT_DOUBLE_EQ(expected_distinct_experts(1, 8, 256), 8.0);
    EXPECT_NEAR(expected_distinct_experts(8, 8, 256), 57.4, 0.1);  // measured draws: 61 (bench_gemm)
    EXPECT_NEAR(expected_distinct_experts(16, 8, 256), 102.0, 0.1);  // measured: 102
    EXPECT_DOUBLE_EQ(expected_distinct_experts(5, 4, 4), 4.0);      // every expert chosen by every token
    EXPECT_DOUBLE_EQ(expected_distinct_experts(0, 8, 256), 0.0);
}

TEST(MoePlan, AutomaticRuleFollowsTheMeasuredCrossover) {
    // GLM-5.2: 256 experts, 8 per token. Per choice measured faster at 1-8 tokens, grouped at 10, 12, 16 and 32.
    for (int64_t n = 1; n <= 8; ++n) EXPECT_FALSE(grouped_by_expert(n, 8, 256, 0)) << n;
    for (int64_t n = 10; n <= 32; ++n) EXPECT_TRUE(grouped_by_expert(n, 8, 256, 0)) << n;
    // The glm52-shape preset: 4 experts, 2 per token; grouped measured faster from 3 tokens (session 16).
    EXPECT_FALSE(grouped_by_expert(2, 2, 4, 0));
    for (int64_t n = 3; n <= 32; ++n) EXPECT_TRUE(grouped_by_expert(n, 2, 4, 0)) << n;
}

TEST(MoePlan, FixedThreshold) {
    EXPECT_FALSE(grouped_by_expert(2, 8, 256, 3));
    EXPECT_TRUE(grouped_by_expert(3, 8, 256, 3));
    EXPECT_TRUE(grouped_by_expert(1, 8, 256, 1));
    EXPECT_FALSE(grouped_by_expert(32, 2, 4, 33));  // above the few-token limit: grouping off
}
