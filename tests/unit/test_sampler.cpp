#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/sampler.h"

namespace megactx {
namespace {

TEST(Sampler, GreedyIsArgmaxLowestIndexOnTies) {
    const float l[5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
    Sampler s(SamplingParams{});
    EXPECT_EQ(s.sample(l, 5), 1);
    EXPECT_EQ(argmax(l, 5), 1);
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
    const float l[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 2;
    const auto pk = Sampler(p).probs(l, 4);
    EXPECT_GT(pk[0], 0.0f);
    EXPECT_GT(pk[1], 0.0f);
    EXPECT_EQ(pk[2], 0.0f);
    EXPECT_EQ(pk[3], 0.0f);
    EXPECT_NEAR(pk[0] + pk[1], 1.0f, 1e-6f);
    EXPECT_NEAR(pk[0] / pk[1], std::exp(1.0f), 1e-4f);
    p.top_k = 0;
    p.top_p = 0.5f;  // softmax(3,2,1,0) = .644, .237, ...: the first token alone reaches 0.5
    const auto pp = Sampler(p).probs(l, 4);
    EXPECT_EQ(pp[0], 1.0f);
}

TEST(Sampler, SeededSamplingIsReproducibleAndFollowsTheDistribution) {
    const float l[3] = {0.0f, std::log(3.0f), -100.0f};  // p = 1/4, 3/4, ~0
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = 42;
    Sampler a(p), b(p);
    int count1 = 0;
    for (int i = 0; i < 4000; ++i) {
        const int32_t x = a.sample(l, 3);
        EXPECT_EQ(x, b.sample(l, 3));
        count1 += x == 1;
    }
    EXPECT_NEAR(count1 / 4000.0, 0.75, 0.03);
}

TEST(Sampler, InvalidParametersAreClearErrors) {
    SamplingParams p;
    p.temperature = -1.0f;
    EXPECT_THROW(p.validate(), Error);
    p.temperature = 1.0f;
    p.top_p = 0.0f;
    EXPECT_THROW(p.validate(), Error);
    p.top_p = 1.0f;
    p.top_k = -3;
    EXPECT_THROW(p.validate(), Error);
}

}  // namespace
}  // namespace megactx
