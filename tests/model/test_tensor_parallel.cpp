// Tensor / expert parallel on the CPU (issue 6): a TensorParallelGroup of 2 or 4 ranks (CpuOps each, ThreadComm)
// gives the single-device logits on every fixture — heads, MLP columns, expert columns or whole experts and the
// LM-head vocabulary split across the ranks, partial results summed — and transformers' logits within the
// fixture bounds; the collectives and weight shards are checked on their own. Pipeline stages (issue 53), alone
// and around tensor-parallel groups, give the logits of the same group without stages bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#include "backend/cpu/cpu_ops.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "fixture_util.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/glm_dsa.h"
#include "parallel/comm_thread.h"
#include "parallel/tp_group.h"

namespace megactx {
namespace {

std::unique_ptr<TensorParallelGroup> cpu_group(const std::string& dir, const ParallelOptions& o) {
    std::vector<std::unique_ptr<Ops>> ops;
    for (int64_t r = 0; r < o.n_gpus * o.pp; ++r) ops.push_back(std::make_unique<CpuOps>());
    return std::make_unique<TensorParallelGroup>(dir, o, std::move(ops), make_thread_comms);
}

struct TpCase {
    std::string fixture;
    int64_t ranks;
    bool expert_parallel;
    int64_t chunk;
    bool layer_split = false;
    bool indexer_split = false;
};

class TensorParallelLogits : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelLogits, MatchesOneDeviceAndTransformers) {
    const TpCase c = GetParam();
    const std::string dir = test::fixture_dir(c.fixture);
    const std::vector<int32_t> tokens = test::fixture_tokens(c.fixture);
    const auto n = static_cast<int64_t>(tokens.size());

    const GlmDsaModel single(dir);
    CpuOps ops1;
    SequenceRunner r1(single, ops1, n);
    const std::vector<float> want = r1.feed(tokens, c.chunk, true);

    ParallelOptions o;
    o.n_gpus = c.ranks;
    o.expert_parallel = c.expert_parallel;
    o.layer_split = c.layer_split;
    o.indexer_split = c.indexer_split;
    auto group = cpu_group(dir, o);
    SequenceRunner rg(group->model(), group->ops(), n);
    if (c.layer_split) {  // rank 0 holds only its group of layers
        EXPECT_LT(rg.kv().layers().size(), group->model().config().n_layers_total());
        EXPECT_LT(rg.kv().bytes_per_token(), kv_bytes_per_token(group->model().config(), KvFormat::F32));
    }
    const std::vector<float> got = rg.feed(tokens, c.chunk, true);
    ASSERT_EQ(got.size(), want.size());

    const NpyArray ref = read_npy_f32(dir + "/ref_logits.npy");
    const double scale = test::max_abs(ref.data);
    const double vs_single = test::max_abs_diff(got.data(), want.data(), got.size()) / scale;
    const double vs_ref = test::max_abs_diff(got.data(), ref.data.data(), got.size()) / scale;
    std::printf("%s TP%lld%s%s%s chunk %lld: vs one device %.2e, vs transformers %.2e (of max |ref|)\n",
                c.fixture.c_str(), static_cast<long long>(c.ranks), c.expert_parallel ? "+EP" : "",
                c.layer_split ? "+LayerSplit" : "", c.indexer_split ? "+IndexerSplit" : "",
                static_cast<long long>(c.chunk), vs_single, vs_ref);
    // Only the summation order differs (partial sums per rank, then across ranks): fp32 rounding.
    EXPECT_LE(vs_single, 1e-5);  // measured ≤ 2.5e-6; a wrong shard or a missed reduction gives O(1)
    EXPECT_LE(vs_ref, 2e-5);
}

std::vector<TpCase> tp_cases() {
    std::vector<TpCase> cases;
    for (const auto& f : test::fixture_names()) {
        cases.push_back({f, 2, false, 0});
        cases.push_back({f, 2, true, 7});
        cases.push_back({f, 4, true, 0});
        cases.push_back({f, 2, true, 0, true});
        cases.push_back({f, 4, false, 5, true});
        cases.push_back({f, 2, true, 7, false, true});
        cases.push_back({f, 4, false, 0, false, true});
    }
    cases.push_back({"pattern_bf16", 4, false, 1});
    cases.push_back({"freq_offset_f32", 4, true, 1, true});  // token by token: decode-shaped collectives
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelLogits, ::testing::ValuesIn(tp_cases()),
                         [](const ::testing::TestParamInfo<TpCase>& info) {
                             return info.param.fixture + "_tp" + std::to_string(info.param.ranks) +
                                    (info.param.expert_parallel ? "_ep" : "") +
                                    (info.param.layer_split ? "_layersplit" : "") +
                                    (info.param.indexer_split ? "_indexersplit" : "") + "_chunk" +
                                    std::to_string(info.param.chunk);
                         });

TEST(TensorParallel, GreedyGenerationMatchesOneDevice) {
    const std::string dir = test::fixture_dir("pattern_bf16");
    const std::vector<int32_t> prompt = test::fixture_tokens("pattern_bf16");
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
    const GlmDsaModel single(dir);
    CpuOps ops1;
    SequenceRunner r1(single, ops1, 40 + 24);
    const auto want = r1.generate(head, 24, SamplingParams{}, false);
    ParallelOptions o;
    o.n_gpus = 2;
    o.expert_parallel = true;
    auto group = cpu_group(dir, o);
    SequenceRunner rg(group->model(), group->ops(), 40 + 24);
    EXPECT_EQ(rg.generate(head, 24, SamplingParams{}, false), want);
}

TEST(TensorParallel, BadBatchFailsWithoutHangingTheFollowers) {
    const std::string dir = test::fixture_dir("freq_offset_f32");
    ParallelOptions o;
    o.n_gpus = 2;
    auto group = cpu_group(dir, o);
    SequenceRunner rg(group->model(), group->ops(), 64);
    EXPECT_THROW(rg.feed({0, 1, 1 << 20}, 0, false), Error);  // token id out of range: rank 0 rejects it first
    EXPECT_EQ(rg.feed({0, 1, 2}, 0, false).size(), static_cast<size_t>(group->model().config().vocab_size));
}

// A group that cannot be built fails with an error naming the reason.
void expect_group_error(const ParallelOptions& o, const std::string& part) {
    try {
        cpu_group(test::fixture_dir("freq_offset_f32"), o);
        FAIL() << "expected an error containing '" << part << "'";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
}

TEST(TensorParallel, IndexerSplitAndLayerSplitExcludeEachOther) {
    ParallelOptions o;
    o.n_gpus = 2;
    o.indexer_split = true;
    o.layer_split = true;
    expect_group_error(o, "exclude each other");
}

TEST(TensorParallel, PlanThatDoesNotDivideIsRejected) {
    ParallelOptions o;
    o.n_gpus = 3;  // 4 heads
    expect_group_error(o, "does not divide by 3 GPUs");
}

TEST(ThreadComm, CollectivesGiveEveryRankTheSameValues) {
    constexpr int kRanks = 3;
    std::vector<std::unique_ptr<Ops>> ops;
    std::vector<Ops*> raw;
    for (int r = 0; r < kRanks; ++r) {
        ops.push_back(std::make_unique<CpuOps>());
        raw.push_back(ops.back().get());
    }
    auto comms = make_thread_comms(raw);
    std::vector<std::vector<float>> sums(kRanks), gathered(kRanks);
    std::vector<std::vector<int32_t>> bcast(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, r] {
            Ops& o = *ops[static_cast<size_t>(r)];
            Comm& c = *comms[static_cast<size_t>(r)];
            Tensor t = o.alloc(DType::F32, {2, 3});
            for (int i = 0; i < 6; ++i) t.f32()[i] = static_cast<float>((r + 1) * (i + 1));
            c.all_reduce_sum(t);
            sums[static_cast<size_t>(r)].assign(t.f32(), t.f32() + 6);
            Tensor part = o.alloc(DType::F32, {2, 2});  // rank r's columns [2r, 2r + 2) of a [2, 6] matrix
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j) part.f32()[i * 2 + j] = static_cast<float>(i * 6 + 2 * r + j);
            Tensor full = o.alloc(DType::F32, {2, 6});
            c.all_gather_cols(part, full);
            gathered[static_cast<size_t>(r)].assign(full.f32(), full.f32() + 12);
            Tensor b = o.alloc(DType::I32, {4});
            for (int i = 0; i < 4; ++i) b.i32()[i] = r * 100 + i;
            c.broadcast(b, 2);
            bcast[static_cast<size_t>(r)].assign(b.i32(), b.i32() + 4);
        });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
        for (int i = 0; i < 6; ++i) EXPECT_EQ(sums[static_cast<size_t>(r)][static_cast<size_t>(i)], 6.0f * (i + 1));
        for (int i = 0; i < 12; ++i) EXPECT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(i)], static_cast<float>(i));
        EXPECT_EQ(bcast[static_cast<size_t>(r)], (std::vector<int32_t>{200, 201, 202, 203}));
    }
}

TEST(SliceWeight, RowsAndColumnsOfEveryDtype) {
    for (const auto& f : test::fixture_names()) {
        const TensorStore store(test::fixture_dir(f));
        const GlmDsaModel m(test::fixture_dir(f));
        const ModelConfig& c = m.config();
        const Weight w = load_weight(store, "model.layers.0.self_attn.o_proj.weight", c.hidden_size,
                                     c.n_head * c.v_head_dim);
        const Weight s = slice_weight(w, 8, 40, c.v_head_dim, 3 * c.v_head_dim);
        ASSERT_EQ(s.rows, 32);
        ASSERT_EQ(s.cols, 2 * c.v_head_dim);
        EXPECT_NE(s.data, w.data);
        std::vector<float> full(static_cast<size_t>(w.cols)), part(static_cast<size_t>(s.cols));
        for (int64_t r = 0; r < s.rows; ++r) {
            w.row_f32(8 + r, full.data());
            s.row_f32(r, part.data());
            for (int64_t j = 0; j < s.cols; ++j)
                ASSERT_EQ(part[static_cast<size_t>(j)], full[static_cast<size_t>(c.v_head_dim + j)]) << f << " " << r;
        }
        EXPECT_THROW(slice_weight(w, 0, w.rows + 1, 0, w.cols), Error);
    }
}

}  // namespace
}  // namespace megactx

namespace megactx {
namespace {

// A rank whose backend fails at its n-th linear (e.g. out of memory half-way through a forward).
class FailingOps final : public CpuOps {
public:
    explicit FailingOps(int fail_at) : fail_at_(fail_at) {}
    void linear(const Tensor& x, const Weight& w, Tensor& y) override {
        if (++calls_ == fail_at_) MEGACTX_FAIL("injected failure in linear {}", w.name);
        CpuOps::linear(x, w, y);
    }

private:
    int fail_at_, calls_ = 0;
};

// A rank whose device is too small for the KV pool.
class SmallOps final : public CpuOps {
public:
    Tensor alloc(DType dtype, std::vector<int64_t> shape) override {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        if (n > (int64_t{1} << 16)) MEGACTX_FAIL("out of memory: {} elements", n);
        return CpuOps::alloc(dtype, std::move(shape));
    }
};

TEST(TensorParallel, AFollowersPoolThatDoesNotFitFailsAtStartup) {
    ParallelOptions o;
    o.n_gpus = 2;
    std::vector<std::unique_ptr<Ops>> ops;
    ops.push_back(std::make_unique<CpuOps>());
    ops.push_back(std::make_unique<SmallOps>());
    TensorParallelGroup g(test::fixture_dir("pattern_bf16"), o, std::move(ops), make_thread_comms);
    try {
        SequenceRunner run(g.model(), g.ops(), 4096);  // rank 0 fits; rank 1's pool does not
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
    }
}

TEST(TensorParallel, ARankFailingMidForwardReportsItsErrorWithoutHanging) {
    for (int failing_rank : {0, 1}) {
        ParallelOptions o;
        o.n_gpus = 2;
        std::vector<std::unique_ptr<Ops>> ops;
        for (int r = 0; r < 2; ++r) {
            if (r == failing_rank) ops.push_back(std::make_unique<FailingOps>(12));  // inside layer 1
            else ops.push_back(std::make_unique<CpuOps>());
        }
        TensorParallelGroup g(test::fixture_dir("pattern_bf16"), o, std::move(ops), make_thread_comms);
        SequenceRunner run(g.model(), g.ops(), 64);
        try {
            run.feed({1, 2, 3, 4}, 0, false);
            FAIL() << "expected an error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos)
                << "rank " << failing_rank << ": " << e.what();
        }
        // The group is aborted: the next forward fails at once instead of hanging.
        EXPECT_THROW(run.feed({5}, 0, false), Error);
    }
}

}  // namespace
}  // namespace megactx

namespace megactx {
namespace {

struct EngineRun {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> logprobs;
    int64_t cached_last = 0;  // the last request's prompt tokens served by the prefix cache
    EngineStats mid;          // after the first three requests
};

// Three requests with chunked prefill interleaved with decodes, then request 0's prompt again (a prefix hit).
EngineRun run_engine(const GlmDsaModel& model, Ops& ops, EngineConfig cfg) {
    const std::vector<int32_t> base = test::fixture_tokens("pattern_bf16");
    cfg.scheduler.max_num_batched_tokens = 40;
    Engine e(model, ops, cfg);
    std::map<int64_t, std::vector<int32_t>> tokens;
    std::map<int64_t, std::vector<float>> logprobs;
    std::map<int64_t, int64_t> cached;
    auto sink = [&](const TokenEvent& ev) {
        if (ev.token >= 0) {
            tokens[ev.request_id].push_back(ev.token);
            if (ev.has_logprobs) logprobs[ev.request_id].push_back(ev.logprobs.logprob);
        }
        cached[ev.request_id] = ev.n_cached_prompt;
        return true;
    };
    GenerationParams g;
    g.max_tokens = 6;
    g.ignore_eos = true;
    g.top_logprobs = 1;
    std::vector<int64_t> ids;
    auto prompt = [&](int64_t n, int32_t salt) {  // fixture tokens, varied, longer than the fixture
        std::vector<int32_t> p;
        for (int64_t i = 0; i < n; ++i)
            p.push_back((base[static_cast<size_t>(i) % base.size()] + salt * static_cast<int32_t>(i / 7)) % 250 + 2);
        return p;
    };
    for (int i = 0; i < 3; ++i) ids.push_back(e.submit(prompt(70 + 9 * i, i + 1), g, sink));
    while (e.step()) {
    }
    EngineRun out;
    out.mid = e.stats();
    ids.push_back(e.submit(prompt(70, 1), g, sink));  // request 0's prompt again: a prefix hit
    while (e.step()) {
    }
    for (int64_t id : ids) {
        out.tokens.push_back(tokens[id]);
        out.logprobs.push_back(logprobs[id]);
    }
    out.cached_last = cached[ids.back()];
    return out;
}

void expect_same_run(const EngineRun& got, const EngineRun& want) {
    EXPECT_EQ(got.cached_last, want.cached_last);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t i = 0; i < want.logprobs.size(); ++i) {
        ASSERT_EQ(got.logprobs[i].size(), want.logprobs[i].size());
        for (size_t j = 0; j < want.logprobs[i].size(); ++j)
            EXPECT_NEAR(got.logprobs[i][j], want.logprobs[i][j], 1e-4) << i << " " << j;
    }
}

// The engine with MTP speculation on the shipped demo model, k drafts a step (0: plain decoding; share: later draft
// steps reuse step 0's top-k): three requests with chunked prefill beside the others' verification, 24 greedy
// tokens each.
std::vector<std::vector<int32_t>> run_speculative(const GlmDsaModel& model, Ops& ops, int64_t k, bool share,
                                                  EngineStats* stats) {
    const std::vector<int32_t> text = test::fixture_tokens("../data/glm_demo_ref");
    EngineConfig cfg;
    cfg.n_kv_blocks = 32;
    cfg.scheduler.max_num_batched_tokens = 64;  // chunked prefill next to the other requests' verification
    cfg.speculative_tokens = k;
    cfg.no_mtp_index_share = !share;
    Engine e(model, ops, cfg);
    std::map<int64_t, std::vector<int32_t>> tokens;
    GenerationParams g;
    g.max_tokens = 24;
    g.ignore_eos = true;
    std::vector<int64_t> ids;
    for (int i = 0; i < 3; ++i) {
        const std::vector<int32_t> p(text.begin() + 10 * i, text.begin() + 60 + 40 * i);
        ids.push_back(e.submit(p, g, [&tokens](const TokenEvent& ev) {
            if (ev.token >= 0) tokens[ev.request_id].push_back(ev.token);
            return true;
        }));
    }
    while (e.step()) {
    }
    if (stats) *stats = e.stats();
    std::vector<std::vector<int32_t>> out;
    for (int64_t id : ids) out.push_back(tokens[id]);
    return out;
}

// The serving engine on parallel layouts: rank 0 drives the group unchanged.
struct Layout {
    const char* name;
    int64_t tp, pp;
    bool ep, layer_split;
};

ParallelOptions options(const Layout& l) {
    ParallelOptions o;
    o.n_gpus = l.tp;
    o.pp = l.pp;
    o.expert_parallel = l.ep;
    o.layer_split = l.layer_split;
    return o;
}

// The run on one device without a host tier (32 KV blocks): what every layout must give.
EngineRun one_device_run(const std::string& dir) {
    EngineConfig cfg;
    cfg.n_kv_blocks = 32;
    const GlmDsaModel single(dir);
    CpuOps ops;
    return run_engine(single, ops, cfg);
}

// Continuous batching with chunked prefill (under PP, micro-batches that cut sequences and mix prefill with
// decode) and a prefix-cache hit give one device's tokens and log-probabilities.
TEST(ParallelEngine, WithPrefixCacheMatchesOneDevice) {
    const std::string dir = test::fixture_dir("pattern_bf16");
    EngineConfig cfg;
    cfg.n_kv_blocks = 32;
    const EngineRun want = one_device_run(dir);
    EXPECT_EQ(want.cached_last, 64);
    for (const Layout& l : {Layout{"TP 2 + EP + LayerSplit", 2, 1, true, true}, Layout{"PP 2", 1, 2, false, false},
                            Layout{"PP 2 x TP 2 + EP", 2, 2, true, false}}) {
        SCOPED_TRACE(l.name);
        auto group = cpu_group(dir, options(l));
        expect_same_run(run_engine(group->model(), group->ops(), cfg), want);
    }
}

// The host KV tier: with 2 device blocks and 30 host blocks each rank moves its blocks by its own layers'
// selections (every layer under TP + EP; its own layers under LayerSplit and on a pipeline stage) and fetches
// selected rows from the host, giving one untiered device's tokens and log-probabilities, the prefix hit included.
TEST(ParallelEngine, WithHostTierMatchesOneDevice) {
    const std::string dir = test::fixture_dir("pattern_bf16");
    const EngineRun want = one_device_run(dir);
    EngineConfig tiered;
    tiered.n_kv_blocks = 2;
    tiered.n_kv_host_blocks = 30;
    for (const Layout& l : {Layout{"TP 2 + EP", 2, 1, true, false}, Layout{"TP 2 + EP + LayerSplit", 2, 1, true, true},
                            Layout{"PP 2", 1, 2, false, false}, Layout{"PP 2 x TP 2 + LayerSplit", 2, 2, false, true}}) {
        SCOPED_TRACE(l.name);
        auto group = cpu_group(dir, options(l));
        const EngineRun got = run_engine(group->model(), group->ops(), tiered);
        EXPECT_GT(got.mid.kv_host_blocks_used, 0);
        EXPECT_GT(got.mid.kv_fetched_rows, 0);
        expect_same_run(got, want);
    }
}

// MTP speculation on the shipped demo model: under TP the MTP layer is sharded like the others (its inputs reach
// the followers through host memory); under PP it runs on the last stage, its inputs shipped there and its
// logits, hidden rows and top-k back to rank 0. Greedy tokens equal plain decoding's on the same group and one
// device's, the drafts are one device's (followers given wrong inputs would draft worse), and the draft steps
// after the first reuse step 0's top-k or, with no_mtp_index_share, run the MTP indexer: the same tokens.
TEST(ParallelEngine, SpeculativeDecodingMatchesPlain) {
    const std::string dir = MEGACTX_DEFAULT_MODEL_DIR;
    const GlmDsaModel single(dir);
    CpuOps ops1;
    EngineStats one_device;
    const auto want = run_speculative(single, ops1, 3, true, &one_device);
    ASSERT_GT(one_device.spec.mean_acceptance_length(), 1.5);
    for (const Layout& l : {Layout{"TP 2 + EP", 2, 1, true, false}, Layout{"TP 2 + LayerSplit", 2, 1, false, true},
                            Layout{"PP 2", 1, 2, false, false}, Layout{"PP 2 x TP 2 + EP", 2, 2, true, false}}) {
        SCOPED_TRACE(l.name);
        auto group = cpu_group(dir, options(l));
        const auto plain = run_speculative(group->model(), group->ops(), 0, true, nullptr);
        ASSERT_EQ(plain.size(), 3u);
        for (const auto& t : plain) ASSERT_EQ(t.size(), 24u);
        EXPECT_EQ(plain, want);
        EngineStats st;
        EXPECT_EQ(run_speculative(group->model(), group->ops(), 3, true, &st), plain);
        std::printf("%s K=3: drafts accepted %lld of %lld, mean acceptance length %.2f\n", l.name,
                    static_cast<long long>(st.spec.accepted), static_cast<long long>(st.spec.drafted),
                    st.spec.mean_acceptance_length());
        EXPECT_EQ(st.spec.accepted_at, one_device.spec.accepted_at);
        EXPECT_EQ(st.spec.drafted_at, one_device.spec.drafted_at);
        EXPECT_EQ(run_speculative(group->model(), group->ops(), 3, false, nullptr), plain) << "per-step MTP indexer";
    }
}

// Pipeline parallel (issue 53): P stages of `tp` ranks, each stage its layers and their KV, the batch in
// micro-batches; the logits equal those of the same tensor-parallel group without stages (one device for tp 1)
// bit for bit: a stage runs the same ops on the same rows, only split into micro-batches, and the CPU backend's
// rows do not depend on the rest of the batch.
struct PpCase {
    std::string fixture;
    int64_t pp, tp;
    bool expert_parallel;
    int64_t chunk;
    bool layer_split = false;
};

class PipelineParallelLogits : public ::testing::TestWithParam<PpCase> {};

TEST_P(PipelineParallelLogits, EqualTheGroupWithoutStagesBitForBit) {
    const PpCase c = GetParam();
    const std::string dir = test::fixture_dir(c.fixture);
    const std::vector<int32_t> tokens = test::fixture_tokens(c.fixture);
    const auto n = static_cast<int64_t>(tokens.size());
    ParallelOptions o;
    o.n_gpus = c.tp;
    o.expert_parallel = c.expert_parallel;
    o.layer_split = c.layer_split;
    std::vector<float> want;
    if (c.tp == 1) {
        const GlmDsaModel single(dir);
        CpuOps ops1;
        SequenceRunner r1(single, ops1, n);
        want = r1.feed(tokens, c.chunk, true);
    } else {
        auto flat = cpu_group(dir, o);
        SequenceRunner rf(flat->model(), flat->ops(), n);
        want = rf.feed(tokens, c.chunk, true);
    }
    o.pp = c.pp;
    auto group = cpu_group(dir, o);
    EXPECT_EQ(group->size(), c.pp * c.tp);
    SequenceRunner rg(group->model(), group->ops(), n);
    EXPECT_LT(rg.kv().layers().size(), group->model().config().n_layers_total());  // stage 0's layers only
    const std::vector<float> got = rg.feed(tokens, c.chunk, true);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "max |diff| " << test::max_abs_diff(got.data(), want.data(), got.size());
}

std::vector<PpCase> pp_cases() {
    std::vector<PpCase> cases;
    for (const auto& f : test::fixture_names()) {
        cases.push_back({f, 2, 1, false, 0});
        cases.push_back({f, 3, 1, false, 7});  // stage 1 starts at layer 3, a shared layer: the top-k travels too
        cases.push_back({f, 2, 2, true, 0});
        cases.push_back({f, 2, 2, false, 5, true});
    }
    cases.push_back({"pattern_bf16", 4, 1, false, 1});  // token by token: one micro-batch a step
    cases.push_back({"freq_offset_f32", 8, 1, true, 3});  // a layer a stage
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PipelineParallelLogits, ::testing::ValuesIn(pp_cases()),
                         [](const ::testing::TestParamInfo<PpCase>& info) {
                             const PpCase& c = info.param;
                             return c.fixture + "_pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) +
                                    (c.expert_parallel ? "_ep" : "") + (c.layer_split ? "_layersplit" : "") +
                                    "_chunk" + std::to_string(c.chunk);
                         });

TEST(PipelineParallel, MicroBatchesCoverTheBatchInOrder) {
    EXPECT_EQ(micro_batches(1, 4), (std::vector<Range>{{0, 1}}));
    EXPECT_EQ(micro_batches(5, 2), (std::vector<Range>{{0, 2}, {2, 5}}));
    EXPECT_EQ(micro_batches(9, 3), (std::vector<Range>{{0, 3}, {3, 6}, {6, 9}}));
    EXPECT_EQ(micro_batches(7, 1), (std::vector<Range>{{0, 7}}));
}

TEST(PipelineParallel, MoreStagesThanLayersIsRejected) {
    ParallelOptions o;
    o.pp = 9;  // 8 layers
    expect_group_error(o, "--pipeline-parallel-size must be 1..8");
}

}  // namespace
}  // namespace megactx
