// `megactx cost`: analytic per-token FLOPs, bytes and KV memory of a DSA config (glm_moe_dsa, deepseek_v32) at a
// context length, with the config's IndexShare layout and with every layer full (model-spec §4.3, anchors §2). The
// counting conventions are listed at the top of cost.cpp and in docs/cost.md.
#pragma once

#include <cstdint>
#include <string>

#include "io/config.h"

namespace megactx {

struct CostBreakdown {
    double n_full_layers = 0;            // layers that run the indexer (fractional only for the "one in four" case)
    double decode_flops = 0;             // one decode token at position L (attends to min(L, index_topk) tokens)
    double prefill_flops_avg = 0;        // average per token over a prefill of L tokens
    double decode_bytes = 0;             // bytes read per decode token (weights active per token + KV read)
    double decode_weight_bytes = 0;      // the weight part of decode_bytes
    double decode_kv_bytes = 0;          // the KV-cache part of decode_bytes (latent rows + indexer keys)
    double kv_bytes_per_token = 0;       // FP8 cache: 656 B latent per layer + 132 B indexer per full layer
    double kv_bytes_per_seq = 0;         // kv_bytes_per_token · L
    double indexer_flops = 0;            // the indexer part of decode_flops
    double attention_flops = 0;          // the sparse MLA part of decode_flops
    double dense_flops = 0;              // projections, MLP/MoE, LM head part of decode_flops
    double prefill_indexer_flops = 0;    // the indexer part of prefill_flops_avg
    double prefill_attention_flops = 0;  // the sparse MLA part of prefill_flops_avg
};

struct CostReport {
    std::string model_type;  // glm_moe_dsa or deepseek_v32
    int64_t context = 0;
    int64_t n_layers = 0;
    int64_t n_full_layers = 0;
    int64_t n_mtp_layers = 0;  // excluded from every FLOP and byte figure; KV listed separately
    int64_t index_topk = 0;
    std::string indexer_source;  // which config field decided the layout
    double active_params = 0;    // weights used by one token, excl. embedding and MTP (GLM-5.2: ≈40.30 B)
    bool fp8_weights = false;    // quantization_config present → 1 B/param (BF16 tensors of the FP8 ckpt: 2 B)
    std::string quant_method;
    double latent_row_bytes = 0;        // FP8 MLA cache row per token per layer (656 for d_latent 576)
    double indexer_row_bytes = 0;       // FP8 indexer key per token per full layer (132 for d_indexer 128)
    double kv_bytes_per_token_mtp = 0;  // n_mtp_layers · (latent + indexer row); not in the breakdowns
    CostBreakdown index_share;          // the config's layout
    CostBreakdown all_full;             // every layer runs its indexer (GLM-5.1 style)
    CostBreakdown quarter;              // exactly n_layers/4 full layers (the published "2.9×" setting)
    double decode_ratio = 0;            // all_full.decode_flops / index_share.decode_flops
    double prefill_ratio = 0;           // all_full.prefill_flops_avg / index_share.prefill_flops_avg
    double quarter_decode_ratio = 0;    // all_full.decode_flops / quarter.decode_flops
    double quarter_prefill_ratio = 0;
};

CostReport compute_cost(const ModelConfig& c, int64_t context);
// Human-readable table (or JSON when as_json) of the report.
std::string format_cost(const CostReport& r, bool as_json);

}  // namespace megactx
