// Synthetic weights (model/synthetic_weights.h) and a solo rank (parallel/comm_solo.h), the benchmarks' way to run
// shapes no disk holds: the store has every tensor a checkpoint of the config has, in the asked dtypes, each matrix
// at its own address; the model loads from it whole or as one rank's shard and its forward gives finite logits.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/cpu/cpu_ops.h"
#include "engine/runner.h"
#include "io/config.h"
#include "model/gen_model.h"
#include "model/glm_dsa.h"
#include "model/synthetic_weights.h"
#include "parallel/comm_solo.h"
#include "parallel/shard_plan.h"

namespace megactx {
namespace {

ModelConfig tiny_config() { return parse_config_json(preset_config("tiny").dump(), "tiny"); }

TEST(SyntheticWeights, HoldEveryCheckpointTensorAtItsOwnAddress) {
    const ModelConfig c = tiny_config();
    for (DType lt : {DType::F32, DType::BF16, DType::F8_E4M3}) {
        const std::unique_ptr<TensorStore> store = synthetic_store(c, lt, 3);
        const std::vector<TensorToWrite> want = model_tensors(c, lt, 3, false);
        ASSERT_EQ(store->names().size(), want.size());
        std::set<const uint8_t*> matrices;
        int64_t n_matrices = 0;
        for (const TensorToWrite& t : want) {
            const TensorInfo& info = store->get(t.name, t.shape);
            EXPECT_EQ(info.dtype, t.dtype) << t.name;
            if (t.shape.size() == 2 && t.name.find("weight_scale_inv") == std::string::npos) {
                matrices.insert(info.data);
                ++n_matrices;
            }
        }
        EXPECT_EQ(static_cast<int64_t>(matrices.size()), n_matrices) << "matrices sharing an address";
        EXPECT_GT(n_matrices, 50);
    }
    EXPECT_THROW(synthetic_store(c, DType::F16, 0), Error);
}

bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

TEST(SyntheticWeights, WholeModelAndSoloRankRunForwards) {
    const ModelConfig c = tiny_config();
    const std::vector<int32_t> tokens = {5, 17, 42, 99, 3, 250, 7, 8, 300, 11};
    CpuOps ops;
    const GlmDsaModel whole(c, synthetic_store(c, DType::F8_E4M3, 1));
    ASSERT_TRUE(whole.has_mtp());
    SequenceRunner r(whole, ops, 16);
    const std::vector<float> logits = r.feed(tokens, 4, true);
    ASSERT_EQ(logits.size(), tokens.size() * static_cast<size_t>(c.vocab_size));
    EXPECT_TRUE(all_finite(logits));
    float spread = 0.0f;
    for (int64_t v = 1; v < c.vocab_size; ++v) spread = std::max(spread, std::fabs(logits[v] - logits[0]));
    EXPECT_GT(spread, 1e-3f) << "logits do not depend on the vocabulary row";

    // Rank 1 of 2 (expert parallel) alone: its half of the experts and heads, its columns of the logits, zeros in
    // the other rank's.
    ParallelOptions po;
    po.n_gpus = 2;
    po.expert_parallel = true;
    const ShardPlan plan = make_shard_plan(c, po);
    SoloRankComm comm(ops, 1, 2);
    EXPECT_TRUE(comm.on_device_only());
    const GlmDsaModel rank(c, synthetic_store(c, DType::F8_E4M3, 1), &plan, 1, &comm);
    EXPECT_TRUE(rank.single_device());  // its forward records as one graph where the backend can
    SequenceRunner rr(rank, ops, 16);
    const std::vector<float> part = rr.feed(tokens, 4, true);
    ASSERT_EQ(part.size(), logits.size());
    EXPECT_TRUE(all_finite(part));
    const Range mine = plan.ranks[1].vocab;
    for (size_t i = 0; i < tokens.size(); ++i) {
        for (int64_t v = 0; v < c.vocab_size; ++v) {
            if (v < mine.begin || v >= mine.end)
                ASSERT_EQ(part[i * static_cast<size_t>(c.vocab_size) + static_cast<size_t>(v)], 0.0f) << v;
        }
    }
    EXPECT_THROW(SoloRankComm(ops, 0, 1), Error);
}

}  // namespace
}  // namespace megactx
