// MTP speculative decoding in the engine (EngineConfig::speculative_tokens): at temperature 0 the tokens and
// log-probabilities equal plain decoding's for every K, with continuous batching, chunked prefill, prefix-cache
// hits, preemption and max_tokens or a stop token landing inside an accepted run; the shipped model's drafts are
// accepted; rejection sampling reproduces the target distribution exactly.
#include <gtest/gtest.h>

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
                       EngineStats* stats = nullptr) {
    CpuOps ops;
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

// Eight requests of different lengths, chunked prefill interleaved with (speculative) decodes, on the random
// fixture model (its MTP drafts are mostly rejected: the exactness of rejection is what is checked here).
TEST(Speculative, GreedyEqualsPlainUnderContinuousBatching) {
    const std::string f = "freq_offset_f32";
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
}

}  // namespace
}  // namespace megactx
