// Exactness on the CPU backend: one pass = chunked prefill = token-by-token decode, bit for bit; a token's
// logits do not depend on which other sequences share its ragged batch; greedy generation is argmax of the
// model's own logits.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/runner.h"
#include "fixture_util.h"
#include "model/batch.h"
#include "model/glm_dsa.h"

namespace megactx {
namespace {

const std::string kFixture = "freq_offset_f32";  // 80 tokens: crosses top-k and the 64-token block boundary

TEST(Exactness, ChunkedPrefillAndDecodeAreBitIdenticalToOnePass) {
    const GlmDsaModel model(test::fixture_dir(kFixture));
    const std::vector<int32_t> tokens = test::fixture_tokens(kFixture);
    CpuOps ops;
    const auto run = [&](int64_t chunk) {
        SequenceRunner r(model, ops, static_cast<int64_t>(tokens.size()));
        return r.feed(tokens, chunk, true);
    };
    const std::vector<float> one_pass = run(0);
    for (int64_t chunk : {1, 3, 63, 64, 65}) {
        const std::vector<float> chunked = run(chunk);
        ASSERT_EQ(chunked.size(), one_pass.size());
        EXPECT_EQ(0, std::memcmp(chunked.data(), one_pass.data(), one_pass.size() * 4)) << "chunk " << chunk;
    }
}

TEST(Exactness, RaggedBatchEqualsSeparateRuns) {
    const GlmDsaModel model(test::fixture_dir(kFixture));
    const std::vector<int32_t> tokens = test::fixture_tokens(kFixture);
    const int64_t V = model.config().vocab_size;
    CpuOps ops;
    // Sequence A: tokens[0..40) then 5 more; sequence B: reversed tokens [0..70) then 1 more.
    std::vector<int32_t> a(tokens.begin(), tokens.begin() + 45), b(tokens.rbegin(), tokens.rbegin() + 71);

    const auto separate = [&](const std::vector<int32_t>& s, int64_t n_prefix) {
        SequenceRunner r(model, ops, static_cast<int64_t>(s.size()));
        r.feed(std::vector<int32_t>(s.begin(), s.begin() + n_prefix), 0, false);
        return r.feed(std::vector<int32_t>(s.begin() + n_prefix, s.end()), 0, true);
    };
    const std::vector<float> ref_a = separate(a, 40), ref_b = separate(b, 70);

    KvCache kv(ops, model.config(), 4);
    SeqKv sa, sb;
    sa.reserve(kv.blocks(), 45);
    sb.reserve(kv.blocks(), 71);
    Batch prefill;  // both prompts in one batch
    prefill.add_sequence(&sa.blocks, a.data(), 40, 0, false);
    prefill.add_sequence(&sb.blocks, b.data(), 70, 0, false);
    model.forward(ops, prefill, kv);
    Batch step;  // B's decode token first, then A's 5-token chunk
    step.add_sequence(&sb.blocks, b.data() + 70, 1, 70);
    step.add_sequence(&sa.blocks, a.data() + 40, 5, 40);
    const ForwardResult r = model.forward(ops, step, kv);
    ASSERT_EQ(r.logits.numel(), 6 * V);
    EXPECT_EQ(0, std::memcmp(r.logits.f32(), ref_b.data(), V * 4));
    EXPECT_EQ(0, std::memcmp(r.logits.f32() + V, ref_a.data(), 5 * V * 4));
}

// The padded plan GraphedForward uses for recorded decode steps (Batch::pad_blocks: block tables padded to a
// bucket, max_context = the bucket) changes sizes only, not results: bit-identical decode logits on the CPU.
TEST(Exactness, PaddedDecodePlanIsBitIdentical) {
    const GlmDsaModel model(test::fixture_dir(kFixture));
    const std::vector<int32_t> tokens = test::fixture_tokens(kFixture);
    const int64_t V = model.config().vocab_size, n = static_cast<int64_t>(tokens.size()), n_prefix = 60;
    CpuOps ops;
    std::vector<float> out[2];
    for (int64_t pad : {int64_t{0}, int64_t{16}}) {
        KvCache kv(ops, model.config(), 4);
        SeqKv seq;
        seq.reserve(kv.blocks(), n);
        Batch prefill;
        prefill.add_sequence(&seq.blocks, tokens.data(), n_prefix, 0, false);
        model.forward(ops, prefill, kv);
        for (int64_t t = n_prefix; t < n; ++t) {  // one-token steps across the 64-token block boundary
            Batch step;
            step.add_sequence(&seq.blocks, tokens.data() + t, 1, t);
            step.pad_blocks = pad;
            const ForwardResult r = model.forward(ops, step, kv);
            ASSERT_EQ(r.logits.numel(), V);
            out[pad > 0].insert(out[pad > 0].end(), r.logits.f32(), r.logits.f32() + V);
        }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4));
}

// BatchPlan::host_inputs with padding: each table padded (or cut) to pad_blocks entries, offsets pad_blocks apart,
// and a position beyond the padded blocks is an error naming it.
TEST(Exactness, PaddedHostInputs) {
    const std::vector<int32_t> ta = {7, 3, 9}, tb = {4};
    const int32_t toks[2] = {11, 12};
    Batch b;
    b.add_sequence(&ta, toks, 1, 130);  // block 2 of ta
    b.add_sequence(&tb, toks + 1, 1, 5);
    b.pad_blocks = 4;
    const std::vector<std::vector<int32_t>> in = BatchPlan::host_inputs(b);
    ASSERT_EQ(in.size(), 7u);
    EXPECT_EQ(in[3], (std::vector<int32_t>{9 * 64 + 2, 4 * 64 + 5}));  // write slots
    EXPECT_EQ(in[4], (std::vector<int32_t>{0, 4}));                    // table offsets
    EXPECT_EQ(in[5], (std::vector<int32_t>{7, 3, 9, 0, 4, 0, 0, 0}));  // padded tables
    b.pad_blocks = 2;                                                  // position 130 needs block 2
    try {
        BatchPlan::host_inputs(b);
        FAIL() << "a position beyond the padded blocks was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("padded"), std::string::npos) << e.what();
    }
}

TEST(Exactness, GreedyGenerationIsArgmaxOfTheModelsLogits) {
    const GlmDsaModel model(test::fixture_dir(kFixture));
    const std::vector<int32_t> tokens = test::fixture_tokens(kFixture);
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 20);
    const int64_t V = model.config().vocab_size, n_new = 12;
    CpuOps ops;
    SequenceRunner g1(model, ops, 64), g2(model, ops, 64);
    const std::vector<int32_t> out1 = g1.generate(prompt, n_new, SamplingParams{}, false);
    const std::vector<int32_t> out2 = g2.generate(prompt, n_new, SamplingParams{}, false);
    ASSERT_EQ(out1.size(), prompt.size() + n_new);
    EXPECT_EQ(out1, out2);
    SequenceRunner check(model, ops, 64);
    const std::vector<float> logits = check.feed(out1, 0, true);
    for (size_t i = prompt.size(); i < out1.size(); ++i) {
        EXPECT_EQ(out1[i], argmax(logits.data() + (i - 1) * V, V)) << "position " << i;
    }
}

}  // namespace
}  // namespace megactx
