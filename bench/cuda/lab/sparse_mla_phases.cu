// Lab (not built by CMake): per-phase globaltimer stamps of the sparse MLA decode kernel, FP8 KV, 64 heads, top-2048,
// batch 1 (value-dim splits 1 and 2), 2 and 16 inside CUDA graphs of 12 steps. Build and run with
// bench/cuda/lab/sparse_mla_phases.sh on the GPU machine (it stamps a copy of sparse_mla.cu with
// sparse_mla_stamps.py). Output: µs per step (mode 0 plain, 1 stamped, 2 main kernel only) and, for mode 1, each
// phase's min / mean / max over the CTAs in ns from the first CTA's entry. Session 8 used it to find where a
// batch-1 step went (bench/results/cuda-h200-2026-11-30-sparse_mla-phases.txt).
#include "sparse_mla_stamped.cu"
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
using namespace megactx::cuda;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
__global__ void fill_fp8(uint8_t* cache) {
    const int64_t r = blockIdx.x;
    uint8_t* row = cache + r * 656;
    for (int j = threadIdx.x; j < 512; j += blockDim.x) { uint32_t h = (uint32_t)(r * 1024 + j) * 2654435761u; uint8_t c = h >> 24; c &= 0xbf; if ((c & 0x7f) == 0x7f) c ^= 1; row[j] = c; }
    if (threadIdx.x < 4) reinterpret_cast<float*>(row + 512)[threadIdx.x] = 0.0625f;
    if (threadIdx.x < 64) reinterpret_cast<uint16_t*>(row + 528)[threadIdx.x] = 0x3c00;
}
int main(int argc, char** argv) {
    const int64_t n_rows = 1 << 20; const int topk = 2048;
    uint8_t* cache; CK(cudaMalloc(&cache, n_rows * 656)); fill_fp8<<<n_rows, 128>>>(cache);
    float *q, *out; CK(cudaMalloc(&q, 256ll * 64 * 576 * 4)); CK(cudaMalloc(&out, 128ll * 64 * 512 * 4));
    std::vector<float> hq(128ll * 64 * 576); std::mt19937 rng(1); for (auto& v : hq) v = (rng() % 2000) / 1000.f - 1.f;
    CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    unsigned long long* prof; CK(cudaMalloc(&prof, 4096 * 16 * 8));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    // (n, v_split) cases; mode 0: timing without stamps, 1: with stamps, 2: main kernel (and Q preparation) only
    const int cases[][2] = {{1, 1}, {1, 2}, {2, 1}, {16, 1}};
    for (const auto& cs : cases) for (int mode = 0; mode < 3; ++mode) {
        const int n = cs[0];
        const int n_sets = 12;
        std::vector<int32_t> hs((size_t)n_sets * n * topk); for (auto& s : hs) s = rng() % n_rows;
        int32_t* slots; CK(cudaMalloc(&slots, hs.size() * 4)); CK(cudaMemcpy(slots, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
        SparseMlaRunParams p; p.q = q; p.cache = cache; p.out = out; p.format = MlaCacheFormat::FP8; p.n = n; p.n_head = 64; p.topk = topk; p.scale = 1.f / 16;
        p.plan = sparse_mla_plan(n, 64, topk, 132); p.plan.v_split = cs[1];
        void* scratch; CK(cudaMalloc(&scratch, sparse_mla_scratch_bytes(n, 64, p.plan) + 16)); p.scratch = scratch;
        unsigned long long* pp = mode == 1 ? prof : nullptr; CK(cudaMemcpyToSymbol(g_prof, &pp, 8));
        CK(cudaMemset(prof, 0, 4096 * 16 * 8));
        p.slots = slots; CK(launch_sparse_mla(p, st)); CK(cudaStreamSynchronize(st));
        cudaGraph_t g; cudaGraphExec_t ge; CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < n_sets; ++k) { p.slots = slots + (size_t)k * n * topk; if (mode == 2) CK(launch_main(p, st)); else CK(launch_sparse_mla(p, st)); }
        CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, st));
        std::vector<float> ms;
        for (int r = 0; r < 30; ++r) { CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float t; CK(cudaEventElapsedTime(&t, e0, e1)); ms.push_back(t); }
        std::sort(ms.begin(), ms.end());
        printf("n=%d split=%d v_split=%d mode=%d: %.2f us/step\n", n, p.plan.n_split, p.plan.v_split, mode, ms[15] * 1e3 / n_sets);
        if (mode == 1) {  // the last step of the last replay
            std::vector<unsigned long long> h(4096 * 16); CK(cudaMemcpy(h.data(), prof, h.size() * 8, cudaMemcpyDeviceToHost));
            const int ctas = n * p.plan.n_split * p.plan.v_split; unsigned long long t0 = ~0ull;
            const int prep = (n * 64 + 7) / 8;
            for (int c = 0; c < prep; ++c) if (h[(3000 + c) * 16]) t0 = std::min(t0, h[(3000 + c) * 16]);
            for (int c = 0; c < ctas; ++c) t0 = std::min(t0, h[c * 16]);
            for (int k = 0; k < 2; ++k) { double mn = 1e30, mx = 0; for (int c = 0; c < prep; ++c) { unsigned long long v = h[(3000 + c) * 16 + k]; if (!v) continue; mn = std::min(mn, (double)(v - t0)); mx = std::max(mx, (double)(v - t0)); }
                printf("  q_prep%d   min %7.0f  max %7.0f ns\n", k, mn, mx); }
            const char* names[] = {"entry", "q landed", "q barrier", "rows a in", "published", "QK done", "PV done", "epi staged", "stored"};
            for (int k = 0; k < 9; ++k) { double mn = 1e30, mx = 0, sum = 0; int cnt = 0;
                for (int c = 0; c < ctas; ++c) if (h[c * 16 + k]) { double v = (double)(h[c * 16 + k] - t0); mn = std::min(mn, v); mx = std::max(mx, v); sum += v; ++cnt; }
                printf("  %-10s min %7.0f  mean %7.0f  max %7.0f ns (%d)\n", names[k], mn, cnt ? sum / cnt : 0, mx, cnt); }
            const int cb = n * 64 * 2; for (int k = 0; k < 3; ++k) { double mn = 1e30, mx = 0; for (int c = 0; c < cb; ++c) { unsigned long long v = h[(1000 + c) * 16 + k]; if (!v) continue; mn = std::min(mn, (double)(v - t0)); mx = std::max(mx, (double)(v - t0)); }
                printf("  combine%d  min %7.0f  max %7.0f ns\n", k, mn, mx); }
        }
        CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaFree(slots)); CK(cudaFree(scratch));
    }
    return 0;
}
