// Benchmark of the DSA lightning-indexer logits kernel (indexer_logits.h) on GLM-5.2 shapes (32 heads × 128,
// FP8 paged keys, 64-token blocks):
//   decode: batch 1 (in a CUDA graph, 8 launches over 8 different sequences so the keys come from HBM, not L2) and
//           batch 64, 1 or 4 queries per sequence (4 = MTP verification; keys are read once per sequence), at
//           L = 128K, 256K, 512K, 1M: effective TB/s over 132 · L · batch bytes vs the 4.23 TB/s copy bandwidth;
//           batch 1 also with the exact top-2048 (topk.h) after each launch (decode_topk_graph: the default top-k,
//           for <= 2 rows the few-rows kernel; kernel 2 also: decode_topk_chain_graph, the three-kernel chain
//           (few_rows = 0), and decode_topk_fused_graph, as indexer_topk.cu runs decode: plan kernel zeroing the
//           select's control words, kernel 2 counting its first histogram, the prepared select); batch 64 also as
//           scores + the top-2048 of every row (decode_topk, plain launches);
//   each for kernel 1 (mma.sync) and kernel 2 (wgmma) of indexer_logits;
//   prefill, kernels 1, 2 and 3 (warp-specialised): 4096 queries (positions L − 4096 .. L − 1) of one sequence over
//           L = 16K, 32K, 64K keys, and 64 queries at L = 1M (the model's row block under its scratch budget):
//           TFLOP/s over 2 · 32 · 128 FLOP per causal (query, key) pair vs 1331 (dense FP8 peak).
// The plan (row grouping, once per batch for all indexer layers) is built before timing. CUDA events, median.
// Usage: bench_indexer [--json PATH] [--quick] [--only decode|prefill] [--kernels 1,2,3] [--qps 1,4] [--check]
//                      [--heads 32|64]
//   --heads 64: DeepSeek-V3.2's indexer (kernel 2 only; FLOP per causal pair 2 · 64 · 128).
//   --qps: the decode queries per sequence measured (1..4; default 1 and 4).
//   --check: every prefill result is compared with kernel 2's scores of the same shape (max |diff| / max |ref| over
//   the causal entries, printed; exit 3 above 1e-3: kernel 1 accumulates in fp32, wgmma with about 14 mantissa bits),
//   so that lab builds of a kernel are checked where they are timed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/indexer_logits.h"
#include "backend/cuda/topk.h"
#include "cuda_bench.cuh"

namespace {

constexpr double kCopyTBs = 4.23, kFp8Tflops = 1331.0;
constexpr int64_t kBlockBytes = 8448;

// Random finite e4m3 codes (no NaN 0x7f/0xff) and power-of-two scales.
__global__ void fill_pool(uint8_t* pool, int64_t n_blocks) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n_blocks * (kBlockBytes / 4);
         e += stride) {
        const int64_t byte = e * 4, in_block = byte % kBlockBytes;
        uint32_t h = static_cast<uint32_t>(e) * 2654435761u ^ static_cast<uint32_t>(e >> 32);
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        uint32_t v;
        if (in_block < 64 * 128) {
            v = h & 0xf6f6f6f6u;  // clears bit 0 and 3 of each byte: never 0x7f / 0xff
        } else {
            v = __float_as_uint(ldexpf(1.0f, static_cast<int>(h % 8) - 10));
        }
        reinterpret_cast<uint32_t*>(pool)[e] = v;
    }
}

// --check: out[0] = max |a − b|, out[1] = max |b| over the causal entries (row j of `rows` holds positions
// 0 .. first_pos + j) of two [rows, L] score arrays, as float bits (non-negative floats order as their bits; a NaN
// difference orders above every finite one).
__global__ void max_diff(const float* a, const float* b, int64_t rows, int64_t L, int64_t first_pos, unsigned* out) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    float d = 0.0f, m = 0.0f;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * L; e += stride) {
        const int64_t j = e / L, t = e % L;
        if (t > first_pos + j) continue;
        const float diff = fabsf(a[e] - b[e]);
        d = diff != diff ? __int_as_float(0x7fc00000) : fmaxf(d, diff);
        m = fmaxf(m, fabsf(b[e]));
    }
    atomicMax(out, __float_as_uint(d));
    atomicMax(out + 1, __float_as_uint(m));
}

struct Result {
    std::string kind;
    int kernel;
    int64_t batch, queries_per_seq, context;
    double us, tbs, pct_copy, tflops, pct_fp8;
};

double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    using namespace megactx;
    std::string json_path;
    bool quick = false, check = false;
    std::string only;
    std::vector<int> kernels{1, 2, 3};
    std::vector<int64_t> qps_list{1, 4};
    int heads = 32;
    for (int a = 1; a < argc; ++a) {
        const std::string s = argv[a];
        if (s == "--json" && a + 1 < argc) {
            json_path = argv[++a];
        } else if (s == "--heads" && a + 1 < argc) {
            heads = std::atoi(argv[++a]);
            if (heads != 32 && heads != 64) {
                std::fprintf(stderr, "--heads takes 32 or 64\n");
                return 2;
            }
        } else if (s == "--quick") {
            quick = true;
        } else if (s == "--check") {
            check = true;
        } else if (s == "--only" && a + 1 < argc) {
            only = argv[++a];
            if (only != "decode" && only != "prefill") {
                std::fprintf(stderr, "--only takes decode or prefill, not %s\n", only.c_str());
                return 2;
            }
        } else if ((s == "--qps" || s == "--kernels") && a + 1 < argc) {
            // A list of single digits in [1, hi], e.g. "1,4" or "23".
            const int hi = s == "--qps" ? 4 : 3;
            std::vector<int> digits;
            for (const char* c = argv[++a]; *c != 0; ++c)
                if (*c >= '1' && *c <= '0' + hi) digits.push_back(*c - '0');
            if (digits.empty()) {
                std::fprintf(stderr, "%s takes a list of 1..%d\n", s.c_str(), hi);
                return 2;
            }
            if (s == "--qps")
                qps_list.assign(digits.begin(), digits.end());
            else
                kernels = digits;
        } else {
            std::fprintf(stderr, "unknown argument %s\n", s.c_str());
            return 2;
        }
    }
    if (heads == 64) kernels = {2};  // the one kernel with 64 heads
    // The kernels of `candidates` that run in the `kind` part ("decode" or "prefill") under --only / --kernels.
    const auto select_kernels = [&](std::vector<int> candidates, const std::string& kind) {
        std::vector<int> r;
        if (!only.empty() && only != kind) return r;
        for (int k : candidates)
            if (std::find(kernels.begin(), kernels.end(), k) != kernels.end()) r.push_back(k);
        return r;
    };
    cudaDeviceProp prop{};
    MEGACTX_BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    const std::vector<int64_t> contexts =
        quick ? std::vector<int64_t>{131072} : std::vector<int64_t>{131072, 262144, 524288, 1048576};
    const int64_t max_ctx = contexts.back(), max_pages = max_ctx / 64, max_batch = 64, max_qps = 4;
    const int64_t n_blocks = max_batch * max_pages;
    uint8_t* pool;
    MEGACTX_BENCH_CK(cudaMalloc(&pool, n_blocks * kBlockBytes));
    fill_pool<<<4096, 256>>>(pool, n_blocks);
    MEGACTX_BENCH_CK(cudaGetLastError());
    // Block tables: a random permutation of the pool; sequence s owns tables[s · max_pages ...].
    std::vector<int32_t> tables(static_cast<size_t>(n_blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::mt19937 rng(7);
    std::shuffle(tables.begin(), tables.end(), rng);
    int32_t* d_tables;
    MEGACTX_BENCH_CK(cudaMalloc(&d_tables, tables.size() * 4));
    MEGACTX_BENCH_CK(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    const int64_t max_rows = 4096;
    std::vector<uint8_t> q8(static_cast<size_t>(max_rows * heads * 128));
    std::vector<float> w8(static_cast<size_t>(max_rows * heads));
    for (auto& b : q8) b = static_cast<uint8_t>(rng() & 0xf6);
    for (auto& w : w8) w = std::uniform_real_distribution<float>(-1e-3f, 1e-3f)(rng);
    uint8_t* d_q8;
    float* d_w8;
    MEGACTX_BENCH_CK(cudaMalloc(&d_q8, q8.size()));
    MEGACTX_BENCH_CK(cudaMalloc(&d_w8, w8.size() * 4));
    MEGACTX_BENCH_CK(cudaMemcpy(d_q8, q8.data(), q8.size(), cudaMemcpyHostToDevice));
    MEGACTX_BENCH_CK(cudaMemcpy(d_w8, w8.data(), w8.size() * 4, cudaMemcpyHostToDevice));
    // Decode rows × context, or the prefill's 4096 rows × 64K scores, whichever is larger.
    const size_t out_bytes = std::max(static_cast<size_t>(max_batch * max_qps) * max_ctx, size_t{4096} * 65536) * 4;
    float *d_out, *d_ref = nullptr;
    MEGACTX_BENCH_CK(cudaMalloc(&d_out, out_bytes));
    unsigned* d_diff = nullptr;
    if (check) {
        MEGACTX_BENCH_CK(cudaMalloc(&d_ref, size_t{4096} * 65536 * 4));
        MEGACTX_BENCH_CK(cudaMalloc(&d_diff, 8));
    }
    bool check_failed = false;
    int32_t *d_pos, *d_seq, *d_toff, *d_plan;
    MEGACTX_BENCH_CK(cudaMalloc(&d_pos, max_rows * 4));
    MEGACTX_BENCH_CK(cudaMalloc(&d_seq, max_rows * 4));
    MEGACTX_BENCH_CK(cudaMalloc(&d_toff, max_batch * 4 * 8));
    constexpr int kRot = 8;
    const int64_t plan_ints = indexer_plan_ints(max_rows);
    MEGACTX_BENCH_CK(
        cudaMalloc(&d_plan, plan_ints * 4 * kRot));  // one plan per rotation (a plan records its table offsets)
    int32_t* d_len;                                  // [kRot, max_rows] top-k row lengths
    MEGACTX_BENCH_CK(cudaMalloc(&d_len, max_rows * 4 * kRot));
    cudaStream_t stream;
    MEGACTX_BENCH_CK(cudaStreamCreate(&stream));
    cudaEvent_t e0, e1;
    MEGACTX_BENCH_CK(cudaEventCreate(&e0));
    MEGACTX_BENCH_CK(cudaEventCreate(&e1));
    std::vector<Result> results;

    // Rows of `batch` sequences × qps queries at the last positions of context L; table offsets of rotation r.
    auto setup = [&](int64_t batch, int64_t qps, int64_t L, int n_rot) {
        std::vector<int32_t> pos, seq, toff;
        for (int64_t s = 0; s < batch; ++s)
            for (int64_t j = 0; j < qps; ++j) pos.push_back(static_cast<int32_t>(L - qps + j)), seq.push_back(s);
        for (int r = 0; r < n_rot; ++r)
            for (int64_t s = 0; s < batch; ++s) toff.push_back(static_cast<int32_t>((r * batch + s) * max_pages));
        MEGACTX_BENCH_CK(cudaMemcpy(d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
        MEGACTX_BENCH_CK(cudaMemcpy(d_seq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
        MEGACTX_BENCH_CK(cudaMemcpy(d_toff, toff.data(), toff.size() * 4, cudaMemcpyHostToDevice));
        for (int r = 0; r < n_rot; ++r) {
            IndexerPlanParams pp;
            pp.pos = d_pos;
            pp.seq = d_seq;
            pp.row_begin = 0;
            pp.row_end = batch * qps;
            pp.plan = d_plan + r * plan_ints;
            pp.lengths = d_len + r * max_rows;
            pp.table_offset = d_toff + r * batch;
            launch_indexer_plan(pp, stream);
        }
        MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
    };
    const bool no_seq_rows = std::getenv("MEGACTX_BENCH_NO_SEQ_ROWS") != nullptr;
    auto params = [&](int64_t batch, int64_t qps, int64_t L, int rot, int kernel) {
        IndexerLogitsParams p;
        p.kernel = static_cast<int16_t>(
            heads == 64 ? 0 : kernel);  // 64 heads: kernel 2 by shape (an explicit 2 is the batch-invariant tile)
        p.n_head = static_cast<int16_t>(heads);
        p.q8 = d_q8;
        p.w8 = d_w8;
        p.pool = pool;
        p.pool_blocks = n_blocks;
        p.pos = d_pos;
        p.seq = d_seq;
        p.table_offset = d_toff + rot * batch;
        p.tables = d_tables;
        p.row_begin = 0;
        p.row_end = batch * qps;
        p.n_seq = batch;
        p.max_seq_rows = no_seq_rows ? 0 : qps;  // as BatchPlan passes it (MEGACTX_BENCH_NO_SEQ_ROWS=1: unknown)
        p.max_context = L;
        p.out = d_out + static_cast<size_t>(rot) * batch * qps * L;
        p.out_stride = L;
        p.plan = d_plan + rot * plan_ints;
        return p;
    };
    // Exact top-k (k = 2048) of the scores of rotation r (decode + top-k rows).
    size_t topk_scratch_max = 256;
    for (int64_t L : contexts)
        for (int64_t qps = 1; qps <= max_qps; ++qps)
            topk_scratch_max = std::max(topk_scratch_max, (cuda::topk_scratch_bytes(qps, L, 2048) + 255) / 256 * 256);
    void* d_topk_scratch;
    int32_t* d_topk_idx;
    MEGACTX_BENCH_CK(cudaMalloc(&d_topk_scratch, topk_scratch_max * kRot));
    MEGACTX_BENCH_CK(cudaMalloc(&d_topk_idx, max_qps * 2048 * 4 * kRot));
    // Batch 64: the top-2048 of every row after the scores (decode_topk, batch 64): its own scratch and output.
    constexpr int64_t kBatch = 64;
    size_t batch_topk_scratch = 256;
    for (int64_t L : contexts)
        batch_topk_scratch = std::max(batch_topk_scratch, cuda::topk_scratch_bytes(kBatch * max_qps, L, 2048));
    void* d_batch_scratch;
    int32_t* d_batch_idx;
    MEGACTX_BENCH_CK(cudaMalloc(&d_batch_scratch, batch_topk_scratch));
    MEGACTX_BENCH_CK(cudaMalloc(&d_batch_idx, kBatch * max_qps * 2048 * 4));
    auto topk_params = [&](int64_t qps, int64_t L, int rot) {
        cuda::TopkParams tp;
        tp.values = d_out + static_cast<size_t>(rot) * qps * L;
        tp.lengths = d_len + rot * max_rows;
        tp.n_rows = qps;
        tp.row_stride = L;
        tp.k = 2048;
        tp.out_idx = d_topk_idx + rot * max_qps * 2048;
        tp.scratch_bytes = cuda::topk_scratch_bytes(qps, L, 2048);
        tp.scratch = static_cast<uint8_t*>(d_topk_scratch) + rot * topk_scratch_max;
        return tp;
    };

    // MEGACTX_TOPK_FEW=0: the top-k rows take the three-kernel chain everywhere (_MAX_ROWS: the few-rows limit).
    cuda::TopkTuning topk_base;
    if (const char* c = std::getenv("MEGACTX_TOPK_FEW")) topk_base.few_rows = std::atoi(c);
    if (const char* c = std::getenv("MEGACTX_TOPK_FEW_MAX_ROWS")) topk_base.few_max_rows = std::atoi(c);
    cuda::topk_set_tuning(topk_base);
    for (int kernel : select_kernels({1, 2, 3}, "decode"))
        for (int64_t L : contexts) {
            for (int64_t qps : qps_list) {
                // Batch 1 in a CUDA graph: 8 launches over 8 disjoint sequences (8 · 132 · L bytes > L2); with_topk
                // adds the exact top-2048 of each launch's scores (the whole decode selection).
                // with_topk 2 (kernel 2 only): the top-k on its three-kernel chain (TopkTuning::few_rows = 0),
                // the path decode took before the few-rows kernel.
                // with_topk 3 (kernel 2, one query): the prepared select, the plan kernel zeroing the few-rows
                // select's control words and kernel 2 counting its first histogram (decode_topk_fused_graph; it
                // includes the plan kernel, which the other rows leave out; indexer_topk.cu's decode folds the plan
                // into the q quantisation instead, which bench_layer measures).
                for (int with_topk = 0; with_topk < (kernel == 2 ? (qps == 1 ? 4 : 3) : 2); ++with_topk) {
                    cuda::TopkTuning tt = topk_base;
                    if (with_topk == 2) tt.few_rows = 0;
                    cuda::topk_set_tuning(tt);
                    const int n_rot = kRot;
                    setup(1, qps, L, n_rot);
                    auto enqueue = [&]() {
                        for (int r = 0; r < n_rot; ++r) {
                            if (with_topk == 3) {
                                cuda::TopkParams tp = topk_params(qps, L, r);
                                const cuda::TopkGridCtl gc = cuda::topk_grid_ctl(tp);
                                IndexerPlanParams pp;
                                pp.pos = d_pos;
                                pp.seq = d_seq;
                                pp.row_begin = 0;
                                pp.row_end = qps;
                                pp.plan = d_plan + r * plan_ints;
                                pp.lengths = d_len + r * max_rows;
                                pp.table_offset = d_toff + r;
                                pp.zero = gc.ctl;
                                pp.zero_n = gc.n_ints;
                                launch_indexer_plan(pp, stream);
                                const IndexerLogitsHist hist{gc.hist0, gc.row_stride};
                                bool done = false;
                                launch_indexer_logits(params(1, qps, L, r, kernel), stream, &hist, &done);
                                tp.grid_prepared = gc.ctl == nullptr ? 0 : done ? 2 : 1;
                                cuda::launch_topk(tp, stream);
                                continue;
                            }
                            launch_indexer_logits(params(1, qps, L, r, kernel), stream);
                            if (with_topk) cuda::launch_topk(topk_params(qps, L, r), stream);
                        }
                    };
                    enqueue();
                    MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
                    MEGACTX_BENCH_CK(cudaGetLastError());
                    cudaGraph_t graph;
                    cudaGraphExec_t exec;
                    MEGACTX_BENCH_CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
                    enqueue();
                    MEGACTX_BENCH_CK(cudaStreamEndCapture(stream, &graph));
                    MEGACTX_BENCH_CK(cudaGraphInstantiate(&exec, graph, 0));
                    for (int w = 0; w < 3; ++w) MEGACTX_BENCH_CK(cudaGraphLaunch(exec, stream));
                    std::vector<float> ms;
                    for (int it = 0; it < (quick ? 5 : 30); ++it) {
                        MEGACTX_BENCH_CK(cudaEventRecord(e0, stream));
                        MEGACTX_BENCH_CK(cudaGraphLaunch(exec, stream));
                        MEGACTX_BENCH_CK(cudaEventRecord(e1, stream));
                        MEGACTX_BENCH_CK(cudaEventSynchronize(e1));
                        float m;
                        MEGACTX_BENCH_CK(cudaEventElapsedTime(&m, e0, e1));
                        ms.push_back(m / n_rot);
                    }
                    MEGACTX_BENCH_CK(cudaGraphExecDestroy(exec));
                    MEGACTX_BENCH_CK(cudaGraphDestroy(graph));
                    const double us = median(ms) * 1e3, tbs = 132.0 * L / (us * 1e-6) / 1e12;
                    const double tfl = 8192.0 * qps * L / (us * 1e-6) / 1e12;
                    cuda::topk_set_tuning(topk_base);
                    const char* kind = with_topk == 0   ? "decode_graph"
                                       : with_topk == 1 ? "decode_topk_graph"
                                       : with_topk == 2 ? "decode_topk_chain_graph"
                                                        : "decode_topk_fused_graph";
                    results.push_back(
                        {kind, kernel, 1, qps, L, us, tbs, 100 * tbs / kCopyTBs, tfl, 100 * tfl / kFp8Tflops});
                }
                // Batch 64, plain launches: the scores alone, then scores + the exact top-2048 of every row
                // (decode_topk: the whole selection of a batch-64 decode step, as one timed pipeline).
                for (int with_topk = 0; with_topk < 2; ++with_topk) {
                    const int64_t batch = kBatch;
                    setup(batch, qps, L, 1);
                    const auto p = params(batch, qps, L, 0, kernel);
                    cuda::TopkParams tp = topk_params(qps, L, 0);
                    tp.n_rows = batch * qps;
                    tp.out_idx = d_batch_idx;
                    tp.scratch = d_batch_scratch;
                    tp.scratch_bytes = cuda::topk_scratch_bytes(tp.n_rows, L, 2048);
                    auto run = [&] {
                        launch_indexer_logits(p, stream);
                        if (with_topk) cuda::launch_topk(tp, stream);
                    };
                    for (int w = 0; w < 2; ++w) run();
                    std::vector<float> ms;
                    for (int it = 0; it < (quick ? 3 : 10); ++it) {
                        MEGACTX_BENCH_CK(cudaEventRecord(e0, stream));
                        run();
                        MEGACTX_BENCH_CK(cudaEventRecord(e1, stream));
                        MEGACTX_BENCH_CK(cudaEventSynchronize(e1));
                        float m;
                        MEGACTX_BENCH_CK(cudaEventElapsedTime(&m, e0, e1));
                        ms.push_back(m);
                    }
                    const double us = median(ms) * 1e3, tbs = 132.0 * L * batch / (us * 1e-6) / 1e12;
                    const double tfl = 8192.0 * qps * L * batch / (us * 1e-6) / 1e12;
                    results.push_back({with_topk ? "decode_topk" : "decode", kernel, batch, qps, L, us, tbs,
                                       100 * tbs / kCopyTBs, tfl, 100 * tfl / kFp8Tflops});
                }
                MEGACTX_BENCH_CK(cudaGetLastError());
            }
        }
    // Prefill: 4096 queries of one sequence at positions L − 4096 .. L − 1 (all rows in one group: 4096 · L · 4 B
    // of scores ≤ 1 GiB at L = 64K); at L = 1M the 64 rows the model scores at once under its 256-MB scratch.
    const std::pair<int64_t, int64_t> prefill_shapes[] = {{16384, 4096}, {32768, 4096}, {65536, 4096},
                                                          {1 << 20, 64}, {1 << 20, 31}, {1 << 20, 16}};
    for (int kernel : select_kernels({1, 2, 3}, "prefill"))
        for (const auto& [L, sq] : prefill_shapes) {
            if (L > max_ctx) continue;
            std::vector<int32_t> pos(static_cast<size_t>(sq)), seq(static_cast<size_t>(sq), 0);
            double pairs = 0;
            for (int64_t j = 0; j < sq; ++j)
                pos[static_cast<size_t>(j)] = static_cast<int32_t>(L - sq + j), pairs += L - sq + j + 1;
            MEGACTX_BENCH_CK(cudaMemcpy(d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
            MEGACTX_BENCH_CK(cudaMemcpy(d_seq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
            const int32_t toff0 = 0;
            MEGACTX_BENCH_CK(cudaMemcpy(d_toff, &toff0, 4, cudaMemcpyHostToDevice));
            IndexerPlanParams pp;
            pp.pos = d_pos;
            pp.seq = d_seq;
            pp.row_begin = 0;
            pp.row_end = sq;
            pp.plan = d_plan;
            pp.table_offset = d_toff;
            launch_indexer_plan(pp, stream);
            IndexerLogitsParams p;
            p.kernel = static_cast<int16_t>(
                heads == 64 ? 0 : kernel);  // 64 heads: kernel 2 by shape (an explicit 2 is the batch-invariant tile)
            p.n_head = static_cast<int16_t>(heads);
            p.q8 = d_q8;
            p.w8 = d_w8;
            p.pool = pool;
            p.pool_blocks = n_blocks;
            p.pos = d_pos;
            p.seq = d_seq;
            p.table_offset = d_toff;
            p.tables = d_tables;
            p.row_begin = 0;
            p.row_end = sq;
            p.n_seq = 1;
            p.max_context = L;
            p.out = d_out;
            p.out_stride = L;
            p.plan = d_plan;
            if (launch_indexer_logits(p, stream) != kernel) {
                std::fprintf(stderr, "prefill: kernel %d did not run (fallback); skipped\n", kernel);
                continue;
            }
            launch_indexer_logits(p, stream);
            std::vector<float> ms;
            for (int it = 0; it < (quick ? 3 : 10); ++it) {
                MEGACTX_BENCH_CK(cudaEventRecord(e0, stream));
                launch_indexer_logits(p, stream);
                MEGACTX_BENCH_CK(cudaEventRecord(e1, stream));
                MEGACTX_BENCH_CK(cudaEventSynchronize(e1));
                float m;
                MEGACTX_BENCH_CK(cudaEventElapsedTime(&m, e0, e1));
                ms.push_back(m);
            }
            MEGACTX_BENCH_CK(cudaGetLastError());
            if (check) {  // kernel 2's scores of the same shape as the reference
                IndexerLogitsParams r = p;
                r.kernel = 2;
                r.out = d_ref;
                if (launch_indexer_logits(r, stream) != 2) {
                    std::fprintf(stderr, "check: kernel 2 did not run\n");
                    return 1;
                }
                MEGACTX_BENCH_CK(cudaMemsetAsync(d_diff, 0, 8, stream));
                max_diff<<<1024, 256, 0, stream>>>(d_out, d_ref, sq, L, L - sq, d_diff);
                unsigned h[2];
                MEGACTX_BENCH_CK(cudaMemcpyAsync(h, d_diff, 8, cudaMemcpyDeviceToHost, stream));
                MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
                float diff, ref;
                std::memcpy(&diff, &h[0], 4);
                std::memcpy(&ref, &h[1], 4);
                const double rel = ref > 0 ? diff / ref : diff;
                const bool ok = rel <= 1e-3;
                check_failed |= !ok;
                std::printf("check: kernel %d, %lld rows x L %lld: max |diff| %.3g, max |ref| %.3g, rel %.3g %s\n",
                            kernel, static_cast<long long>(sq), static_cast<long long>(L), diff, ref, rel,
                            ok ? "ok" : "FAILED");
            }
            const double us = median(ms) * 1e3, tfl = 256.0 * heads * pairs / (us * 1e-6) / 1e12;
            const double tbs = 132.0 * L / (us * 1e-6) / 1e12;
            results.push_back(
                {"prefill", kernel, 1, sq, L, us, tbs, 100 * tbs / kCopyTBs, tfl, 100 * tfl / kFp8Tflops});
        }

    std::printf("%-18s %3s %6s %4s %8s %10s %8s %7s %9s %7s\n", "kind", "krn", "batch", "q/s", "L", "us", "TB/s",
                "%copy", "TFLOP/s", "%fp8");
    for (const auto& r : results)
        std::printf("%-18s %3d %6lld %4lld %8lld %10.2f %8.3f %6.1f%% %9.1f %6.1f%%\n", r.kind.c_str(), r.kernel,
                    static_cast<long long>(r.batch), static_cast<long long>(r.queries_per_seq),
                    static_cast<long long>(r.context), r.us, r.tbs, r.pct_copy, r.tflops, r.pct_fp8);
    if (!json_path.empty()) {
        FILE* f = std::fopen(json_path.c_str(), "w");
        if (!f) return 1;
        char date[32];
        const std::time_t now = std::time(nullptr);
        std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
        std::fprintf(f, "{\n  \"bench\": \"indexer_logits\",\n  \"device\": \"%s\",\n  \"date\": \"%s\",\n", prop.name,
                     date);
        std::fprintf(
            f, "  \"commit\": \"%s\",\n  \"heads\": %d,\n  \"ceilings\": {\"copy_TBs\": %.2f, \"fp8_TFLOPs\": %.0f},\n",
            megactx::bench_cuda::commit(), heads, kCopyTBs, kFp8Tflops);
        std::fprintf(f,
                     "  \"note\": \"kernel 1 = mma.sync, 2 = wgmma; decode bytes = 132*L*batch (keys read once per "
                     "sequence; decode_topk adds the top-2048 of the scores, decode_topk_chain on the three-kernel "
                     "top-k chain); prefill FLOP = 256 * heads per causal (query, "
                     "key) pair\",\n  \"results\": [\n");
        for (size_t i = 0; i < results.size(); ++i) {
            const auto& r = results[i];
            std::fprintf(
                f,
                "    {\"kind\": \"%s\", \"kernel\": %d, \"batch\": %lld, \"queries_per_seq\": %lld, \"context\": %lld, "
                "\"us\": %.3f, \"TBs\": %.4f, \"pct_copy\": %.2f, \"TFLOPs\": %.2f, \"pct_fp8\": %.2f}%s\n",
                r.kind.c_str(), r.kernel, static_cast<long long>(r.batch), static_cast<long long>(r.queries_per_seq),
                static_cast<long long>(r.context), r.us, r.tbs, r.pct_copy, r.tflops, r.pct_fp8,
                i + 1 < results.size() ? "," : "");
        }
        std::fprintf(f, "  ]\n}\n");
        std::fclose(f);
    }
    return check_failed ? 3 : 0;
}
