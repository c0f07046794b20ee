// Shared by the CUDA benchmark programs: the CUDA error check, a hash for device-side random data, and the commit
// to record (MEGACTX_COMMIT from the environment: the GPU machine's copy of the tree has no usable git metadata).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define MEGACTX_BENCH_CK(call)                                                                                 \
    do {                                                                                                       \
        cudaError_t megactx_e_ = (call);                                                                       \
        if (megactx_e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(megactx_e_)); \
            std::exit(1);                                                                                      \
        }                                                                                                      \
    } while (0)

namespace megactx::bench_cuda {

// splitmix64's finaliser: a well-mixed 32-bit value from a counter.
__device__ inline uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return static_cast<uint32_t>(x);
}

// The median time of one replay of `exec` on `stream` in milliseconds, over `reps` timed replays after 3 untimed
// ones (events around each replay).
inline double graph_median_ms(cudaGraphExec_t exec, cudaStream_t stream, int reps) {
    cudaEvent_t e0, e1;
    MEGACTX_BENCH_CK(cudaEventCreate(&e0));
    MEGACTX_BENCH_CK(cudaEventCreate(&e1));
    for (int w = 0; w < 3; ++w) MEGACTX_BENCH_CK(cudaGraphLaunch(exec, stream));
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
        MEGACTX_BENCH_CK(cudaEventRecord(e0, stream));
        MEGACTX_BENCH_CK(cudaGraphLaunch(exec, stream));
        MEGACTX_BENCH_CK(cudaEventRecord(e1, stream));
        MEGACTX_BENCH_CK(cudaEventSynchronize(e1));
        float t;
        MEGACTX_BENCH_CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    MEGACTX_BENCH_CK(cudaEventDestroy(e0));
    MEGACTX_BENCH_CK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

inline const char* commit() {
    const char* c = std::getenv("MEGACTX_COMMIT");
    return c != nullptr && *c != '\0' ? c : "unknown";
}

}  // namespace megactx::bench_cuda
