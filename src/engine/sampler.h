// Token sampling: greedy at temperature 0, else temperature → top-k → top-p → a draw from a seeded RNG.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace megactx {

struct SamplingParams {
    float temperature = 0.0f;  // 0 = greedy
    float top_p = 1.0f;        // (0, 1]
    int64_t top_k = 0;         // 0 = all
    uint64_t seed = 0;

    void validate() const;  // clear errors naming the parameter
};

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    int32_t sample(const float* logits, int64_t vocab);

    // The distribution sample() draws from (after temperature, top-k, top-p), for tests and speculative
    // verification. Greedy gives a one-hot.
    std::vector<float> probs(const float* logits, int64_t vocab) const;

private:
    SamplingParams p_;
    std::mt19937_64 rng_;
};

// Index of the largest logit; the lowest index wins ties.
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace megactx
