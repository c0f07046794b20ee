// Logits of every fixture (tiny random GlmMoeDsa checkpoints, reference from transformers 5.17.0, made by
// tools/reference/make_fixtures.py) at every position, fed in one pass, 7 tokens at a time and one token at
// a time through the paged KV cache. The same for the checkpoints that tools/train/model.py exports, against
// model.py's own logits (tools/train/check.py: model.py equals transformers on those weights).
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/cpu_ops.h"
#include "engine/runner.h"
#include "fixture_util.h"
#include "io/npy.h"
#include "model/glm_dsa.h"

namespace megactx {
namespace {

struct Case {
    std::string fixture;
    int64_t chunk;
};

class FixtureLogits : public ::testing::TestWithParam<Case> {};

TEST_P(FixtureLogits, MatchesReference) {
    const Case c = GetParam();
    const GlmDsaModel model(test::fixture_dir(c.fixture));
    const std::vector<int32_t> tokens = test::fixture_tokens(c.fixture);
    const NpyArray ref = read_npy_f32(test::fixture_dir(c.fixture) + "/ref_logits.npy");
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(tokens.size()), model.config().vocab_size}));
    // Sequences must be several times longer than index_topk, or DSA degenerates to dense attention.
    ASSERT_GE(static_cast<int64_t>(tokens.size()), 4 * model.config().index_topk);

    CpuOps ops;
    SequenceRunner runner(model, ops, static_cast<int64_t>(tokens.size()));
    const std::vector<float> logits = runner.feed(tokens, c.chunk, true);
    ASSERT_EQ(logits.size(), ref.data.size());
    const double scale = test::max_abs(ref.data);
    const double err = test::max_abs_diff(logits.data(), ref.data.data(), logits.size());
    RecordProperty("max_abs_err_relative", std::to_string(err / scale));
    std::printf("%s chunk %lld: max |logit - ref| / max |ref| = %.2e\n", c.fixture.c_str(),
                static_cast<long long>(c.chunk), err / scale);
    EXPECT_LE(err, test::fixture_tolerance(c.fixture) * scale)
        << c.fixture << " chunk " << c.chunk << ": max |logit - ref| = " << err << ", max |ref| = " << scale;
    // Stricter than the bound: this implementation lands near 5e-6 on every fixture, while using
    // eps 1e-5 instead of 1e-6 in the q/kv latent norms (model-spec §2.7) gives 3.5e-5 to 6e-5 here and
    // would slip through 1e-4. The fixtures compute in fp32 from the stored weights, so this holds for BF16
    // and FP8 weights too.
    EXPECT_LE(err, 2e-5 * scale) << c.fixture << " chunk " << c.chunk << ": above the implementation's bound";
}

std::vector<Case> all_cases(const std::vector<std::string>& fixtures) {
    std::vector<Case> cases;
    for (const auto& f : fixtures) {
        for (int64_t chunk : {0, 1, 7}) cases.push_back({f, chunk});
    }
    return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    return info.param.fixture + "_chunk" + std::to_string(info.param.chunk);
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, FixtureLogits, ::testing::ValuesIn(all_cases(test::fixture_names())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(ModelPy, FixtureLogits, ::testing::ValuesIn(all_cases(test::model_py_fixture_names())),
                         case_name);

// The fixture configs exercise every IndexShare source of config.json and the legacy head_dim field.
TEST(FixtureConfigs, IndexerLayoutResolvedFromEachSource) {
    const auto layout = [](const std::string& f) {
        const ModelConfig c = load_config(test::fixture_dir(f));
        std::string s;
        for (bool full : c.layer_full) s += full ? 'F' : 'S';
        return std::make_pair(s, c.indexer_source);
    };
    EXPECT_EQ(layout("freq_offset_f32"), std::make_pair(std::string("FFFSSSFS"),
                                                        std::string("index_topk_freq/index_skip_topk_offset")));
    EXPECT_EQ(layout("pattern_bf16"), std::make_pair(std::string("FFSFSSFS"), std::string("index_topk_pattern")));
    EXPECT_EQ(layout("allfull_group_f32").first, "FFFFFFFF");
    EXPECT_EQ(layout("explicit_fp8"), std::make_pair(std::string("FFFSSSFS"), std::string("indexer_types")));
    EXPECT_EQ(layout("train_model_bf16"), std::make_pair(std::string("FSSSFS"), std::string("indexer_types")));
    EXPECT_EQ(load_config(test::fixture_dir("allfull_group_f32")).n_group, 2);
}

}  // namespace
}  // namespace megactx
