// Verification of MTP drafts (model-spec §5.5): K draft tokens, each proposed from a draft distribution q_i,
// against the target's K + 1 distributions p_0..p_K (row i scores the token after the prompt, the output so far
// and drafts 1..i). Both come from logits processed the same way (penalties, temperature, top-k, top-p, min-p:
// Sampler::probs), so the accepted tokens are distributed exactly as plain decoding's.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sampler.h"
#include "engine/sequence.h"

namespace megactx {

struct Verified {
    std::vector<int32_t> tokens;  // the accepted drafts, then the token the target chose where they stopped
    int64_t n_accepted = 0;       // drafts accepted (tokens.size() - 1)
};

// Greedy (sampler.greedy()): draft i is accepted iff it is p_{i-1}'s argmax; the first rejected position and the
// bonus after K accepted drafts take the argmax. Otherwise rejection sampling with the request's RNG: draft x_i is
// accepted with probability min(1, p_{i-1}(x) / q_i(x)); at the first rejection the token is drawn from
// normalize(max(0, p_{i-1} - q_i)); after K acceptances a bonus token is drawn from p_K.
// p[i] and q[i] are full distributions over the vocabulary (greedy: one-hot). p.size() == drafts.size() + 1.
Verified verify_drafts(Sampler& sampler, const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
                       const std::vector<std::vector<float>>& p);

// Greedy verification from the target's choices alone: best[i] is p_i's argmax (drafts.size() + 1 of them), as the
// device's argmax_rows gives it without the logits leaving the device. The same tokens as verify_drafts' greedy case.
Verified verify_greedy(const std::vector<int32_t>& drafts, const int32_t* best);

// Set acceptance, for benchmarks (EngineConfig::forced_acceptance_length): the speed of speculation at an
// acceptance the model does not have. Every draft step and the verification run at their real cost; only the
// verifier's decision is replaced: draft i is accepted with probability alpha once drafts 1..i-1 were, whatever
// the target chose, and the token after the accepted run is the target's at that row. The sequence stays
// consistent (each accepted draft is the input its row's KV was computed from), but it is not the model's output.
class ForcedAcceptance {
  public:
    // alpha such that the mean acceptance length with k drafts, 1 + alpha + ... + alpha^k, equals `length`.
    // Throws Error unless 1 <= length <= k + 1.
    ForcedAcceptance(double length, int64_t k, uint64_t seed);
    double alpha() const { return alpha_; }
    // The number of drafts accepted out of n_drafts.
    int64_t draw(int64_t n_drafts);

  private:
    double alpha_ = 0.0;
    uint64_t state_ = 0;
};

// The mean acceptance length of k drafts accepted each with probability alpha in turn: sum of alpha^i, i = 0..k.
double acceptance_length(double alpha, int64_t k);

}  // namespace megactx
