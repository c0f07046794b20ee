// bench_layer: one DSA attention layer's decode step (issue 5 target: ≤ 45 µs at L = 1M, batch 1, in a CUDA
// graph; floor 33 µs = the 132·L indexer bytes + 1.34 MB of selected latent rows at 4.23 TB/s, anchors §2).
//
// The step is what a full layer does beyond its projections, through CudaOps exactly as the model calls it:
//   latent_cache_write (RMSNorm + RoPE + FP8 row of the new token) → indexer_cache_write (LayerNorm + RoPE +
//   FP8 key) → indexer_topk (FP8 scores over the L cached keys + exact top-2048) → sparse_mla (64 heads over
//   the 2048 selected FP8 rows),
// captured once into a CUDA graph and replayed; a shared (IndexShare) layer skips the two indexer ops. The
// pools hold random valid FP8 rows (kv_fill.h). Each replay starts from a cold L2 (a 128 MB memset between
// replays, outside the timed region), so the keys and rows come from HBM. Events around each replay, median.
//
// Two more steps time the attention's other per-head work at batch 1 around it, through the same ops: the query
// absorption (q_nope · W_UK per head, mla_absorb_q) and the value expansion (W_UV · latent per head, mla_expand_v)
// over an FP8 kv_b of GLM-5.2's shape (64 heads × (192 + 256) rows × 512, as the FP8 checkpoints store it).
//
//   bench_layer [--contexts 131072,1048575] [--reps 200] [--json PATH]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kv_fill.h"
#include "backend/cuda/topk.h"
#include "bench_util.h"
#include "kv/kv_format.h"
#include "model/weight.h"

using namespace megactx;

namespace {

// GLM-5.2's attention geometry (model-spec §1.1).
constexpr int64_t kHeads = 64, kRank = 512, kRope = 64, kIdxHeads = 32, kIdxDim = 128, kTopk = 2048, kBlock = 64;
constexpr int64_t kNope = 192, kVHead = 256;       // qk_nope_head_dim, v_head_dim
const Rope kRopeTable = Rope::plain(1e6f, kRope);  // GLM-5.2: interleaved pairs over the 64 rope dims

#define CK(expr)                                                                   \
    do {                                                                           \
        const cudaError_t e_ = (expr);                                             \
        MEGACTX_CHECK(e_ == cudaSuccess, "{}: {}", #expr, cudaGetErrorString(e_)); \
    } while (0)

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

Tensor random_f32(Ops& ops, std::vector<int64_t> shape, std::mt19937& rng, float scale) {
    Tensor t = ops.alloc(DType::F32, std::move(shape));
    std::vector<float> h(static_cast<size_t>(t.numel()));
    std::normal_distribution<float> nd(0.0f, scale);
    for (float& x : h) x = nd(rng);
    ops.upload(h.data(), t);
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_layer: one DSA attention layer's decode step at long context, in a CUDA graph"};
    std::string contexts_arg = "131072,1048575", json_path;
    int64_t reps = 200;
    app.add_option("--contexts", contexts_arg, "context lengths L (cached tokens before the decode token)");
    app.add_option("--reps", reps, "timed replays per case")->check(CLI::Range(10, 100000));
    app.add_option("--json", json_path, "write the results as JSON");
    CLI11_PARSE(app, argc, argv);
    try {
        const std::vector<int64_t> contexts = bench::parse_positive_list(contexts_arg, "--contexts");
        const int64_t max_l = *std::max_element(contexts.begin(), contexts.end());
        const cuda::DeviceInfo dev = cuda::device_info(0);
        if (const char* few = std::getenv("MEGACTX_TOPK_FEW")) {  // A/B of the decode top-k kernels (topk.h)
            cuda::TopkTuning tu;
            tu.few_rows = std::atoi(few);
            cuda::topk_set_tuning(tu);
        }
        auto ops_owner = make_cuda_ops(CudaOptions{});
        auto& ops = dynamic_cast<cuda::CudaOps&>(*ops_owner);
        const cudaStream_t stream = ops.stream();

        const int64_t n_blocks = (max_l + 1 + kBlock - 1) / kBlock, n_slots = n_blocks * kBlock;
        const int64_t row_bytes = fp8_latent_row_bytes(kRank, kRope);
        Tensor latent = ops.alloc(DType::F8_E4M3, {n_slots, row_bytes});
        Tensor index = ops.alloc(DType::F8_E4M3, {n_blocks, fp8_indexer_block_bytes(kIdxDim)});
        cuda::fill_kv_random(latent.data, cuda::KvFillKind::kLatent, cuda::KvFillFormat::kFp8, n_slots, kRank, kRope,
                             1);
        cuda::fill_kv_random(index.data, cuda::KvFillKind::kIndexer, cuda::KvFillFormat::kFp8, n_slots, kIdxDim, 0, 2);

        std::mt19937 rng(7);
        Tensor kv_a = random_f32(ops, {1, kRank + kRope}, rng, 1.0f);        // [1, 576] raw kv_a_proj output
        Tensor k_raw = random_f32(ops, {1, kIdxDim}, rng, 1.0f);             // [1, 128] raw indexer key
        Tensor iq = random_f32(ops, {1, kIdxHeads, kIdxDim}, rng, 1.0f);     // [1, 32, 128] indexer query (RoPE'd)
        Tensor gates = random_f32(ops, {1, kIdxHeads}, rng, 1.0f);           // [1, 32]
        Tensor q = random_f32(ops, {1, kHeads, kRank + kRope}, rng, 0.05f);  // [1, 64, 576] absorbed query
        Tensor slots_out = ops.alloc(DType::I32, {1, kTopk});
        Tensor lat_out = ops.alloc(DType::F32, {1, kHeads, kRank});
        const std::vector<float> norm_w(kRank, 1.0f), ln_w(kIdxDim, 1.0f), ln_b(kIdxDim, 0.0f);
        // kv_b [64 · (192 + 256), 512] in FP8 with 128 × 128 block scales: random finite e4m3 codes.
        std::vector<uint8_t> kv_b_codes(static_cast<size_t>(kHeads * (kNope + kVHead) * kRank));
        for (uint8_t& b : kv_b_codes) {
            const uint8_t c = static_cast<uint8_t>(rng());
            b = (c & 0x7f) >= 0x7e ? static_cast<uint8_t>(c & 0xbf) : c;  // no NaN codes (0x7f, 0xff)
        }
        Weight kv_b;
        kv_b.name = "kv_b";
        kv_b.dtype = DType::F8_E4M3;
        kv_b.rows = kHeads * (kNope + kVHead);
        kv_b.cols = kRank;
        kv_b.data = kv_b_codes.data();
        kv_b.scale_inv.assign(static_cast<size_t>((kv_b.rows / 128) * (kv_b.cols / 128)), 1e-3f);
        Tensor q_heads = random_f32(ops, {1, kHeads, kNope + kRope}, rng, 1.0f);  // [1, 64, 256] per-head query
        Tensor q_abs = ops.alloc(DType::F32, {1, kHeads, kRank + kRope});
        Tensor o_heads = ops.alloc(DType::F32, {1, kHeads * kVHead});
        std::vector<int32_t> table(static_cast<size_t>(n_blocks));
        for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
        const Tensor tables = ops.upload_i32(table);
        const Tensor seq = ops.upload_i32({0}), toff = ops.upload_i32({0});
        void* flush = nullptr;
        const size_t flush_bytes = size_t{128} << 20;
        CK(cudaMalloc(&flush, flush_bytes));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));

        nlohmann::json out = {{"bench", "bench_layer"},
                              {"device", dev.name},
                              {"date", bench::utc_now()},
                              {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
                              {"batch", 1},
                              {"cuda_graph", true},
                              {"cold_l2", true},
                              {"results", nlohmann::json::array()}};
        std::printf("%9s  %-34s %10s %10s %12s\n", "L", "step", "µs", "floor µs", "% of floor");
        for (const int64_t L : contexts) {
            const Tensor pos = ops.upload_i32({static_cast<int32_t>(L)});
            const Tensor slot = ops.upload_i32({static_cast<int32_t>(L)});  // block b = b: slot = position
            IndexerTopkParams ip;
            ip.q = &iq;
            ip.weights = &gates;
            ip.keys = &index;
            ip.map.block_size = kBlock;
            ip.map.pos = pos.i32();
            ip.map.seq = seq.i32();
            ip.map.table_offset = toff.i32();
            ip.map.tables = tables.i32();
            ip.map.n_seq = 1;
            ip.map.max_seq_rows = 1;  // as BatchPlan records it for a decode step
            ip.map.max_context = L + 1;
            ip.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kIdxDim));
            ip.head_scale = 1.0f / std::sqrt(static_cast<float>(kIdxHeads));
            ip.topk = kTopk;
            ip.out_slots = &slots_out;
            SparseMlaParams sp;
            sp.q = &q;
            sp.cache = &latent;
            sp.slots = &slots_out;
            sp.d_v = kRank;
            sp.scale = 1.0f / std::sqrt(256.0f);
            sp.out = &lat_out;
            auto cache_writes = [&] {
                ops.latent_cache_write(kv_a, norm_w, 1e-6f, pos, kRopeTable, slot, latent);
                ops.indexer_cache_write(k_raw, ln_w, ln_b, 1e-6f, pos, kRopeTable, slot, index, false);
            };
            struct Step {
                const char* name;
                std::function<void()> run;
                double floor_bytes;
            };
            const double idx_bytes = 132.0 * static_cast<double>(L + 1),
                         mla_bytes = static_cast<double>(kTopk * row_bytes);
            const std::vector<Step> steps = {
                {"full layer (writes+indexer+mla)",
                 [&] {
                     cache_writes();
                     ops.indexer_topk(ip);
                     ops.sparse_mla(sp);
                 },
                 idx_bytes + mla_bytes},
                {"shared layer (latent write+mla)",
                 [&] {
                     ops.latent_cache_write(kv_a, norm_w, 1e-6f, pos, kRopeTable, slot, latent);
                     ops.sparse_mla(sp);
                 },
                 mla_bytes},
                {"  cache writes", cache_writes, 0.0},
                {"  indexer scores + top-2048", [&] { ops.indexer_topk(ip); }, idx_bytes},
                {"  sparse MLA", [&] { ops.sparse_mla(sp); }, mla_bytes},
                // floors: the FP8 bytes of W_UK / W_UV (what an FP8 kernel would read)
                {"  q absorb (W_UK, 64 heads)", [&] { ops.mla_absorb_q(q_heads, kv_b, kNope, kVHead, q_abs); },
                 static_cast<double>(kHeads * kNope * kRank)},
                {"  v expand (W_UV, 64 heads)", [&] { ops.mla_expand_v(lat_out, kv_b, kNope, kVHead, o_heads); },
                 static_cast<double>(kHeads * kVHead * kRank)},
            };
            for (const Step& s : steps) {
                for (int i = 0; i < 3; ++i) s.run();  // warm-up: uploads, kernel attributes, allocator free lists
                CK(cudaStreamSynchronize(stream));
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
                s.run();
                CK(cudaStreamEndCapture(stream, &graph));
                CK(cudaGraphInstantiate(&exec, graph, 0));
                std::vector<double> us;
                for (int64_t r = 0; r < reps + 5; ++r) {
                    CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
                    CK(cudaEventRecord(e0, stream));
                    CK(cudaGraphLaunch(exec, stream));
                    CK(cudaEventRecord(e1, stream));
                    CK(cudaEventSynchronize(e1));
                    float ms = 0;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 5) us.push_back(1e3 * ms);
                }
                CK(cudaGraphExecDestroy(exec));
                CK(cudaGraphDestroy(graph));
                const double t = median(us), floor_us = s.floor_bytes / 4.23e12 * 1e6;
                std::printf("%9lld  %-34s %10.1f %10.1f %11.0f%%\n", static_cast<long long>(L), s.name, t, floor_us,
                            floor_us > 0 ? 100.0 * floor_us / t : 0.0);
                out["results"].push_back({{"context", L},
                                          {"step", s.name},
                                          {"us_median", t},
                                          {"us_min", *std::min_element(us.begin(), us.end())},
                                          {"floor_us", floor_us}});
            }
        }
        CK(cudaFree(flush));
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_layer: %s\n", e.what());
        return 1;
    }
    return 0;
}
