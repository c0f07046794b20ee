// bench_topk: launch_topk (exact top-k, k = 2048 by default) on the DSA indexer shapes, each call timed
// alone inside a CUDA graph (CUDA events, median of many), inputs rotated over >= 128 MB so that
// small shapes do not sit in the 50 MB L2. Reports µs and effective GB/s of the score bytes read
// (vs the 4.23 TB/s copy ceiling), validates the first result (chosen >= unchosen), writes --json PATH.
// Long-row shapes also get a per-kernel breakdown of the three-kernel chain (sample / filter / select, plain
// stream launches with events between the kernels, PDL off, few-rows path off); shapes of <= 4
// long rows are also timed on that chain (few_rows = 0) next to the default few-rows kernel; --sweep times
// variants (PDL, filter work-item size, persistent filter grid) through TopkTuning.
// Standalone (no megactx_core): nvcc -O3 -std=c++20 -arch=sm_90a -Isrc bench/cuda/bench_topk.cu
//   src/backend/cuda/topk.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "backend/cuda/topk.h"
#include "cuda_bench.cuh"

namespace {

using megactx::bench_cuda::hash32;

// dist 0: normal(0,1); 1: uniform [0,1); 2: ReLU-like, 99.9 % exact zeros, else |normal|; 3: normal with hot
// windows, as real indexer scores have: the first 300 (sinks) and last 1500 (recent tokens) of each row of
// `len` are raised by 8, so one or two slices of the few-rows kernel hold most of the top 2048; 4: runs of 32 nearly
// equal values (neighbours correlated: the long-row sample's estimate varies more, and a too-high estimate sends a
// row to the one-CTA whole-row select).
__global__ void init_kernel(float* v, int64_t n, int dist, uint64_t seed, int64_t len) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float u1 = (hash32(seed * 0x9e3779b97f4a7c15ull + 2 * i) + 0.5f) * 2.3283064e-10f;
        const float u2 = (hash32(seed * 0x9e3779b97f4a7c15ull + 2 * i + 1) + 0.5f) * 2.3283064e-10f;
        const float g = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
        float x = g;
        if (dist == 1) x = u1;
        if (dist == 2) x = u2 < 0.999f ? 0.f : fabsf(g);
        if (dist == 3 && (i % len < 300 || i % len >= len - 1500)) x += 8.f;
        if (dist == 4) {  // runs of 32 nearly equal values, not aligned with anything: a strongly correlated row
            const uint64_t run = static_cast<uint64_t>(i + 5 * (i / len)) / 32 + (uint64_t{1} << 40);
            const float r1 = (hash32(seed * 0x9e3779b97f4a7c15ull + 2 * run) + 0.5f) * 2.3283064e-10f;
            const float r2 = (hash32(seed * 0x9e3779b97f4a7c15ull + 2 * run + 1) + 0.5f) * 2.3283064e-10f;
            x = sqrtf(-2.f * logf(r1)) * cospif(2.f * r2) + 0.01f * g;
        }
        v[i] = x;
    }
}

struct Shape {
    const char* name;
    int64_t n_rows, len;
    int dist;
};

std::string utc_now() {
    char buf[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace megactx::cuda;
    std::string json_path;
    int64_t k = 2048;
    int iters = 200;
    bool sweep = false;
    std::string only;  // --only TEXT: the shapes whose name contains TEXT
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!std::strcmp(argv[i], "--k") && i + 1 < argc)
            k = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--sweep"))
            sweep = true;
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
    }
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress survives a timeout
    cudaDeviceProp prop{};
    MEGACTX_BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    const char* commit = megactx::bench_cuda::commit();
    // MEGACTX_TOPK_FILTER_{VARIANT,CHUNK} / MEGACTX_TOPK_ORDER_RANGE / MEGACTX_TOPK_FEW(_MAX_ROWS) override those
    // TopkTuning defaults for the whole run.
    TopkTuning base;
    if (const char* c = std::getenv("MEGACTX_TOPK_FILTER_VARIANT")) base.filter_variant = std::atoi(c);
    if (const char* c = std::getenv("MEGACTX_TOPK_FILTER_CHUNK")) base.filter_chunk = std::atoi(c);
    if (const char* c = std::getenv("MEGACTX_TOPK_FILTER_PREFETCH")) base.filter_prefetch = std::atoi(c);
    if (const char* c = std::getenv("MEGACTX_TOPK_ORDER_RANGE")) base.order_range = std::atoi(c);
    if (const char* c = std::getenv("MEGACTX_TOPK_FEW")) base.few_rows = std::atoi(c);
    if (const char* c = std::getenv("MEGACTX_TOPK_FEW_MAX_ROWS")) base.few_max_rows = std::atoi(c);
    const std::vector<Shape> shapes = {
        {"decode 64 x 1M", 64, 1 << 20, 0},
        {"decode 1 x 1M", 1, 1 << 20, 0},
        {"decode 1 x 128K", 1, 1 << 17, 0},
        {"decode 1 x 8K", 1, 8192, 0},
        {"decode 1 x 32K", 1, 32768, 0},
        {"decode 1 x 32K hot windows", 1, 32768, 3},
        {"decode 8 x 16K", 8, 16384, 0},
        {"decode 64 x 128K", 64, 1 << 17, 0},
        {"decode 1 x 256K", 1, 1 << 18, 0},
        {"decode 1 x 512K", 1, 1 << 19, 0},
        {"decode 4 x 1M", 4, 1 << 20, 0},
        {"decode 2 x 128K", 2, 1 << 17, 0},
        {"prefill 4096 x 4K", 4096, 4096, 0},
        {"prefill 1024 x 16K", 1024, 16384, 0},
        {"long-stride 512 x 64K", 512, 1 << 16, 0},
        {"64 x 1M uniform", 64, 1 << 20, 1},
        {"64 x 1M runs of 32", 64, 1 << 20, 4},
        {"64 x 128K relu 99.9% zeros", 64, 1 << 17, 2},
        {"decode 1 x 1M hot windows", 1, 1 << 20, 3},
        {"decode 1 x 128K hot windows", 1, 1 << 17, 3},
        {"decode 2 x 256K hot windows", 2, 1 << 18, 3},
    };
    std::printf("%-28s %8s %10s %10s %9s %7s %s\n", "shape", "rows", "len", "median_us", "min_us", "GB/s", "valid");
    std::string rows_json;
    cudaStream_t stream;
    MEGACTX_BENCH_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (const Shape& s : shapes) {
        if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
        const int64_t elems = s.n_rows * s.len;
        const size_t bytes = static_cast<size_t>(elems) * sizeof(float);
        const int64_t n_buf = std::clamp<int64_t>((int64_t(128) << 20) / int64_t(bytes) + 1, 1, 256);
        float* d_v = nullptr;
        int32_t *d_len = nullptr, *d_out = nullptr;
        void* d_scratch = nullptr;
        MEGACTX_BENCH_CK(cudaMalloc(&d_v, bytes * n_buf));
        MEGACTX_BENCH_CK(cudaMalloc(&d_len, s.n_rows * sizeof(int32_t)));
        MEGACTX_BENCH_CK(cudaMalloc(&d_out, s.n_rows * k * sizeof(int32_t)));
        const size_t scratch = topk_scratch_bytes(s.n_rows, s.len, k);
        if (scratch) MEGACTX_BENCH_CK(cudaMalloc(&d_scratch, scratch));
        init_kernel<<<1024, 256>>>(d_v, elems * n_buf, s.dist, 1234, s.len);
        std::vector<int32_t> lens(s.n_rows, static_cast<int32_t>(s.len));
        MEGACTX_BENCH_CK(cudaMemcpy(d_len, lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        TopkParams p;
        p.lengths = d_len;
        p.n_rows = s.n_rows;
        p.row_stride = s.len;
        p.k = k;
        p.out_idx = d_out;
        p.scratch = d_scratch;
        p.scratch_bytes = scratch;
        // Warm-up outside capture (sets smem attributes), then validate buffer 0.
        p.values = d_v;
        topk_set_tuning(base);
        launch_topk(p, stream);
        MEGACTX_BENCH_CK(cudaGetLastError());
        MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
        bool valid = true;
        {
            std::vector<float> hv(elems);
            std::vector<int32_t> ho(s.n_rows * k);
            MEGACTX_BENCH_CK(cudaMemcpy(hv.data(), d_v, bytes, cudaMemcpyDeviceToHost));
            MEGACTX_BENCH_CK(cudaMemcpy(ho.data(), d_out, ho.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
            std::vector<char> chosen(s.len);
            for (int64_t r = 0; r < s.n_rows && valid; ++r) {
                std::fill(chosen.begin(), chosen.end(), 0);
                const float* row = hv.data() + r * s.len;
                float mn = INFINITY, mx = -INFINITY;
                for (int64_t i = 0; i < k; ++i) {
                    const int32_t ix = ho[r * k + i];
                    if (ix < 0 || ix >= s.len || chosen[ix]) {
                        valid = false;
                        break;
                    }
                    chosen[ix] = 1;
                }
                for (int64_t i = 0; i < s.len && valid; ++i)
                    chosen[i] ? (mn = std::min(mn, row[i])) : (mx = std::max(mx, row[i]));
                if (mn < mx) valid = false;
            }
        }
        // Median / min µs of launch_topk inside CUDA graphs (one per rotated buffer) under tuning tu.
        auto time_graph = [&](const TopkTuning& tu, double& med_out, double& min_out) {
            topk_set_tuning(tu);
            std::vector<cudaGraphExec_t> graphs(n_buf);
            for (int64_t b = 0; b < n_buf; ++b) {
                p.values = d_v + b * elems;
                launch_topk(p, stream);  // outside capture first
                cudaGraph_t g;
                MEGACTX_BENCH_CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
                launch_topk(p, stream);
                MEGACTX_BENCH_CK(cudaStreamEndCapture(stream, &g));
                MEGACTX_BENCH_CK(cudaGraphInstantiate(&graphs[b], g, 0));
                MEGACTX_BENCH_CK(cudaGraphDestroy(g));
            }
            for (int64_t i = 0; i < std::min<int64_t>(n_buf, 20); ++i)
                MEGACTX_BENCH_CK(cudaGraphLaunch(graphs[i], stream));
            std::vector<cudaEvent_t> ev(2 * iters);
            for (auto& e : ev) MEGACTX_BENCH_CK(cudaEventCreate(&e));
            for (int i = 0; i < iters; ++i) {
                MEGACTX_BENCH_CK(cudaEventRecord(ev[2 * i], stream));
                MEGACTX_BENCH_CK(cudaGraphLaunch(graphs[i % n_buf], stream));
                MEGACTX_BENCH_CK(cudaEventRecord(ev[2 * i + 1], stream));
            }
            MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
            std::vector<float> t(iters);
            for (int i = 0; i < iters; ++i) {
                float ms = 0;
                MEGACTX_BENCH_CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
                t[i] = ms * 1000.f;
            }
            std::sort(t.begin(), t.end());
            med_out = t[iters / 2];
            min_out = t[0];
            for (auto& e : ev) MEGACTX_BENCH_CK(cudaEventDestroy(e));
            for (auto& g : graphs) MEGACTX_BENCH_CK(cudaGraphExecDestroy(g));
            topk_set_tuning(base);
        };
        double med = 0, mn = 0;
        time_graph(base, med, mn);
        MEGACTX_BENCH_CK(cudaGetLastError());
        // <= 4 long rows: the few-rows kernel against the three-kernel chain it replaces; its per-phase
        // globaltimer stamps (plain launches, row 0).
        std::string chain_json;
        if (scratch && s.n_rows <= base.few_max_rows && base.few_rows != 0) {
            double vmed[2] = {0, 0};
            for (int v = 0; v < 2; ++v) {
                if (v == base.few_rows) {
                    vmed[v] = med;
                    continue;
                }
                TopkTuning tu = base;
                tu.few_rows = v;
                double vm = 0, vn = 0;
                time_graph(tu, vm, vn);
                vmed[v] = vm;
                std::printf("    few_rows = %d%s: %.1f us (min %.1f)\n", v,
                            v == 0 ? (s.len > 32768 ? " (three-kernel chain)" : " (one CTA per row)") : "", vm, vn);
            }
            if (sweep || std::getenv("MEGACTX_TOPK_FEW_SWEEP")) {
                for (int slice : {1024, 4096, 8192}) {
                    TopkTuning v = base;
                    v.few_slice_min = slice;
                    double vm = 0, vn = 0;
                    time_graph(v, vm, vn);
                    std::printf("    sweep few_rows=%d few_slice_min=%5d: %8.1f us (min %.1f)\n", base.few_rows, slice,
                                vm, vn);
                }
                TopkTuning v = base;
                v.few_threads = 512;
                double vm = 0, vn = 0;
                time_graph(v, vm, vn);
                std::printf("    sweep few_rows=%d few_threads=512: %8.1f us (min %.1f)\n", base.few_rows, vm, vn);
            }
            // Phases from the few-rows kernel's globaltimer stamps (topk.cu, CTA 0): [0] start, [1] keys staged and
            // histogrammed, [2] past the first barrier, [3] rounds done, [4] counts published (barrier), [5] the
            // select, [6] end; [7] rounds | candidates << 32.
            unsigned long long* d_dbg = nullptr;
            MEGACTX_BENCH_CK(cudaMalloc(&d_dbg, 16 * sizeof(unsigned long long)));
            if (s.len > 32768) {
                TopkTuning tu = base;
                tu.debug_times = d_dbg;
                topk_set_tuning(tu);
                std::vector<double> ph[6];
                unsigned long long h[16] = {};
                for (int i = 0; i < 30; ++i) {
                    p.values = d_v + (i % n_buf) * elems;
                    MEGACTX_BENCH_CK(cudaMemset(d_dbg, 0, 16 * sizeof(unsigned long long)));
                    launch_topk(p, stream);
                    MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
                    MEGACTX_BENCH_CK(cudaMemcpy(h, d_dbg, sizeof h, cudaMemcpyDeviceToHost));
                    for (int j = 0; j < 6; ++j) ph[j].push_back((double(h[j + 1]) - double(h[j])) * 1e-3);
                }
                topk_set_tuning(base);
                double m[6];
                for (int j = 0; j < 6; ++j) {
                    std::sort(ph[j].begin(), ph[j].end());
                    m[j] = ph[j][ph[j].size() / 2];
                }
                std::printf(
                    "    phases (us, CTA 0): load + histogram %.2f, barrier %.2f, rest of %llu rounds %.2f, counts + "
                    "barrier %.2f, select %.2f, emit %.2f; candidates %llu\n",
                    m[0], m[1], h[7] & 0xffffffffull, m[2], m[3], m[4], m[5], h[7] >> 32);
            }
            MEGACTX_BENCH_CK(cudaFree(d_dbg));
            char b3[224];
            std::snprintf(b3, sizeof b3, ", \"chain_median_us\": %.2f, \"few_median_us\": %.2f", vmed[0], vmed[1]);
            chain_json = b3;
        }
        // Per-kernel breakdown (long rows): plain launches, events between the kernels, median per step.
        std::string steps_json;
        if (scratch && s.len > 32768) {  // shorter rows: one CTA each or the few-rows kernel, no chain
            cudaEvent_t se[4];
            for (auto& e : se) MEGACTX_BENCH_CK(cudaEventCreate(&e));
            TopkTuning tu = base;
            tu.step_events = se;
            topk_set_tuning(tu);
            const int n_it = std::max(20, iters / 4);
            std::vector<float> st[3];
            for (int i = 0; i < n_it; ++i) {
                p.values = d_v + (i % n_buf) * elems;
                launch_topk(p, stream);
                MEGACTX_BENCH_CK(cudaStreamSynchronize(stream));
                for (int j = 0; j < 3; ++j) {
                    float ms = 0;
                    MEGACTX_BENCH_CK(cudaEventElapsedTime(&ms, se[j], se[j + 1]));
                    st[j].push_back(ms * 1000.f);
                }
            }
            topk_set_tuning(base);
            double sm[3];
            for (int j = 0; j < 3; ++j) {
                std::sort(st[j].begin(), st[j].end());
                sm[j] = st[j][n_it / 2];
            }
            std::printf("    steps (stream, no PDL): sample %.1f  filter %.1f (%.0f GB/s)  select %.1f us\n", sm[0],
                        sm[1], double(bytes) / (sm[1] * 1e-6) / 1e9, sm[2]);
            char b2[256];
            std::snprintf(b2, sizeof b2, ", \"steps_us\": {\"sample\": %.2f, \"filter\": %.2f, \"select\": %.2f}",
                          sm[0], sm[1], sm[2]);
            steps_json = b2;
            for (auto& e : se) MEGACTX_BENCH_CK(cudaEventDestroy(e));
            if (sweep && std::strncmp(s.name, "decode", 6) == 0) {
                struct V {
                    int pdl, chunk, cps, variant;
                };
                std::vector<V> vs = {{0, 0, 0, 0}};
                for (int variant : {0, 1})
                    for (int chunk : {0, 2048, 4096, 8192, 16384})
                        for (int cps : {0, 8}) vs.push_back({1, chunk, cps, variant});
                for (const V& x : vs) {
                    TopkTuning v;
                    v.pdl = x.pdl;
                    v.filter_chunk = x.chunk;
                    v.filter_ctas_per_sm = x.cps;
                    v.filter_variant = x.variant;
                    double vm = 0, vn = 0;
                    time_graph(v, vm, vn);
                    std::printf("    sweep pdl=%d chunk=%5d ctas/sm=%d filter_variant=%d: %8.1f us (min %.1f)\n", x.pdl,
                                x.chunk, x.cps, x.variant, vm, vn);
                }
            }
        }
        const double gbps = double(bytes) / (med * 1e-6) / 1e9;
        std::printf("%-28s %8lld %10lld %10.1f %9.1f %7.0f %s\n", s.name, (long long)s.n_rows, (long long)s.len, med,
                    mn, gbps, valid ? "ok" : "INVALID");
        char buf[768];
        std::snprintf(buf, sizeof buf,
                      "%s    {\"shape\": \"%s\", \"n_rows\": %lld, \"len\": %lld, \"k\": %lld, \"median_us\": %.2f, "
                      "\"min_us\": %.2f, \"gb_per_s\": %.1f, \"frac_of_copy_bw\": %.3f, \"valid\": %s%s}",
                      rows_json.empty() ? "" : ",\n", s.name, (long long)s.n_rows, (long long)s.len, (long long)k, med,
                      mn, gbps, gbps / 4230.0, valid ? "true" : "false", (steps_json + chain_json).c_str());
        rows_json += buf;
        MEGACTX_BENCH_CK(cudaFree(d_v));
        MEGACTX_BENCH_CK(cudaFree(d_len));
        MEGACTX_BENCH_CK(cudaFree(d_out));
        if (d_scratch) MEGACTX_BENCH_CK(cudaFree(d_scratch));
    }
    if (!json_path.empty()) {
        FILE* f = std::fopen(json_path.c_str(), "w");
        if (!f) return 1;
        std::fprintf(f,
                     "{\n  \"bench\": \"topk\",\n  \"device\": \"%s\",\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n"
                     "  \"timing\": \"each call alone in a CUDA graph, median of %d, inputs rotated over >= 128 MB\",\n"
                     "  \"copy_ceiling_gb_per_s\": 4230,\n  \"results\": [\n%s\n  ]\n}\n",
                     prop.name, utc_now().c_str(), commit ? commit : "unknown", iters, rows_json.c_str());
        std::fclose(f);
    }
    return 0;
}
