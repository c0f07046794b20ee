// The serving engine: block allocator with prefix caching, scheduler policy, and the engine end to end on a
// fixture model (continuous batching, chunked prefill, prefix-cache hits, preemption, cancellation).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/runner.h"

namespace megactx {
namespace {

TEST(BlockAllocator, PublishedBlocksAreCachedThenEvictedLeastRecentlyUsedFirst) {
    BlockAllocator a(3);
    const int32_t b0 = a.allocate(), b1 = a.allocate(), b2 = a.allocate();
    EXPECT_EQ(a.n_available(), 0);
    EXPECT_THROW(a.allocate(), Error);
    a.publish(b0, 100);
    a.publish(b1, 200);
    a.release(b1);  // cached, most recently used last
    a.release(b0);
    a.release(b2);  // unpublished: plain free
    EXPECT_EQ(a.n_available(), 3);
    EXPECT_EQ(a.n_cached(), 2);
    EXPECT_EQ(a.lookup(100), b0);
    EXPECT_EQ(a.allocate(), b2);  // free blocks go first
    EXPECT_EQ(a.allocate(), b1);  // then the least recently used cached block, evicting its content
    EXPECT_FALSE(a.lookup(200).has_value());
    EXPECT_EQ(a.lookup(100), b0);
    a.retain(b0);  // a prefix hit revives it
    EXPECT_EQ(a.refcount(b0), 1);
    EXPECT_EQ(a.n_available(), 0);
}

TEST(BlockAllocator, ChainedHashDependsOnThePrefix) {
    std::vector<int32_t> t(64, 7);
    EXPECT_EQ(block_hash(0, t.data(), 64), block_hash(0, t.data(), 64));
    EXPECT_NE(block_hash(0, t.data(), 64), block_hash(1, t.data(), 64));
    t[63] = 8;
    EXPECT_NE(block_hash(0, t.data(), 64), block_hash(0, std::vector<int32_t>(64, 7).data(), 64));
}

Sequence make_seq(int64_t n_tokens, int64_t n_computed, int64_t arrival) {
    Sequence s;
    s.tokens.assign(static_cast<size_t>(n_tokens), 3);
    s.n_prompt = n_tokens;
    s.n_computed = n_computed;
    s.arrival = arrival;
    return s;
}

TEST(Scheduler, DecodesFirstThenPrefillChunksUnderTheBudgetFifo) {
    BlockAllocator a(100);
    Sequence d = make_seq(10, 9, 0), p = make_seq(300, 0, 1), w1 = make_seq(50, 0, -1), w2 = make_seq(40, 0, -1);
    d.kv.reserve(a, 10);
    SchedulerConfig cfg;
    cfg.max_num_batched_tokens = 200;
    const SchedulePlan plan = schedule(cfg, {&p, &d}, {&w1, &w2}, a, [](const Sequence&) { return PrefixMatch{}; });
    ASSERT_EQ(plan.chunks.size(), 2u);
    EXPECT_EQ(plan.chunks[0].seq, &d);  // the decode token comes first although p is older in the list
    EXPECT_EQ(plan.chunks[0].n_tokens, 1);
    EXPECT_EQ(plan.chunks[1].seq, &p);  // then p's prefill gets the remaining 199 tokens
    EXPECT_EQ(plan.chunks[1].n_tokens, 199);
    EXPECT_TRUE(plan.admitted.empty());  // no budget left for the waiting requests
}

TEST(Scheduler, PreemptsTheNewestWhenADecodeCannotGrow) {
    BlockAllocator a(3);
    Sequence old = make_seq(65, 64, 0), young = make_seq(70, 69, 1);  // old needs a 2nd block at position 64
    old.kv.reserve(a, 64);
    young.kv.reserve(a, 70);  // takes the last 2 blocks
    ASSERT_EQ(a.n_available(), 0);
    const SchedulePlan plan = schedule(SchedulerConfig{}, {&old, &young}, {}, a,
                                       [](const Sequence&) { return PrefixMatch{}; });
    ASSERT_EQ(plan.preempted.size(), 1u);
    EXPECT_EQ(plan.preempted[0], &young);
    ASSERT_EQ(plan.chunks.size(), 1u);
    EXPECT_EQ(plan.chunks[0].seq, &old);
}

// --- the engine on a fixture model ---

const std::string kFixture = "freq_offset_f32";

struct Collected {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    FinishReason finish = FinishReason::kNone;
    int64_t n_cached_prompt = 0;
};

struct Harness {
    GlmDsaModel model{test::fixture_dir(kFixture)};
    CpuOps ops;
    std::map<int64_t, Collected> out;

    TokenSink sink(int64_t* id_slot) {
        return [this, id_slot](const TokenEvent& ev) {
            Collected& c = out[ev.request_id];
            if (ev.token >= 0) {
                c.tokens.push_back(ev.token);
                if (ev.has_logprobs) c.logprobs.push_back(ev.logprobs);
            }
            if (ev.finish != FinishReason::kNone) c.finish = ev.finish;
            c.n_cached_prompt = ev.n_cached_prompt;
            (void)id_slot;
            return true;
        };
    }
    std::vector<int32_t> prompt(int64_t n, int32_t salt) const {
        const std::vector<int32_t> base = test::fixture_tokens(kFixture);
        std::vector<int32_t> p;
        for (int64_t i = 0; i < n; ++i) p.push_back((base[i % base.size()] + salt * static_cast<int32_t>(i / 7)) % 250 + 2);
        return p;
    }
    std::vector<int32_t> alone(const std::vector<int32_t>& p, int64_t n_new) {
        SequenceRunner r(model, ops, static_cast<int64_t>(p.size()) + n_new);
        const std::vector<int32_t> all = r.generate(p, n_new, SamplingParams{}, false);
        return std::vector<int32_t>(all.begin() + static_cast<long>(p.size()), all.end());
    }
};

GenerationParams greedy(int64_t max_tokens) {
    GenerationParams g;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    return g;
}

TEST(Engine, ConcurrentGreedyRequestsMatchRunningAlone) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    cfg.scheduler.max_num_batched_tokens = 48;  // forces chunked prefill interleaved with decodes
    Engine e(h.model, h.ops, cfg);
    std::vector<std::pair<int64_t, std::vector<int32_t>>> reqs;
    for (int i = 0; i < 8; ++i) {
        const std::vector<int32_t> p = h.prompt(10 + 17 * i, i + 1);
        reqs.push_back({e.submit(p, greedy(6 + i), h.sink(nullptr)), p});
    }
    while (e.step()) {
    }
    for (int i = 0; i < 8; ++i) {
        const Collected& c = h.out[reqs[i].first];
        EXPECT_EQ(c.finish, FinishReason::kLength);
        EXPECT_EQ(c.tokens, h.alone(reqs[i].second, 6 + i)) << "request " << i;
    }
    EXPECT_EQ(e.stats().running, 0);
}

TEST(Engine, PrefixCacheHitGivesBitIdenticalLogprobs) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 16;
    Engine e(h.model, h.ops, cfg);
    const std::vector<int32_t> p = h.prompt(150, 3);
    GenerationParams g = greedy(8);
    g.top_logprobs = h.model.config().vocab_size;  // the whole distribution of every step
    const int64_t cold = e.submit(p, g, h.sink(nullptr));
    while (e.step()) {
    }
    const int64_t hit = e.submit(p, g, h.sink(nullptr));
    while (e.step()) {
    }
    EXPECT_EQ(h.out[cold].n_cached_prompt, 0);
    EXPECT_EQ(h.out[hit].n_cached_prompt, 128);  // two full 64-token blocks of the prompt
    EXPECT_EQ(h.out[cold].tokens, h.out[hit].tokens);
    ASSERT_EQ(h.out[cold].logprobs.size(), h.out[hit].logprobs.size());
    for (size_t i = 0; i < h.out[cold].logprobs.size(); ++i) {
        const auto& a = h.out[cold].logprobs[i].top;
        const auto& b = h.out[hit].logprobs[i].top;
        ASSERT_EQ(a.size(), b.size());
        for (size_t j = 0; j < a.size(); ++j) {
            ASSERT_EQ(a[j].first, b[j].first);
            ASSERT_EQ(0, std::memcmp(&a[j].second, &b[j].second, 4)) << "step " << i;
        }
    }
    const EngineStats st = e.stats();
    EXPECT_EQ(st.prefix_hit_tokens, 128);
    EXPECT_EQ(st.prefix_query_tokens, 300);
}

TEST(Engine, PreemptionUnderKvPressureKeepsOutputsExact) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 6;  // 384 tokens for four requests that need 4 × 130
    cfg.scheduler.max_num_batched_tokens = 64;
    Engine e(h.model, h.ops, cfg);
    std::vector<std::pair<int64_t, std::vector<int32_t>>> reqs;
    for (int i = 0; i < 4; ++i) {
        const std::vector<int32_t> p = h.prompt(60 + i, i + 5);
        reqs.push_back({e.submit(p, greedy(70), h.sink(nullptr)), p});
    }
    while (e.step()) {
    }
    EXPECT_GT(e.stats().preemptions, 0);
    for (auto& [id, p] : reqs) {
        EXPECT_EQ(h.out[id].finish, FinishReason::kLength);
        EXPECT_EQ(h.out[id].tokens, h.alone(p, 70));
    }
}

TEST(Engine, CancelFreesBlocksWithinOneStep) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 8;
    cfg.prefix_caching = false;
    Engine e(h.model, h.ops, cfg);
    const int64_t id = e.submit(h.prompt(100, 1), greedy(50), h.sink(nullptr));
    e.step();
    e.step();
    EXPECT_EQ(e.stats().kv_blocks_used, 2);
    e.cancel(id);
    e.step();
    EXPECT_EQ(h.out[id].finish, FinishReason::kCancelled);
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST(Engine, SinkReturningFalseAndStopTokensEndTheRequest) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 8;
    Engine e(h.model, h.ops, cfg);
    const std::vector<int32_t> p = h.prompt(20, 2);
    const std::vector<int32_t> ref = h.alone(p, 10);
    int n_seen = 0;
    const int64_t a = e.submit(p, greedy(10), [&](const TokenEvent& ev) {
        if (ev.finish != FinishReason::kNone) h.out[ev.request_id].finish = ev.finish;
        return ev.token < 0 || ++n_seen < 3;  // the consumer ends it after 3 tokens (a stop string, say)
    });
    GenerationParams g = greedy(10);
    g.stop_token_ids = {ref[4]};
    const int64_t b = e.submit(p, g, h.sink(nullptr));
    while (e.step()) {
    }
    EXPECT_EQ(n_seen, 3);
    EXPECT_EQ(h.out[a].finish, FinishReason::kStop);
    EXPECT_EQ(h.out[b].finish, FinishReason::kStop);
    const auto first = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
    EXPECT_EQ(h.out[b].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
}

TEST(Engine, RequestsThatCanNeverRunAreClearErrors) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 2;
    cfg.max_model_len = 100;
    Engine e(h.model, h.ops, cfg);
    EXPECT_THROW(e.submit({}, greedy(1), nullptr), Error);
    EXPECT_THROW(e.submit({1, 999}, greedy(1), nullptr), Error);
    EXPECT_THROW(e.submit(h.prompt(95, 1), greedy(10), nullptr), Error);  // beyond max_model_len
    EXPECT_THROW(e.submit({1, 2}, greedy(0), nullptr), Error);
    cfg.max_model_len = 0;
    Engine small(h.model, h.ops, cfg);
    EXPECT_THROW(small.submit(h.prompt(100, 1), greedy(40), nullptr), Error);  // beyond the 128-token cache
    EngineConfig too_long;
    too_long.max_model_len = 5000;
    EXPECT_THROW(Engine(h.model, h.ops, too_long), Error);  // the fixture allows 4096 positions
}

TEST(Engine, BackgroundLoopServesRequests) {
    Harness h;
    EngineConfig cfg;
    cfg.n_kv_blocks = 16;
    Engine e(h.model, h.ops, cfg);
    std::mutex mu;
    std::condition_variable cv;
    int finished = 0;
    std::map<int64_t, std::vector<int32_t>> got;
    e.start();
    std::vector<std::pair<int64_t, std::vector<int32_t>>> reqs;
    for (int i = 0; i < 4; ++i) {
        const std::vector<int32_t> p = h.prompt(30 + i, i);
        reqs.push_back({e.submit(p, greedy(5), [&](const TokenEvent& ev) {
                            std::lock_guard<std::mutex> lock(mu);
                            if (ev.token >= 0) got[ev.request_id].push_back(ev.token);
                            if (ev.finish != FinishReason::kNone) ++finished;
                            cv.notify_all();
                            return true;
                        }),
                        p});
    }
    {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return finished == 4; });
    }
    e.stop();
    for (auto& [id, p] : reqs) EXPECT_EQ(got[id], h.alone(p, 5));
}

}  // namespace
}  // namespace megactx
