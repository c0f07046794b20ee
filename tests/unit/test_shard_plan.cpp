// Sharding plans (src/parallel/shard_plan.h) on GLM-5.2's config: ranges cover every head, expert and layer once,
// LayerSplit groups are contiguous and balanced, weight bytes add up to the real checkpoint, capacity follows,
// and bad GPU counts fail naming the dimension.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "io/config.h"
#include "parallel/shard_plan.h"

namespace megactx {
namespace {

const std::string kGlm52 = std::string(MEGACTX_TEST_DATA) + "/glm52_config.json";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Ranges of consecutive ranks tile [0, n) in order.
template <typename Get>
void expect_tiles(const ShardPlan& p, int64_t n, Get get, const char* what) {
    int64_t at = 0;
    for (const RankPlan& r : p.ranks) {
        const Range x = get(r);
        EXPECT_EQ(x.begin, at) << what << " rank " << r.rank;
        EXPECT_GT(x.size(), 0) << what << " rank " << r.rank;
        at = x.end;
    }
    EXPECT_EQ(at, n) << what;
}

TEST(ShardPlan, Glm52TensorAndExpertParallelOverEight) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions o;
    o.n_gpus = 8;
    o.expert_parallel = true;
    o.indexer_split = true;
    const ShardPlan p = make_shard_plan(c, o);
    ASSERT_EQ(p.ranks.size(), 8u);
    expect_tiles(p, 64, [](const RankPlan& r) { return r.heads; }, "heads");
    expect_tiles(p, 32, [](const RankPlan& r) { return r.indexer_heads; }, "indexer heads");
    expect_tiles(p, 256, [](const RankPlan& r) { return r.experts; }, "experts");
    expect_tiles(p, c.vocab_size, [](const RankPlan& r) { return r.vocab; }, "vocab");
    for (const RankPlan& r : p.ranks) {
        EXPECT_EQ(r.heads.size(), 8);
        EXPECT_EQ(r.experts.size(), 32);
        EXPECT_EQ(r.expert_ff.size(), c.moe_intermediate_size);  // whole experts under EP
        EXPECT_EQ(r.kv_layers.begin, 0);                          // no LayerSplit: every rank keeps all KV
        EXPECT_EQ(r.kv_layers.end, c.n_layers_total());
        EXPECT_DOUBLE_EQ(r.kv_bytes_per_token, p.kv_bytes_per_token_total);
        EXPECT_DOUBLE_EQ(r.weight_bytes, p.ranks[0].weight_bytes);  // symmetric shards
    }
    // 78 + 1 MTP latent rows of 656 B, indexer keys of 132 B on 21 full layers + the MTP layer (anchors §2: 53,940 B
    // without the MTP layer).
    EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_total, 79 * 656 + 22 * 132);
}

TEST(ShardPlan, LayerSplitGroupsAreContiguousAndBalanced) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions o;
    o.n_gpus = 8;
    o.layer_split = true;
    const ShardPlan p = make_shard_plan(c, o);
    expect_tiles(p, c.n_layers_total(), [](const RankPlan& r) { return r.kv_layers; }, "KV layers");
    double sum = 0, largest = 0;
    for (const RankPlan& r : p.ranks) {
        sum += r.kv_bytes_per_token;
        largest = std::max(largest, r.kv_bytes_per_token);
    }
    EXPECT_DOUBLE_EQ(sum, p.kv_bytes_per_token_total);
    // The largest group exceeds the even share by less than one layer's bytes.
    EXPECT_LT(largest, p.kv_bytes_per_token_total / 8 + 656 + 132);
    // Experts split by columns without EP: every rank has all 256, a slice of each.
    for (const RankPlan& r : p.ranks) {
        EXPECT_EQ(r.experts.size(), 256);
        EXPECT_EQ(r.expert_ff.size(), c.moe_intermediate_size / 8);
        EXPECT_EQ(r.indexer_heads.size(), 32);  // replicated
    }
}

TEST(ShardPlan, WeightsAddUpToTheCheckpoint) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions one;
    const ShardPlan p1 = make_shard_plan(c, one);
    // zai-org/GLM-5.2-FP8 is 755.6 GB (model-spec §7.2); the plan counts linears at 1 B, the rest at 2 B, no scales.
    EXPECT_NEAR(p1.ranks[0].weight_bytes / 1e9, 755.6, 755.6 * 0.02);
    ParallelOptions eight;
    eight.n_gpus = 8;
    const ShardPlan p8 = make_shard_plan(c, eight);
    // Replicated parts (q_a, kv_a, indexer wk, router, MTP eh_proj) make eight shards a little more than one.
    EXPECT_GT(8 * p8.ranks[0].weight_bytes, p1.ranks[0].weight_bytes);
    EXPECT_LT(8 * p8.ranks[0].weight_bytes, 1.1 * p1.ranks[0].weight_bytes);
}

TEST(ShardPlan, CapacityWithAndWithoutLayerSplit) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions o;
    o.n_gpus = 8;
    o.expert_parallel = true;
    const ShardPlan plain = make_shard_plan(c, o);
    o.layer_split = true;
    const ShardPlan split = make_shard_plan(c, o);
    const double gpu = 126.0 * kGiB;
    const NodeCapacity a = node_capacity(plain, gpu, 1048576), b = node_capacity(split, gpu, 1048576);
    EXPECT_NEAR(a.kv_tokens, std::floor((gpu - plain.ranks[0].weight_bytes) / plain.kv_bytes_per_token_total), 1.0);
    EXPECT_EQ(a.sequences_at_context, 0);  // anchors §2: one 1M sequence does not fit without splitting the KV
    EXPECT_GT(b.kv_tokens, 7.0 * a.kv_tokens);
    EXPECT_GE(b.sequences_at_context, 4);
    // A GPU too small for its weights holds no KV at all.
    EXPECT_EQ(node_capacity(split, 10.0 * kGiB, 1048576).kv_tokens, 0.0);
}

// GLM-5.2 over 4 GPUs: 178.5 GiB of weights each. The error names the shortfall and the smallest count that fits.
TEST(ShardPlan, WeightsThatDoNotFitSayWhatWould) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions o;
    o.n_gpus = 4;
    const auto message = [&](const ModelConfig& m, double gib) {
        try {
            check_weights_fit(m, make_shard_plan(m, o), gib * kGiB);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(message(c, 126.0),
              "sharding plan: the weights do not fit: 178.5 GiB per GPU at --tensor-parallel-size 4, 52.5 GiB more "
              "than --gpu-memory-gib 126; what fits: --tensor-parallel-size 8 (91.0 GiB of weights per GPU), or "
              "--pipeline-parallel-size 2 (94.9 GiB of weights per GPU, 8 GPUs), or --gpu-memory-gib 178.6 or more for "
              "the weights alone");
    EXPECT_NE(message(c, 64.0).find("what fits: --tensor-parallel-size 16 (47.3 GiB"), std::string::npos);
    EXPECT_NE(message(c, 10.0).find("what fits: no power-of-two --tensor-parallel-size up to 1024"), std::string::npos);
    EXPECT_EQ(message(c, 179.0), "no error");
    // Expert columns that divide by 4 but not by 8: 8 GPUs fit with whole experts per rank.
    ModelConfig odd = c;
    odd.moe_intermediate_size = 2052;
    odd.n_shared_experts = 2;  // the shared expert (split by TP) divides by 8
    EXPECT_NE(message(odd, 126.0).find("what fits: --tensor-parallel-size 8 --expert-parallel ("), std::string::npos)
        << message(odd, 126.0);
}

// DeepSeek-V3.2 (its own config.json): 128 heads over 8 GPUs, 16 each, the 64-head indexer replicated; 62 layers
// of KV (the MTP layer's included) at 656 + 132 B. One 8×H200 node holds the weights, one 8×H100 node does not.
TEST(ShardPlan, DeepSeekV32OnEightGpus) {
    const ModelConfig c = load_config(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/config.json");
    ParallelOptions o;
    o.n_gpus = 8;
    o.expert_parallel = true;
    const ShardPlan p = make_shard_plan(c, o);
    ASSERT_EQ(p.ranks.size(), 8u);
    EXPECT_EQ(p.ranks[1].heads.begin, 16);
    EXPECT_EQ(p.ranks[1].heads.end, 32);
    EXPECT_EQ(p.kv_bytes_per_token_total, 62.0 * (656 + 132));
    EXPECT_NO_THROW(check_weights_fit(c, p, 126.0 * kGiB));
    EXPECT_THROW(check_weights_fit(c, p, 72.0 * kGiB), Error);  // 0.9 × 80 GB: two H100 nodes are needed
    o.layer_split = true;
    EXPECT_GE(node_capacity(make_shard_plan(c, o), 126.0 * kGiB, 1048576).sequences_at_context, 6);
}

// Pipeline stages (vLLM's split): GLM-5.2's 78 decoder layers in two stages of 39, the MTP layer on the last; V3.2's
// 61 as 31 + 30 (the extra layer before the last stage, which also holds the LM head). A rank holds its stage's
// weights and KV only; the embedding sits on the first stage and, for the MTP layer, on the last.
TEST(ShardPlan, PipelineStagesSplitLayersWeightsAndKv) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions o;
    o.n_gpus = 8;
    o.expert_parallel = true;
    o.pp = 2;
    const ShardPlan p = make_shard_plan(c, o);
    ASSERT_EQ(p.ranks.size(), 16u);
    EXPECT_EQ(p.ranks[7].stage, 0);
    EXPECT_EQ(p.ranks[8].stage, 1);
    EXPECT_EQ(p.ranks[0].layers.begin, 0);
    EXPECT_EQ(p.ranks[0].layers.end, 39);
    EXPECT_EQ(p.ranks[15].layers.begin, 39);
    EXPECT_EQ(p.ranks[15].layers.end, 79);  // 39 decoder layers and the MTP layer
    EXPECT_EQ(p.ranks[8].heads.begin, 0);   // each stage splits the heads over its own 8 GPUs
    EXPECT_EQ(p.ranks[0].kv_layers.end, 39);
    EXPECT_EQ(p.ranks[0].vocab.size(), 0);  // the LM head is on the last stage
    EXPECT_EQ(p.ranks[8].vocab.size(), c.vocab_size / 8);
    double kv = 0;
    for (const RankPlan* r : {&p.ranks[0], &p.ranks[8]}) kv += r->kv_bytes_per_token;
    EXPECT_DOUBLE_EQ(kv, p.kv_bytes_per_token_total);  // the stages' KV adds up to the model's
    // One GPU per stage: the stages' weights add up to the whole model's plus the last stage's embedding copy.
    ParallelOptions one, two;
    two.pp = 2;
    const double whole = make_shard_plan(c, one).ranks[0].weight_bytes;
    const ShardPlan p2 = make_shard_plan(c, two);
    EXPECT_NEAR(p2.ranks[0].weight_bytes + p2.ranks[1].weight_bytes,
                whole + 2.0 * static_cast<double>(c.vocab_size * c.hidden_size), 1.0);
    // GLM-5.2 on two 8×H100 nodes (0.9 · 80 GB): TP 8 × PP 2 fits, with 6 sequences of 1M under LayerSplit.
    EXPECT_NO_THROW(check_weights_fit(c, p, 72.0 * kGiB));
    o.layer_split = true;
    EXPECT_GE(node_capacity(make_shard_plan(c, o), 72.0 * kGiB, 1048576).sequences_at_context, 6);

    const ModelConfig d = load_config(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/config.json");
    const ShardPlan q = make_shard_plan(d, two);
    EXPECT_EQ(q.ranks[0].layers.end, 31);
    EXPECT_EQ(q.ranks[1].layers.begin, 31);
    EXPECT_EQ(q.ranks[1].layers.end, 62);
    ParallelOptions bad;
    bad.pp = 79;
    EXPECT_THROW(make_shard_plan(c, bad), Error);
    // One layer a stage leaves nothing for LayerSplit to split over 8 GPUs: the table says so instead of failing.
    ParallelOptions thin;
    thin.n_gpus = 8;
    thin.pp = 78;
    const std::string table = format_shard_plan(c, make_shard_plan(c, thin), 10.0 * kGiB, 1048576);
    EXPECT_NE(table.find("with LayerSplit:   not possible: sharding plan: LayerSplit needs at least one layer per GPU"),
              std::string::npos)
        << table;
}

TEST(ShardPlan, BadGpuCountsNameTheDimension) {
    const ModelConfig c = load_config(kGlm52);
    ParallelOptions o;
    o.n_gpus = 3;
    try {
        make_shard_plan(c, o);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("num_attention_heads = 64 does not divide by 3 GPUs"), std::string::npos)
            << e.what();
    }
    o.n_gpus = 128;  // 64 heads
    EXPECT_THROW(make_shard_plan(c, o), Error);
    o.n_gpus = 0;
    EXPECT_THROW(make_shard_plan(c, o), Error);
    // LayerSplit over more GPUs than layers
    ModelConfig small = c;
    small.n_layers = 4;
    small.layer_full.resize(4);
    small.layer_moe.resize(4);
    small.n_mtp_layers = 0;
    small.n_head = 16;
    small.intermediate_size = 16 * 128;
    small.moe_intermediate_size = 16 * 128;
    small.n_head_indexer = 16;
    ParallelOptions ls;
    ls.n_gpus = 8;
    ls.layer_split = true;
    try {
        make_shard_plan(small, ls);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("at least one layer per GPU"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace megactx
