// bench_kv_fetch: the host KV tier's gather (kv_tier.h launch_kv_fetch_rows) — m selected FP8 latent rows (656 B)
// read from pinned, mapped host memory into device staging rows — against a contiguous cudaMemcpyAsync of the
// same bytes (the PCIe link's rate). The host pool is 1M rows (688 MB), as one layer's latent cache at 1M tokens.
// Row orders: random (a selection over the whole context), sorted random, consecutive; host memory from
// cudaHostAlloc, and (--thp) from 2 MiB-aligned transparent huge pages registered with cudaHostRegister, which
// tells whether the IOMMU's page walks on scattered 4 KiB pages are what limits the gather.
//
//   bench_kv_fetch [--rows 256,2048,16384] [--reps 50] [--thp] [--json PATH]
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/kv_tier.h"
#include "bench_util.h"

using namespace megactx;

namespace {

#define MEGACTX_BENCH_CK(call)                                                                         \
    do {                                                                                               \
        const cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

constexpr int64_t kRowBytes = 656, kPoolRows = 1 << 20;

// Median µs of `reps` launches of f, timed with events around each.
template <typename F>
double time_us(int reps, cudaStream_t s, F f) {
    cudaEvent_t a, b;
    MEGACTX_BENCH_CK(cudaEventCreate(&a));
    MEGACTX_BENCH_CK(cudaEventCreate(&b));
    f();
    MEGACTX_BENCH_CK(cudaStreamSynchronize(s));
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
        MEGACTX_BENCH_CK(cudaEventRecord(a, s));
        f();
        MEGACTX_BENCH_CK(cudaEventRecord(b, s));
        MEGACTX_BENCH_CK(cudaEventSynchronize(b));
        float ms = 0;
        MEGACTX_BENCH_CK(cudaEventElapsedTime(&ms, a, b));
        us.push_back(1e3 * ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_kv_fetch: gathering selected KV rows from pinned host memory"};
    std::string rows_arg = "256,2048,16384", json_path;
    int reps = 50;
    bool thp = false;
    app.add_option("--rows", rows_arg, "rows gathered per launch");
    app.add_option("--reps", reps)->check(CLI::Range(1, 100000));
    app.add_flag("--thp", thp, "also a host pool of transparent huge pages (cudaHostRegister)");
    app.add_option("--json", json_path, "write the results as JSON");
    CLI11_PARSE(app, argc, argv);
    const std::vector<int64_t> row_counts = bench::parse_positive_list(rows_arg, "--rows");
    const int64_t max_m = *std::max_element(row_counts.begin(), row_counts.end());
    cudaStream_t s;
    MEGACTX_BENCH_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t pool_bytes = static_cast<size_t>(kPoolRows * kRowBytes);

    struct Pool {
        const char* name;
        void* p;
    };
    std::vector<Pool> pools;
    void* pinned = nullptr;
    MEGACTX_BENCH_CK(cudaHostAlloc(&pinned, pool_bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(pinned, 1, pool_bytes);
    pools.push_back({"cudaHostAlloc", pinned});
    void* huge = nullptr;
    if (thp) {
        const size_t two_mib = size_t{2} << 20, bytes = (pool_bytes + two_mib - 1) / two_mib * two_mib;
        if (posix_memalign(&huge, two_mib, bytes) == 0) {
            madvise(huge, bytes, MADV_HUGEPAGE);
            std::memset(huge, 1, bytes);
            if (cudaHostRegister(huge, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable) == cudaSuccess) {
                pools.push_back({"THP + cudaHostRegister", huge});
            } else {
                std::fprintf(stderr, "cudaHostRegister of the huge-page pool failed\n");
            }
        }
    }
    void* dst = nullptr;
    MEGACTX_BENCH_CK(cudaMalloc(&dst, static_cast<size_t>(max_m * kRowBytes)));
    int32_t* rows_dev = nullptr;
    MEGACTX_BENCH_CK(cudaMalloc(&rows_dev, static_cast<size_t>(max_m) * 4));

    nlohmann::json out = {{"bench", "bench_kv_fetch"},
                          {"device", cuda::device_info(0).name},
                          {"date", bench::utc_now()},
                          {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
                          {"row_bytes", kRowBytes},
                          {"pool_rows", kPoolRows},
                          {"results", nlohmann::json::array()}};
    std::printf("%-24s %-16s %8s %10s %10s\n", "host memory", "rows", "m", "µs", "GB/s");
    std::mt19937 rng(7);
    for (const int64_t m : row_counts) {
        std::vector<int32_t> random(static_cast<size_t>(m)), sorted, consecutive(static_cast<size_t>(m));
        for (auto& r : random) r = static_cast<int32_t>(rng() % kPoolRows);
        sorted = random;
        std::sort(sorted.begin(), sorted.end());
        std::iota(consecutive.begin(), consecutive.end(), 4096);
        const auto record = [&](const char* mem, const char* order, double us) {
            const double gbs = static_cast<double>(m * kRowBytes) / (us * 1e3);
            std::printf("%-24s %-16s %8lld %10.1f %10.1f\n", mem, order, static_cast<long long>(m), us, gbs);
            out["results"].push_back({{"host_memory", mem}, {"rows", order}, {"m", m}, {"us", us}, {"gb_s", gbs}});
        };
        for (const int cap : {16, 32, 64}) {  // the grid capped, as a gather beside compute would run
            MEGACTX_BENCH_CK(cudaMemcpy(rows_dev, random.data(), static_cast<size_t>(m) * 4, cudaMemcpyHostToDevice));
            const std::string name = "random, " + std::to_string(cap) + " CTAs";
            record(pools[0].name, name.c_str(), time_us(reps, s, [&] {
                       MEGACTX_BENCH_CK(
                           cuda::launch_kv_fetch_rows(dst, pinned, rows_dev, m, kPoolRows, kRowBytes, s, cap));
                   }));
        }
        for (const Pool& pool : pools) {
            for (const auto& [order, v] : {std::pair<const char*, const std::vector<int32_t>*>{"random", &random},
                                           {"sorted", &sorted},
                                           {"consecutive", &consecutive}}) {
                MEGACTX_BENCH_CK(cudaMemcpy(rows_dev, v->data(), static_cast<size_t>(m) * 4, cudaMemcpyHostToDevice));
                record(
                    pool.name, order, time_us(reps, s, [&] {
                        MEGACTX_BENCH_CK(cuda::launch_kv_fetch_rows(dst, pool.p, rows_dev, m, kPoolRows, kRowBytes, s));
                    }));
            }
        }
        record("cudaMemcpyAsync", "contiguous", time_us(reps, s, [&] {
                   MEGACTX_BENCH_CK(
                       cudaMemcpyAsync(dst, pinned, static_cast<size_t>(m * kRowBytes), cudaMemcpyHostToDevice, s));
               }));
    }
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    if (huge) cudaHostUnregister(huge);
    return 0;
}
