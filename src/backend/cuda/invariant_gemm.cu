// The batch-invariant mode's GEMM (contract: invariant_gemm.h): a plain shared-memory tiled GEMM on the CUDA cores,
// one fp32 accumulator per output, k in ascending order; no split of k, no atomics, nothing chosen by the row count.
// Not measured yet (written without a GPU); its cost against the default paths is cuda.sh's `invariant` stage.
#include "backend/cuda/invariant_gemm.h"

#include "backend/cuda/cuda_common.cuh"

#include <cstdint>

namespace megactx::cuda {
namespace {

constexpr int kBm = 32, kBn = 64, kBk = 32, kThreads = 256;

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

__device__ __forceinline__ float load_w(const Args& p, int64_t r, int64_t c) {
    const int64_t i = r * p.w_ld + c;
    if (p.wtype == 0) return static_cast<const float*>(p.w)[i];
    if (p.wtype == 1) return bf16_bits_to_f32(static_cast<const uint16_t*>(p.w)[i]);
    return fp8_to_f32(static_cast<const uint8_t*>(p.w)[i]) * p.scales[(r / p.block) * p.scale_ld + c / p.block];
}

// Block (o tile, row tile, batch). Thread (ty, tx) = (tid / 16, tid % 16) owns rows ty · 2 + {0, 1} and outputs
// tx + 16 · {0..3} of the tile; every output's sum runs over k = 0, 1, ..., in - 1 in that order (the tail of the
// last k step adds exact zeros).
__global__ void __launch_bounds__(kThreads) invariant_gemm_kernel(Args p) {
    __shared__ float xs[kBk][kBm + 1];
    __shared__ float ws[kBk][kBn + 1];
    const int tid = static_cast<int>(threadIdx.x), tx = tid % 16, ty = tid / 16;
    const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kBn, t0 = static_cast<int64_t>(blockIdx.y) * kBm;
    const int64_t b = blockIdx.z;
    const float* x = p.x + b * p.x_bstride;
    float* y = p.y + b * p.y_bstride;
    const int64_t wr0 = p.w_row0 + b * p.w_batch_rows;
    float acc[2][4] = {};
    for (int64_t k0 = 0; k0 < p.in; k0 += kBk) {
        for (int e = tid; e < kBm * kBk; e += kThreads) {  // x tile, k fastest (coalesced along a row)
            const int r = e / kBk, kk = e % kBk;
            const int64_t t = t0 + r, k = k0 + kk;
            xs[kk][r] = t < p.n && k < p.in ? x[t * p.ldx + k] : 0.0f;
        }
        for (int e = tid; e < kBn * kBk; e += kThreads) {  // W tile, along the stored row
            int o, kk;
            if (p.o_rows) {
                o = e / kBk;
                kk = e % kBk;
            } else {
                o = e % kBn;
                kk = e / kBn;
            }
            const int64_t og = o0 + o, k = k0 + kk;
            float v = 0.0f;
            if (og < p.out && k < p.in) v = p.o_rows ? load_w(p, wr0 + og, k) : load_w(p, wr0 + k, og);
            ws[kk][o] = v;
        }
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < kBk; ++kk) {
            const float a0 = xs[kk][ty * 2], a1 = xs[kk][ty * 2 + 1];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float w = ws[kk][tx + 16 * j];
                acc[0][j] = fmaf(a0, w, acc[0][j]);
                acc[1][j] = fmaf(a1, w, acc[1][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int64_t t = t0 + ty * 2 + i;
        if (t >= p.n) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t o = o0 + tx + 16 * j;
            if (o < p.out) y[t * p.ldy + o] = acc[i][j];
        }
    }
}

}  // namespace

cudaError_t launch_invariant_gemm(const InvariantGemmParams& p, cudaStream_t stream) {
    if (p.n == 0 || p.out == 0 || p.batch == 0) return cudaSuccess;
    const int64_t sizes[] = {p.ldx, p.x_bstride, p.scale_ld, p.block, p.w_ld, p.w_row0, p.w_batch_rows,
                             p.ldy, p.y_bstride, p.n, p.out, p.in, p.batch};
    for (const int64_t v : sizes)
        if (v < 0 || v > INT32_MAX) return cudaErrorInvalidValue;
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
    invariant_gemm_kernel<<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
