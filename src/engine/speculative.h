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

}  // namespace megactx
