// The host KV tier (kv/kv_tiers.h) on the CPU backend, with a small "device" pool: the tier bookkeeping on its
// own, then tiered = untiered logits bit for bit (fixtures, a long random-model run, a cache that moves blocks
// every step), the engine with a host tier (batching, prefix-cache hits served from the host, a request that fits
// in neither tier).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "model/gen_model.h"

namespace megactx {
namespace {

// Every block in use has exactly one frame, and no two blocks share one.
void expect_frames_distinct(const KvTiers& t, const std::set<int32_t>& in_use) {
    std::set<int32_t> seen;
    for (int32_t b : in_use) {
        const int32_t l = t.loc()[static_cast<size_t>(b)];
        ASSERT_NE(l, kTierNowhere) << "block " << b;
        EXPECT_TRUE(seen.insert(l).second) << "block " << b << " shares frame " << l;
        EXPECT_LT(l >= 0 ? l : -(l + 1), l >= 0 ? t.n_device() : t.n_host()) << "block " << b;
    }
}

TEST(KvTiers, NewBlocksStartOnTheDeviceAndTheLeastRecentlySelectedMoveDown) {
    KvTiers t(2, 3);
    EXPECT_TRUE(t.place(0).empty());
    EXPECT_TRUE(t.place(1).empty());
    EXPECT_GE(t.loc()[0], 0);
    EXPECT_GE(t.loc()[1], 0);
    // Step 1 selects block 1 only; block 0 is then the coldest and makes room for block 2.
    std::vector<int32_t> hits(5, 0);
    hits[1] = 4;
    EXPECT_TRUE(t.end_step(hits).empty());
    const int32_t d0 = t.loc()[0];
    const std::vector<TierMove> m = t.place(2);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].block, 0);
    EXPECT_EQ(m[0].from, d0);
    EXPECT_LT(m[0].to, 0);
    EXPECT_EQ(t.loc()[2], d0);
    EXPECT_EQ(t.stats().demotions, 1);
    expect_frames_distinct(t, {0, 1, 2});
    EXPECT_EQ(t.stats().device_rows, 4);
}

TEST(KvTiers, SelectedHostBlocksArePromotedIntoColdDeviceFrames) {
    KvTiers t(1, 2);
    t.place(0);
    t.place(1);  // block 0 was placed in the same step: block 1 goes to the host
    EXPECT_LT(t.loc()[1], 0);
    std::vector<int32_t> hits(3, 0);
    EXPECT_TRUE(t.end_step(hits).empty());  // a block placed this step is not moved down in it
    hits[1] = 3;                            // only the host block is selected
    const std::vector<TierMove> m = t.end_step(hits);
    ASSERT_EQ(m.size(), 2u);  // block 0 down into a free host frame, block 1 up into its device frame
    EXPECT_EQ(m[0].block, 0);
    EXPECT_EQ(m[1].block, 1);
    EXPECT_GE(t.loc()[1], 0);
    EXPECT_LT(t.loc()[0], 0);
    EXPECT_EQ(t.stats().host_rows, 3);
    EXPECT_EQ(t.stats().promotions, 1);
    expect_frames_distinct(t, {0, 1});

    // A new block takes the device frame of the least recently selected block (1, which moves down).
    t.place(2);
    EXPECT_GE(t.loc()[2], 0);
    EXPECT_LT(t.loc()[1], 0);
    // Now the host tier is full: promoting block 0 swaps it with block 2 through the staging rows — once it is
    // selected in two steps running (a block selected once stays where it is).
    hits.assign(3, 0);
    hits[0] = 1;
    EXPECT_TRUE(t.end_step(hits).empty());
    const std::vector<TierMove> s = t.end_step(hits);
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0].block, 2);
    EXPECT_EQ(s[0].to, kTierStaging);
    EXPECT_EQ(s[1].block, 0);
    EXPECT_EQ(s[2].from, kTierStaging);
    expect_frames_distinct(t, {0, 1, 2});
    EXPECT_GE(t.loc()[0], 0);

    // Blocks selected this step are never demoted for a promotion.
    hits.assign(3, 1);
    EXPECT_TRUE(t.end_step(hits).empty());
    t.drop(1);
    EXPECT_EQ(t.loc()[1], kTierNowhere);
    EXPECT_EQ(t.host_used(), 1);
    EXPECT_EQ(t.device_used(), 1);
}

// A full host tier and several promotions in one step: every swap goes through its own staging block, and the
// moves come in three phases (out of the device, into it, staged blocks down) so each phase copies at once.
TEST(KvTiers, SwapsOfOneStepUseOneStagingBlockEachInThreePhases) {
    KvTiers t(2, 3, 32, 2);
    for (int32_t b = 0; b < 5; ++b) t.place(b);  // blocks 0, 1 on the device, 2, 3, 4 on the host
    std::vector<int32_t> hits(5, 0);
    t.end_step(hits);
    hits = {0, 0, 5, 4, 3};  // all three host blocks selected: two swaps fit the staging rows
    const std::vector<TierMove> m = t.end_step(hits);
    ASSERT_EQ(m.size(), 6u);
    for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(m[static_cast<size_t>(i)].to, kTierStaging + i) << i;        // 0 and 1 out, into staging 0, 1
        EXPECT_GE(m[static_cast<size_t>(2 + i)].to, 0) << i;                   // 2 and 3 up
        EXPECT_EQ(m[static_cast<size_t>(4 + i)].from, kTierStaging + i) << i;  // the staged blocks down
    }
    EXPECT_EQ(m[2].block, 2);
    EXPECT_EQ(m[3].block, 3);
    EXPECT_GE(t.loc()[2], 0);
    EXPECT_GE(t.loc()[3], 0);
    EXPECT_LT(t.loc()[4], 0);  // no staging block left for the third
    EXPECT_EQ(t.stats().promotions, 2);
    expect_frames_distinct(t, {0, 1, 2, 3, 4});
}

// Promotions that are not read again halve the per-step limit (down to 1), then space the single probes out
// (1, 2, 4, ... steps apart, up to 32); promotions that are read double the limit back, a probe at a time.
TEST(KvTiers, PromotionsBackOffWhileThePromotedBlocksAreNotReadAgain) {
    // 16 device blocks, 360 host blocks in use and 40 host frames free (demotions need no staging).
    const int32_t n_device = 16, n_host = 400, n_used = n_device + 360;
    KvTiers t(n_device, n_host, 8);
    for (int32_t b = 0; b < n_used; ++b) t.place(b);
    std::vector<int32_t> hits(static_cast<size_t>(n_device + n_host), 0);
    t.end_step(hits);
    // A selection that moves every step: each host block is selected in two steps running, then never again.
    auto moving = [&](int32_t step) {
        hits.assign(hits.size(), 0);
        for (int32_t j = 0; j < 8; ++j) {
            hits[static_cast<size_t>(n_device + step * 8 + j)] = 2;
            hits[static_cast<size_t>(n_device + (step + 1) * 8 + j)] = 1;
        }
    };
    std::vector<int64_t> promoted;
    for (int32_t step = 0; step < 40; ++step) {
        const int64_t before = t.stats().promotions;
        moving(step);
        t.end_step(hits);
        promoted.push_back(t.stats().promotions - before);
    }
    // (Step 0 promotes too: every block was last stamped when it was placed, the step before.)
    EXPECT_EQ(promoted[0], 8);  // the first promotions take the whole limit
    EXPECT_EQ(promoted[1], 4);  // none of them was read again: 8 → 4 → 2 → 1
    EXPECT_EQ(promoted[2], 2);
    EXPECT_EQ(promoted[3], 1);
    // Then single probes, each missed one doubling the gap to the next: steps 4, 6, 10, 18, 34.
    std::vector<int32_t> probes;
    for (int32_t step = 4; step < 40; ++step) {
        EXPECT_LE(promoted[static_cast<size_t>(step)], 1) << step;
        if (promoted[static_cast<size_t>(step)] == 1) probes.push_back(step);
    }
    EXPECT_EQ(probes, (std::vector<int32_t>{4, 6, 10, 18, 34}));
    EXPECT_EQ(t.promotion_limit(), 1);
    EXPECT_EQ(t.stats().promotions_unread, t.stats().promotions);  // the last probe (34) was judged at 35

    // A stable selection: the promoted blocks are read again, and the limit doubles back to 8.
    hits.assign(hits.size(), 0);
    for (int32_t j = 0; j < 8; ++j) hits[static_cast<size_t>(n_device + 340 + j)] = 3;
    for (int32_t step = 0; step < 40; ++step) t.end_step(hits);
    EXPECT_EQ(t.promotion_limit(), 8);
    for (int32_t j = 0; j < 8; ++j) EXPECT_GE(t.loc()[static_cast<size_t>(n_device + 340 + j)], 0) << j;
    std::set<int32_t> all;
    for (int32_t b = 0; b < n_used; ++b) all.insert(b);
    expect_frames_distinct(t, all);
}

TEST(KvTiers, RandomTrafficKeepsEveryBlockInExactlyOneFrame) {
    std::mt19937 rng(7);
    KvTiers t(3, 9, 4);
    std::set<int32_t> used;
    for (int step = 0; step < 500; ++step) {
        const int32_t b = static_cast<int32_t>(rng() % 12);
        if (used.count(b) && rng() % 2) {
            t.drop(b);
            used.erase(b);
        } else if (!used.count(b)) {
            t.place(b);
            used.insert(b);
        }
        std::vector<int32_t> hits(12, 0);
        for (int32_t u : used)
            if (rng() % 3 == 0) hits[static_cast<size_t>(u)] = 1 + static_cast<int32_t>(rng() % 5);
        t.end_step(hits);
        expect_frames_distinct(t, used);
        EXPECT_EQ(t.device_used() + t.host_used(), static_cast<int64_t>(used.size()));
    }
    EXPECT_GT(t.stats().promotions, 0);
}

// One sequence fed through `kv` in chunks the way SequenceRunner feeds it: end_step (promotions), reserve,
// flush, forward. Returns the logits of every token fed.
struct Feeder {
    const GlmDsaModel& model;
    CpuOps& ops;
    KvCache& kv;
    SeqKv seq;

    std::vector<float> feed(const std::vector<int32_t>& tokens, int64_t chunk) {
        std::vector<float> out;
        for (int64_t i0 = 0; i0 < static_cast<int64_t>(tokens.size()); i0 += chunk) {
            const int64_t m = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size()) - i0);
            kv.end_step();
            if (kv.tiered()) {  // the step's counts were read and cleared for the next step
                const Tensor& hits = kv.tier_hits();
                EXPECT_EQ(std::count(hits.i32(), hits.i32() + hits.numel(), 0), hits.numel());
            }
            seq.reserve(kv.blocks(), seq.n_tokens + m);
            kv.flush_tiers();
            Batch b;
            b.add_sequence(&seq.blocks, tokens.data() + i0, m, seq.n_tokens, true);
            const ForwardResult r = model.forward(ops, b, kv);
            seq.n_tokens += m;
            const size_t off = out.size();
            out.resize(off + static_cast<size_t>(r.logits.numel()));
            std::memcpy(out.data() + off, r.logits.f32(), static_cast<size_t>(r.logits.numel()) * 4);
        }
        return out;
    }
};

std::vector<float> run_through(const GlmDsaModel& model, CpuOps& ops, KvCache& kv, const std::vector<int32_t>& tokens,
                               int64_t chunk) {
    Feeder f{model, ops, kv, {}};
    return f.feed(tokens, chunk);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(TieredKv, LogitsEqualTheUntieredCacheBitForBitOnEveryFixture) {
    for (const std::string& name : test::fixture_names()) {
        if (!std::filesystem::exists(test::fixture_dir(name))) continue;  // (moved aside for a device run)
        const GlmDsaModel model(test::fixture_dir(name));
        const std::vector<int32_t> tokens = test::fixture_tokens(name);
        const int64_t n_blocks = (static_cast<int64_t>(tokens.size()) + kBlockSize - 1) / kBlockSize;
        CpuOps ops;
        for (int64_t chunk : {int64_t{1}, int64_t{7}, static_cast<int64_t>(tokens.size())}) {
            KvCache flat_c(ops, model.config(), n_blocks);
            const std::vector<float> ref = run_through(model, ops, flat_c, tokens, chunk);
            // No device block (every selected row comes through the staging rows), and one.
            for (int64_t n_device : {0, 1}) {
                KvCache tiered(ops, model.config(), n_device, KvFormat::F32, {}, KvTierOptions{n_blocks});
                EXPECT_TRUE(bit_equal(run_through(model, ops, tiered, tokens, chunk), ref))
                    << name << " chunk " << chunk << " device blocks " << n_device;
                tiered.end_step();  // the last forward's selections into the stats
                if (n_device == 0) {
                    EXPECT_GT(tiered.tiers().stats().host_rows, 0) << name;
                }
            }
        }
    }
}

std::string tiny_model_dir() {
    const std::string dir = (std::filesystem::temp_directory_path() / "megactx-test-tiny-seed3").string();
    if (!std::filesystem::exists(dir + "/config.json")) {
        GenModelOptions g;
        g.preset = "tiny";
        g.seed = 3;
        generate_model(dir, g);
    }
    return dir;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return t;
}

// 3,000 tokens (47 blocks) with 4 device blocks: prefill chunks of 512, then 40 tokens one by one, where each
// step selects host blocks and promotes some of them (moving others down).
TEST(TieredKv, LongRunWithBlocksMovingEveryStepEqualsUntiered) {
    const GlmDsaModel model(tiny_model_dir());
    CpuOps ops;
    const std::vector<int32_t> tokens = random_tokens(3000, model.config().vocab_size, 11);
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 2960), rest(tokens.begin() + 2960, tokens.end());
    const auto run = [&](KvCache& kv) {
        Feeder f{model, ops, kv, {}};
        std::vector<float> all = f.feed(prompt, 512);
        const std::vector<float> tail = f.feed(rest, 1);
        all.insert(all.end(), tail.begin(), tail.end());
        return all;
    };
    KvCache flat(ops, model.config(), 47);
    const std::vector<float> ref = run(flat);
    KvCache tiered(ops, model.config(), 4, KvFormat::F32, {}, KvTierOptions{43, 8, 3});
    EXPECT_TRUE(bit_equal(run(tiered), ref));
    tiered.end_step();
    const TierStats& st = tiered.tiers().stats();
    EXPECT_GE(st.promotions, 20);  // blocks moved in most decode steps
    EXPECT_GE(st.demotions, 20);
    EXPECT_GT(st.host_rows, 0);
    EXPECT_GT(st.device_rows, 0);
}

// The runner's byte budgets: a device tier too small for the sequence, completed by the host tier.
TEST(TieredKv, RunnerBudgetsSplitTheSequenceAcrossTiers) {
    const GlmDsaModel model(tiny_model_dir());
    CpuOps ops;
    const std::vector<int32_t> tokens = random_tokens(700, model.config().vocab_size, 5);
    SequenceRunner flat(model, ops, 700);
    const std::vector<float> ref = flat.feed(tokens, 128, true);
    const int64_t per_block = kv_bytes_per_token(model.config(), KvFormat::F32) * kBlockSize;
    // Device: the staging rows (8 · top-k rows of every layer), the indexer keys of the 8 host blocks, 3 blocks.
    const int64_t latent = model.config().d_latent() * 4 * model.config().n_layers_total();  // bytes per token
    const int64_t staging = 8 * model.config().index_topk * latent;
    const int64_t indexer = (per_block / kBlockSize - latent) * kBlockSize * 8;
    SequenceRunner tiered(model, ops, 700, KvFormat::F32, staging + indexer + 3 * per_block, 8 * latent * kBlockSize);
    ASSERT_TRUE(tiered.kv().tiered());
    EXPECT_EQ(tiered.kv().tiers().n_device(), 3);
    EXPECT_EQ(tiered.kv().tiers().n_host(), 8);
    EXPECT_TRUE(bit_equal(tiered.feed(tokens, 128, true), ref));
    // Neither tier large enough: a clear error before anything runs.
    try {
        SequenceRunner small(model, ops, 700, KvFormat::F32, staging + indexer + 3 * per_block,
                             4 * latent * kBlockSize);
        FAIL() << "a 700-token sequence fit in 3 + 4 blocks";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv-offload-memory"), std::string::npos) << e.what();
    }
}

struct Harness {
    GlmDsaModel model{test::fixture_dir("freq_offset_f32")};
    CpuOps ops;
    std::map<int64_t, std::vector<int32_t>> tokens;
    std::map<int64_t, std::vector<TokenLogprobs>> logprobs;
    std::map<int64_t, int64_t> cached;

    TokenSink sink() {
        return [this](const TokenEvent& ev) {
            if (ev.token >= 0) {
                tokens[ev.request_id].push_back(ev.token);
                if (ev.has_logprobs) logprobs[ev.request_id].push_back(ev.logprobs);
            }
            cached[ev.request_id] = ev.n_cached_prompt;
            return true;
        };
    }
    std::vector<int32_t> prompt(int64_t n, uint32_t seed) const {
        return random_tokens(n, model.config().vocab_size, seed);
    }
};

GenerationParams greedy(int64_t max_tokens, int64_t top_logprobs = 0) {
    GenerationParams g;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    g.top_logprobs = top_logprobs;
    return g;
}

// staging_rows 0: sized by the budget (here one pass a step); 3: decode batches and prefill chunks in passes.
class TieredKvEngine : public ::testing::TestWithParam<int64_t> {};

TEST_P(TieredKvEngine, BatchedRequestsAndAHostTierPrefixHitEqualTheUntieredEngine) {
    Harness h;
    const int64_t V = h.model.config().vocab_size;
    const std::vector<int32_t> shared = h.prompt(200, 1);
    // The same requests on an untiered engine and on one with 2 device blocks and 30 host blocks.
    const auto serve = [&](EngineConfig cfg) {
        cfg.scheduler.max_num_batched_tokens = 96;
        Engine e(h.model, h.ops, cfg);
        std::vector<int64_t> ids;
        for (uint32_t i = 0; i < 4; ++i) ids.push_back(e.submit(h.prompt(50 + 40 * i, 10 + i), greedy(12), h.sink()));
        ids.push_back(e.submit(shared, greedy(6, V), h.sink()));
        while (e.step()) {
        }
        const EngineStats mid = e.stats();
        ids.push_back(e.submit(shared, greedy(6, V), h.sink()));  // a prefix hit on blocks now in the host tier
        while (e.step()) {
        }
        return std::make_pair(ids, mid);
    };
    EngineConfig flat;
    flat.n_kv_blocks = 32;
    const auto [ref_ids, ref_mid] = serve(flat);
    EngineConfig tiered;
    tiered.n_kv_blocks = 2;
    tiered.n_kv_host_blocks = 30;
    tiered.kv_staging_rows = GetParam();
    const auto [ids, mid] = serve(tiered);
    EXPECT_GT(mid.kv_host_blocks_used, 0);  // the shared prompt's cached blocks are (partly) on the host
    EXPECT_EQ(h.cached[ids.back()], 192);   // three full blocks served from the cache
    EXPECT_EQ(h.cached[ref_ids.back()], 192);
    for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(h.tokens[ids[i]], h.tokens[ref_ids[i]]) << "request " << i;
        const auto& a = h.logprobs[ids[i]];
        const auto& b = h.logprobs[ref_ids[i]];
        ASSERT_EQ(a.size(), b.size());
        for (size_t j = 0; j < a.size(); ++j) {
            ASSERT_EQ(a[j].top.size(), b[j].top.size());
            for (size_t k = 0; k < a[j].top.size(); ++k) {
                ASSERT_EQ(a[j].top[k].first, b[j].top[k].first);
                ASSERT_EQ(0, std::memcmp(&a[j].top[k].second, &b[j].top[k].second, 4)) << "request " << i;
            }
        }
    }
    // The hit equals its own cold run too (the same engine's first request of that prompt).
    EXPECT_EQ(h.tokens[ids[4]], h.tokens[ids[5]]);
}

INSTANTIATE_TEST_SUITE_P(StagingRows, TieredKvEngine, ::testing::Values(int64_t{0}, int64_t{3}));

// MTP speculation over a host tier: a verification's K + 1 rows select more rows, gathered from the host in the
// staging passes. Greedy tokens equal plain decoding's, tiered or not; with a forced acceptance (drafts accepted at
// random whatever the target says, so most verifications keep several rows) the tiered engine's tokens equal the
// untiered one's.
TEST(TieredKvEngine, SpeculativeDecodingEqualsTheUntieredEngine) {
    Harness h;
    ASSERT_TRUE(h.model.has_mtp());
    const auto serve = [&](int64_t k, int64_t host_blocks, int64_t staging_rows, double forced, EngineStats* stats) {
        EngineConfig cfg;
        cfg.n_kv_blocks = host_blocks > 0 ? 2 : 32;
        cfg.n_kv_host_blocks = host_blocks;
        cfg.kv_staging_rows = staging_rows;
        cfg.speculative_tokens = k;
        cfg.forced_acceptance_length = forced;
        cfg.forced_acceptance_seed = 5;
        cfg.scheduler.max_num_batched_tokens = 96;
        Engine e(h.model, h.ops, cfg);
        std::vector<int64_t> ids;
        for (uint32_t i = 0; i < 3; ++i) ids.push_back(e.submit(h.prompt(60 + 50 * i, 40 + i), greedy(20), h.sink()));
        while (e.step()) {
        }
        if (stats) *stats = e.stats();
        std::vector<std::vector<int32_t>> out;
        for (const int64_t id : ids) out.push_back(h.tokens[id]);
        h.tokens.clear();
        return out;
    };
    const auto plain = serve(0, 0, 0, 0.0, nullptr);
    EXPECT_EQ(serve(3, 0, 0, 0.0, nullptr), plain);
    EngineStats tiered;
    EXPECT_EQ(serve(3, 30, 0, 0.0, &tiered), plain);
    EXPECT_GT(tiered.kv_fetched_rows, 0);
    EXPECT_EQ(serve(3, 30, 3, 0.0, nullptr), plain);
    EngineStats forced;
    const auto forced_flat = serve(3, 0, 0, 3.0, &forced);
    EXPECT_GT(forced.spec.mean_acceptance_length(), 2.0);
    EXPECT_EQ(serve(3, 30, 0, 3.0, nullptr), forced_flat);
    EXPECT_EQ(serve(3, 30, 3, 3.0, nullptr), forced_flat);
}

TEST(KvTierBlocks, StagingRowsFollowTheStepUpToAnEighthOfTheDeviceBudget) {
    const GlmDsaModel model(test::fixture_dir("freq_offset_f32"));
    const ModelConfig& c = model.config();
    const int64_t latent = c.d_latent() * 4 * c.n_layers_total();  // a token's f32 latent rows, all layers
    const int64_t per_query_row = c.index_topk * latent;  // staging bytes of one query row's selection
    const int64_t big = int64_t{1} << 30, host = 4 * kBlockSize * latent;  // four host blocks
    EXPECT_EQ(kv_tier_blocks(c, KvFormat::F32, {}, big, host, 0, 2048).rows_per_pass,
              std::min<int64_t>(2048, big / 8 / per_query_row));
    EXPECT_EQ(kv_tier_blocks(c, KvFormat::F32, {}, big, host, 0, 20).rows_per_pass, 20);  // the step's rows
    EXPECT_EQ(kv_tier_blocks(c, KvFormat::F32, {}, big, host, 0, 3).rows_per_pass, 8);    // at least 8
    EXPECT_EQ(kv_tier_blocks(c, KvFormat::F32, {}, 40 * per_query_row, host, 0, 2048).rows_per_pass, 8);
    EXPECT_EQ(kv_tier_blocks(c, KvFormat::F32, {}, 160 * per_query_row, host, 0, 2048).rows_per_pass, 20);
    EXPECT_EQ(kv_tier_blocks(c, KvFormat::F32, {}, big, host, 5, 2048).rows_per_pass, 5);  // as given
    // The staging rows are paid from the device budget.
    EXPECT_GT(kv_tier_blocks(c, KvFormat::F32, {}, big, host, 8, 2048).device,
              kv_tier_blocks(c, KvFormat::F32, {}, big, host, 0, 2048).device);
}

TEST(TieredKvEngineStats, TheFetchStallIsTheTimeSpentGatheringHostRows) {
    Harness h;
    const auto run = [&](int64_t device_blocks, int64_t host_blocks) {
        EngineConfig cfg;
        cfg.n_kv_blocks = device_blocks;
        cfg.n_kv_host_blocks = host_blocks;
        cfg.scheduler.max_num_batched_tokens = 96;
        Engine e(h.model, h.ops, cfg);
        for (uint32_t i = 0; i < 3; ++i) e.submit(h.prompt(150, 20 + i), greedy(16), h.sink());
        while (e.step()) {
        }
        return e.stats();
    };
    const EngineStats flat = run(32, 0);
    EXPECT_EQ(flat.kv_fetch_stall_s, 0.0);
    EXPECT_EQ(h.ops.kv_fetch_stall_ns(), 0);  // no host tier: nothing is gathered
    EXPECT_GT(flat.step_s, 0.0);
    const EngineStats tiered = run(2, 30);
    ASSERT_GT(tiered.kv_fetched_rows, 0);
    EXPECT_GT(tiered.kv_fetch_stall_s, 0.0);
    EXPECT_LT(tiered.kv_fetch_stall_s, tiered.step_s);  // the gathers are a part of the steps
}

TEST(TieredKvAdmission, ARequestBeyondBothTiersIsAClearError) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 2;
    cfg.n_kv_host_blocks = 3;
    Engine e(h.model, h.ops, cfg);
    EXPECT_NE(e.kv_capacity_line().find("2 device blocks"), std::string::npos) << e.kv_capacity_line();
    try {
        e.submit(h.prompt(300, 2), greedy(30), h.sink());
        FAIL() << "330 tokens fit in 5 blocks";
    } catch (const Error& err) {
        const std::string m = err.what();
        EXPECT_NE(m.find("128 on the device and 192 in the host tier"), std::string::npos) << m;
    }
    const int64_t ok = e.submit(h.prompt(250, 3), greedy(20), h.sink());  // 270 tokens: both tiers
    while (e.step()) {
    }
    EXPECT_EQ(h.tokens[ok].size(), 20u);
    EXPECT_TRUE(e.alive());
}

}  // namespace
}  // namespace megactx
