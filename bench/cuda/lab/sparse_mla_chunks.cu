// Lab (not built by CMake): per-chunk clock64 stamps of the sparse MLA kernel's producer and consumers (FP8 KV,
// 64 heads, top-2048), to see where a multi-chunk CTA's time goes. Build with bench/cuda/lab/sparse_mla_chunks.sh
// (stamps a copy of sparse_mla.cu with sparse_mla_chunks.py); run the binary on the GPU machine. For each shape it
// prints the step time without and with stamps, then the mean cycles of each interval over all CTAs and the
// chunks 2 .. n-3 of each (steady state), and the timeline of CTA 0's first chunks.
#include "sparse_mla_chunks_stamped.cu"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

using namespace megactx::cuda;
#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            std::printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);          \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

__global__ void fill_fp8(uint8_t* cache) {
    const int64_t r = blockIdx.x;
    uint8_t* row = cache + r * 656;
    for (int j = threadIdx.x; j < 512; j += blockDim.x) {
        uint8_t c = static_cast<uint8_t>((static_cast<uint32_t>(r * 1024 + j) * 2654435761u) >> 24) & 0xbf;
        if ((c & 0x7f) == 0x7f) c ^= 1;
        row[j] = c;
    }
    if (threadIdx.x < 4) reinterpret_cast<float*>(row + 512)[threadIdx.x] = 0.0625f;
    if (threadIdx.x < 64) reinterpret_cast<uint16_t*>(row + 528)[threadIdx.x] = 0x3c00;
}

int main() {
    const int64_t n_rows = 1 << 20;
    const int topk = 2048, n_chunks = topk / 64;
    uint8_t* cache;
    CK(cudaMalloc(&cache, n_rows * 656));
    fill_fp8<<<static_cast<unsigned>(n_rows), 128>>>(cache);
    const int max_n = 4096;
    float *q, *out;
    CK(cudaMalloc(&q, static_cast<size_t>(max_n) * 64 * 576 * 4));
    CK(cudaMalloc(&out, static_cast<size_t>(max_n) * 64 * 512 * 4));
    std::vector<float> hq(static_cast<size_t>(max_n) * 64 * 576);
    std::mt19937 rng(1);
    for (auto& v : hq) v = static_cast<float>(rng() % 2000) / 1000.f - 1.f;
    CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    const size_t st_count = static_cast<size_t>(max_n) * 32 * 48;
    long long* st;
    CK(cudaMalloc(&st, st_count * 8));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // n = 32 with one split: 32 CTAs on 132 SMs, so HBM has headroom (a per-SM limit shows the same intervals).
    for (int n : {128, 64, 32}) {
        const int n_sets = 8;
        std::vector<int32_t> hs(static_cast<size_t>(n_sets) * n * topk);
        for (auto& s : hs) s = static_cast<int32_t>(rng() % n_rows);
        int32_t* slots;
        CK(cudaMalloc(&slots, hs.size() * 4));
        CK(cudaMemcpy(slots, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
        SparseMlaRunParams p;
        p.q = q;
        p.cache = cache;
        p.out = out;
        p.format = MlaCacheFormat::FP8;
        p.n = n;
        p.n_head = 64;
        p.topk = topk;
        p.scale = 1.f / 16;
        p.plan = sparse_mla_plan(n, 64, topk, 132);
        if (n == 32) p.plan = SparseMlaPlan{1, 1};
        void* scratch;
        CK(cudaMalloc(&scratch, sparse_mla_scratch_bytes(n, 64, p.plan) + 16));
        p.scratch = scratch;
        for (int with : {0, 1}) {
            long long* sp = with ? st : nullptr;
            CK(cudaMemcpyToSymbol(g_st, &sp, 8));
            CK(cudaMemset(st, 0, st_count * 8));
            std::vector<float> ms;
            for (int r = 0; r < 3 * n_sets; ++r) {
                p.slots = slots + static_cast<size_t>(r % n_sets) * n * topk;
                CK(cudaEventRecord(e0, stream));
                CK(launch_sparse_mla(p, stream));
                CK(cudaEventRecord(e1, stream));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            std::printf("n=%d split=%d cluster=%d stamps=%d: %.2f us per launch (median, plain launches)\n", n,
                        p.plan.n_split, p.plan.cluster, with, ms[ms.size() / 2] * 1e3);
        }
        std::vector<long long> h(st_count);
        CK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
        const int ctas = static_cast<int>(n * p.plan.n_split);
        const int cpc = n_chunks / p.plan.n_split;  // chunks per CTA
        auto at = [&](int cta, int it, int slot) { return h[(static_cast<size_t>(cta) * 32 + it) * 48 + slot]; };
        struct Iv {
            const char* name;
            int a, b, da;  // slot b (same chunk) minus slot a (of chunk it + da)
        };
        const Iv ivs[] = {
            {"P0 period (top of chunk c+1 - top of c)", 0, 0, 1},
            {"P0 wait rows 0..31", 0, 1, 0},
            {"P0 dequant half a lo + wait rows 32..63", 1, 2, 0},
            {"P0 dequant half b lo + producer barrier", 2, 3, 0},
            {"P0 dequant hi halves + publish", 3, 4, 0},
            {"P0 wait tile c-1 freed", 4, 5, 0},
            {"P0 issue chunk c+1 (+ scales, slots)", 5, 6, 0},
            {"P0 issued c+1 -> top of c+1", 6, 0, 1},
            {"P3 wait rows 0..31", 24, 25, 0},
            {"P3 dequant half a lo + wait rows 32..63", 25, 26, 0},
            {"P3 dequant half b lo + producer barrier", 26, 27, 0},
            {"WG0 wait tile ready", 32, 33, 0},
            {"WG0 Q.K^T", 33, 34, 0},
            {"WG0 softmax + wait P free", 34, 35, 0},
            {"WG0 P store + P.V", 35, 36, 0},
            {"WG0 P.V done -> next wait", 36, 32, 1},
            {"WG1 P ready -> P.V done", 40, 41, 0},
            {"WG1 P.V done -> next P ready", 41, 40, 1},
            {"publish (P0) -> WG0 ready", 4, 33, 0},
            {"P0 issue c+1 done -> WG0 ready c+1", 6, 33, 1},
        };
        std::printf("  steady state, mean cycles over %d CTAs x chunks 2..%d:\n", ctas, cpc - 3);
        for (const Iv& iv : ivs) {
            double sum = 0;
            long cnt = 0;
            for (int c = 0; c < ctas; ++c)
                for (int it = 2; it + 2 < cpc && it + iv.da < 32; ++it) {
                    const long long x = at(c, it, iv.a), y = at(c, it + iv.da, iv.b);
                    if (!x || !y) continue;
                    sum += static_cast<double>(y - x);
                    ++cnt;
                }
            std::printf("    %-45s %8.0f  (%ld)\n", iv.name, cnt ? sum / cnt : 0.0, cnt);
        }
        std::printf("  CTA 0 timeline (cycles from its first stamp), chunks 0..5:\n");
        long long t0 = at(0, 0, 0);
        const int show[] = {0, 1, 2, 3, 4, 5, 6, 32, 33, 34, 35, 36, 40, 41};
        std::printf("    it");
        for (int sl : show) std::printf(" %6d", sl);
        std::printf("\n");
        for (int it = 0; it < std::min(6, cpc); ++it) {
            std::printf("    %2d", it);
            for (int sl : show) {
                const long long v = at(0, it, sl);
                std::printf(" %6lld", v ? v - t0 : -1);
            }
            std::printf("\n");
        }
        CK(cudaFree(slots));
        CK(cudaFree(scratch));
    }
    return 0;
}
