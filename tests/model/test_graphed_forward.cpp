// GraphedForward's bookkeeping on the CPU, through a backend that "records" by running the body and counts
// replays (the CPU has no graphs; the CUDA behaviour is tested in tests/cuda/test_cuda_model.cpp): which steps
// run eagerly, are recorded or replayed, which batches do not qualify, and eviction by count and bytes.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "fixture_util.h"
#include "kv/kv_cache.h"
#include "model/glm_dsa.h"
#include "model/graphed_forward.h"

namespace megactx {
namespace {

class RecordingCpuOps : public CpuOps {
  public:
    int64_t graph_bytes = 1000;
    int64_t replays = 0;
    bool can_record() const override { return true; }
    std::unique_ptr<OpsGraph> record(const std::function<void()>& body) override {
        body();
        auto g = std::make_unique<OpsGraph>();
        g->bytes = graph_bytes;
        return g;
    }
    void replay(OpsGraph&) override { ++replays; }
};

TEST(GraphedForward, EagerThenRecordThenReplayAndEviction) {
    const GlmDsaModel model(test::fixture_dir("freq_offset_f32"));
    const std::vector<int32_t> tokens = test::fixture_tokens("freq_offset_f32");
    RecordingCpuOps ops;
    KvCache kv(ops, model.config(), 16);
    std::vector<SeqKv> seqs(3);
    for (SeqKv& s : seqs) s.reserve(kv.blocks(), 64);
    GraphedForward gf(model, ops, kv, 2500);  // room for two graphs of 1000 B
    // A decode step of the first n sequences, one token each at position p.
    const auto step = [&](int64_t n, int32_t p) {
        Batch b;
        for (int64_t i = 0; i < n; ++i) b.add_sequence(&seqs[static_cast<size_t>(i)].blocks, tokens.data() + p, 1, p);
        return gf.forward(b);
    };
    for (int32_t p = 0; p < 3; ++p) step(1, p);  // shape 1: eager, recorded, replayed
    EXPECT_EQ(gf.stats().eager, 1);
    EXPECT_EQ(gf.stats().recorded, 1);
    EXPECT_EQ(gf.stats().replayed, 2);  // the recorded step is replayed too: recording runs nothing
    EXPECT_EQ(ops.replays, 2);
    step(2, 3);
    step(2, 4);  // shape 2: 2 graphs, 2000 B
    EXPECT_EQ(gf.stats().graphs, 2);
    EXPECT_EQ(gf.stats().bytes, 2000);
    step(3, 5);
    step(3, 6);  // shape 3: over 2500 B, shape 1 (least recently used) goes
    EXPECT_EQ(gf.stats().graphs, 2);
    EXPECT_EQ(gf.stats().bytes, 2000);
    EXPECT_EQ(gf.stats().evicted, 1);
    step(1, 7);  // shape 1 again: forgotten, so eager first
    EXPECT_EQ(gf.stats().eager, 4);
    // A bad token id on a recorded shape is the model's clear error, before any replay; graphs stay on.
    {
        const int32_t bad = static_cast<int32_t>(model.config().vocab_size);
        Batch b;
        b.add_sequence(&seqs[0].blocks, &bad, 1, 9);
        b.add_sequence(&seqs[1].blocks, &bad, 1, 9);
        const int64_t replays = ops.replays;
        EXPECT_THROW(gf.forward(b), Error);
        EXPECT_EQ(ops.replays, replays);
        EXPECT_TRUE(gf.enabled());
    }
    // Not eligible: a multi-token chunk (prefill) runs plain forward, counted nowhere.
    const GraphedForward::Stats before = gf.stats();
    Batch chunk;
    chunk.add_sequence(&seqs[0].blocks, tokens.data(), 4, 8);
    gf.forward(chunk);
    EXPECT_EQ(gf.stats().eager, before.eager);
    EXPECT_EQ(gf.stats().replayed, before.replayed);
}

TEST(GraphedForward, OffOnBackendsWithoutGraphs) {
    const GlmDsaModel model(test::fixture_dir("freq_offset_f32"));
    const std::vector<int32_t> tokens = test::fixture_tokens("freq_offset_f32");
    CpuOps ops;
    KvCache kv(ops, model.config(), 4);
    SeqKv s;
    s.reserve(kv.blocks(), 8);
    GraphedForward gf(model, ops, kv);
    EXPECT_FALSE(gf.enabled());
    for (int32_t p = 0; p < 3; ++p) {
        Batch b;
        b.add_sequence(&s.blocks, tokens.data() + p, 1, p);
        gf.forward(b);
    }
    EXPECT_EQ(gf.stats().eager + gf.stats().recorded + gf.stats().replayed, 0);
}

}  // namespace
}  // namespace megactx
