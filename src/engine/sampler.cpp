#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace megactx {

void SamplingParams::validate() const {
    MEGACTX_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be >= 0, got {}", temperature);
    MEGACTX_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}", top_p);
    MEGACTX_CHECK(top_k >= 0, "top_k must be >= 0, got {}", top_k);
    MEGACTX_CHECK(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}", min_p);
    MEGACTX_CHECK(std::isfinite(presence_penalty) && std::fabs(presence_penalty) <= 2.0f,
                  "presence_penalty must be in [-2, 2], got {}", presence_penalty);
    MEGACTX_CHECK(std::isfinite(frequency_penalty) && std::fabs(frequency_penalty) <= 2.0f,
                  "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
    MEGACTX_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
                  "repetition_penalty must be > 0, got {}", repetition_penalty);
    for (const auto& [token, bias] : logit_bias) {
        MEGACTX_CHECK(token >= 0, "logit_bias: token id {} is negative", token);
        MEGACTX_CHECK(std::isfinite(bias) && std::fabs(bias) <= 100.0f, "logit_bias of token {} must be in [-100, 100], got {}",
                      token, bias);
    }
}

void apply_penalties(const SamplingParams& p, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                     float* logits, int64_t vocab) {
    if (p.repetition_penalty != 1.0f) {
        std::vector<bool> seen(static_cast<size_t>(vocab), false);
        for (const auto* list : {&prompt, &output}) {
            for (int32_t t : *list) seen[static_cast<size_t>(t)] = true;
        }
        for (int64_t i = 0; i < vocab; ++i) {
            if (!seen[i]) continue;
            logits[i] = logits[i] > 0 ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
        }
    }
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
        std::vector<int32_t> count(static_cast<size_t>(vocab), 0);
        for (int32_t t : output) ++count[static_cast<size_t>(t)];
        for (int64_t i = 0; i < vocab; ++i) {
            if (count[i] == 0) continue;
            logits[i] -= p.frequency_penalty * static_cast<float>(count[i]) + p.presence_penalty;
        }
    }
    for (const auto& [token, bias] : p.logit_bias) {
        if (token >= 0 && token < vocab) logits[token] += bias;
    }
}

TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int64_t n_top) {
    double mx = logits[0];
    for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    TokenLogprobs r;
    r.logprob = static_cast<float>(logits[token] - lse);
    if (n_top > 0) {
        std::vector<int32_t> order(static_cast<size_t>(vocab));
        std::iota(order.begin(), order.end(), 0);
        const auto k = static_cast<size_t>(std::min(n_top, vocab));
        std::partial_sort(order.begin(), order.begin() + static_cast<long>(k), order.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        for (size_t i = 0; i < k; ++i) r.top.push_back({order[i], static_cast<float>(logits[order[i]] - lse)});
    }
    return r;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { p_.validate(); }

int32_t argmax(const float* logits, int64_t vocab) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i) {
        if (logits[i] > logits[best]) best = i;
    }
    return static_cast<int32_t>(best);
}

std::vector<float> Sampler::probs(const float* logits, int64_t vocab) const {
    std::vector<float> p(static_cast<size_t>(vocab), 0.0f);
    if (p_.temperature == 0.0f) {
        p[static_cast<size_t>(argmax(logits, vocab))] = 1.0f;
        return p;
    }
    // Candidates sorted by logit (descending, lower id first on ties).
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    size_t keep = order.size();
    if (p_.top_k > 0) keep = std::min(keep, static_cast<size_t>(p_.top_k));
    const float mx = logits[order[0]];
    std::vector<double> e(keep);
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
        e[i] = std::exp(static_cast<double>(logits[order[i]] - mx) / p_.temperature);
        sum += e[i];
    }
    if (p_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
        double acc = 0.0;
        size_t cut = keep;
        for (size_t i = 0; i < keep; ++i) {
            acc += e[i] / sum;
            if (acc >= p_.top_p) {
                cut = i + 1;
                break;
            }
        }
        keep = cut;
        sum = 0.0;
        for (size_t i = 0; i < keep; ++i) sum += e[i];
    }
    if (p_.min_p > 0.0f) {  // relative to the most likely remaining token
        const double floor = p_.min_p * e[0];
        while (keep > 1 && e[keep - 1] < floor) --keep;
        sum = 0.0;
        for (size_t i = 0; i < keep; ++i) sum += e[i];
    }
    for (size_t i = 0; i < keep; ++i) p[static_cast<size_t>(order[i])] = static_cast<float>(e[i] / sum);
    return p;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
    if (p_.temperature == 0.0f) return argmax(logits, vocab);
    return draw(probs(logits, vocab));
}

double Sampler::uniform() {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    return u(rng_);
}

int32_t Sampler::draw(const std::vector<float>& p) {
    const double r = uniform();
    double acc = 0.0;
    int32_t last = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] <= 0.0f) continue;
        acc += p[i];
        last = static_cast<int32_t>(i);
        if (r < acc) return last;
    }
    return last;
}

}  // namespace megactx
