// The MTP layer (model-spec §5.1) against a reference built from transformers modules (model-spec §9.3), and
// against tools/train/model.py's MTP forward on the checkpoints it exports:
// input = embedding of token t+1 and the main model's normed hidden state at t, at position t.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/cpu_ops.h"
#include "fixture_util.h"
#include "io/npy.h"
#include "kv/kv_cache.h"
#include "model/glm_dsa.h"

namespace megactx {
namespace {

class MtpFixture : public ::testing::TestWithParam<std::string> {};

// Runs the MTP layer over positions 0..T-2 in chunks of `chunk`, returning logits and output hidden states.
std::pair<std::vector<float>, std::vector<float>> run_mtp(const GlmDsaModel& model, const std::vector<int32_t>& tokens,
                                                          const NpyArray& hidden, int64_t chunk) {
    CpuOps ops;
    const int64_t T = static_cast<int64_t>(tokens.size()), H = model.config().hidden_size;
    KvCache kv(ops, model.config(), (T + kBlockSize - 1) / kBlockSize);
    SeqKv seq;
    seq.reserve(kv.blocks(), T);
    std::vector<float> logits, out_hidden;
    for (int64_t p0 = 0; p0 < T - 1; p0 += chunk) {
        const int64_t m = std::min(chunk, T - 1 - p0);
        Batch b;
        b.add_sequence(&seq.blocks, tokens.data() + p0 + 1, m, p0);
        Tensor h = ops.alloc(DType::F32, {m, H});
        std::copy(hidden.data.begin() + p0 * H, hidden.data.begin() + (p0 + m) * H, h.f32());
        const ForwardResult r = model.mtp_forward(ops, b, h, kv);
        logits.insert(logits.end(), r.logits.f32(), r.logits.f32() + r.logits.numel());
        out_hidden.insert(out_hidden.end(), r.hidden.f32(), r.hidden.f32() + r.hidden.numel());
    }
    return {logits, out_hidden};
}

TEST_P(MtpFixture, MatchesReference) {
    const std::string f = GetParam();
    const GlmDsaModel model(test::fixture_dir(f));
    ASSERT_TRUE(model.has_mtp());
    const std::vector<int32_t> tokens = test::fixture_tokens(f);
    const NpyArray hidden = read_npy_f32(test::fixture_dir(f) + "/ref_hidden.npy");
    const NpyArray ref = read_npy_f32(test::fixture_dir(f) + "/mtp_ref_logits.npy");
    const NpyArray ref_hidden = read_npy_f32(test::fixture_dir(f) + "/mtp_ref_hidden.npy");
    const double scale = test::max_abs(ref.data);
    for (int64_t chunk : {int64_t{1} << 20, int64_t{1}, int64_t{7}}) {
        const auto [logits, out_hidden] = run_mtp(model, tokens, hidden, chunk);
        ASSERT_EQ(logits.size(), ref.data.size());
        const double err = test::max_abs_diff(logits.data(), ref.data.data(), logits.size());
        std::printf("%s MTP chunk %lld: max |logit - ref| / max |ref| = %.2e\n", f.c_str(),
                    static_cast<long long>(chunk), err / scale);
        EXPECT_LE(err, test::fixture_tolerance(f) * scale) << f << " chunk " << chunk << ": err " << err;
        const double herr = test::max_abs_diff(out_hidden.data(), ref_hidden.data.data(), out_hidden.size());
        EXPECT_LE(herr, test::fixture_tolerance(f) * test::max_abs(ref_hidden.data)) << f << " hidden";
    }
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, MtpFixture, ::testing::ValuesIn(test::fixture_names()));
INSTANTIATE_TEST_SUITE_P(ModelPy, MtpFixture, ::testing::ValuesIn(test::model_py_fixture_names()));

// Draft steps ≥ 1 reuse the step-0 indices (model-spec §5.3): passing the indices the MTP indexer chose
// must reproduce the step-0 result exactly, and the reuse path must not run the indexer.
TEST(Mtp, ReusedIndicesReproduceOwnIndexer) {
    const std::string f = "freq_offset_f32";
    const GlmDsaModel model(test::fixture_dir(f));
    const std::vector<int32_t> tokens = test::fixture_tokens(f);
    const NpyArray hidden = read_npy_f32(test::fixture_dir(f) + "/ref_hidden.npy");
    const int64_t T = static_cast<int64_t>(tokens.size()), H = model.config().hidden_size;
    CpuOps ops;
    auto run = [&](const Tensor* reuse, ForwardResult* out) {
        KvCache kv(ops, model.config(), (T + kBlockSize - 1) / kBlockSize);
        SeqKv seq;
        seq.reserve(kv.blocks(), T);
        Batch b;
        b.add_sequence(&seq.blocks, tokens.data() + 1, T - 1, 0);
        Tensor h = ops.alloc(DType::F32, {T - 1, H});
        std::copy(hidden.data.begin(), hidden.data.begin() + (T - 1) * H, h.f32());
        *out = model.mtp_forward(ops, b, h, kv, reuse);
    };
    ForwardResult own, reused;
    run(nullptr, &own);
    run(&own.topk, &reused);
    ASSERT_EQ(own.logits.numel(), reused.logits.numel());
    EXPECT_EQ(0, std::memcmp(own.logits.data, reused.logits.data, own.logits.numel() * 4));

    // Different indices give different logits: the reuse path really attends over what it is given.
    Tensor other = ops.alloc(DType::I32, own.topk.shape);
    const int64_t k = own.topk.dim(1);
    for (int64_t i = 0; i < T - 1; ++i) {
        for (int64_t j = 0; j < k; ++j) other.i32()[i * k + j] = j == 0 ? static_cast<int32_t>(i) : -1;
    }
    ForwardResult diag;
    run(&other, &diag);
    EXPECT_NE(0, std::memcmp(own.logits.data, diag.logits.data, own.logits.numel() * 4));
}

}  // namespace
}  // namespace megactx
