// bench_gemm: the prefill GEMMs of an FP8 checkpoint through CudaOps::linear, W8A8 (activations quantised per
// 1 × 128 group, e4m3 weights with 128 × 128 block scales read as they are: CudaOptions::fp8_gemm) against the bf16
// path it replaced (a bf16 copy of each weight, activations rounded to bf16). Shapes are GLM-5.2's projections of
// one layer (model-spec §1.1) at a prefill chunk of --rows tokens, and one routed expert at --expert-rows tokens.
// Time per call = events around --reps back-to-back calls after a warm-up (activation quantisation or bf16
// conversion included), TFLOP/s = 2 · rows · in · out / time. Also prints the weight bytes each path holds.
//
//   bench_gemm [--rows 4096] [--expert-rows 256] [--reps 20] [--json PATH]
//
// --decode-rows 1,2,4,8,16 instead measures the decode shapes (a few rows of x) through the three FP8 paths: the GEMV
// (fp8_gemv.h, up to 8 rows), the few-row W8A8 kernel (fp8_gemm_small.h, up to 16) and cuBLASLt's W8A8 GEMM, each over rotating copies of the weight (≥ 256 MB, so every call reads its weight from
// HBM as a decode step does) captured in one CUDA graph; µs per call and the weight bytes read per second.
// --moe-tokens 1,4,8,16,32 [--moe-experts 256] [--moe-topk 8] [--moe-shared] instead measures one MoE layer's routed
// experts at decode (moe_sweep below).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/moe_plan.h"
#include "bench_util.h"

using namespace megactx;

namespace {

#define CK(expr)                                                                   \
    do {                                                                           \
        const cudaError_t e_ = (expr);                                             \
        MEGACTX_CHECK(e_ == cudaSuccess, "{}: {}", #expr, cudaGetErrorString(e_)); \
    } while (0)

struct Shape {
    const char* name;
    int64_t out, in;
    bool expert;  // runs at --expert-rows
};

// Random e4m3 codes of magnitude ≤ 448 (no NaN: magnitudes 0x7e and 0x7f map to 0x3e and 0x3f), eight per splitmix64
// step. (Drawing each byte from mt19937 took most of a --decode-rows run: ~4 GB of codes for the rotating copies.)
void fill_e4m3(uint8_t* p, size_t n, uint64_t seed) {
    uint64_t x = seed;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        for (size_t k = 0; k < 8 && i + k < n; ++k) {
            const uint8_t b = static_cast<uint8_t>(z >> (8 * k)), m = b & 0x7f;
            p[i + k] = static_cast<uint8_t>((b & 0x80) | (m > 0x7d ? m - 0x40 : m));
        }
    }
}

// An FP8 weight [out, in]: random e4m3 codes of magnitude ≤ 448, block scales around 1e-3.
Weight random_fp8_weight(const Shape& s, std::mt19937& rng, std::vector<uint8_t>& codes) {
    codes.resize(static_cast<size_t>(s.out * s.in));
    fill_e4m3(codes.data(), codes.size(), rng());
    const int64_t rb = (s.out + 127) / 128, cb = (s.in + 127) / 128;
    std::uniform_real_distribution<float> u(0.5e-3f, 2e-3f);
    Weight w;
    w.name = s.name;
    w.dtype = DType::F8_E4M3;
    w.rows = s.out;
    w.cols = s.in;
    w.scale_inv.resize(static_cast<size_t>(rb * cb));
    for (float& x : w.scale_inv) x = u(rng);
    w.data = codes.data();
    return w;
}

// Captures `body` once into a CUDA graph on `stream` and returns the µs per replay over `reps` replays (after one).
double graph_us(cudaStream_t stream, const std::function<void()>& body, int64_t reps) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    body();
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, stream));
    for (int64_t r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return 1e3 * ms / static_cast<double>(reps);
}

// The decode sweep: for each projection and row count, the three FP8 paths, cold weights, graph replays. Besides the
// prefill shapes: the indexer's projections and the LM head (GLM-5.2's vocabulary).
void decode_sweep(std::vector<Shape> shapes, const std::vector<int64_t>& row_counts, int64_t reps,
                  nlohmann::json& out) {
    shapes.push_back({"indexer wq_b (2048 -> 4096)", 4096, 2048, false});
    shapes.push_back({"indexer wk (6144 -> 128)", 128, 6144, false});
    shapes.push_back({"lm_head (6144 -> 154880)", 154880, 6144, false});
    constexpr int64_t kRotateBytes = int64_t{256} << 20;
    std::mt19937 rng(11);
    std::printf("%-28s %6s %10s %6s %10s %6s %10s %6s\n", "GEMM", "rows", "GEMV us", "TB/s", "small us", "TB/s",
                "cuBLASLt", "TB/s");
    for (const Shape& s : shapes) {
        if (s.expert) continue;
        const int64_t bytes = s.out * s.in, copies = std::max<int64_t>(2, kRotateBytes / bytes);
        std::vector<uint8_t> codes;
        Weight proto = random_fp8_weight(s, rng, codes);  // the scales; the codes come from `pool`
        std::vector<uint8_t> pool(static_cast<size_t>(bytes * copies));
        fill_e4m3(pool.data(), pool.size(), rng());
        std::vector<Weight> ws(static_cast<size_t>(copies), proto);
        for (int64_t c = 0; c < copies; ++c) ws[static_cast<size_t>(c)].data = pool.data() + c * bytes;
        // One backend per path for all row counts: each uploads the copies once.
        std::unique_ptr<Ops> by_path[3];
        for (const int64_t n : row_counts) {
            double us[3] = {-1, -1, -1};
            for (int path = 0; path < 3; ++path) {  // 0: GEMV, 1: few-row tensor-core kernel, 2: cuBLASLt
                if ((path == 0 && n > 8) || (path == 1 && n > 16)) continue;
                if (!by_path[path]) {
                    CudaOptions o;
                    o.fp8_gemv_max_rows = path == 0 ? 8 : 0;
                    o.fp8_gemm_small_max_rows = path == 1 ? 16 : 0;
                    by_path[path] = make_cuda_ops(o);
                }
                Ops* ops = by_path[path].get();
                auto* cops = dynamic_cast<cuda::CudaOps*>(ops);
                const cudaStream_t stream = cops->stream();
                Tensor x = ops->alloc(DType::F32, {n, s.in});
                std::vector<float> hx(static_cast<size_t>(n * s.in));
                std::normal_distribution<float> nd(0.0f, 1.0f);
                for (float& v : hx) v = nd(rng);
                ops->upload(hx.data(), x);
                Tensor y = ops->alloc(DType::F32, {n, s.out});
                for (int i = 0; i < 2; ++i)
                    for (const Weight& w : ws) ops->linear(x, w, y);  // uploads, plans, allocator free lists
                CK(cudaStreamSynchronize(stream));
                us[path] = graph_us(stream, [&] { for (const Weight& w : ws) ops->linear(x, w, y); }, reps) /
                           static_cast<double>(copies);
            }
            auto tbs = [&](double t) { return t > 0 ? static_cast<double>(bytes) / t / 1e6 : 0.0; };
            std::printf("%-28s %6lld", s.name, static_cast<long long>(n));
            nlohmann::json r = {{"gemm", s.name}, {"rows", n}, {"in", s.in}, {"out", s.out}};
            const char* keys[3] = {"gemv", "small", "cublaslt"};
            for (int path = 0; path < 3; ++path) {
                if (us[path] > 0) {
                    std::printf(" %10.1f %6.2f", us[path], tbs(us[path]));
                    r[std::string(keys[path]) + "_us"] = us[path];
                    r[std::string(keys[path]) + "_weight_tb_s"] = tbs(us[path]);
                } else {
                    std::printf(" %10s %6s", "-", "-");
                }
            }
            std::printf("\n");
            std::fflush(stdout);
            out["results"].push_back(r);
        }
    }
}

// The routed experts of one MoE layer at decode (--moe-tokens): n tokens, each routed to k distinct random experts of
// E, GLM-5.2's expert shape (d 6144, ff 2048, FP8 with 128 x 128 block scales), weights cold (E x 37.7 MB >> L2),
// one moe_experts call per replay (--moe-shared: every token on the first one's experts, as in a batch of identical
// sequences). The per-choice kernels (moe.h: one weight read per (token, choice)) against the grouped tensor-core path
// (moe_fp8.h: each chosen expert read once), then the default dispatch (moe_plan.h: for 3-6 tokens the device
// picks one in the graph through a conditional node) and the path it takes; TB/s over the distinct experts' bytes, which is what a step must read at least. Every expert holds the same random codes in its own buffer (the backend keeps a
// device copy per weight address).
void moe_sweep(const std::vector<int64_t>& token_counts, int64_t n_exp, int64_t k, bool shared, int64_t reps,
               nlohmann::json& out) {
    constexpr int64_t d = 6144, ff = 2048;
    MEGACTX_CHECK(k >= 1 && k <= n_exp, "--moe-topk {} must be in 1..--moe-experts ({})", k, n_exp);
    std::mt19937 rng(13);
    std::vector<uint8_t> cg, cd;
    const Weight pg = random_fp8_weight({"expert gate/up (6144 -> 2048)", ff, d, true}, rng, cg);
    const Weight pd = random_fp8_weight({"expert down (2048 -> 6144)", d, ff, true}, rng, cd);
    const size_t eb = 2 * cg.size() + cd.size();  // one expert's codes
    std::vector<uint8_t> pool(eb * static_cast<size_t>(n_exp));
    std::vector<MlpWeights> experts(static_cast<size_t>(n_exp));
    for (int64_t e = 0; e < n_exp; ++e) {
        uint8_t* base = pool.data() + static_cast<size_t>(e) * eb;
        std::copy(cg.begin(), cg.end(), base);
        std::copy(cg.begin(), cg.end(), base + cg.size());
        std::copy(cd.begin(), cd.end(), base + 2 * cg.size());
        MlpWeights& m = experts[static_cast<size_t>(e)];
        m.gate = pg;
        m.up = pg;
        m.down = pd;
        m.gate.data = base;
        m.up.data = base + cg.size();
        m.down.data = base + 2 * cg.size();
    }
    out["moe"] = {{"experts", n_exp}, {"topk", k}, {"d", d}, {"ff", ff}, {"expert_bytes", eb}, {"shared", shared}};
    std::printf("%-8s %8s %14s %6s %14s %6s %8s %11s %6s %s\n", "tokens", "experts", "per-choice us", "TB/s",
                "grouped us", "TB/s", "speedup", "default us", "TB/s", "default's path");
    std::unique_ptr<Ops> by_path[3];  // 0: per-choice, 1: grouped, 2: the default (moe_plan.h)
    for (int path = 0; path < 3; ++path) {
        CudaOptions o;
        if (path < 2) o.moe_fp8_min_tokens = path == 0 ? 1 << 20 : 1;
        by_path[path] = make_cuda_ops(o);
    }
    for (const int64_t n : token_counts) {
        std::vector<int32_t> ids;
        std::vector<int32_t> wbits;
        std::vector<int32_t> all(static_cast<size_t>(n_exp));
        std::vector<bool> used(static_cast<size_t>(n_exp), false);
        for (int64_t t = 0; t < n; ++t) {
            if (t == 0 || !shared) {  // --moe-shared: every token takes the first one's experts
                for (int64_t e = 0; e < n_exp; ++e) all[static_cast<size_t>(e)] = static_cast<int32_t>(e);
                std::shuffle(all.begin(), all.end(), rng);
            }
            for (int64_t j = 0; j < k; ++j) {
                ids.push_back(all[static_cast<size_t>(j)]);
                used[static_cast<size_t>(all[static_cast<size_t>(j)])] = true;
                const float wt = 1.0f / static_cast<float>(k);
                int32_t b;
                std::memcpy(&b, &wt, 4);
                wbits.push_back(b);
            }
        }
        const int64_t distinct = std::count(used.begin(), used.end(), true);
        std::vector<int32_t> xbits(static_cast<size_t>(n * d));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int32_t& b : xbits) {
            const float v = nd(rng);
            std::memcpy(&b, &v, 4);
        }
        double us[3] = {-1, -1, -1};
        for (int path = 0; path < 3; ++path) {
            Ops* ops = by_path[path].get();
            const cudaStream_t stream = dynamic_cast<cuda::CudaOps*>(ops)->stream();
            Tensor x = ops->upload_i32(xbits), ti = ops->upload_i32(ids), tw = ops->upload_i32(wbits);
            x.dtype = DType::F32;
            x.shape = {n, d};
            ti.shape = {n, k};
            tw.dtype = DType::F32;
            tw.shape = {n, k};
            Tensor y = ops->alloc(DType::F32, {n, d});
            for (int i = 0; i < 2; ++i) ops->moe_experts(x, ti, tw, experts, y);  // uploads, plans
            CK(cudaStreamSynchronize(stream));
            us[path] = graph_us(stream, [&] { ops->moe_experts(x, ti, tw, experts, y); }, reps);
        }
        const double bytes = static_cast<double>(distinct) * static_cast<double>(eb);
        auto tbs = [&](double t) { return bytes / t / 1e6; };
        const moe_plan::MoePath mp = moe_plan::moe_path(n, k, n_exp, CudaOptions{}.moe_fp8_min_tokens);
        const char* default_path = mp == moe_plan::MoePath::kGrouped                 ? "grouped"
                                   : mp == moe_plan::MoePath::kPerChoice             ? "per-choice"
                                   : distinct > moe_plan::grouped_max_active(n, k) ? "on device: per-choice"
                                                                                     : "on device: grouped";
        std::printf("%-8lld %8lld %14.1f %6.2f %14.1f %6.2f %8.2f %11.1f %6.2f %s\n", static_cast<long long>(n),
                    static_cast<long long>(distinct), us[0], tbs(us[0]), us[1], tbs(us[1]), us[0] / us[1], us[2],
                    tbs(us[2]), default_path);
        std::fflush(stdout);
        out["results"].push_back({{"tokens", n},
                                   {"distinct_experts", distinct},
                                   {"per_choice_us", us[0]},
                                   {"per_choice_tb_s", tbs(us[0])},
                                   {"grouped_us", us[1]},
                                   {"default_us", us[2]},
                                   {"default_path", default_path},
                                   {"grouped_tb_s", tbs(us[1])}});
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_gemm: FP8 prefill GEMMs, W8A8 against the bf16 copy"};
    int64_t rows = 4096, expert_rows = 256, reps = 20;
    std::string json_path, decode_rows, moe_tokens;
    int64_t moe_experts = 256, moe_topk = 8;
    bool moe_shared = false;
    app.add_option("--decode-rows", decode_rows, "decode mode: these row counts, GEMV against W8A8 (cold weights)");
    app.add_option("--moe-tokens", moe_tokens,
                   "MoE decode mode: these token counts through one layer's routed experts, per-choice vs grouped");
    app.add_option("--moe-experts", moe_experts, "MoE decode mode: routed experts (GLM-5.2: 256)")
        ->check(CLI::Range(1, 1024));
    app.add_option("--moe-topk", moe_topk, "MoE decode mode: experts per token (GLM-5.2: 8)")->check(CLI::Range(1, 64));
    app.add_flag("--moe-shared", moe_shared, "MoE decode mode: every token routes to the same experts");
    app.add_option("--rows", rows, "tokens of the prefill chunk")->check(CLI::Range(1, 65536));
    app.add_option("--expert-rows", expert_rows, "tokens routed to the one expert")->check(CLI::Range(1, 65536));
    app.add_option("--reps", reps)->check(CLI::Range(1, 10000));
    app.add_option("--json", json_path);
    CLI11_PARSE(app, argc, argv);
    try {
        const std::vector<Shape> shapes = {
            {"q_a (6144 -> 2048)", 2048, 6144, false},          {"kv_a (6144 -> 576)", 576, 6144, false},
            {"q_b (2048 -> 16384)", 16384, 2048, false},        {"o (16384 -> 6144)", 6144, 16384, false},
            {"dense gate (6144 -> 12288)", 12288, 6144, false}, {"dense down (12288 -> 6144)", 6144, 12288, false},
            {"expert gate (6144 -> 2048)", 2048, 6144, true},   {"expert down (2048 -> 6144)", 6144, 2048, true},
        };
        const cuda::DeviceInfo dev = cuda::device_info(0);
        nlohmann::json out = {{"bench", "bench_gemm"},
                              {"device", dev.name},
                              {"date", bench::utc_now()},
                              {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
                              {"rows", rows},
                              {"expert_rows", expert_rows},
                              {"reps", reps},
                              {"results", nlohmann::json::array()}};
        if (!moe_tokens.empty()) {
            out["mode"] = "moe_decode";
            out.erase("rows");
            out.erase("expert_rows");
            moe_sweep(bench::parse_positive_list(moe_tokens, "--moe-tokens"), moe_experts, moe_topk, moe_shared, reps,
                      out);
            if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
            return 0;
        }
        if (!decode_rows.empty()) {
            out["mode"] = "decode";
            out.erase("rows");
            out.erase("expert_rows");
            decode_sweep(shapes, bench::parse_positive_list(decode_rows, "--decode-rows"), reps, out);
            if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
            return 0;
        }
        std::printf("%-28s %6s %12s %10s %12s %10s %8s\n", "GEMM", "rows", "W8A8 us", "TFLOP/s", "bf16 us", "TFLOP/s",
                    "speedup");
        std::mt19937 rng(7);
        int64_t weight_bytes[2] = {0, 0};
        for (const Shape& s : shapes) {
            std::vector<uint8_t> codes;
            const Weight w = random_fp8_weight(s, rng, codes);
            const int64_t n = s.expert ? expert_rows : rows;
            double us[2] = {0, 0};
            for (int path = 0; path < 2; ++path) {  // 0: W8A8, 1: bf16 copy
                CudaOptions o;
                o.fp8_gemm = path == 0;
                auto ops = make_cuda_ops(o);
                auto* cops = dynamic_cast<cuda::CudaOps*>(ops.get());
                Tensor x = ops->alloc(DType::F32, {n, s.in});
                std::vector<float> hx(static_cast<size_t>(n * s.in));
                std::normal_distribution<float> nd(0.0f, 1.0f);
                for (float& v : hx) v = nd(rng);
                ops->upload(hx.data(), x);
                Tensor y = ops->alloc(DType::F32, {n, s.out});
                for (int i = 0; i < 3; ++i) ops->linear(x, w, y);  // weight upload, plans, warm-up
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                CK(cudaEventRecord(e0, cops->stream()));
                for (int64_t i = 0; i < reps; ++i) ops->linear(x, w, y);
                CK(cudaEventRecord(e1, cops->stream()));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                us[path] = 1e3 * ms / static_cast<double>(reps);
                weight_bytes[path] += cuda_memory_stats(*ops).weight_bytes;
                CK(cudaEventDestroy(e0));
                CK(cudaEventDestroy(e1));
            }
            const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(s.in) * static_cast<double>(s.out);
            std::printf("%-28s %6lld %12.1f %10.0f %12.1f %10.0f %7.2fx\n", s.name, static_cast<long long>(n), us[0],
                        flop / us[0] / 1e6, us[1], flop / us[1] / 1e6, us[1] / us[0]);
            out["results"].push_back({{"gemm", s.name},
                                      {"rows", n},
                                      {"in", s.in},
                                      {"out", s.out},
                                      {"w8a8_us", us[0]},
                                      {"w8a8_tflops", flop / us[0] / 1e6},
                                      {"bf16_copy_us", us[1]},
                                      {"bf16_copy_tflops", flop / us[1] / 1e6}});
        }
        std::printf("weight bytes on the device for these %zu weights: W8A8 %.1f MiB, bf16 path %.1f MiB\n",
                    shapes.size(), static_cast<double>(weight_bytes[0]) / (1 << 20),
                    static_cast<double>(weight_bytes[1]) / (1 << 20));
        out["weight_bytes_w8a8"] = weight_bytes[0];
        out["weight_bytes_bf16_path"] = weight_bytes[1];
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gemm: %s\n", e.what());
        return 1;
    }
    return 0;
}
