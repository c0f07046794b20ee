// GraphedForward's bookkeeping on the CPU, through a backend that "records" by running the body and counts
// replays (the CPU has no graphs; the CUDA behaviour is tested in tests/cuda/test_cuda_model.cpp): which steps
// run eagerly, are recorded or replayed, which batches do not qualify, and eviction by count and bytes.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "engine/sampler.h"
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
    // Not eligible: a prefill chunk (logits for its last row only) runs plain forward, counted nowhere; so do
    // batches over GraphedForward::kMaxTokens tokens and sequences whose tokens are not consecutive.
    const GraphedForward::Stats before = gf.stats();
    Batch chunk;
    chunk.add_sequence(&seqs[0].blocks, tokens.data(), 4, 8, false);
    chunk.want_logits.back() = true;
    gf.forward(chunk);
    SeqKv long_seq;
    long_seq.reserve(kv.blocks(), GraphedForward::kMaxTokens + 1);
    std::vector<int32_t> many(static_cast<size_t>(GraphedForward::kMaxTokens + 1));
    for (size_t i = 0; i < many.size(); ++i) many[i] = tokens[i % tokens.size()];
    Batch big;
    big.add_sequence(&long_seq.blocks, many.data(), static_cast<int64_t>(many.size()), 0);
    gf.forward(big);
    Batch gap;
    gap.add_sequence(&seqs[0].blocks, tokens.data(), 1, 3);
    gap.add_sequence(&seqs[0].blocks, tokens.data(), 1, 5);
    gap.seq.back() = 0;  // the same sequence twice, positions 3 and 5
    gap.block_tables.pop_back();
    gf.forward(gap);
    EXPECT_EQ(gf.stats().eager, before.eager);
    EXPECT_EQ(gf.stats().replayed, before.replayed);
    // Beyond 32 and up to kMaxTokens scored tokens qualify (a batch of verification rows): eager, recorded, replayed.
    Batch mid;
    mid.add_sequence(&long_seq.blocks, many.data(), 40, 0);
    for (int i = 0; i < 3; ++i) gf.forward(mid);
    EXPECT_EQ(gf.stats().eager - before.eager, 1);
    EXPECT_EQ(gf.stats().recorded - before.recorded, 1);
    EXPECT_EQ(gf.stats().replayed - before.replayed, 2);
}

// Verification steps (several scored tokens of one sequence, beside one-token decodes) and the MTP layer's draft
// steps go through graphs too, each shape on its own: eager first, with the padded plan (the same results as the
// unpadded plain call), then recorded, then replayed with the step's inputs — for an MTP step with a reused top-k
// those are the top-k slots followed by the batch plan's arrays.
TEST(GraphedForward, VerifyAndMtpStepsAreGraphed) {
    const GlmDsaModel model(test::fixture_dir("freq_offset_f32"));
    const std::vector<int32_t> tokens = test::fixture_tokens("freq_offset_f32");
    const int64_t topk = model.config().index_topk, H = model.config().hidden_size;
    RecordingCpuOps ops;
    KvCache kv(ops, model.config(), 16);
    std::vector<SeqKv> seqs(2);
    for (SeqKv& s : seqs) s.reserve(kv.blocks(), 128);
    GraphedForward gf(model, ops, kv);
    {  // prefill both sequences' first 40 tokens (not graphed)
        Batch b;
        for (SeqKv& s : seqs) b.add_sequence(&s.blocks, tokens.data(), 40, 0, false);
        gf.forward(b);
    }
    const auto verify = [&](int32_t p) {  // sequence 0 verifies 3 drafts, sequence 1 decodes
        Batch b;
        b.add_sequence(&seqs[0].blocks, tokens.data() + p, 4, p);
        b.add_sequence(&seqs[1].blocks, tokens.data() + p, 1, p);
        return b;
    };
    std::vector<float> want, got;
    for (int32_t p : {40, 44, 48}) {
        const Batch b = verify(p);
        const ForwardResult r = gf.forward(b);
        if (p == 40) {  // the eager step equals the plain forward on a copy of the cache state
            got.resize(static_cast<size_t>(r.logits.numel()));
            ops.download(r.logits, got.data());
            EXPECT_EQ(r.logits.dim(0), 5);
        }
    }
    EXPECT_EQ(gf.stats().eager, 1);
    EXPECT_EQ(gf.stats().recorded, 1);
    EXPECT_EQ(gf.stats().replayed, 2);
    {  // the same step through plain forward on a fresh cache gives the eager (padded-plan) logits exactly
        CpuOps plain;
        KvCache kv2(plain, model.config(), 16);
        std::vector<SeqKv> s2(2);
        for (SeqKv& s : s2) s.reserve(kv2.blocks(), 128);
        Batch pre;
        for (SeqKv& s : s2) pre.add_sequence(&s.blocks, tokens.data(), 40, 0, false);
        model.forward(plain, pre, kv2);
        Batch b;
        b.add_sequence(&s2[0].blocks, tokens.data() + 40, 4, 40);
        b.add_sequence(&s2[1].blocks, tokens.data() + 40, 1, 40);
        const ForwardResult r = model.forward(plain, b, kv2);
        want.resize(static_cast<size_t>(r.logits.numel()));
        plain.download(r.logits, want.data());
        EXPECT_EQ(want, got);
    }

    // MTP steps: step 0 (own indexer) over 2 rows of sequence 0, then a reuse step of 1 row; each shape eager,
    // recorded, replayed.
    const GraphedForward::Stats before = gf.stats();
    Tensor hidden2 = ops.alloc(DType::F32, {2, H}), hidden1 = ops.alloc(DType::F32, {1, H});
    std::vector<float> hv(static_cast<size_t>(2 * H));
    for (size_t i = 0; i < hv.size(); ++i) hv[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
    ops.upload(hv.data(), hidden2);
    ops.upload(hv.data(), hidden1);
    std::vector<int32_t> reuse;
    for (int32_t p : {52, 54, 56}) {
        Batch b0;
        b0.add_sequence(&seqs[0].blocks, tokens.data() + p + 1, 2, p, false);
        b0.want_logits.back() = true;
        const ForwardResult m = gf.mtp_forward(b0, hidden2, nullptr);
        if (p == 52) {
            std::vector<int32_t> all(static_cast<size_t>(m.topk.numel()));
            ops.download(m.topk, all.data());
            reuse.assign(all.begin() + topk, all.end());
            EXPECT_EQ(m.logits.dim(0), 1);
        }
        Batch b1;
        b1.add_sequence(&seqs[0].blocks, tokens.data() + p + 3, 1, p + 2);
        gf.mtp_forward(b1, hidden1, &reuse);
    }
    EXPECT_EQ(gf.stats().eager - before.eager, 2);
    EXPECT_EQ(gf.stats().recorded - before.recorded, 2);
    EXPECT_EQ(gf.stats().replayed - before.replayed, 4);
    EXPECT_EQ(gf.stats().graphs, 3);
    // A reused top-k of the wrong size is a clear error, before anything runs.
    std::vector<int32_t> short_reuse(static_cast<size_t>(topk - 1), 0);
    Batch b1;
    b1.add_sequence(&seqs[0].blocks, tokens.data(), 1, 60);
    EXPECT_THROW(gf.mtp_forward(b1, hidden1, &short_reuse), Error);
}

// The greedy MTP draft chain (GraphedForward::mtp_greedy_chain, one graph for all K steps) gives the drafts the
// step-by-step path gives — step 0 with its indexer, then each draft fed back at the next position over step 0's
// top-k row, argmax on the host — for two sequences drafting together; and as one shape it is eager, recorded,
// then replayed.
TEST(GraphedForward, GreedyDraftChainMatchesStepByStep) {
    const GlmDsaModel model(test::fixture_dir("freq_offset_f32"));
    const std::vector<int32_t> tokens = test::fixture_tokens("freq_offset_f32");
    const int64_t topk = model.config().index_topk, H = model.config().hidden_size, V = model.config().vocab_size;
    const int64_t k = 3;
    std::vector<float> hv(static_cast<size_t>(3 * H));
    for (size_t i = 0; i < hv.size(); ++i) hv[i] = static_cast<float>((i * 37) % 11) * 0.2f - 1.0f;
    // Both paths start from the same cache: 50 and 30 tokens of prefill, and the MTP layer's KV of the positions
    // before step 0's rows (as the engine's step 0 over the prefill rows writes it).
    const auto prefill = [&](Ops& ops, KvCache& kv, std::vector<SeqKv>& seqs) {
        for (SeqKv& s : seqs) s.reserve(kv.blocks(), 128);
        Batch b;
        b.add_sequence(&seqs[0].blocks, tokens.data(), 50, 0, false);
        b.add_sequence(&seqs[1].blocks, tokens.data() + 5, 30, 0, false);
        const ForwardResult r = model.forward(ops, b, kv);
        Batch m;
        m.add_sequence(&seqs[0].blocks, tokens.data() + 1, 48, 0, false);
        m.add_sequence(&seqs[1].blocks, tokens.data() + 6, 29, 0, false);
        std::vector<int32_t> rows;
        for (int32_t i = 0; i < 48; ++i) rows.push_back(i);
        for (int32_t i = 0; i < 29; ++i) rows.push_back(50 + i);
        Tensor h = ops.alloc(DType::F32, {m.n_tokens(), H});
        ops.gather_rows(r.hidden, ops.upload_i32(rows), h);
        model.mtp_forward(ops, m, h, kv);
    };
    // Step 0: sequence 0 over its rows 48..49 (2 rows), sequence 1 over row 29; logits at each one's last row.
    const auto step0 = [&](std::vector<SeqKv>& seqs) {
        Batch b;
        b.add_sequence(&seqs[0].blocks, tokens.data() + 49, 2, 48, false);
        b.want_logits.back() = true;
        b.add_sequence(&seqs[1].blocks, tokens.data() + 35, 1, 29, true);
        return b;
    };
    const std::vector<int32_t> last_rows = {1, 2};
    const std::vector<int64_t> pos0 = {49, 29};

    std::vector<int32_t> want;  // [k][2]
    {
        CpuOps ops;
        KvCache kv(ops, model.config(), 16);
        std::vector<SeqKv> seqs(2);
        prefill(ops, kv, seqs);
        Tensor h0 = ops.alloc(DType::F32, {3, H});
        ops.upload(hv.data(), h0);
        const Batch b0 = step0(seqs);
        ForwardResult m = model.mtp_forward(ops, b0, h0, kv);
        std::vector<float> lg(static_cast<size_t>(2 * V));
        ops.download(m.logits, lg.data());
        std::vector<int32_t> all(static_cast<size_t>(3 * topk));
        ops.download(m.topk, all.data());
        std::vector<int32_t> reuse(all.begin() + topk, all.end());  // rows 1 and 2
        Tensor hidden = ops.alloc(DType::F32, {2, H});
        ops.gather_rows(m.hidden, ops.upload_i32(last_rows), hidden);
        std::vector<int32_t> cur(2);
        for (int64_t j = 0; j < k; ++j) {
            for (int64_t i = 0; i < 2; ++i) cur[i] = argmax(lg.data() + i * V, V);
            want.insert(want.end(), cur.begin(), cur.end());
            if (j + 1 == k) break;
            Batch bj;
            for (int64_t i = 0; i < 2; ++i) bj.add_sequence(&seqs[i].blocks, &cur[i], 1, pos0[i] + j + 1);
            Tensor r = ops.upload_i32(reuse);
            r.shape = {2, topk};
            ForwardResult mj = model.mtp_forward(ops, bj, hidden, kv, &r);
            ops.download(mj.logits, lg.data());
            hidden = mj.hidden;
        }
    }
    RecordingCpuOps ops;
    KvCache kv(ops, model.config(), 16);
    std::vector<SeqKv> seqs(2);
    prefill(ops, kv, seqs);
    GraphedForward gf(model, ops, kv);
    Tensor h0 = ops.alloc(DType::F32, {3, H});
    ops.upload(hv.data(), h0);
    const int32_t placeholder = 0;
    std::vector<Batch> steps(static_cast<size_t>(k - 1));
    for (int64_t j = 0; j + 1 < k; ++j)
        for (int64_t i = 0; i < 2; ++i) steps[j].add_sequence(&seqs[i].blocks, &placeholder, 1, pos0[i] + j + 1);
    EXPECT_EQ(gf.mtp_greedy_chain(step0(seqs), h0, last_rows, steps, true), want);  // eager, padded
    EXPECT_EQ(gf.mtp_greedy_chain(step0(seqs), h0, last_rows, steps, true), want);  // recorded (the body runs)
    gf.mtp_greedy_chain(step0(seqs), h0, last_rows, steps, true);                    // replayed
    EXPECT_EQ(gf.stats().eager, 1);
    EXPECT_EQ(gf.stats().recorded, 1);
    EXPECT_EQ(gf.stats().replayed, 2);
    EXPECT_EQ(ops.replays, 2);
    // A step batch that does not hold one token per drafting sequence is a clear error.
    std::vector<Batch> bad = steps;
    bad[0].add_sequence(&seqs[0].blocks, &placeholder, 1, 60);
    EXPECT_THROW(gf.mtp_greedy_chain(step0(seqs), h0, last_rows, bad, true), Error);
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
