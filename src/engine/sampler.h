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
    float min_p = 0.0f;               // [0, 1]: drop tokens below min_p · p(most likely)
    float presence_penalty = 0.0f;    // [-2, 2], OpenAI: over generated tokens
    float frequency_penalty = 0.0f;   // [-2, 2], OpenAI: over generated tokens
    float repetition_penalty = 1.0f;  // > 0, HF/vLLM: over prompt and generated tokens
    std::vector<std::pair<int32_t, float>> logit_bias = {};  // OpenAI: (token, [-100, 100]) added after the penalties

    void validate() const;  // clear errors naming the parameter
};

class Sampler {
  public:
    explicit Sampler(const SamplingParams& p);
    int32_t sample(const float* logits, int64_t vocab);

    // The distribution sample() draws from (after temperature, top-k, top-p), for tests and speculative
    // verification. Greedy gives a one-hot.
    std::vector<float> probs(const float* logits, int64_t vocab) const;
    // Speculative verification draws from the request's RNG too: a uniform in [0, 1), and a token from a
    // distribution (the inverse CDF that sample() uses).
    double uniform();
    int32_t draw(const std::vector<float>& p);
    bool greedy() const { return p_.temperature == 0.0f; }

  private:
    SamplingParams p_;
    std::mt19937_64 rng_;
};

// Index of the largest logit; the lowest index wins ties.
int32_t argmax(const float* logits, int64_t vocab);

// Applies presence/frequency (over `output`) and repetition (over `prompt` and `output`) penalties, then the
// logit bias, in place.
void apply_penalties(const SamplingParams& p, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                     float* logits, int64_t vocab);

// log-softmax of the raw logits at `token`, and the n most likely tokens with their log-probabilities.
struct TokenLogprobs {
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
};
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int64_t n_top);

}  // namespace megactx
