// The whole model on the GPU against the CPU oracle: logits of every fixture (tests/fixtures, reference from
// transformers) fed in one pass, 7 tokens and 1 token at a time, with the KV cache in f32, bf16 and fp8, and
// greedy generation of 32 tokens. Skips without a GPU.
// DSA selects the top-k cached tokens by score, so a perturbation of the keys (bf16 / fp8 storage) can swap a
// near-tied candidate and move the logits by tens of percent (seen on the H200: bf16 KV against the plain f32 CPU
// run differs by 0.65 · max |logit| from the first token where selection starts, token index_topk + 1). The
// reference is therefore the CPU oracle storing its KV rows through the same format (KvFormatCpuOps), and the GPU
// runs fp32 GEMMs where the checkpoint is bf16 / fp8. Error = max |gpu − ref| / max |ref|; the distance to the plain
// f32 CPU run and to transformers is printed as information.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "eval/niah.h"
#include "io/npy.h"
#include "kv/kv_cache.h"
#include "kv/kv_format.h"
#include "model/gen_model.h"
#include "model/glm_dsa.h"
#include "model/graphed_forward.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

// The fixtures folder: $MEGACTX_FIXTURE_DIR when set (binaries carried to another machine), else the source tree's.
std::string fixture_path(const std::string& name) {
    const char* env = std::getenv("MEGACTX_FIXTURE_DIR");
    return (env != nullptr ? std::string(env) : std::string(MEGACTX_FIXTURE_DIR)) + "/" + name;
}

std::vector<int32_t> fixture_tokens(const std::string& name) {
    std::ifstream in(fixture_path(name) + "/tokens.json");
    return nlohmann::json::parse(in)["token_ids"].get<std::vector<int32_t>>();
}

// The shipped demo model: $MEGACTX_DEMO_MODEL when set (binaries carried to another machine), else the source tree's.
std::string demo_model_dir() {
    const char* env = std::getenv("MEGACTX_DEMO_MODEL");
    return env != nullptr ? std::string(env) : std::string(MEGACTX_DEMO_MODEL_DIR);
}

// The CPU oracle with the GPU's KV storage: rows pass through `format` (bf16 rounding, or FP8 pack + unpack) before
// they are stored in the CPU's F32 pool. With the indexer's Hadamard rotation (ModelConfig::indexer_hadamard) an FP8
// cache stores the rotated keys, as the GPU does, and the queries are rotated to score against them.
class KvFormatCpuOps : public CpuOps {
  public:
    explicit KvFormatCpuOps(KvFormat format) : format_(format) {}

    void latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                            const Rope& rope, const Tensor& slots, Tensor& cache) override {
        writing_ = Writing::kLatent;
        rank_ = static_cast<int64_t>(norm_w.size());
        CpuOps::latent_cache_write(kv_a, norm_w, eps, pos, rope, slots, cache);
        writing_ = Writing::kNone;
    }
    void indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w, const std::vector<float>& ln_b,
                             float eps, const Tensor& pos, const Rope& rope, const Tensor& slots, Tensor& cache,
                             bool hadamard) override {
        writing_ = Writing::kIndexer;
        rotate_ = hadamard && format_ == KvFormat::FP8;
        CpuOps::indexer_cache_write(k_raw, ln_w, ln_b, eps, pos, rope, slots, cache, false);
        writing_ = Writing::kNone;
    }
    void indexer_topk(const IndexerTopkParams& p) override {
        if (!p.hadamard || format_ != KvFormat::FP8) return CpuOps::indexer_topk(p);
        Tensor q = alloc(DType::F32, p.q->shape);  // [n, n_head_indexer, d_indexer] H · q per head
        std::memcpy(q.f32(), p.q->f32(), static_cast<size_t>(q.numel()) * 4);
        const int64_t d = q.shape.back();
        for (int64_t r = 0; r < q.numel() / d; ++r) hadamard_transform(q.f32() + r * d, d);
        IndexerTopkParams rotated = p;
        rotated.q = &q;
        CpuOps::indexer_topk(rotated);
    }
    void cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) override {
        if (writing_ == Writing::kNone || format_ == KvFormat::F32) return CpuOps::cache_write(rows, slots, cache);
        const int64_t d = rows.shape.back(), n = rows.numel() / d;
        Tensor r = alloc(DType::F32, {n, d});  // [n, d] rows as the format stores them
        std::vector<uint8_t> buf(static_cast<size_t>(fp8_indexer_block_bytes(d) + fp8_latent_row_bytes(d, d)));
        for (int64_t i = 0; i < n; ++i) {
            const float* src = rows.f32() + i * d;
            float* dst = r.f32() + i * d;
            if (format_ == KvFormat::BF16) {
                for (int64_t c = 0; c < d; ++c) dst[c] = bf16_to_f32(f32_to_bf16(src[c]));
            } else if (writing_ == Writing::kLatent) {
                fp8_latent_pack(src, rank_, d - rank_, buf.data());
                fp8_latent_unpack(buf.data(), rank_, d - rank_, dst);
            } else {
                std::vector<float> key(src, src + d);
                if (rotate_) hadamard_transform(key.data(), d);
                fp8_indexer_pack(key.data(), d, 0, buf.data());
                fp8_indexer_unpack(buf.data(), d, 0, dst);
            }
        }
        CpuOps::cache_write(r, slots, cache);
    }

  private:
    enum class Writing { kNone, kLatent, kIndexer };
    KvFormat format_;
    Writing writing_ = Writing::kNone;
    bool rotate_ = false;  // the indexer keys being written are stored rotated
    int64_t rank_ = 0;
};

// The GPU runs these with fp32 GEMMs (CudaOptions::gemm_f32), so bf16 / FP8 checkpoints are compared without
// GEMM-input rounding: on these tiny random models (top-8 of ~80 tokens, random routers) rounding every GEMM
// input to bf16 alone moves the CPU's own logits by 0.3-1.0 × max |logit| through near-tied top-k and router
// choices (measured on the H200 run of 2026-11-29), so only the KV format's rounding is emulated and bounded.
double kv_tolerance(KvFormat f) { return f == KvFormat::F32 ? 1e-4 : f == KvFormat::BF16 ? 1e-2 : 5e-2; }

struct Case {
    std::string fixture;
    KvFormat format;
    int64_t chunk;
};

class CudaFixtureLogits : public ::testing::TestWithParam<Case> {};

TEST_P(CudaFixtureLogits, MatchesCpu) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const Case c = GetParam();
    const GlmDsaModel model(fixture_path(c.fixture));
    const std::vector<int32_t> tokens = fixture_tokens(c.fixture);
    const NpyArray ref = read_npy_f32(fixture_path(c.fixture) + "/ref_logits.npy");
    const auto n = static_cast<int64_t>(tokens.size());

    CpuOps cpu;
    SequenceRunner cpu_run(model, cpu, n);
    const std::vector<float> plain = cpu_run.feed(tokens, c.chunk, true);
    KvFormatCpuOps emul(c.format);
    SequenceRunner emul_run(model, emul, n);
    const std::vector<float> want = emul_run.feed(tokens, c.chunk, true);

    CudaOptions o;
    o.gemm_f32 = true;
    const std::unique_ptr<Ops> gpu = make_cuda_ops(o);
    SequenceRunner gpu_run(model, *gpu, n, c.format);
    const std::vector<float> got = gpu_run.feed(tokens, c.chunk, true);
    ASSERT_EQ(got.size(), want.size());

    const double scale = test::max_abs(want);
    const double err = test::max_abs_diff(got.data(), want.data(), got.size());
    const double err_plain = test::max_abs_diff(got.data(), plain.data(), got.size()) / test::max_abs(plain);
    const double err_ref = test::max_abs_diff(got.data(), ref.data.data(), got.size()) / test::max_abs(ref.data);
    const double tol = kv_tolerance(c.format);
    // Where the first token whose logits differ beyond the bound is tells a cache bug (late) from an op bug (all).
    int64_t first_bad = -1;
    const int64_t vocab = model.config().vocab_size;
    for (int64_t t = 0; t < n && first_bad < 0; ++t) {
        if (test::max_abs_diff(got.data() + t * vocab, want.data() + t * vocab, static_cast<size_t>(vocab)) >
            tol * scale)
            first_bad = t;
    }
    const CudaMemoryStats ms = cuda_memory_stats(*gpu);
    std::printf(
        "%-18s kv %-4s chunk %lld: |gpu-ref|/max = %.2e (tol %.0e); vs plain f32 cpu %.2e, vs transformers "
        "%.2e; first token over: %lld; %lld B reserved, %lld cudaMalloc\n",
        c.fixture.c_str(), kv_format_name(c.format), static_cast<long long>(c.chunk), err / scale, tol, err_plain,
        err_ref, static_cast<long long>(first_bad), static_cast<long long>(ms.reserved_bytes),
        static_cast<long long>(ms.n_cuda_malloc));
    if (c.format == KvFormat::F32) {
        EXPECT_LE(err, tol * scale) << c.fixture << " kv f32 chunk " << c.chunk;
    } else {
        // A rounded cache's stated bound (bf16 1e-2, FP8 5e-2 × max |ref|) holds up to the first cached value that
        // lands on a rounding boundary. The GPU's fp32 rows differ from the CPU's in the last bits (summation
        // order), and a value within that distance of a boundary rounds one step apart (bf16 2^-8, e4m3 ≈ 6%); on
        // these tiny random models (the bf16 cache alone moves the CPU's logits by 0.65-0.9 × max) a near-tied
        // top-8 choice then diverges: on the H200 2 of 27 fp8 cases from positions 31 and 53 of 80, and
        // dsv32_legacy_fp8 with bf16 from 27 (H200 and H100); on the H100 freq_offset_f32 bf16 chunk 7 from 47
        // (79bea48). So the first 24 positions must hold the bound and later ones are reported.
        EXPECT_TRUE(first_bad < 0 || first_bad >= 24) << c.fixture << " kv " << kv_format_name(c.format) << " chunk "
                                                      << c.chunk << ": position " << first_bad << " is over " << tol;
    }
}

std::vector<Case> all_cases() {
    std::vector<Case> cases;
    for (const auto& f : test::fixture_names()) {
        for (KvFormat kf : {KvFormat::F32, KvFormat::BF16, KvFormat::FP8}) {
            for (int64_t chunk : {0, 1, 7}) cases.push_back({f, kf, chunk});
        }
    }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, CudaFixtureLogits, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                             return info.param.fixture + "_" + kv_format_name(info.param.format) + "_chunk" +
                                    std::to_string(info.param.chunk);
                         });

// Greedy decoding from the fixture prompt: 32 new tokens, each decode step one token through the paged cache.
TEST(CudaGenerate, Greedy32MatchesCpu) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    for (const std::string fixture : {"freq_offset_f32", "allfull_group_f32"}) {
        const GlmDsaModel model(fixture_path(fixture));
        const std::vector<int32_t> prompt = fixture_tokens(fixture);
        const int64_t max_new = 32;
        SamplingParams sp;  // temperature 0: greedy
        const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
        for (KvFormat f : {KvFormat::F32, KvFormat::BF16}) {
            KvFormatCpuOps cpu(f);
            SequenceRunner cpu_run(model, cpu, static_cast<int64_t>(prompt.size()) + max_new);
            const std::vector<int32_t> want = cpu_run.generate(prompt, max_new, sp, false);
            SequenceRunner gpu_run(model, *gpu, static_cast<int64_t>(prompt.size()) + max_new, f);
            const std::vector<int32_t> got = gpu_run.generate(prompt, max_new, sp, false);
            ASSERT_EQ(got.size(), want.size());
            int64_t same_prefix = 0;
            while (same_prefix < static_cast<int64_t>(got.size()) && got[same_prefix] == want[same_prefix])
                ++same_prefix;
            std::printf("%s greedy 32, kv %s: first %lld of %zu new tokens agree with the CPU\n", fixture.c_str(),
                        kv_format_name(f), static_cast<long long>(same_prefix - static_cast<int64_t>(prompt.size())),
                        static_cast<size_t>(max_new));
            // f32 KV must agree token for token. bf16 KV is compared with the CPU that stores the same bf16 rows, but
            // the GPU's fp32 rows can still round to a neighbouring bf16 value and swap a near-tied top-k candidate:
            // there only the first new token is required.
            if (f == KvFormat::F32)
                EXPECT_EQ(got, want) << fixture << " kv f32";
            else
                EXPECT_GT(same_prefix, static_cast<int64_t>(prompt.size())) << fixture << " kv bf16: first new token";
        }
    }
}

// The caching allocator reaches a steady state: a second identical forward makes no new cudaMalloc.
TEST(CudaMemory, SteadyStateNoMalloc) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GlmDsaModel model(fixture_path("freq_offset_f32"));
    const std::vector<int32_t> tokens = fixture_tokens("freq_offset_f32");
    const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
    {
        SequenceRunner run(model, *gpu, static_cast<int64_t>(tokens.size()), KvFormat::BF16);
        run.feed(tokens, 7, false);
    }
    const int64_t before = cuda_memory_stats(*gpu).n_cuda_malloc;
    {
        SequenceRunner run(model, *gpu, static_cast<int64_t>(tokens.size()), KvFormat::BF16);
        run.feed(tokens, 7, false);
    }
    const CudaMemoryStats after = cuda_memory_stats(*gpu);
    std::printf("cudaMalloc calls: %lld after the first run, %lld after the second; %lld B reserved, %lld B weights\n",
                static_cast<long long>(before), static_cast<long long>(after.n_cuda_malloc),
                static_cast<long long>(after.reserved_bytes), static_cast<long long>(after.weight_bytes));
    EXPECT_EQ(after.n_cuda_malloc, before);
}

// A budget too small for the KV pool fails with an Error that names the budget.
TEST(CudaMemory, BudgetExceededIsAClearError) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    CudaOptions o;
    o.memory_budget_bytes = int64_t{64} << 20;
    const std::unique_ptr<Ops> gpu = make_cuda_ops(o);
    try {
        gpu->alloc(DType::F32, {int64_t{1} << 26});
        FAIL() << "allocation beyond the budget succeeded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
    }
}

}  // namespace

// The fast DSA kernels (FP8 indexer + exact top-k, wgmma sparse MLA, fused cache writes) inside the whole model,
// against the same model on the reference CUDA kernels (MEGACTX_CUDA_REFERENCE=1), on GLM-5.2's attention
// geometry (the glm52-mini preset) at 2600 tokens, so top-2048 selects. The two paths differ by design: the
// fast indexer scores FP8-quantised queries and sparse MLA multiplies bf16 queries, where the reference keeps
// fp32; a selection swap at the top-k boundary moves a token's logits. So the test bounds the typical row
// (median over rows) tightly and the worst row loosely, and prints both.
namespace {

std::string glm52_mini_dir() {
    const std::string dir = (std::filesystem::temp_directory_path() / "megactx-test-glm52-mini-seed0").string();
    if (!std::filesystem::exists(dir + "/config.json")) {
        GenModelOptions g;
        g.preset = "glm52-mini";
        generate_model(dir, g);
    }
    return dir;
}

std::vector<float> run_logits(const GlmDsaModel& model, bool reference, KvFormat f, const std::vector<int32_t>& toks,
                              int64_t chunk) {
    if (reference) setenv("MEGACTX_CUDA_REFERENCE", "1", 1);
    const std::unique_ptr<Ops> ops = make_cuda_ops(CudaOptions{});
    unsetenv("MEGACTX_CUDA_REFERENCE");
    SequenceRunner run(model, *ops, static_cast<int64_t>(toks.size()), f);
    return run.feed(toks, chunk, true);
}

// Greedy requests (ignore_eos, log-probabilities on) through an Engine on `ops`: all submitted at once and stepped
// to the end; with `repeat`, then each prompt again alone on the same engine (a prefix-cache hit), its results at
// index prompts.size() + i. Without `graphs`, MEGACTX_GRAPHS=0 while it runs.
struct Served {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> logprobs;
    std::vector<int64_t> cached;  // prompt tokens served from the prefix cache
    EngineStats stats;
};

Served serve_greedy(const GlmDsaModel& model, Ops& ops, const EngineConfig& cfg,
                    const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens, bool graphs = true,
                    bool repeat = false) {
    if (graphs)
        unsetenv("MEGACTX_GRAPHS");
    else
        setenv("MEGACTX_GRAPHS", "0", 1);
    Engine e(model, ops, cfg);
    Served r;
    const size_t n_req = prompts.size() * (repeat ? 2 : 1);
    r.tokens.resize(n_req);
    r.logprobs.resize(n_req);
    r.cached.assign(n_req, 0);
    auto submit = [&](size_t i) {
        GenerationParams g;
        g.max_tokens = max_tokens;
        g.ignore_eos = true;
        g.top_logprobs = 0;
        e.submit(prompts[i % prompts.size()], g, [&r, i](const TokenEvent& ev) {
            if (ev.token >= 0) {
                r.tokens[i].push_back(ev.token);
                r.logprobs[i].push_back(ev.logprobs.logprob);
                r.cached[i] = ev.n_cached_prompt;
            }
            return true;
        });
    };
    for (size_t i = 0; i < prompts.size(); ++i) submit(i);
    while (e.step()) {
    }
    for (size_t i = prompts.size(); i < n_req; ++i) {
        submit(i);
        while (e.step()) {
        }
    }
    r.stats = e.stats();
    unsetenv("MEGACTX_GRAPHS");
    return r;
}

// The tokens two runs share before the first difference.
size_t same_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t s = 0;
    while (s < a.size() && s < b.size() && a[s] == b[s]) ++s;
    return s;
}

}  // namespace

TEST(CudaFastKernels, ModelMatchesReferenceKernelsOnGlm52Geometry) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GlmDsaModel model(glm52_mini_dir());
    const int64_t vocab = model.config().vocab_size, n = 2600;
    std::vector<int32_t> toks(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) toks[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % (vocab - 8));
    for (KvFormat f : {KvFormat::BF16, KvFormat::FP8}) {
        const std::vector<float> ref = run_logits(model, true, f, toks, 0);
        const std::vector<float> fast = run_logits(model, false, f, toks, 0);
        const std::vector<float> fast_chunked = run_logits(model, false, f, toks, 512);
        ASSERT_EQ(ref.size(), static_cast<size_t>(n * vocab));
        ASSERT_EQ(fast.size(), ref.size());
        ASSERT_EQ(fast_chunked.size(), ref.size());
        std::vector<double> rel, rel_chunk;
        for (int64_t t = 0; t < n; ++t) {
            const float* r = ref.data() + t * vocab;
            double scale = 0;
            for (int64_t v = 0; v < vocab; ++v) scale = std::max(scale, static_cast<double>(std::fabs(r[v])));
            rel.push_back(test::max_abs_diff(fast.data() + t * vocab, r, static_cast<size_t>(vocab)) / scale);
            rel_chunk.push_back(test::max_abs_diff(fast_chunked.data() + t * vocab, fast.data() + t * vocab,
                                                   static_cast<size_t>(vocab)) /
                                scale);
        }
        auto stats = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return std::make_pair(v[v.size() / 2], v.back());
        };
        const auto [med, worst] = stats(rel);
        const auto [med_c, worst_c] = stats(rel_chunk);
        std::vector<double> tail(rel.begin() + 2048, rel.end());  // rows where top-k actually selects
        const auto [med_tail, worst_tail] = stats(tail);
        std::printf(
            "glm52-mini kv %s: fast vs reference kernels, max|Δlogit|/max|ref| per row: median %.2e, worst "
            "%.2e (rows ≥ 2048: median %.2e, worst %.2e); fast chunk 512 vs one pass: median %.2e, worst %.2e\n",
            kv_format_name(f), med, worst, med_tail, worst_tail, med_c, worst_c);
        // Measured on the H200 (2026-11-29): bf16 median 1.3e-2 (tail 1.4e-2), fp8 1.6e-2 (tail 8.8e-2: the FP8
        // indexer query swaps near-tied boundary candidates of the flat random scores), chunked vs one pass
        // 7.5e-3 / 8.6e-3; single rows reach ~1 where a selection swap lands. A wrong slot, scale or layout
        // moves every row by O(1), which these medians catch.
        const bool fp8 = f == KvFormat::FP8;
        EXPECT_LT(med, 3e-2) << kv_format_name(f);
        EXPECT_LT(med_tail, fp8 ? 0.15 : 3e-2) << kv_format_name(f);
        EXPECT_LT(med_c, 1.5e-2) << kv_format_name(f) << ": chunked prefill moved the fast path's logits";
    }
}

// Decode steps replayed from recorded CUDA graphs (GraphedForward, on by default in SequenceRunner) against the
// same steps run eagerly (MEGACTX_GRAPHS=0), on glm52-mini's fast kernels with FP8 KV: 4040 cached tokens (so
// top-2048 selects), then 80 one-token steps that cross the 64 → 128-block bucket at 4096. The fast path is
// reproducible bit for bit (canonical top-k order, no float atomics), so a second eager run and the graph run must
// both equal the first exactly; a replay with a stale position, slot or block table would move every step by O(1).
TEST(CudaGraphs, DecodeReplaysMatchEager) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GlmDsaModel model(glm52_mini_dir());
    const int64_t vocab = model.config().vocab_size, n_ctx = 4040, n_dec = 80;
    std::vector<int32_t> toks(static_cast<size_t>(n_ctx + n_dec));
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7919 + 13) % (vocab - 8));
    const std::vector<int32_t> ctx(toks.begin(), toks.begin() + n_ctx), dec(toks.begin() + n_ctx, toks.end());
    const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
    // Runs 0 and 1 eager, run 2 through graphs. The fast path is deterministic (top-k in canonical order, no float
    // atomics in the decode kernels), so all three must agree bit for bit.
    std::vector<float> logits[3];
    GraphedForward::Stats stats[3];
    for (int run = 0; run < 3; ++run) {
        if (run == 2)
            unsetenv("MEGACTX_GRAPHS");
        else
            setenv("MEGACTX_GRAPHS", "0", 1);
        SequenceRunner r(model, *gpu, n_ctx + n_dec, KvFormat::FP8);
        r.feed(ctx, 512, false);
        logits[run] = r.feed(dec, 1, true);
        stats[run] = r.graphs().stats();
    }
    unsetenv("MEGACTX_GRAPHS");
    // Two shapes (64 and 128 blocks): each one eager step, one recorded, the rest replayed.
    EXPECT_EQ(stats[2].eager, 2);
    EXPECT_EQ(stats[2].recorded, 2);
    EXPECT_EQ(stats[2].replayed, n_dec - 2);
    EXPECT_EQ(stats[0].replayed, 0);
    const auto diffs = [&](const std::vector<float>& a, const std::vector<float>& ref) {
        std::vector<double> rel;
        for (int64_t t = 0; t < n_dec; ++t) {
            const float* r = ref.data() + t * vocab;
            double scale = 0;
            for (int64_t v = 0; v < vocab; ++v) scale = std::max(scale, static_cast<double>(std::fabs(r[v])));
            rel.push_back(test::max_abs_diff(a.data() + t * vocab, r, static_cast<size_t>(vocab)) / scale);
        }
        std::sort(rel.begin(), rel.end());
        return rel;
    };
    ASSERT_EQ(logits[2].size(), logits[0].size());
    const std::vector<double> noise = diffs(logits[1], logits[0]), graph = diffs(logits[2], logits[0]);
    const double med_noise = noise[noise.size() / 2], med_graph = graph[graph.size() / 2];
    std::printf(
        "%lld decode steps, max|Δlogit|/max|ref| per step: eager vs eager median %.2e (worst %.2e), graph "
        "replays vs eager median %.2e (worst %.2e); %lld eager, %lld recorded, %lld replayed\n",
        static_cast<long long>(n_dec), med_noise, noise.back(), med_graph, graph.back(),
        static_cast<long long>(stats[2].eager), static_cast<long long>(stats[2].recorded),
        static_cast<long long>(stats[2].replayed));
    EXPECT_EQ(noise.back(), 0.0) << "two eager runs differ: the fast path is not reproducible";
    EXPECT_EQ(graph.back(), 0.0) << "graph replays differ from eager steps";
    (void)med_noise;
    (void)med_graph;
}

// The shipped demo model on NIAH prompts (megactx eval niah's generator, seed 0): the GPU with bf16 and with FP8 KV
// gives the CPU oracle's greedy answer (12 tokens, f32 KV), and the logits at the prompt's last position differ
// from the CPU's by what is printed (max |Δ| / max |logit|). A trained model's indexer separates the needle's
// rows from the rest, so rounding does not flip the selection that matters here, unlike the random fixtures.
TEST(CudaDemoModel, NiahAnswersMatchCpu) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string dir = demo_model_dir();
    const GlmDsaModel model(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    const niah::SampleGenerator gen(tok, niah::read_haystack(dir + "/haystack.txt"));
    const int64_t vocab = model.config().vocab_size;
    const auto answer = [&](Ops& ops, KvFormat f, const std::vector<int32_t>& prompt, std::vector<float>* last) {
        SequenceRunner r(model, ops, static_cast<int64_t>(prompt.size()) + niah::kMaxNewTokens, f);
        std::vector<float> l = r.feed(prompt, 2048, false);
        *last = l;
        std::vector<int32_t> out;
        for (int64_t i = 0; i < niah::kMaxNewTokens; ++i) {
            out.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
            if (i + 1 < niah::kMaxNewTokens) l = r.feed({out.back()}, 0, false);
        }
        return out;
    };
    const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
    int64_t n = 0, n_correct_cpu = 0;
    for (int64_t length : {2048, 8192}) {
        for (double depth : {0.0, 0.5, 1.0}) {
            const niah::Sample smp = gen.make(length, depth, 0, niah::sample_seed(0, length, depth, 0));
            CpuOps cpu;
            std::vector<float> ref;
            const std::vector<int32_t> want = answer(cpu, KvFormat::F32, smp.tokens, &ref);
            double scale = 0;
            for (float x : ref) scale = std::max(scale, static_cast<double>(std::fabs(x)));
            ++n;
            n_correct_cpu += niah::is_correct(tok.decode(want, true), smp.passkey);
            for (KvFormat f : {KvFormat::BF16, KvFormat::FP8}) {
                std::vector<float> last;
                const std::vector<int32_t> got = answer(*gpu, f, smp.tokens, &last);
                const double d = test::max_abs_diff(last.data(), ref.data(), static_cast<size_t>(vocab)) / scale;
                std::printf(
                    "NIAH %s depth %s, %zu tokens, %s KV: answer %s the CPU's (%s), last-position "
                    "max|Δlogit|/max|logit| = %.2e\n",
                    niah::length_label(length).c_str(), niah::depth_label(depth).c_str(), smp.tokens.size(),
                    kv_format_name(f), got == want ? "=" : "!=", tok.decode(want, true).c_str(), d);
                EXPECT_EQ(got, want) << niah::length_label(length) << " depth " << depth << " " << kv_format_name(f);
            }
        }
    }
    std::printf("CPU answers correct: %lld of %lld\n", static_cast<long long>(n_correct_cpu),
                static_cast<long long>(n));
}

// The host KV tier on the GPU (pinned, mapped host pools; kv_tier.h): glm52-mini on the fast kernels, 4,040
// tokens prefilled in chunks of 512, then 40 decode steps replayed as CUDA graphs, with 6 device blocks of 65 —
// most selected rows are gathered from host memory every step, and blocks are demoted as the sequence grows.
// Logits equal the untiered cache's bit for bit in bf16 and FP8 KV: the same rows reach the same kernels in the
// same order (the staging passes plan sparse_mla as one call would).
TEST(CudaTieredKv, LogitsEqualUntieredBitForBit) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GlmDsaModel model(glm52_mini_dir());
    const int64_t vocab = model.config().vocab_size, n_ctx = 4040, n_dec = 40;
    const int64_t n_blocks = (n_ctx + n_dec + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> toks(static_cast<size_t>(n_ctx + n_dec));
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 4099 + 7) % (vocab - 8));
    const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
    const auto run = [&](KvCache& kv, GraphedForward::Stats* stats) {
        GraphedForward graphs(model, *gpu, kv);
        SeqKv seq;
        std::vector<float> out;
        for (int64_t i0 = 0; i0 < n_ctx + n_dec;) {
            const int64_t m = i0 < n_ctx ? std::min<int64_t>(512, n_ctx - i0) : 1;
            kv.end_step();
            seq.reserve(kv.blocks(), seq.n_tokens + m);
            Batch b;
            b.add_sequence(&seq.blocks, toks.data() + i0, m, seq.n_tokens, false);
            b.want_logits.back() = true;
            const ForwardResult r = graphs.forward(b);
            seq.n_tokens += m;
            i0 += m;
            const size_t off = out.size();
            out.resize(off + static_cast<size_t>(vocab));
            gpu->download(r.logits, out.data() + off);
        }
        kv.end_step();
        if (stats) *stats = graphs.stats();
        return out;
    };
    for (KvFormat f : {KvFormat::BF16, KvFormat::FP8}) {
        KvCache flat(*gpu, model.config(), n_blocks, f);
        const std::vector<float> ref = run(flat, nullptr);
        KvCache tiered(*gpu, model.config(), 6, f, {}, KvTierOptions{n_blocks});
        GraphedForward::Stats st;
        const std::vector<float> got = run(tiered, &st);
        const TierStats& ts = tiered.tiers().stats();
        std::printf(
            "%s KV: %lld selected rows on the device, %lld gathered from the host, %lld promotions, %lld "
            "demotions; %lld graph replays\n",
            kv_format_name(f), static_cast<long long>(ts.device_rows), static_cast<long long>(ts.host_rows),
            static_cast<long long>(ts.promotions), static_cast<long long>(ts.demotions),
            static_cast<long long>(st.replayed));
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4)) << kv_format_name(f);
        EXPECT_GT(ts.host_rows, ts.device_rows) << "most selected rows should come from the host tier";
        EXPECT_GT(ts.demotions, 0);  // (promotions need a device block the step did not select: none here)
        EXPECT_GT(st.replayed, n_dec / 2) << "decode steps should replay as CUDA graphs";
    }
}

// --batch-invariant on the GPU (CudaOptions::batch_invariant). (1) Logits of one pass = chunks of 7 = token by
// token (through the decode graphs), bit for bit, on glm52-mini (the FP8 indexer, wgmma sparse MLA, FP8 KV; 2,200
// tokens so that top-2048 selects) and on the demo model (bf16 KV). (2) Through the engine on the demo model: MTP
// speculation with K = 1, 3 and 7 gives plain decoding's tokens and log-probabilities for two requests decoded
// together, and a prefix-cache hit gives the cold run's. The default mode's deviation on the same requests is
// printed (tokens equal before the first divergence), not asserted.
TEST(CudaBatchInvariant, ChunkingSpeculationAndPrefixHitsChangeNoBit) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    CudaOptions o;
    o.batch_invariant = true;
    const std::unique_ptr<Ops> inv = make_cuda_ops(o);
    struct M {
        std::string dir;
        KvFormat format;
        int64_t n;
    };
    for (const M& m : {M{glm52_mini_dir(), KvFormat::FP8, 2200}, M{demo_model_dir(), KvFormat::BF16, 600}}) {
        const GlmDsaModel model(m.dir);
        const int64_t vocab = model.config().vocab_size;
        std::vector<int32_t> toks(static_cast<size_t>(m.n));
        for (int64_t i = 0; i < m.n; ++i)
            toks[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % (vocab - 8));
        auto feed = [&](int64_t chunk) {
            SequenceRunner run(model, *inv, m.n, m.format);
            return run.feed(toks, chunk, true);
        };
        const std::vector<float> one = feed(0), sevens = feed(7), single = feed(1);
        ASSERT_EQ(one.size(), static_cast<size_t>(m.n * vocab));
        EXPECT_TRUE(one == sevens) << m.dir << ": chunks of 7 differ from one pass, max |Δ| "
                                   << test::max_abs_diff(one.data(), sevens.data(), one.size());
        EXPECT_TRUE(one == single) << m.dir << ": token by token differs from one pass, max |Δ| "
                                   << test::max_abs_diff(one.data(), single.data(), one.size());
    }

    const GlmDsaModel model(demo_model_dir());
    const std::unique_ptr<Ops> plain_ops = make_cuda_ops(CudaOptions{});
    const std::vector<int32_t> base = fixture_tokens("freq_offset_f32");
    std::vector<std::vector<int32_t>> prompts(2);
    for (int64_t i = 0; i < 300; ++i) prompts[0].push_back((base[i % base.size()] * 31 + i) % 8000 + 10);
    for (int64_t i = 0; i < 120; ++i) prompts[1].push_back((base[i % base.size()] * 17 + 3 * i) % 8000 + 10);
    const auto serve = [&](Ops& ops, int64_t k, bool repeat) {
        EngineConfig cfg;
        cfg.kv_format = KvFormat::BF16;
        cfg.max_model_len = 1024;
        cfg.n_kv_blocks = 64;
        cfg.speculative_tokens = k;
        return serve_greedy(model, ops, cfg, prompts, 96, true, repeat);
    };
    const Served plain = serve(*inv, 0, true);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_GT(plain.cached[prompts.size() + i], 0) << "request " << i << " again: no prefix-cache hit";
        EXPECT_EQ(plain.tokens[prompts.size() + i], plain.tokens[i]) << "prefix-cache hit, request " << i;
        EXPECT_EQ(plain.logprobs[prompts.size() + i], plain.logprobs[i]) << "prefix-cache hit, request " << i;
    }
    for (const int64_t k : {int64_t{1}, int64_t{3}, int64_t{7}}) {
        const Served spec = serve(*inv, k, false);
        EXPECT_GT(spec.stats.spec.accepted, 0) << "K = " << k;
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "K = " << k << ", request " << i;
            EXPECT_EQ(spec.logprobs[i], plain.logprobs[i]) << "K = " << k << ", request " << i;
        }
        std::printf("batch-invariant, K = %lld: %lld of %lld drafts accepted, tokens and log-probabilities = plain\n",
                    static_cast<long long>(k), static_cast<long long>(spec.stats.spec.accepted),
                    static_cast<long long>(spec.stats.spec.drafted));
    }
    // The default mode on the same requests, for the record.
    const Served d_plain = serve(*plain_ops, 0, true), d_spec = serve(*plain_ops, 3, false);
    for (size_t i = 0; i < prompts.size(); ++i)
        std::printf(
            "default mode, request %zu: K = 3 = plain for %zu of %zu tokens; prefix hit = cold for %zu; "
            "batch-invariant = default for %zu\n",
            i, same_prefix(d_spec.tokens[i], d_plain.tokens[i]), d_plain.tokens[i].size(),
            same_prefix(d_plain.tokens[prompts.size() + i], d_plain.tokens[i]),
            same_prefix(plain.tokens[i], d_plain.tokens[i]));
}

// MTP speculative decoding through CUDA graphs (verification steps and draft steps, GraphedForward) against the
// same engine run eagerly (MEGACTX_GRAPHS=0), on the shipped demo model with bf16 and FP8 KV: two greedy requests with
// different prompts decoding together, K = 3. Each graph replays the kernels its eager step ran, on the step's
// inputs, so tokens, acceptance and every log-probability must be identical; a replay reading a stale position,
// slot, top-k row or hidden input would change the drafts (acceptance) or the tokens. Printed as information:
// how far the speculative tokens agree with plain decoding's (K = 0), which on the GPU is not guaranteed, since
// a verification step's rows run in other GEMM shapes than a decode step's.
TEST(CudaGraphs, SpeculativeStepsReplayMatchEager) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GlmDsaModel model(demo_model_dir());
    const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
    const std::vector<int32_t> base = fixture_tokens("freq_offset_f32");
    std::vector<std::vector<int32_t>> prompts(2);
    for (int64_t i = 0; i < 300; ++i) prompts[0].push_back((base[i % base.size()] * 31 + i) % 8000 + 10);
    for (int64_t i = 0; i < 120; ++i) prompts[1].push_back((base[i % base.size()] * 17 + 3 * i) % 8000 + 10);
    for (KvFormat format : {KvFormat::BF16, KvFormat::FP8}) {
        const auto serve = [&](int64_t k, bool graphs) {
            EngineConfig cfg;
            cfg.kv_format = format;
            cfg.max_model_len = 1024;
            cfg.n_kv_blocks = 64;
            cfg.speculative_tokens = k;
            return serve_greedy(model, *gpu, cfg, prompts, 96, graphs);
        };
        const Served eager = serve(3, false), graphed = serve(3, true), plain = serve(0, true);
        EXPECT_EQ(eager.stats.graph_replays, 0);
        EXPECT_GT(graphed.stats.graph_replays, 50);
        EXPECT_GT(graphed.stats.spec.accepted, 0);
        EXPECT_EQ(graphed.stats.spec.drafted, eager.stats.spec.drafted);
        EXPECT_EQ(graphed.stats.spec.accepted, eager.stats.spec.accepted);
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_EQ(graphed.tokens[i], eager.tokens[i]) << kv_format_name(format) << " request " << i;
            EXPECT_EQ(graphed.logprobs[i], eager.logprobs[i]) << kv_format_name(format) << " request " << i;
            const size_t same = same_prefix(plain.tokens[i], graphed.tokens[i]);
            std::printf(
                "%s KV, request %zu: %zu tokens, speculative (K = 3) = plain for the first %zu; %lld of %lld "
                "drafts accepted; %lld steps replayed from graphs\n",
                kv_format_name(format), i, graphed.tokens[i].size(), same,
                static_cast<long long>(graphed.stats.spec.accepted), static_cast<long long>(graphed.stats.spec.drafted),
                static_cast<long long>(graphed.stats.graph_replays));
        }
    }
}

// Twelve requests decoding together with K = 3 verify 48 rows a step, beyond the 32 at which the routed experts
// used to sync with the host: the few-token expert paths now run in passes of 32 up to 128 tokens, so these
// verification steps replay graphs too. Graphed = eager (MEGACTX_GRAPHS=0) in tokens,
// log-probabilities and acceptance, bf16 KV, demo model; and the step count that replayed is printed.
TEST(CudaGraphs, VerificationBeyond32RowsReplays) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const GlmDsaModel model(demo_model_dir());
    const std::unique_ptr<Ops> gpu = make_cuda_ops(CudaOptions{});
    const std::vector<int32_t> base = fixture_tokens("freq_offset_f32");
    std::vector<std::vector<int32_t>> prompts(12);
    for (size_t r = 0; r < prompts.size(); ++r)
        for (int64_t i = 0; i < 90 + 7 * static_cast<int64_t>(r); ++i)
            prompts[r].push_back((base[(i + r) % base.size()] * 29 + 5 * i + static_cast<int64_t>(r)) % 8000 + 10);
    EngineConfig cfg;
    cfg.kv_format = KvFormat::BF16;
    cfg.max_model_len = 512;
    cfg.n_kv_blocks = 128;
    cfg.speculative_tokens = 3;
    const Served eager = serve_greedy(model, *gpu, cfg, prompts, 64, false),
                 graphed = serve_greedy(model, *gpu, cfg, prompts, 64, true);
    EXPECT_EQ(eager.stats.graph_replays, 0);
    // The verification steps (12 × 4 rows, one shape) replay from their third on, and so does the draft chain
    // since its step 0 covers each sequence's whole verification (before, its shape followed the acceptance
    // pattern and seldom repeated: 34 replays in 39 steps on the H200). At least half the engine's steps replay,
    // where none of the 48-row ones could before the passes of 32.
    EXPECT_GE(2 * graphed.stats.graph_replays, graphed.stats.steps);
    EXPECT_EQ(graphed.stats.spec.accepted, eager.stats.spec.accepted);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(graphed.tokens[i], eager.tokens[i]) << "request " << i;
        EXPECT_EQ(graphed.logprobs[i], eager.logprobs[i]) << "request " << i;
    }
    std::printf("12 requests, K = 3: %lld engine steps, %lld graph replays; %lld of %lld drafts accepted\n",
                static_cast<long long>(graphed.stats.steps), static_cast<long long>(graphed.stats.graph_replays),
                static_cast<long long>(graphed.stats.spec.accepted),
                static_cast<long long>(graphed.stats.spec.drafted));
}

}  // namespace megactx
