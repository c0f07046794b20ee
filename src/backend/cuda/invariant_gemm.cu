// The batch-invariant mode's GEMM (contract: invariant_gemm.h): a plain shared-memory tiled GEMM on the CUDA cores,
// one fp32 accumulator per output, k in ascending order; no split of k, no atomics, nothing chosen by the row count.
// Its cost against the default paths: docs/benchmarks.md (cuda.sh's `invariant` stage).
#include "backend/cuda/invariant_gemm.h"

#include "backend/cuda/cuda_common.cuh"

#include <algorithm>
#include <cstdint>

namespace megactx::cuda {
namespace {

constexpr int kBm = 32, kBn = 32, kBk = 128, kThreads = 256;
constexpr int kPerThread = kBm * kBk / kThreads;  // x values and W values each thread stages per k step (16)
static_assert(kBn * kBk / kThreads == kPerThread, "the x and W tiles are staged alike");

// InvariantGemmParams as the kernel takes it: 32-bit sizes, 96 bytes (design.md §6: parameter structs passed by value
// stay within 128 bytes). Offsets are formed in 64 bits in the kernel.
struct Args {
    const float* x;
    const void* w;
    const float* scales;
    float* y;
    int32_t ldx, x_bstride, scale_ld, block, w_ld, w_row0, w_batch_rows, ldy, y_bstride, n, out, in;
    int32_t wtype;
    bool o_rows;
};
static_assert(sizeof(Args) <= 128, "kernel parameters within 128 bytes");

template <int kType>
__device__ __forceinline__ float load_w(const Args& p, int64_t r, int32_t c) {
    const int64_t i = r * p.w_ld + c;
    if constexpr (kType == 0) return static_cast<const float*>(p.w)[i];
    if constexpr (kType == 1) return bf16_bits_to_f32(static_cast<const uint16_t*>(p.w)[i]);
    const int32_t rb = static_cast<int32_t>(r) / p.block, cb = c / p.block;
    return fp8_to_f32(static_cast<const uint8_t*>(p.w)[i]) * p.scales[static_cast<int64_t>(rb) * p.scale_ld + cb];
}

// Block (o tile, row tile, batch): 32 rows × 32 outputs, k in steps of 128 through shared memory, the next step's
// tiles loaded into registers while this one is summed (a decode row's GEMM is a chain of k steps: each would
// otherwise wait a full global-memory latency). Warp w owns rows 4w..4w+3 and lane l output l; a warp whose rows
// lie past n skips the sums (a decode step's single row costs one warp's work, not 32 rows'). Every output's sum runs
// over k = 0, 1, ..., in - 1 in that order in one fp32 accumulator (the tail of the last k step adds nothing: rows
// and outputs past the ends are never summed, and k past `in` holds zeros times zeros).
template <int kType>
__global__ void __launch_bounds__(kThreads) invariant_gemm_kernel(Args p) {
    __shared__ float xs[kBk][kBm + 1];
    __shared__ float ws[kBk][kBn + 1];
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int32_t o0 = static_cast<int32_t>(blockIdx.x) * kBn, t0 = static_cast<int32_t>(blockIdx.y) * kBm;
    const int64_t b = blockIdx.z;
    const float* x = p.x + b * p.x_bstride;
    float* y = p.y + b * p.y_bstride;
    const int64_t wr0 = static_cast<int64_t>(p.w_row0) + b * p.w_batch_rows;
    const int rows = min(max(p.n - t0 - warp * 4, 0), 4);  // this warp's rows that exist
    float xr[kPerThread], wr[kPerThread];
    // Element e of a tile: x row e / kBk, k e % kBk (k fastest: a row's values are adjacent in memory); W output
    // e / kBk and k e % kBk when W's stored rows are outputs, else output e % kBn and k e / kBn (adjacent outputs).
    auto load = [&](int32_t k0) {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
            const int e = tid + i * kThreads;
            const int32_t t = t0 + e / kBk, kx = k0 + e % kBk;
            xr[i] = t < p.n && kx < p.in ? x[static_cast<int64_t>(t) * p.ldx + kx] : 0.0f;
            const int o = p.o_rows ? e / kBk : e % kBn, kk = p.o_rows ? e % kBk : e / kBn;
            const int32_t og = o0 + o, k = k0 + kk;
            wr[i] = og < p.out && k < p.in ? (p.o_rows ? load_w<kType>(p, wr0 + og, k) : load_w<kType>(p, wr0 + k, og))
                                           : 0.0f;
        }
    };
    float acc[4] = {};
    load(0);
    for (int32_t k0 = 0; k0 < p.in; k0 += kBk) {
        __syncthreads();  // the previous step's sums are done with the tiles
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
            const int e = tid + i * kThreads;
            xs[e % kBk][e / kBk] = xr[i];
            const int o = p.o_rows ? e / kBk : e % kBn, kk = p.o_rows ? e % kBk : e / kBn;
            ws[kk][o] = wr[i];
        }
        __syncthreads();
        if (k0 + kBk < p.in) load(k0 + kBk);  // in flight during the sums below
        if (rows == 0) continue;
        const int kn = min(kBk, p.in - k0);
        for (int kk = 0; kk < kn; ++kk) {
            const float w = ws[kk][lane];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (i < rows) acc[i] = fmaf(xs[kk][warp * 4 + i], w, acc[i]);
        }
    }
    const int32_t o = o0 + lane;
    if (o >= p.out) return;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (i < rows) y[static_cast<int64_t>(t0 + warp * 4 + i) * p.ldy + o] = acc[i];
}

}  // namespace

cudaError_t launch_invariant_gemm(const InvariantGemmParams& p, cudaStream_t stream) {
    if (p.n == 0 || p.out == 0 || p.batch == 0) return cudaSuccess;
    const int64_t sizes[] = {p.ldx, p.x_bstride, p.scale_ld, p.block, p.w_ld, p.w_row0, p.w_batch_rows,
                             p.ldy, p.y_bstride, p.n, p.out, p.in, p.batch};
    for (const int64_t v : sizes)
        if (v < 0 || v > INT32_MAX) return cudaErrorInvalidValue;
    if (p.w_row0 + p.batch * p.w_batch_rows + std::max(p.out, p.in) > INT32_MAX) return cudaErrorInvalidValue;
    if (p.wtype < 0 || p.wtype > 2 || (p.wtype == 2 && (p.scales == nullptr || p.block <= 0)))
        return cudaErrorInvalidValue;
    const int64_t gy = (p.n + kBm - 1) / kBm;
    if (gy > 65535 || p.batch > 65535) return cudaErrorInvalidValue;
    Args a{p.x,
           p.w,
           p.scales,
           p.y,
           static_cast<int32_t>(p.ldx),
           static_cast<int32_t>(p.x_bstride),
           static_cast<int32_t>(p.scale_ld),
           static_cast<int32_t>(p.block),
           static_cast<int32_t>(p.w_ld),
           static_cast<int32_t>(p.w_row0),
           static_cast<int32_t>(p.w_batch_rows),
           static_cast<int32_t>(p.ldy),
           static_cast<int32_t>(p.y_bstride),
           static_cast<int32_t>(p.n),
           static_cast<int32_t>(p.out),
           static_cast<int32_t>(p.in),
           p.wtype,
           p.o_rows};
    const dim3 grid(static_cast<unsigned>((p.out + kBn - 1) / kBn), static_cast<unsigned>(gy),
                    static_cast<unsigned>(p.batch));
    if (p.wtype == 0)
        invariant_gemm_kernel<0><<<grid, kThreads, 0, stream>>>(a);
    else if (p.wtype == 1)
        invariant_gemm_kernel<1><<<grid, kThreads, 0, stream>>>(a);
    else
        invariant_gemm_kernel<2><<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
