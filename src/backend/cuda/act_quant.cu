// act_quant kernel (contract in act_quant.h). One warp per (row, group): lane l holds columns l, l+32, l+64, l+96
// of the group (coalesced loads and byte stores), the amax is a warp shuffle reduction.
#include <cuda_fp8.h>

#include "backend/cuda/act_quant.h"

namespace megactx::cuda {
namespace {

constexpr int kGroup = 128, kThreads = 256, kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads)
    act_quant_kernel(const float* __restrict__ x, int64_t n, int64_t k, int64_t n_pad, uint8_t* __restrict__ q,
                     float* __restrict__ scales) {
    // The GEMM behind it (fp8_gemm_small, under PDL) may start fetching its weight now; it waits for this grid's
    // results before reading them.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int64_t groups = (k + kGroup - 1) / kGroup;
    const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (item >= n_pad * groups) return;
    const int lane = threadIdx.x & 31;
    // Consecutive warps take consecutive groups of one row: the row's reads stay contiguous.
    const int64_t row = item / groups, g = item % groups, c0 = g * kGroup;
    float v[4];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int64_t c = c0 + lane + 32 * j;
        v[j] = row < n && c < k ? x[row * k + c] : 0.f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = amax > 0.f ? amax / 448.f : 1.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int64_t c = c0 + lane + 32 * j;
        if (c < k) q[row * k + c] = __nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) scales[g * n_pad + row] = s;
}

}  // namespace

cudaError_t launch_act_quant_fp8(const float* x, int64_t n, int64_t k, int64_t n_pad, uint8_t* q, float* scales,
                                 cudaStream_t stream) {
    if (n < 0 || n_pad < n || k < 0) return cudaErrorInvalidValue;
    const int64_t items = n_pad * ((k + kGroup - 1) / kGroup);
    if (items == 0) return cudaSuccess;
    act_quant_kernel<<<static_cast<unsigned>((items + kWarps - 1) / kWarps), kThreads, 0, stream>>>(x, n, k, n_pad, q,
                                                                                                    scales);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
