// MTP speculative decoding in the engine (EngineConfig::speculative_tokens): at temperature 0 the tokens and
// log-probabilities equal plain decoding's for every K, with continuous batching, chunked prefill, prefix-cache
// hits, preemption and max_tokens or a stop token landing inside an accepted run; the shipped model's drafts are
// accepted; rejection sampling reproduces the target distribution exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/speculative.h"

namespace megactx {
namespace {

struct Out {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    FinishReason finish = FinishReason::kNone;
    SpecStats spec;
};

// Runs the requests (prompt, params) through one engine to the end; outputs by submission order.
std::vector<Out> serve(const GlmDsaModel& model, EngineConfig cfg,
                       const std::vector<std::pair<std::vector<int32_t>, GenerationParams>>& reqs,
                       EngineStats* stats = nullptr, Ops* backend = nullptr) {
    CpuOps cpu;
    Ops& ops = backend ? *backend : cpu;
    Engine e(model, ops, cfg);
    std::map<int64_t, Out> by_id;
    std::vector<int64_t> ids;
    for (const auto& [prompt, params] : reqs) {
        ids.push_back(e.submit(prompt, params, [&by_id](const TokenEvent& ev) {
            Out& o = by_id[ev.request_id];
            if (ev.token >= 0) {
                o.tokens.push_back(ev.token);
                if (ev.has_logprobs) o.logprobs.push_back(ev.logprobs.logprob);
            }
            if (ev.finish != FinishReason::kNone) o.finish = ev.finish;
            o.spec = ev.spec;
            return true;
        }));
    }
    while (e.step()) {
    }
    if (stats) *stats = e.stats();
    std::vector<Out> out;
    for (int64_t id : ids) out.push_back(by_id[id]);
    return out;
}

GenerationParams greedy(int64_t max_tokens) {
    GenerationParams g;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    g.top_logprobs = 0;
    return g;
}

std::vector<int32_t> prompt_of(const std::string& fixture, int64_t n, int32_t salt, int32_t vocab) {
    const std::vector<int32_t> base = test::fixture_tokens(fixture);
    std::vector<int32_t> p;
    for (int64_t i = 0; i < n; ++i)
        p.push_back((base[i % base.size()] + salt * static_cast<int32_t>(i / 5)) % (vocab - 2) + 2);
    return p;
}

void expect_same(const std::vector<Out>& plain, const std::vector<Out>& spec, const std::string& what) {
    ASSERT_EQ(plain.size(), spec.size());
    for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_EQ(plain[i].tokens, spec[i].tokens) << what << ", request " << i;
        EXPECT_EQ(plain[i].finish, spec[i].finish) << what << ", request " << i;
        ASSERT_EQ(plain[i].logprobs.size(), spec[i].logprobs.size()) << what;
        for (size_t j = 0; j < plain[i].logprobs.size(); ++j) {
            // The verify rows compute the same positions in a different batch shape: equal to float rounding.
            EXPECT_NEAR(plain[i].logprobs[j], spec[i].logprobs[j], 1e-4) << what << ", request " << i << " token " << j;
        }
    }
}

void greedy_equals_plain_under_continuous_batching(const std::string& f) {
    const GlmDsaModel model(test::fixture_dir(f));
    ASSERT_TRUE(model.has_mtp());
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
    for (int i = 0; i < 8; ++i)
        reqs.push_back(
            {prompt_of(f, 10 + 23 * i, i + 1, static_cast<int32_t>(model.config().vocab_size)), greedy(5 + 3 * i)});
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    cfg.scheduler.max_num_batched_tokens = 48;
    const std::vector<Out> plain = serve(model, cfg, reqs);
    for (int64_t k : {1, 2, 4, 7}) {
        cfg.speculative_tokens = k;
        EngineStats st;
        const std::vector<Out> spec = serve(model, cfg, reqs, &st);
        expect_same(plain, spec, "K=" + std::to_string(k));
        EXPECT_GT(st.spec.verifications, 0);
        EXPECT_EQ(st.spec.drafted_at.size(), static_cast<size_t>(k));
        int64_t drafted = 0;
        for (const Out& o : spec) drafted += o.spec.drafted;
        EXPECT_EQ(drafted, st.spec.drafted);  // per-request counts add up to the engine's
    }
}

// Eight requests of different lengths, chunked prefill interleaved with (speculative) decodes, on the random
// fixture models (their MTP drafts are mostly rejected: the exactness of rejection is what is checked here): GLM's,
// whose draft steps share step 0's top-k, and DeepSeek-V3.2's, whose MTP layer runs its indexer at every step.
TEST(Speculative, GreedyEqualsPlainUnderContinuousBatching) {
    for (const std::string f : {"freq_offset_f32", "dsv32_yarn_f32"}) {
        SCOPED_TRACE(f);
        greedy_equals_plain_under_continuous_batching(f);
    }
}

// --speculative-disable-by-batch-size N (vLLM's disable_by_batch_size): no drafts in a step where more than N
// sequences decode; drafting resumes once the batch has shrunk. Tokens stay plain decoding's; a negative value is
// a clear error.
TEST(Speculative, DisableByBatchSizeStopsDraftingInLargeBatches) {
    const std::string f = "freq_offset_f32";
    const GlmDsaModel model(test::fixture_dir(f));
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
    for (int i = 0; i < 4; ++i)
        reqs.push_back({prompt_of(f, 12 + 7 * i, i + 1, static_cast<int32_t>(model.config().vocab_size)),
                        greedy(6 + 10 * i)});
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    const std::vector<Out> plain = serve(model, cfg, reqs);
    cfg.speculative_tokens = 2;
    EngineStats all, limited, none;
    expect_same(plain, serve(model, cfg, reqs, &all), "K=2");
    cfg.speculative_disable_by_batch_size = 2;
    const std::vector<Out> lim = serve(model, cfg, reqs, &limited);
    expect_same(plain, lim, "K=2, disabled above 2 decoding");
    cfg.speculative_disable_by_batch_size = 4;
    expect_same(plain, serve(model, cfg, reqs, &none), "K=2, disabled above 4 decoding");
    EXPECT_EQ(none.spec.drafted, all.spec.drafted);  // never more than 4 decode: nothing changes
    EXPECT_GT(limited.spec.drafted, 0);               // the two longest requests draft once alone
    EXPECT_LT(limited.spec.drafted, all.spec.drafted);
    EXPECT_EQ(lim[0].spec.drafted, 0);  // the shortest request always decodes beside three others
    EXPECT_GT(lim[3].spec.drafted, 0);
    cfg.speculative_disable_by_batch_size = -1;
    CpuOps ops;
    EXPECT_THROW(Engine(model, ops, cfg), Error);
}

// The plans GraphedForward pads for CUDA graphs (MEGACTX_GRAPHS=pad runs every eligible step eagerly with its
// padded plan on any backend): with prompts beyond 32 tokens and mixed decode/prefill steps, the greedy draft
// chain, the verification steps and plain decode give the same tokens as unpadded runs, and the drafts are the
// same (acceptance counts per position equal). Under ASan this also checks that no padded step writes outside
// its buffers.
TEST(Speculative, PaddedGraphPlansKeepDraftsAndTokens) {
    const GlmDsaModel model(MEGACTX_DEFAULT_MODEL_DIR);
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
    for (int i = 0; i < 3; ++i)
        reqs.push_back({std::vector<int32_t>(text.begin(), text.begin() + 40 + 100 * i), greedy(24 + 4 * i)});
    EngineConfig cfg;
    cfg.n_kv_blocks = 32;
    cfg.scheduler.max_num_batched_tokens = 64;
    const std::vector<Out> plain = serve(model, cfg, reqs);
    cfg.speculative_tokens = 3;
    EngineStats unpadded, padded;
    const std::vector<Out> a = serve(model, cfg, reqs, &unpadded);
    setenv("MEGACTX_GRAPHS", "pad", 1);
    const std::vector<Out> b = serve(model, cfg, reqs, &padded);
    unsetenv("MEGACTX_GRAPHS");
    expect_same(plain, a, "K=3");
    expect_same(plain, b, "K=3, padded plans");
    EXPECT_EQ(padded.spec.accepted_at, unpadded.spec.accepted_at);
    EXPECT_EQ(padded.spec.drafted_at, unpadded.spec.drafted_at);
    EXPECT_GT(padded.spec.accepted, 0);
}

// Twelve greedy requests decoding together with K = 3 and graphs (MEGACTX_GRAPHS=pad: the padded plans, eagerly,
// on the CPU): step 0 of the draft chain covers each request's whole verification, so the steps take a handful
// of shapes (they change as requests finish), not one per acceptance pattern; the tokens stay plain decoding's.
TEST(Speculative, BatchedDraftChainKeepsItsShape) {
    // Under the sanitizers (tens of times slower) a short run, for memory errors and exactness only: the shape
    // count needs the long run, whose steady state outweighs the steps where requests finish.
#if defined(__SANITIZE_ADDRESS__)
    const bool sanitized = true;
#else
    const bool sanitized = false;
#endif
    const GlmDsaModel model(MEGACTX_DEFAULT_MODEL_DIR);
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
    for (int i = 0; i < 12; ++i)
        reqs.push_back({std::vector<int32_t>(text.begin() + 3 * i, text.begin() + 40 + 5 * i),
                        greedy(sanitized ? 16 : 300)});
    EngineConfig cfg;
    cfg.n_kv_blocks = 128;
    cfg.scheduler.max_num_batched_tokens = 1024;  // the prompts in one step
    const std::vector<Out> plain = serve(model, cfg, reqs);
    cfg.speculative_tokens = 3;
    EngineStats st;
    setenv("MEGACTX_GRAPHS", "pad", 1);
    const std::vector<Out> spec = serve(model, cfg, reqs, &st);
    unsetenv("MEGACTX_GRAPHS");
    expect_same(plain, spec, "12 requests, K=3, padded plans");
    std::printf("12 requests, K = 3: %lld steps, %lld step shapes, %lld of %lld drafts accepted\n",
                static_cast<long long>(st.steps), static_cast<long long>(st.graph_shapes),
                static_cast<long long>(st.spec.accepted), static_cast<long long>(st.spec.drafted));
    EXPECT_GT(st.spec.accepted, 0);
    // A verification shape and a chain shape, new only when the requests or their draft counts change (as they
    // finish); with step 0 over the accepted rows only, nearly every step was a new chain shape.
    if (!sanitized) {
        EXPECT_LT(2 * st.graph_shapes, st.steps);
    }
}

// The shipped model drafts well: greedy output unchanged, most first drafts accepted, several tokens per step,
// and with IndexShare across draft steps turned off the tokens are still the same.
TEST(Speculative, ShippedModelAcceptsDraftsAndStaysExact) {
    const GlmDsaModel model(MEGACTX_DEFAULT_MODEL_DIR);
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
    for (int i = 0; i < 3; ++i)
        reqs.push_back({std::vector<int32_t>(text.begin(), text.begin() + 60 + 50 * i), greedy(40)});
    EngineConfig cfg;
    cfg.n_kv_blocks = 32;
    const std::vector<Out> plain = serve(model, cfg, reqs);
    cfg.speculative_tokens = 3;
    EngineStats st;
    expect_same(plain, serve(model, cfg, reqs, &st), "glm-demo K=3");
    ASSERT_EQ(st.spec.drafted_at.size(), 3u);
    const double first = static_cast<double>(st.spec.accepted_at[0]) / static_cast<double>(st.spec.drafted_at[0]);
    std::printf("glm-demo K=3: first-draft acceptance %.2f, mean acceptance length %.2f\n", first,
                st.spec.mean_acceptance_length());
    EXPECT_GT(first, 0.4);
    EXPECT_GT(st.spec.mean_acceptance_length(), 1.5);
    cfg.no_mtp_index_share = true;
    expect_same(plain, serve(model, cfg, reqs), "glm-demo K=3 without IndexShare across draft steps");
}

// Greedy rows whose requests want no log-probabilities take their tokens from the backend's argmax_rows, and no
// logits leave the backend (Engine::step_once): the same tokens as the host's path (the same requests with
// log-probabilities), with and without drafts; beside a sampled request the logits come back for it alone to use.
class DownloadCountingOps final : public CpuOps {
  public:
    int64_t float_bytes = 0, int_bytes = 0;
    void download(const Tensor& t, void* host) override {
        (t.dtype == DType::I32 ? int_bytes : float_bytes) += t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
        CpuOps::download(t, host);
    }
};

TEST(Speculative, GreedyRowsDownloadOnlyTheirArgmax) {
    const GlmDsaModel model(MEGACTX_DEFAULT_MODEL_DIR);
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> ids, host;
    for (int i = 0; i < 3; ++i) {
        GenerationParams g = greedy(24 + 8 * i);
        host.push_back({std::vector<int32_t>(text.begin() + 10 * i, text.begin() + 50 + 30 * i), g});
        g.top_logprobs = -1;
        ids.push_back({host.back().first, g});
    }
    EngineConfig cfg;
    cfg.n_kv_blocks = 32;
    for (const int64_t k : {0, 3}) {
        cfg.speculative_tokens = k;
        const std::string tag = "K=" + std::to_string(k);
        DownloadCountingOps a, b;
        const std::vector<Out> by_ids = serve(model, cfg, ids, nullptr, &a);
        const std::vector<Out> by_host = serve(model, cfg, host, nullptr, &b);
        for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(by_ids[i].tokens, by_host[i].tokens) << tag << ", request " << i;
        EXPECT_EQ(a.float_bytes, 0) << tag;
        EXPECT_GT(a.int_bytes, 0) << tag;
        EXPECT_GT(b.float_bytes, 0) << tag;
        // Beside a sampled request: the greedy ones' tokens unchanged.
        auto mixed = ids;
        GenerationParams sampled = greedy(20);
        sampled.top_logprobs = -1;
        sampled.sampling.temperature = 1.0f;
        sampled.sampling.seed = 5;
        mixed.push_back({ids[0].first, sampled});
        DownloadCountingOps c;
        const std::vector<Out> with_sampled = serve(model, cfg, mixed, nullptr, &c);
        for (size_t i = 0; i < ids.size(); ++i)
            EXPECT_EQ(with_sampled[i].tokens, by_ids[i].tokens) << tag << " beside a sampled request, request " << i;
        EXPECT_EQ(with_sampled.back().tokens.size(), 20u);
        EXPECT_GT(c.float_bytes, 0) << tag;
    }
}

// A prompt served twice (the second a prefix-cache hit), and requests preempted under KV pressure.
TEST(Speculative, PrefixHitsAndPreemptionKeepGreedyExact) {
    const std::string f = "freq_offset_f32";
    const GlmDsaModel model(test::fixture_dir(f));
    const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> twice = {{prompt_of(f, 150, 3, vocab), greedy(12)},
                                                                            {prompt_of(f, 150, 3, vocab), greedy(12)}};
    EngineConfig cfg;
    cfg.n_kv_blocks = 16;
    cfg.scheduler.max_num_seqs = 1;  // the second runs after the first has published its blocks
    const std::vector<Out> plain = serve(model, cfg, twice);
    cfg.speculative_tokens = 4;
    EngineStats st;
    expect_same(plain, serve(model, cfg, twice, &st), "prefix hit");
    EXPECT_EQ(st.prefix_hit_tokens, 128);
    // Sampling with a seed: the hit gives the cold run's tokens (same prompt, so the cached MTP KV is the same).
    for (auto& r : twice) {
        r.second.sampling.temperature = 1.0f;
        r.second.sampling.seed = 9;
    }
    const std::vector<Out> sampled = serve(model, cfg, twice, &st);
    EXPECT_EQ(st.prefix_hit_tokens, 128);
    EXPECT_EQ(sampled[0].tokens, sampled[1].tokens);
    EXPECT_GT(sampled[0].spec.verifications, 0);

    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> four;
    for (int i = 0; i < 4; ++i) four.push_back({prompt_of(f, 60 + i, i + 5, vocab), greedy(70)});
    EngineConfig small;
    small.n_kv_blocks = 7;
    small.scheduler.max_num_batched_tokens = 64;
    const std::vector<Out> p2 = serve(model, small, four);
    small.speculative_tokens = 3;
    expect_same(p2, serve(model, small, four, &st), "preemption");
    EXPECT_GT(st.preemptions, 0);
}

// A prefix hit whose prompt goes on differently from the cached one right after a block: the MTP KV at that block's
// last position was written with the cached sequence's next token, so the block is not reused (with speculation a
// block's key covers the token after it). Seeded sampling with speculation then gives the cold run's tokens.
TEST(Speculative, PrefixHitDivergingAtABlockEdgeSamplesAsCold) {
    const std::string f = "freq_offset_f32";
    const GlmDsaModel model(test::fixture_dir(f));
    const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
    const std::vector<int32_t> shared = prompt_of(f, 128, 3, vocab);  // two whole blocks
    std::vector<int32_t> a = shared, b = shared;
    for (int32_t i = 0; i < 20; ++i) {
        a.push_back((7 + 13 * i) % (vocab - 2) + 2);
        b.push_back((11 + 17 * i) % (vocab - 2) + 2);
    }
    GenerationParams g = greedy(48);
    g.sampling.temperature = 1.0f;
    g.sampling.seed = 5;
    EngineConfig cfg;
    cfg.n_kv_blocks = 24;
    cfg.scheduler.max_num_seqs = 1;  // b runs after a has published its blocks
    cfg.speculative_tokens = 3;
    EngineStats st;
    const std::vector<Out> both = serve(model, cfg, {{a, g}, {b, g}}, &st);
    EXPECT_EQ(st.prefix_hit_tokens, 64);  // the first block; the second's last MTP row read a's token 128
    const std::vector<Out> cold = serve(model, cfg, {{b, g}});
    EXPECT_EQ(both[1].tokens, cold[0].tokens);
    ASSERT_EQ(both[1].logprobs.size(), cold[0].logprobs.size());
    for (size_t j = 0; j < cold[0].logprobs.size(); ++j) EXPECT_EQ(both[1].logprobs[j], cold[0].logprobs[j]) << j;
    EXPECT_GT(cold[0].spec.verifications, 0);
}

// max_tokens inside an accepted run ends the request at exactly max_tokens; a stop token inside it ends it there.
TEST(Speculative, MaxTokensAndStopTokensInsideAnAcceptedRun) {
    const GlmDsaModel model(MEGACTX_DEFAULT_MODEL_DIR);
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    const std::vector<int32_t> prompt(text.begin(), text.begin() + 100);
    EngineConfig cfg;
    cfg.n_kv_blocks = 8;
    const std::vector<Out> ref = serve(model, cfg, {{prompt, greedy(30)}});
    cfg.speculative_tokens = 5;
    for (int64_t n : {1, 2, 7, 13}) {
        const std::vector<Out> o = serve(model, cfg, {{prompt, greedy(n)}});
        ASSERT_EQ(o[0].tokens.size(), static_cast<size_t>(n));
        EXPECT_EQ(o[0].finish, FinishReason::kLength);
        EXPECT_EQ(o[0].tokens, std::vector<int32_t>(ref[0].tokens.begin(), ref[0].tokens.begin() + n));
    }
    GenerationParams g = greedy(30);
    g.stop_token_ids = {ref[0].tokens[9]};
    const std::vector<Out> o = serve(model, cfg, {{prompt, g}});
    const auto first = std::find(ref[0].tokens.begin(), ref[0].tokens.end(), ref[0].tokens[9]);
    const size_t until = static_cast<size_t>(first - ref[0].tokens.begin()) + 1;
    EXPECT_EQ(o[0].finish, FinishReason::kStop);
    EXPECT_EQ(o[0].tokens, std::vector<int32_t>(ref[0].tokens.begin(), ref[0].tokens.begin() + until));
}

TEST(Speculative, BadSettingsAreClearErrors) {
    const GlmDsaModel model(test::fixture_dir("freq_offset_f32"));
    CpuOps ops;
    EngineConfig cfg;
    cfg.n_kv_blocks = 4;
    cfg.speculative_tokens = 8;
    try {
        Engine e(model, ops, cfg);
        ADD_FAILURE() << "K = 8 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--speculative-tokens must be in [0, 7]"), std::string::npos) << e.what();
    }
}

// Set acceptance for benchmarks (EngineConfig::forced_acceptance_length): alpha gives the asked mean length, the
// engine reaches it, alpha = 0 is plain decoding, and with every draft accepted the target's own tokens (one after
// each accepted run) are what a cold run of the same text picks: the forced path leaves a consistent KV cache.
TEST(Speculative, ForcedAcceptanceSetsTheAcceptanceLength) {
    for (auto [len, k] : std::vector<std::pair<double, int64_t>>{{3.0, 3}, {5.47, 7}, {1.0, 3}, {4.0, 3}}) {
        const ForcedAcceptance f(len, k, 1);
        EXPECT_NEAR(acceptance_length(f.alpha(), k), len, 1e-9) << len << " at K = " << k;
    }
    EXPECT_NEAR(ForcedAcceptance(3.0, 3, 1).alpha(), 0.8105, 1e-3);  // 1 + a + a^2 + a^3 = 3
    EXPECT_THROW(ForcedAcceptance(4.5, 3, 1), Error);
    EXPECT_THROW(ForcedAcceptance(0.5, 3, 1), Error);
    EXPECT_THROW(ForcedAcceptance(2.0, 0, 1), Error);

    const std::string fx = "freq_offset_f32";
    const GlmDsaModel model(test::fixture_dir(fx));
    const auto vocab = static_cast<int32_t>(model.config().vocab_size);
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
    for (int i = 0; i < 6; ++i) reqs.push_back({prompt_of(fx, 12 + 7 * i, i + 1, vocab), greedy(60)});
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    cfg.speculative_tokens = 3;
    cfg.forced_acceptance_length = 3.0;
    EngineStats st;
    serve(model, cfg, reqs, &st);
    // about 120 verifications; the length of one has a standard deviation of about 1.1 tokens
    EXPECT_NEAR(st.spec.mean_acceptance_length(), 3.0, 0.3) << st.spec.summary();
    EXPECT_GT(st.spec.verifications, 80);

    EngineConfig plain_cfg = cfg;
    plain_cfg.speculative_tokens = 0;
    plain_cfg.forced_acceptance_length = 0.0;
    const std::vector<Out> plain = serve(model, plain_cfg, reqs);
    cfg.forced_acceptance_length = 1.0;  // alpha = 0: every draft rejected, the target's tokens
    expect_same(plain, serve(model, cfg, reqs), "forced length 1");

    cfg.forced_acceptance_length = 4.0;  // alpha = 1: every draft accepted
    const std::vector<std::pair<std::vector<int32_t>, GenerationParams>> one = {reqs[2]};
    const std::vector<Out> forced = serve(model, cfg, one, &st);
    EXPECT_EQ(st.spec.accepted, st.spec.drafted);
    const std::vector<int32_t>& out = forced[0].tokens;
    ASSERT_EQ(out.size(), 60u);
    EXPECT_NE(out, plain[2].tokens);  // the drafts are not the target's greedy text on this random model
    plain_cfg.n_kv_blocks = 16;
    for (size_t j = 0; j + 4 <= out.size(); j += 4) {  // the first token, then one after each run of 3 drafts
        std::vector<int32_t> text = reqs[2].first;
        text.insert(text.end(), out.begin(), out.begin() + static_cast<long>(j));
        const std::vector<Out> cold = serve(model, plain_cfg, {{text, greedy(1)}});
        EXPECT_EQ(cold[0].tokens.at(0), out[j]) << "target token at output position " << j;
    }
}

// Rejection sampling (one draft): the first token is distributed as p whatever q is. 200,000 trials on a
// four-token vocabulary, seeded: each probability within 0.005 (about 4 standard deviations).
TEST(Speculative, RejectionSamplingGivesTheTargetDistribution) {
    const std::vector<float> p = {0.5f, 0.3f, 0.15f, 0.05f};
    const std::vector<float> q = {0.1f, 0.6f, 0.1f, 0.2f};
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 11;
    Sampler draft_rng(SamplingParams{1.0f, 1.0f, 0, 5});
    Sampler s(sp);
    std::vector<double> count(4, 0.0);
    const int n = 200000;
    int64_t accepted = 0;
    for (int t = 0; t < n; ++t) {
        const int32_t x = draft_rng.draw(q);
        const Verified v = verify_drafts(s, {x}, {q}, {p, p});
        count[static_cast<size_t>(v.tokens[0])] += 1.0;
        accepted += v.n_accepted;
    }
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(count[i] / n, p[i], 0.005) << "token " << i;
    // Expected acceptance: sum of min(p, q) = 0.1 + 0.3 + 0.1 + 0.05 = 0.55.
    EXPECT_NEAR(static_cast<double>(accepted) / n, 0.55, 0.005);

    // Greedy: a draft equal to the argmax is accepted, any other is replaced by it.
    Sampler g(SamplingParams{});
    const std::vector<float> one_hot = {0.0f, 0.0f, 1.0f, 0.0f};
    Verified v = verify_drafts(g, {2, 2}, {{}, {}}, {one_hot, one_hot, {0.0f, 1.0f, 0.0f, 0.0f}});
    EXPECT_EQ(v.tokens, (std::vector<int32_t>{2, 2, 1}));
    EXPECT_EQ(v.n_accepted, 2);
    v = verify_drafts(g, {2, 3}, {{}, {}}, {one_hot, one_hot, one_hot});
    EXPECT_EQ(v.tokens, (std::vector<int32_t>{2, 2}));
    EXPECT_EQ(v.n_accepted, 1);
    // The same from the argmaxes alone (the engine's device-argmax path), at every place of the first mismatch.
    for (int32_t miss = 0; miss <= 3; ++miss) {
        const std::vector<int32_t> drafts = {5, 6, 7};
        std::vector<int32_t> best = {5, 6, 7, 8};
        if (miss < 3) best[static_cast<size_t>(miss)] = 9;
        std::vector<std::vector<float>> p;
        for (int32_t b : best) {
            p.emplace_back(10, 0.0f);
            p.back()[static_cast<size_t>(b)] = 1.0f;
        }
        const Verified a = verify_drafts(g, drafts, {{}, {}, {}}, p), b = verify_greedy(drafts, best.data());
        EXPECT_EQ(b.tokens, a.tokens) << "first mismatch at " << miss;
        EXPECT_EQ(b.n_accepted, a.n_accepted) << "first mismatch at " << miss;
        EXPECT_EQ(b.n_accepted, miss);
    }
}

// P(X >= stat) for X chi-square distributed with df degrees of freedom: the regularized upper incomplete gamma
// Q(df/2, stat/2), by its series below a + 1 and its continued fraction (modified Lentz) above.
double chi_square_p(double stat, int64_t df) {
    const double a = 0.5 * static_cast<double>(df), x = 0.5 * stat;
    if (x <= 0) return 1.0;
    const double log_front = a * std::log(x) - x - std::lgamma(a);
    if (x < a + 1) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 10000 && std::fabs(term) > 1e-15 * std::fabs(sum); ++n) {
            term *= x / (a + n);
            sum += term;
        }
        return 1.0 - sum * std::exp(log_front);
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int n = 1; n < 10000; ++n) {
        const double an = -n * (n - a);
        b += 2;
        d = an * d + b;
        d = std::fabs(d) < tiny ? tiny : d;
        c = b + an / c;
        c = std::fabs(c) < tiny ? tiny : c;
        d = 1 / d;
        const double delta = d * c;
        h *= delta;
        if (std::fabs(delta - 1) < 1e-15) break;
    }
    return std::exp(log_front) * h;
}

// Pearson's goodness of fit of `count` (cells of `want` probability, n draws in all): the p-value. Cells of
// probability 0 must be empty; they add no degree of freedom.
double goodness_of_fit_p(const std::vector<double>& count, const std::vector<double>& want) {
    double n = 0, stat = 0;
    for (double c : count) n += c;
    int64_t cells = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (want[i] <= 0) {
            EXPECT_EQ(count[i], 0.0) << "cell " << i << " has probability 0";
            continue;
        }
        const double e = n * want[i];
        stat += (count[i] - e) * (count[i] - e) / e;
        ++cells;
    }
    return chi_square_p(stat, cells - 1);
}

TEST(ChiSquare, PValuesOfKnownQuantiles) {
    EXPECT_NEAR(chi_square_p(3.841, 1), 0.05, 1e-4);
    EXPECT_NEAR(chi_square_p(10.828, 1), 0.001, 1e-5);
    EXPECT_NEAR(chi_square_p(18.307, 10), 0.05, 1e-4);
    EXPECT_NEAR(chi_square_p(2.558, 10), 0.99, 1e-4);
    EXPECT_NEAR(chi_square_p(124.342, 100), 0.05, 1e-4);
    EXPECT_NEAR(chi_square_p(1.0, 2), std::exp(-0.5), 1e-12);  // df 2: exp(-x/2)
}

// Logits of a five-token vocabulary at three positions, for the target and (different) for the draft.
const std::vector<std::vector<float>> kTargetLogits = {
    {1.2f, 0.4f, -0.3f, 0.9f, -1.5f}, {-0.2f, 1.1f, 0.7f, -0.8f, 0.3f}, {0.5f, -0.6f, 1.4f, 0.2f, 0.0f}};
const std::vector<std::vector<float>> kDraftLogits = {
    {0.2f, 1.3f, -0.1f, 0.4f, 0.6f}, {0.9f, -0.4f, 0.8f, 0.1f, -1.0f}, {-0.3f, 0.2f, 0.6f, 1.5f, -0.2f}};

// Three-token sequences sampled with K = 2 drafts per verification, round after round as the engine runs them
// (each round drafts the next positions from the draft distributions, verifies them against the target's and
// appends what it returns), with temperature, top-k, top-p and min-p applied to both through Sampler::probs: the
// 125 cells of the sequences' joint distribution match the target's (positions independent here, so the product
// of its three distributions), chi-square over 10^5 sequences, p > 0.001. Also for plain processing settings.
TEST(Speculative, SampledSequencesHaveTheTargetsJointDistribution) {
    const int64_t V = 5, T = 3, K = 2, n = 100000;
    struct Case {
        float temperature, top_p;
        int64_t top_k;
        float min_p;
    };
    for (const Case& c : {Case{1.0f, 1.0f, 0, 0.0f}, Case{0.7f, 0.85f, 4, 0.1f}}) {
        SamplingParams sp;
        sp.temperature = c.temperature;
        sp.top_p = c.top_p;
        sp.top_k = c.top_k;
        sp.min_p = c.min_p;
        sp.seed = 3;
        const Sampler proc(sp);
        std::vector<std::vector<float>> p, q;
        for (int64_t t = 0; t < T; ++t) {
            p.push_back(proc.probs(kTargetLogits[t].data(), V));
            q.push_back(proc.probs(kDraftLogits[t].data(), V));
        }
        Sampler target(sp), draft(SamplingParams{1.0f, 1.0f, 0, 17});
        std::vector<double> count(static_cast<size_t>(V * V * V), 0.0);
        int64_t accepted = 0, drafted = 0;
        for (int64_t s = 0; s < n; ++s) {
            std::vector<int32_t> seq;
            while (static_cast<int64_t>(seq.size()) < T) {
                // Drafts for positions t0 .. t0+K-1, verified by the target's rows for t0 .. t0+K (the last one
                // gives the bonus token). Positions past the sequence's end take the last position's
                // distributions: what they give is cut off and cannot change the first T tokens.
                const auto t0 = static_cast<int64_t>(seq.size());
                const auto at = [&](const std::vector<std::vector<float>>& d, int64_t t) -> const std::vector<float>& {
                    return d[static_cast<size_t>(std::min(t, T - 1))];
                };
                std::vector<int32_t> drafts;
                std::vector<std::vector<float>> qs, ps;
                for (int64_t j = 0; j < K; ++j) {
                    qs.push_back(at(q, t0 + j));
                    drafts.push_back(draft.draw(qs.back()));
                    ps.push_back(at(p, t0 + j));
                }
                ps.push_back(at(p, t0 + K));
                const Verified v = verify_drafts(target, drafts, qs, ps);
                accepted += v.n_accepted;
                drafted += K;
                for (int32_t x : v.tokens) seq.push_back(x);
            }
            count[static_cast<size_t>((seq[0] * V + seq[1]) * V + seq[2])] += 1.0;
        }
        std::vector<double> want(count.size());
        for (int64_t a = 0; a < V; ++a)
            for (int64_t b = 0; b < V; ++b)
                for (int64_t d = 0; d < V; ++d) want[static_cast<size_t>((a * V + b) * V + d)] = p[0][a] * p[1][b] * p[2][d];
        const double pv = goodness_of_fit_p(count, want);
        std::printf("temperature %.1f top-p %.2f top-k %lld min-p %.1f: chi-square p = %.3f, %lld of %lld drafts accepted\n",
                    c.temperature, c.top_p, static_cast<long long>(c.top_k), c.min_p, pv,
                    static_cast<long long>(accepted), static_cast<long long>(drafted));
        EXPECT_GT(pv, 0.001);
        EXPECT_GT(accepted, drafted / 10);  // both branches (acceptance and the residual) are exercised
        EXPECT_LT(accepted, drafted * 9 / 10);
    }
}

// The token drawn at the first rejection follows normalize(max(0, p - q)), and after K accepted drafts the bonus
// token follows the last target row: chi-square over 10^5 verifications each, p > 0.001.
TEST(Speculative, ResidualAndBonusTokensHaveTheirDistributions) {
    const std::vector<float> p = {0.5f, 0.3f, 0.15f, 0.05f}, q = {0.1f, 0.6f, 0.1f, 0.2f};
    const std::vector<float> bonus = {0.05f, 0.15f, 0.3f, 0.5f};
    std::vector<double> residual(4);
    double sum = 0;
    for (size_t i = 0; i < 4; ++i) sum += residual[i] = std::max(0.0f, p[i] - q[i]);
    for (double& r : residual) r /= sum;  // {0.4, 0, 0.05, 0} / 0.45
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 5;
    Sampler target(sp), draft(SamplingParams{1.0f, 1.0f, 0, 9});
    std::vector<double> rejected(4, 0.0), bonus_count(4, 0.0);
    const int n = 100000;
    for (int t = 0; t < n; ++t) {
        const Verified v = verify_drafts(target, {draft.draw(q)}, {q}, {p, bonus});
        if (v.n_accepted == 0) rejected[static_cast<size_t>(v.tokens[0])] += 1.0;
        // A draft from p itself is always accepted (p / q = 1), so the second token is the bonus.
        const Verified w = verify_drafts(target, {draft.draw(p)}, {p}, {p, bonus});
        ASSERT_EQ(w.n_accepted, 1);
        bonus_count[static_cast<size_t>(w.tokens[1])] += 1.0;
    }
    const double n_rejected = rejected[0] + rejected[1] + rejected[2] + rejected[3];
    EXPECT_NEAR(n_rejected / n, 0.45, 0.01);  // 1 - sum of min(p, q)
    EXPECT_GT(goodness_of_fit_p(rejected, residual), 0.001);
    EXPECT_GT(goodness_of_fit_p(bonus_count, {bonus.begin(), bonus.end()}), 0.001);
}

// top-k, then top-p over what top-k kept (renormalised), then min-p: the distribution both the draft and the
// target are verified with (Sampler::probs).
TEST(Speculative, TopKThenTopPThenMinP) {
    const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f};
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_p = 0.9f;
    std::vector<float> p = Sampler(sp).probs(logits.data(), 5);  // top-p alone: 0.636 + 0.234 + 0.086 reach 0.9
    EXPECT_GT(p[2], 0.0f);
    EXPECT_EQ(p[3], 0.0f);
    sp.top_k = 3;  // over the top 3 renormalised, 0.665 + 0.245 reach 0.9 first
    p = Sampler(sp).probs(logits.data(), 5);
    EXPECT_EQ(p[2], 0.0f);
    EXPECT_NEAR(p[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
    EXPECT_NEAR(p[1], std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-6);
    sp.top_p = 1.0f;
    sp.min_p = 0.2f;  // top 3 kept by top-k; e^-2 = 0.135 of the best is below 0.2: dropped
    p = Sampler(sp).probs(logits.data(), 5);
    EXPECT_EQ(p[2], 0.0f);
    EXPECT_GT(p[1], 0.0f);
}

// Pearson's test of homogeneity of two samples over the same cells: the p-value.
double homogeneity_p(const std::map<std::vector<int32_t>, double>& a, const std::map<std::vector<int32_t>, double>& b) {
    double na = 0, nb = 0;
    for (const auto& [k, c] : a) na += c;
    for (const auto& [k, c] : b) nb += c;
    std::map<std::vector<int32_t>, std::pair<double, double>> cells;
    for (const auto& [k, c] : a) cells[k].first = c;
    for (const auto& [k, c] : b) cells[k].second = c;
    double stat = 0;
    for (const auto& [k, ab] : cells) {
        const double total = ab.first + ab.second;
        const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
        stat += (ab.first - ea) * (ab.first - ea) / ea + (ab.second - eb) * (ab.second - eb) / eb;
    }
    return chi_square_p(stat, static_cast<int64_t>(cells.size()) - 1);
}

// Through the engine on the demo model, whose MTP drafts are often accepted: requests of one prompt with different
// seeds, temperature 1, top-k 3 and a repetition penalty, three tokens each; the three-token outputs of plain
// decoding and of K = 2 speculative decoding have the same distribution (homogeneity chi-square over the cells,
// p > 0.001) — the engine draws the drafts, processes draft and target logits alike and verifies them as
// verify_drafts does (whose distributions the tests above check over 10^5 draws).
TEST(Speculative, EngineSamplingMatchesPlainInDistribution) {
    const GlmDsaModel model(MEGACTX_DEFAULT_MODEL_DIR);
    const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    const std::vector<int32_t> prompt(text.begin(), text.begin() + 65);
    ASSERT_LT(*std::max_element(prompt.begin(), prompt.end()), vocab);
    // Under the sanitizers (several times slower) the same path runs on few requests, for memory errors only: the
    // distribution is checked by the release build.
#if defined(__SANITIZE_ADDRESS__)
    const bool sanitized = true;
#else
    const bool sanitized = false;
#endif
    const int64_t n = sanitized ? 200 : 4000;
    auto run = [&](int64_t k, SpecStats* spec) {
        EngineConfig cfg;
        cfg.n_kv_blocks = 2 * 256 + 8;
        cfg.scheduler.max_num_seqs = 256;
        cfg.scheduler.max_num_batched_tokens = 2048;
        cfg.speculative_tokens = k;
        CpuOps ops;
        Engine e(model, ops, cfg);
        // One request first, so that the prompt's first block is cached and the others compute one prompt row each.
        GenerationParams first;
        first.max_tokens = 1;
        e.submit(prompt, first, [](const TokenEvent&) { return true; });
        while (e.step()) {
        }
        std::map<int64_t, std::vector<int32_t>> out;
        for (int64_t i = 0; i < n; ++i) {
            GenerationParams g;
            g.max_tokens = 3;
            g.ignore_eos = true;
            g.sampling.temperature = 1.0f;
            g.sampling.top_k = 3;
            g.sampling.repetition_penalty = 1.3f;
            g.sampling.seed = static_cast<uint64_t>(1000 + i);
            e.submit(prompt, g, [&out](const TokenEvent& ev) {
                if (ev.token >= 0) out[ev.request_id].push_back(ev.token);
                return true;
            });
        }
        while (e.step()) {
        }
        if (spec) *spec = e.stats().spec;
        std::map<std::vector<int32_t>, double> cells;
        for (const auto& [id, t] : out) cells[t] += 1.0;
        return cells;
    };
    const auto t0 = std::chrono::steady_clock::now();
    const auto plain = run(0, nullptr);
    SpecStats st;
    const auto spec = run(2, &st);
    const double p = homogeneity_p(plain, spec);
    std::printf("%lld requests each, %zu / %zu distinct outputs, drafts accepted %lld of %lld, homogeneity p = %.3f "
                "(%.1f s)\n",
                static_cast<long long>(n), plain.size(), spec.size(), static_cast<long long>(st.accepted),
                static_cast<long long>(st.drafted), p,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_GT(st.accepted, 0);
    EXPECT_LT(st.accepted, st.drafted);
    if (!sanitized) {
        EXPECT_GT(p, 0.001);
    }
}

}  // namespace
}  // namespace megactx
