// Standalone benchmark of DeepSeek FlashMLA's sm90 sparse FP8 decode kernel (V3.2 KV-cache layout, d_qk 576,
// d_v 512) plus its split-KV combine kernel, for comparison with megactx's bench/cuda/bench_sparse_mla.cu.
//
// Methodology mirrors bench_sparse_mla.cu (decode rows):
//   * 1M-row FP8 cache (656 B/row: 512 e4m3 NoPE codes, 4 fp32 tile scales, 64 bf16 RoPE), filled on the device with
//     the same hash-based finite random values (codes with |v| <= 1.875, scales 2^-4, RoPE in (-1, 1)).
//   * FlashMLA pages: 64 tokens per block, 16384 blocks; a random block table maps logical -> physical blocks and the
//     kernel gets physical token indices (block*64 + offset), as FlashMLA's tests do (abs_indices2indices_in_kvcache).
//     Logical indices are uniform random over the whole cache (std::mt19937(42), rng() % 1M, as megactx's slots).
//   * n_sets = max(2, 150e6 / (batch*topk*656) + 1) index sets, graph of n_launch = max(n_sets, 10) steps rotating
//     over them so one graph replay reads > 150 MB; scheduler metadata (get_decoding_sched_meta) computed once outside
//     the graph; each captured step = sparse FP8 decode kernel + combine kernel (exactly what FlashMLA's
//     sparse_attn_decode_interface launches when tile_scheduler_metadata is passed in).
//   * One warm-up step outside the graph, 3 warm graph replays, 30 timed replays (events), median / n_launch.
// Queries bf16 [b, 1, h, 576] (megactx uses fp32 q/out; FlashMLA only takes bf16), same hash values as megactx's q.
// softmax scale 1/16 (as megactx).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_bench.cuh"  // bench/cuda: the error check and the hash megactx's benchmarks fill their data with
#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

#define CK(call) MEGACTX_BENCH_CK(call)

namespace {

constexpr int kRowBytes = 656;
constexpr int kDqk = 576, kDv = 512, kDnope = 512, kDrope = 64;
constexpr int kPageBlock = 64;
constexpr const char* kFlashMlaCommit = "9241ae3ef9bac614dd25e45e507e089f888280e0";
constexpr const char* kCutlassCommit = "147f5673d0c1c3dcf66f78d677fd647e4a020219";

using megactx::bench_cuda::hash32;

// Identical to bench_sparse_mla.cu's fill_fp8 (row r = physical token r).
__global__ void fill_fp8(uint8_t* cache) {
    const int64_t r = blockIdx.x;
    uint8_t* row = cache + r * kRowBytes;
    for (int j = threadIdx.x; j < 512; j += blockDim.x) {
        uint8_t c = static_cast<uint8_t>(hash32(r * 1024 + j));
        if ((c & 0x7f) == 0x7f) c ^= 1;
        c &= 0xbf;
        row[j] = c;
    }
    if (threadIdx.x < 4) reinterpret_cast<float*>(row + 512)[threadIdx.x] = 0.0625f;
    for (int j = threadIdx.x; j < 64; j += blockDim.x) {
        const float v = static_cast<float>(hash32(r * 1024 + 600 + j) & 0xffff) / 32768.0f - 1.0f;
        const uint32_t u = __float_as_uint(v) >> 16;
        reinterpret_cast<uint16_t*>(row + 528)[j] = static_cast<uint16_t>(u);
    }
}

// megactx's fill_f32 values for q, stored as bf16 (round to nearest).
__global__ void fill_q_bf16(__nv_bfloat16* x, int64_t n) {
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[k] = __float2bfloat16(static_cast<float>(hash32(k + 777) & 0xffff) / 32768.0f - 1.0f);
}

float e4m3_to_float(uint8_t c) {
    const int s = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
    float v;
    if (e == 0)
        v = std::ldexp(static_cast<float>(m) / 8.0f, -6);
    else
        v = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
    if (e == 0xf && m == 7) v = NAN;
    return s ? -v : v;
}
float bf16_bits_to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> v;
    std::stringstream ss(s);
    std::string t;
    while (std::getline(ss, t, ','))
        if (!t.empty()) v.push_back(std::atoi(t.c_str()));
    return v;
}

struct Buffers {
    uint8_t* cache = nullptr;      // [n_blocks, 64, 1, 656]
    __nv_bfloat16* q = nullptr;    // [max_b, 1, max_h, 576]
    __nv_bfloat16* out = nullptr;  // [max_b, 1, max_h, 512]
    float* lse = nullptr;          // [max_b, 1, max_h]
};

// One configuration: everything FlashMLA's sparse_attn_decode_interface sets up, from raw buffers.
struct Config {
    int b, h, topk, num_sm_parts;
    DecodingSchedMeta* sched = nullptr;
    int* num_splits = nullptr;
    float* lse_accum = nullptr;
    float* o_accum = nullptr;
    SparseAttnDecodeParams p{};
    CombineParams c{};

    Config(const Buffers& buf, int b_, int h_, int topk_, int n_sm, int64_t n_rows, float scale, cudaStream_t stream)
        : b(b_), h(h_), topk(topk_) {
        const int s_q = 1;
        num_sm_parts = std::max(n_sm / s_q / (h / 64), 1);  // Decode_Sm90_Impl::get_meta
        CK(cudaMalloc(&sched, sizeof(DecodingSchedMeta) * num_sm_parts));
        CK(cudaMalloc(&num_splits, sizeof(int) * (b + 1)));
        const int total_splits = b + num_sm_parts;
        CK(cudaMalloc(&lse_accum, sizeof(float) * static_cast<size_t>(total_splits) * s_q * h));
        CK(cudaMalloc(&o_accum, sizeof(float) * static_cast<size_t>(total_splits) * s_q * h * kDv));

        std::memset(&p, 0, sizeof p);
        p.b = b;
        p.s_q = s_q;
        p.h_q = h;
        p.h_kv = 1;
        p.d_qk = kDqk;
        p.d_v = kDv;
        p.sm_scale = scale;
        p.sm_scale_div_log2 = scale * 1.44269504088896340736f;  // sm_scale * LOG_2_E, as the API does
        p.num_blocks = static_cast<int>(n_rows / kPageBlock);
        p.page_block_size = kPageBlock;
        p.topk = topk;
        p.model_type = ModelType::V32;
        p.q = reinterpret_cast<cutlass::bfloat16_t*>(buf.q);
        p.kv = reinterpret_cast<cutlass::bfloat16_t*>(buf.cache);
        p.indices = nullptr;  // set per step
        p.topk_length = nullptr;
        p.attn_sink = nullptr;
        p.lse = buf.lse;
        p.out = reinterpret_cast<cutlass::bfloat16_t*>(buf.out);
        p.extra_num_blocks = 0;
        p.extra_page_block_size = 0;
        p.extra_topk = 0;
        p.extra_kv = nullptr;
        p.extra_indices = nullptr;
        p.extra_topk_length = nullptr;
        p.stride_q_b = s_q * h * kDqk;
        p.stride_q_s_q = h * kDqk;
        p.stride_q_h_q = kDqk;
        p.stride_kv_block = kPageBlock * kRowBytes;
        p.stride_kv_row = kRowBytes;  // in bytes (uint8 kv tensor)
        p.stride_indices_b = s_q * topk;
        p.stride_indices_s_q = topk;
        p.stride_lse_b = s_q * h;
        p.stride_lse_s_q = h;
        p.stride_o_b = s_q * h * kDv;
        p.stride_o_s_q = h * kDv;
        p.stride_o_h_q = kDv;
        p.stream = stream;
        p.lse_accum = lse_accum;
        p.o_accum = o_accum;
        p.stride_lse_accum_split = s_q * h;
        p.stride_lse_accum_s_q = h;
        p.stride_o_accum_split = s_q * h * kDv;
        p.stride_o_accum_s_q = h * kDv;
        p.stride_o_accum_h_q = kDv;
        p.tile_scheduler_metadata_ptr = sched;
        p.num_splits_ptr = num_splits;
        p.num_sm_parts = num_sm_parts;

        // Scheduler metadata, outside any graph (block_size_topk 64, fixed overhead 5 blocks: Decode_Sm90_Impl).
        GetDecodeSchedMetaParams g{};
        g.b = b;
        g.s_q = s_q;
        g.block_size_n = 64;
        g.fixed_overhead_num_blocks = 5;
        g.topk = topk;
        g.extra_topk = 0;
        g.topk_length = nullptr;
        g.extra_topk_length = nullptr;
        g.seqlens_k_ptr = nullptr;
        g.tile_scheduler_metadata_ptr = sched;
        g.num_splits_ptr = num_splits;
        g.num_sm_parts = num_sm_parts;
        g.stream = stream;
        smxx::decode::run_get_decoding_sched_meta_kernel(g);
        CK(cudaStreamSynchronize(stream));

        std::memset(&c, 0, sizeof c);
        c.b = b;
        c.s_q = s_q;
        c.h_q = h;
        c.d_v = kDv;
        c.lse = p.lse;
        c.out = p.out;
        c.stride_lse_b = p.stride_lse_b;
        c.stride_lse_s_q = p.stride_lse_s_q;
        c.stride_o_b = p.stride_o_b;
        c.stride_o_s_q = p.stride_o_s_q;
        c.stride_o_h_q = p.stride_o_h_q;
        c.lse_accum = lse_accum;
        c.o_accum = o_accum;
        c.stride_lse_accum_split = p.stride_lse_accum_split;
        c.stride_lse_accum_s_q = p.stride_lse_accum_s_q;
        c.stride_o_accum_split = p.stride_o_accum_split;
        c.stride_o_accum_s_q = p.stride_o_accum_s_q;
        c.stride_o_accum_h_q = p.stride_o_accum_h_q;
        c.tile_scheduler_metadata_ptr = sched;
        c.num_splits_ptr = num_splits;
        c.num_sm_parts = num_sm_parts;
        c.attn_sink = nullptr;
        c.stream = stream;
    }
    ~Config() {
        cudaFree(sched);
        cudaFree(num_splits);
        cudaFree(lse_accum);
        cudaFree(o_accum);
    }
    // One decode step: main kernel + combine (as sparse_attn_decode_interface does).
    void step(int* indices) {
        p.indices = indices;
        if (h == 64)
            sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(p);
        else
            sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(p);
        smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
    }
};

struct Result {
    int h, b, num_sm_parts, n_sets, n_launch;
    double us, step_bytes, tbps, tflops;
};
struct Check {
    int h;
    double max_rel_err, rel_l2_err, max_abs_err, max_abs_ref, lse_max_abs_err;
};

// Logical -> physical token index through the block table.
inline int32_t to_physical(int64_t logical, const std::vector<int32_t>& block_table) {
    return static_cast<int32_t>(static_cast<int64_t>(block_table[logical / kPageBlock]) * kPageBlock +
                                logical % kPageBlock);
}

}  // namespace

int main(int argc, char** argv) {
    std::string json;
    std::vector<int> heads{64, 128}, batches{1, 16, 64, 128};
    bool do_check = true;
    int reps = 30;
    for (int a = 1; a < argc; ++a) {
        const std::string s = argv[a];
        if (s == "--json" && a + 1 < argc)
            json = argv[++a];
        else if (s == "--heads" && a + 1 < argc)
            heads = parse_list(argv[++a]);
        else if (s == "--batch" && a + 1 < argc)
            batches = parse_list(argv[++a]);
        else if (s == "--reps" && a + 1 < argc)
            reps = std::atoi(argv[++a]);
        else if (s == "--no-check")
            do_check = false;
        else if (s == "-h" || s == "--help") {
            std::printf("usage: %s [--heads 64,128] [--batch 1,16,64,128] [--json PATH] [--reps 30] [--no-check]\n",
                        argv[0]);
            return 0;
        } else {
            std::fprintf(stderr, "unknown argument %s\n", s.c_str());
            return 2;
        }
    }
    for (int h : heads)
        if (h != 64 && h != 128) {
            std::fprintf(stderr, "heads must be 64 or 128\n");
            return 2;
        }

    try {
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        if (prop.major != 9 || prop.minor != 0) {
            std::fprintf(stderr, "FlashMLA sm90 kernels need an sm_90 (Hopper) GPU; found %s (sm_%d%d)\n", prop.name,
                         prop.major, prop.minor);
            return 1;
        }
        const int n_sm = prop.multiProcessorCount;
        const int64_t n_rows = 1 << 20;
        const int topk = 2048;
        const float scale = 1.0f / 16.0f;
        const int max_b = *std::max_element(batches.begin(), batches.end());
        const int max_h = 128;

        Buffers buf;
        CK(cudaMalloc(&buf.cache, n_rows * kRowBytes));
        const int64_t q_elems = static_cast<int64_t>(std::max(max_b, 1)) * max_h * kDqk;
        CK(cudaMalloc(&buf.q, q_elems * 2));
        CK(cudaMalloc(&buf.out, static_cast<size_t>(std::max(max_b, 1)) * max_h * kDv * 2));
        CK(cudaMalloc(&buf.lse, static_cast<size_t>(std::max(max_b, 1)) * max_h * 4));
        fill_fp8<<<static_cast<unsigned>(n_rows), 128>>>(buf.cache);
        fill_q_bf16<<<4096, 256>>>(buf.q, q_elems);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());

        // Random block table (FlashMLA tests: a random permutation of physical blocks).
        const int n_blocks = static_cast<int>(n_rows / kPageBlock);
        std::vector<int32_t> block_table(n_blocks);
        std::iota(block_table.begin(), block_table.end(), 0);
        std::mt19937 bt_rng(7);
        std::shuffle(block_table.begin(), block_table.end(), bt_rng);

        std::mt19937 rng(42);  // index stream, as megactx
        cudaStream_t stream;
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

        std::printf("device: %s (%d SMs), FlashMLA %s sparse FP8 decode (V3.2 layout), topk %d, cache %lld rows\n",
                    prop.name, n_sm, kFlashMlaCommit, topk, static_cast<long long>(n_rows));

        // ---- correctness sanity check: batch 1, one query, CPU fp32 reference ----
        std::vector<Check> checks;
        if (do_check) {
            std::mt19937 crng(1234);
            for (int h : heads) {
                Config cfg(buf, 1, h, topk, n_sm, n_rows, scale, stream);
                std::vector<int32_t> idx(topk);
                for (auto& x : idx) x = to_physical(static_cast<int64_t>(crng() % n_rows), block_table);
                int32_t* d_idx;
                CK(cudaMalloc(&d_idx, topk * 4));
                CK(cudaMemcpy(d_idx, idx.data(), topk * 4, cudaMemcpyHostToDevice));
                CK(cudaMemset(buf.out, 0xff,
                              static_cast<size_t>(h) * kDv * 2));  // NaN pattern: catch unwritten outputs
                cfg.step(d_idx);
                CK(cudaStreamSynchronize(stream));
                std::vector<uint16_t> out(static_cast<size_t>(h) * kDv), qh(static_cast<size_t>(h) * kDqk);
                std::vector<float> lse(h);
                CK(cudaMemcpy(out.data(), buf.out, out.size() * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(qh.data(), buf.q, qh.size() * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(lse.data(), buf.lse, h * 4, cudaMemcpyDeviceToHost));
                // Dequantise the selected rows.
                std::vector<float> K(static_cast<size_t>(topk) * kDqk);
                std::vector<uint8_t> row(kRowBytes);
                for (int j = 0; j < topk; ++j) {
                    CK(cudaMemcpy(row.data(), buf.cache + static_cast<int64_t>(idx[j]) * kRowBytes, kRowBytes,
                                  cudaMemcpyDeviceToHost));
                    float sc[4];
                    std::memcpy(sc, row.data() + 512, 16);
                    for (int d = 0; d < kDnope; ++d)
                        K[static_cast<size_t>(j) * kDqk + d] = e4m3_to_float(row[d]) * sc[d / 128];
                    for (int d = 0; d < kDrope; ++d) {
                        uint16_t bits;
                        std::memcpy(&bits, row.data() + 528 + 2 * d, 2);
                        K[static_cast<size_t>(j) * kDqk + kDnope + d] = bf16_bits_to_float(bits);
                    }
                }
                double max_abs_err = 0, max_abs_ref = 0, se = 0, sr = 0, lse_err = 0;
                bool nan = false;
                std::vector<double> s(topk), o(kDv);
                for (int hh = 0; hh < h; ++hh) {
                    double mx = -1e300;
                    for (int j = 0; j < topk; ++j) {
                        double acc = 0;
                        for (int d = 0; d < kDqk; ++d)
                            acc += static_cast<double>(bf16_bits_to_float(qh[static_cast<size_t>(hh) * kDqk + d])) *
                                   K[static_cast<size_t>(j) * kDqk + d];
                        s[j] = acc * scale;
                        mx = std::max(mx, s[j]);
                    }
                    double sum = 0;
                    for (int j = 0; j < topk; ++j) {
                        s[j] = std::exp(s[j] - mx);
                        sum += s[j];
                    }
                    std::fill(o.begin(), o.end(), 0.0);
                    for (int j = 0; j < topk; ++j) {
                        const double pj = s[j] / sum;
                        for (int d = 0; d < kDv; ++d) o[d] += pj * K[static_cast<size_t>(j) * kDqk + d];
                    }
                    const double ref_lse = mx + std::log(sum);  // natural log (FlashMLA's lse convention)
                    if (!std::isfinite(lse[hh])) nan = true;
                    lse_err = std::max(lse_err, std::fabs(static_cast<double>(lse[hh]) - ref_lse));
                    for (int d = 0; d < kDv; ++d) {
                        const double got = bf16_bits_to_float(out[static_cast<size_t>(hh) * kDv + d]);
                        if (!std::isfinite(got)) nan = true;
                        max_abs_err = std::max(max_abs_err, std::fabs(got - o[d]));
                        max_abs_ref = std::max(max_abs_ref, std::fabs(o[d]));
                        se += (got - o[d]) * (got - o[d]);
                        sr += o[d] * o[d];
                    }
                }
                Check ck{h,
                         nan ? INFINITY : max_abs_err / max_abs_ref,
                         nan ? INFINITY : std::sqrt(se / sr),
                         max_abs_err,
                         max_abs_ref,
                         lse_err};
                std::printf(
                    "check h=%-4d b=1: max_rel_err %.3e (max|err| %.3e / max|ref| %.3e), rel_l2_err %.3e, "
                    "lse max|err| %.3e%s\n",
                    h, ck.max_rel_err, max_abs_err, max_abs_ref, ck.rel_l2_err, lse_err,
                    nan ? "  NON-FINITE OUTPUT" : (ck.max_rel_err < 2e-2 ? "  ok" : "  LARGE"));
                checks.push_back(ck);
                CK(cudaFree(d_idx));
            }
        }

        // ---- timing ----
        std::vector<Result> results;
        std::printf("%-5s %-6s %-8s %-7s %-8s %10s %9s %9s\n", "h", "batch", "sm_parts", "n_sets", "n_launch", "us",
                    "TB/s", "TFLOP/s");
        for (int h : heads)
            for (int b : batches) {
                const double step_bytes =
                    static_cast<double>(b) * topk * kRowBytes + static_cast<double>(b) * h * (kDqk + kDv) * 2;
                const int n_sets =
                    std::max(2, static_cast<int>(150e6 / (static_cast<double>(b) * topk * kRowBytes)) + 1);
                const int n_launch = std::max(n_sets, 10);
                std::vector<int32_t> hs(static_cast<size_t>(n_sets) * b * topk);
                for (auto& x : hs) x = to_physical(static_cast<int64_t>(rng() % n_rows), block_table);
                int32_t* slots;
                CK(cudaMalloc(&slots, hs.size() * 4));
                CK(cudaMemcpy(slots, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
                Config cfg(buf, b, h, topk, n_sm, n_rows, scale, stream);
                // Warm-up outside the graph (also sets the kernels' shared-memory attributes before capture).
                cfg.step(slots);
                CK(cudaStreamSynchronize(stream));
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
                for (int k = 0; k < n_launch; ++k) cfg.step(slots + static_cast<size_t>(k % n_sets) * b * topk);
                CK(cudaStreamEndCapture(stream, &graph));
                CK(cudaGraphInstantiate(&exec, graph, 0));
                const double us = megactx::bench_cuda::graph_median_ms(exec, stream, reps) * 1e3 / n_launch;
                const double flops = 2.0 * b * h * topk * (576.0 + 512.0);
                Result res{h,  b,          cfg.num_sm_parts,       n_sets,           n_launch,
                           us, step_bytes, step_bytes / us * 1e-6, flops / us * 1e-6};
                std::printf("%-5d %-6d %-8d %-7d %-8d %10.2f %9.3f %9.1f\n", h, b, cfg.num_sm_parts, n_sets, n_launch,
                            us, res.tbps, res.tflops);
                std::fflush(stdout);
                results.push_back(res);
                CK(cudaGraphExecDestroy(exec));
                CK(cudaGraphDestroy(graph));
                CK(cudaFree(slots));
            }

        if (!json.empty()) {
            FILE* f = std::fopen(json.c_str(), "w");
            if (!f) {
                std::fprintf(stderr, "cannot write %s\n", json.c_str());
                return 1;
            }
            char date[64];
            const std::time_t now = std::time(nullptr);
            std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
            std::fprintf(f,
                         "{\n  \"bench\": \"flashmla_sparse_fp8_decode\",\n  \"device\": \"%s\",\n  \"num_sms\": %d,\n"
                         "  \"date\": \"%s\",\n  \"flashmla_commit\": \"%s\",\n  \"cutlass_commit\": \"%s\",\n"
                         "  \"kernel\": \"sm90 sparse_fp8 v32_persistent (decode) + combine\",\n"
                         "  \"topk\": %d,\n  \"s_q\": 1,\n  \"cache_rows\": %lld,\n  \"page_block_size\": %d,\n"
                         "  \"sm_scale\": %g,\n  \"q_out_dtype\": \"bf16\",\n  \"reps\": %d,\n",
                         prop.name, n_sm, date, kFlashMlaCommit, kCutlassCommit, topk, static_cast<long long>(n_rows),
                         kPageBlock, scale, reps);
            std::fprintf(f, "  \"check\": [");
            for (size_t k = 0; k < checks.size(); ++k) {
                const Check& c = checks[k];
                auto num = [](double v) { return std::isfinite(v) ? v : 1e30; };
                std::fprintf(f,
                             "%s\n    {\"n_head\": %d, \"n\": 1, \"max_rel_err\": %.4e, \"rel_l2_err\": %.4e, "
                             "\"max_abs_err\": %.4e, \"max_abs_ref\": %.4e, \"lse_max_abs_err\": %.4e, \"ok\": %s}",
                             k ? "," : "", c.h, num(c.max_rel_err), num(c.rel_l2_err), c.max_abs_err, c.max_abs_ref,
                             num(c.lse_max_abs_err), c.max_rel_err < 2e-2 ? "true" : "false");
            }
            std::fprintf(f, "%s],\n  \"results\": [\n", checks.empty() ? "" : "\n  ");
            for (size_t k = 0; k < results.size(); ++k) {
                const Result& r = results[k];
                std::fprintf(
                    f,
                    "    {\"mode\": \"decode\", \"kv\": \"fp8\", \"n_head\": %d, \"n\": %d, \"num_sm_parts\": %d, "
                    "\"n_sets\": %d, \"n_launch\": %d, \"us\": %.3f, \"step_bytes\": %.0f, \"tbps\": %.4f, "
                    "\"tflops\": %.2f}%s\n",
                    r.h, r.b, r.num_sm_parts, r.n_sets, r.n_launch, r.us, r.step_bytes, r.tbps, r.tflops,
                    k + 1 < results.size() ? "," : "");
            }
            std::fprintf(f, "  ]\n}\n");
            std::fclose(f);
            std::printf("wrote %s\n", json.c_str());
        }
        cudaFree(buf.cache);
        cudaFree(buf.q);
        cudaFree(buf.out);
        cudaFree(buf.lse);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
