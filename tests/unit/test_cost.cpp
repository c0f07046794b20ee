// `megactx cost` arithmetic against the GLM-5.2 anchors (anchors.md §2, model-spec §4.3, §6).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "io/config.h"
#include "model/cost.h"

namespace megactx {
namespace {

const std::string kGlm52 = std::string(MEGACTX_TEST_DATA) + "/glm52_config.json";
constexpr int64_t k1M = 1048576;

TEST(Cost, Glm52LayoutAndActiveParams) {
    const CostReport r = compute_cost(load_config(kGlm52), k1M);
    EXPECT_EQ(r.n_layers, 78);
    EXPECT_EQ(r.n_full_layers, 21);
    EXPECT_EQ(r.n_mtp_layers, 1);
    EXPECT_TRUE(r.fp8_weights);
    // model-spec §1.1: ≈40.30 B activated per token (excl. MTP, incl. lm_head, excl. embedding).
    EXPECT_NEAR(r.active_params / 1e9, 40.30, 0.01);
}

// Anchors: 772 (all-full) vs 283 (IndexShare) GFLOP at 1M count only 2·32·128·L for the indexer; this model also
// counts ReLU + weighting (+1.2% of the scan) and the indexer projections, so it lands 1.3% / 0.8% above them.
// Tolerance: 2% of the anchor value.
TEST(Cost, Glm52DecodeFlopsAt1M) {
    const CostReport r = compute_cost(load_config(kGlm52), k1M);
    EXPECT_NEAR(r.all_full.decode_flops / 1e9, 772.0, 772.0 * 0.02);
    EXPECT_NEAR(r.index_share.decode_flops / 1e9, 283.0, 283.0 * 0.02);
    // Exact breakdown for this counting (2 FLOPs per MAC): the scan is (2·32·128 + 3·32)·L per full layer.
    const double scan = (2.0 * 32 * 128 + 3 * 32) * k1M;
    const double idx_proj = 2.0 * (4096.0 * 2048 + 128.0 * 6144 + 32.0 * 6144);
    EXPECT_DOUBLE_EQ(r.index_share.indexer_flops, 21 * (scan + idx_proj));
    EXPECT_DOUBLE_EQ(r.all_full.indexer_flops, 78 * (scan + idx_proj));
    // Sparse MLA: 64 heads · 2048 tokens · 2·(576 + 512) per layer (model-spec §2.5: 151 M + 134 M).
    EXPECT_DOUBLE_EQ(r.index_share.attention_flops, 78.0 * 64 * 2048 * 2 * (576 + 512));
    EXPECT_DOUBLE_EQ(r.all_full.attention_flops, r.index_share.attention_flops);
    // Dense/other is 2 FLOPs per active parameter without the indexer weights: ≈ 2 · 40.10 B.
    EXPECT_NEAR(r.index_share.dense_flops / 1e9, 80.20, 0.01);
    EXPECT_DOUBLE_EQ(r.index_share.decode_flops,
                     r.index_share.indexer_flops + r.index_share.attention_flops + r.index_share.dense_flops);
}

TEST(Cost, Glm52Ratios) {
    const CostReport r = compute_cost(load_config(kGlm52), k1M);
    EXPECT_NEAR(r.decode_ratio, 2.74, 0.02);          // anchors: 2.7× with 21 of 78 full
    EXPECT_NEAR(r.quarter_decode_ratio, 2.87, 0.03);  // exactly one in four: the published 2.9×
    EXPECT_DOUBLE_EQ(r.quarter.n_full_layers, 19.5);
    // Prefill: the average token scans (L+1)/2 candidates, so the indexer share and the ratio are smaller.
    EXPECT_GT(r.prefill_ratio, 1.5);
    EXPECT_LT(r.prefill_ratio, r.decode_ratio);
    EXPECT_NEAR(r.index_share.prefill_indexer_flops,
                21 * ((2.0 * 32 * 128 + 3 * 32) * (k1M + 1) / 2 + 2.0 * (4096.0 * 2048 + 160.0 * 6144)), 1.0);
    // Prefill attention average: (K(K+1)/2 + (L-K)·K) / L selected rows per layer, K = 2048.
    const double avg_sel = (2048.0 * 2049 / 2 + (k1M - 2048.0) * 2048) / k1M;
    EXPECT_NEAR(r.index_share.prefill_attention_flops, 78.0 * 64 * 2 * (576 + 512) * avg_sel, 1.0);
}

TEST(Cost, Glm52KvBytesExact) {
    const CostReport r = compute_cost(load_config(kGlm52), k1M);
    EXPECT_EQ(r.latent_row_bytes, 656);
    EXPECT_EQ(r.indexer_row_bytes, 132);
    EXPECT_EQ(r.index_share.kv_bytes_per_token, 53940);  // 78·656 + 21·132
    EXPECT_EQ(r.all_full.kv_bytes_per_token, 78 * (656 + 132));
    EXPECT_EQ(r.index_share.kv_bytes_per_seq, 53940.0 * k1M);  // 56.6 GB (anchors §2)
    EXPECT_EQ(r.all_full.kv_bytes_per_seq, 61464.0 * k1M);     // 64.4 GB
    EXPECT_EQ(r.kv_bytes_per_token_mtp, 788);
    // Decode KV read: 2048 latent rows per layer + L indexer keys per full layer.
    EXPECT_EQ(r.index_share.decode_kv_bytes, 78.0 * 2048 * 656 + 21.0 * k1M * 132);
}

TEST(Cost, Glm52WeightBytesFp8AndBf16) {
    ModelConfig c = load_config(kGlm52);
    const CostReport fp8 = compute_cost(c, k1M);
    // FP8: 1 B/param except lm_head (154880·6144), 75 routers (256·6144), 21 weights_proj (32·6144) at 2 B.
    const double bf16_params = 154880.0 * 6144 + 75.0 * 256 * 6144 + 21.0 * 32 * 6144;
    EXPECT_NEAR(fp8.index_share.decode_weight_bytes, fp8.active_params + bf16_params, 1.0);
    c.quant_method.clear();
    const CostReport bf16 = compute_cost(c, k1M);
    EXPECT_FALSE(bf16.fp8_weights);
    EXPECT_NEAR(bf16.index_share.decode_weight_bytes, 2 * bf16.active_params, 1.0);
    EXPECT_EQ(bf16.index_share.decode_kv_bytes, fp8.index_share.decode_kv_bytes);  // the cache is FP8 either way
}

TEST(Cost, ShortContextAttendsToAllTokens) {
    const CostReport r = compute_cost(load_config(kGlm52), 1000);
    EXPECT_DOUBLE_EQ(r.index_share.attention_flops, 78.0 * 64 * 1000 * 2 * (576 + 512));
    EXPECT_DOUBLE_EQ(r.index_share.prefill_attention_flops, 78.0 * 64 * 500.5 * 2 * (576 + 512));
}

TEST(Cost, AllFullConfigHasRatioOne) {
    ModelConfig c = load_config(kGlm52);
    c.layer_full.assign(static_cast<size_t>(c.n_layers), true);
    const CostReport r = compute_cost(c, k1M);
    EXPECT_EQ(r.n_full_layers, 78);
    EXPECT_DOUBLE_EQ(r.index_share.decode_flops, r.all_full.decode_flops);
    EXPECT_DOUBLE_EQ(r.index_share.prefill_flops_avg, r.all_full.prefill_flops_avg);
    EXPECT_DOUBLE_EQ(r.index_share.decode_bytes, r.all_full.decode_bytes);
    EXPECT_DOUBLE_EQ(r.index_share.kv_bytes_per_token, r.all_full.kv_bytes_per_token);
    EXPECT_DOUBLE_EQ(r.decode_ratio, 1.0);
}

TEST(Cost, FormatHasKeyLines) {
    const CostReport r = compute_cost(load_config(kGlm52), k1M);
    const std::string t = format_cost(r, false);
    for (const char* key : {"context L = 1048576", "21 with a full indexer", "decode GFLOP/token", "sparse attention",
                            "prefill GFLOP/token", "decode GB read/token", "KV bytes/token", "53940", "61464",
                            "MTP layers", "excluded", "1 B/param", "one full layer in four", "2.74x", "2.87x"}) {
        EXPECT_NE(t.find(key), std::string::npos) << "missing '" << key << "' in:\n" << t;
    }
    const nlohmann::json j = nlohmann::json::parse(format_cost(r, true));
    EXPECT_EQ(j["index_share"]["kv_bytes_per_token"].get<double>(), 53940);
    EXPECT_EQ(j["n_full_layers"].get<int64_t>(), 21);
    EXPECT_NEAR(j["decode_ratio"].get<double>(), r.decode_ratio, 1e-12);
}

}  // namespace

// DeepSeek-V3.2 (its own config.json): every one of the 61 layers runs the 64 × 128 indexer, so the layout is its own
// all-full column; 37.5 B active parameters (DeepSeek reports 37 B activated for V3, before the indexer's 0.85 B).
TEST(Cost, DeepSeekV32EveryLayerIndexed) {
    const CostReport r = compute_cost(load_config(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/config.json"), k1M);
    EXPECT_EQ(r.model_type, "deepseek_v32");
    EXPECT_EQ(r.n_layers, 61);
    EXPECT_EQ(r.n_full_layers, 61);
    EXPECT_DOUBLE_EQ(r.decode_ratio, 1.0);
    EXPECT_NEAR(r.active_params / 1e9, 37.48, 0.01);
    const double scan = (2.0 * 64 * 128 + 3 * 64) * k1M;
    const double idx_proj = 2.0 * (1536.0 * 8192 + 128.0 * 7168 + 64.0 * 7168);
    EXPECT_DOUBLE_EQ(r.index_share.indexer_flops, 61 * (scan + idx_proj));
    EXPECT_DOUBLE_EQ(r.index_share.attention_flops, 61.0 * 128 * 2048 * 2 * (576 + 512));
    EXPECT_NE(format_cost(r, false).find("megactx cost: deepseek_v32, 61 layers"), std::string::npos);
}

}  // namespace megactx
