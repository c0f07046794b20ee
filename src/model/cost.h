// `megactx cost`: analytic per-token FLOPs, bytes and KV memory of a glm_moe_dsa config at a context
// length, with the config's IndexShare layout and with every layer full (model-spec §4.3, anchors §2).
#pragma once

#include <cstdint>
#include <string>

#include "io/config.h"

namespace megactx {

struct CostBreakdown {
    double decode_flops = 0;         // one decode token at position L (attends to L tokens)
    double prefill_flops_avg = 0;    // average per token over a prefill of L tokens
    double decode_bytes = 0;         // bytes read per decode token (weights active per token + KV read)
    double kv_bytes_per_token = 0;   // FP8 cache: 656 B latent per layer + 132 B indexer per full layer
    double kv_bytes_per_seq = 0;     // kv_bytes_per_token · L
    double indexer_flops = 0;        // the indexer part of decode_flops
    double attention_flops = 0;      // the sparse MLA part of decode_flops
    double dense_flops = 0;          // projections, MLP/MoE, LM head part of decode_flops
};

struct CostReport {
    int64_t context = 0;
    int64_t n_full_layers = 0;
    CostBreakdown index_share;  // the config's layout
    CostBreakdown all_full;     // every layer runs its indexer (GLM-5.1 style)
};

CostReport compute_cost(const ModelConfig& c, int64_t context);
// Human-readable table (or JSON when as_json) of the report.
std::string format_cost(const CostReport& r, bool as_json);

}  // namespace megactx
