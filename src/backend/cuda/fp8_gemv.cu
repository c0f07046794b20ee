// FP8 block-scaled GEMV for decode (contract: fp8_gemv.h).
// CTA = 8 warps, each warp four output rows for all n rows of x, 1024 columns per step. Per step a lane loads 4
// e4m3 (one 32-bit word) of each row at columns lane·4 + 128·q, q = 0..7: a warp's load is 128 contiguous bytes,
// and the next step's 4 × 8 loads are issued before this step is computed (registers, no barrier), so ~2 steps
// (64 KB per CTA) stay in flight. Each q lies in one 128-column scale block: one warp-uniform scale per (row, q).
// x is read through L1 (every CTA reads the same few rows). A version that staged x in shared memory per step
// ran at half of cuBLAS's bandwidth (ncu, H200): its barriers stopped the loads.
// Split-K: HBM needs ~4 MB in flight, so when the output rows give fewer than two CTAs per SM, blockIdx.y splits
// the columns and the CTAs add their partial sums into y (zeroed first) with atomics.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/fp8_gemv.h"

namespace megactx::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kChunk = 1024;  // columns of x per stage
constexpr int kQ = kChunk / 128;

__device__ __forceinline__ float4 e4m3x4_to_float4(uint32_t v) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <int N>
__global__ void __launch_bounds__(kWarps * 32) fp8_gemv_kernel(Fp8GemvParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
    const int64_t n_cb = (p.in + 127) / 128;  // scale blocks per row
    float acc[kRowsPerWarp][N] = {};
    const int64_t n_chunks = (p.in + kChunk - 1) / kChunk, per = (n_chunks + gridDim.y - 1) / gridDim.y;
    const int64_t c_begin = blockIdx.y * per * kChunk, c_end = min(p.in, (blockIdx.y + 1) * per * kChunk);
    const uint8_t* rows[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) rows[rr] = p.w + min(o0 + rr, p.out - 1) * p.in;  // past the end: unused
    // The chunk's weights: 4 e4m3 per (row, q) at column c0 + 128 q + 4 lane (0 past the end of the row).
    const auto load = [&](int64_t c0, uint32_t(&wv)[kRowsPerWarp][kQ]) {
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
            for (int q = 0; q < kQ; ++q) {
                const int64_t c = c0 + 128 * q + 4 * lane;
                wv[rr][q] = c < c_end ? __ldg(reinterpret_cast<const uint32_t*>(rows[rr] + c)) : 0u;
            }
    };
    uint32_t cur[kRowsPerWarp][kQ], next[kRowsPerWarp][kQ];
    if (c_begin < c_end) load(c_begin, next);
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kChunk) {
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
            for (int q = 0; q < kQ; ++q) cur[rr][q] = next[rr][q];
        if (c0 + kChunk < c_end) load(c0 + kChunk, next);  // in flight while this chunk is computed
#pragma unroll
        for (int q = 0; q < kQ; ++q) {
            const int64_t c = c0 + 128 * q + 4 * lane;
            if (c0 + 128 * q >= c_end) break;
            float4 xv[N];
#pragma unroll
            for (int r = 0; r < N; ++r)
                xv[r] = c < c_end && r < p.n ? __ldg(reinterpret_cast<const float4*>(p.x + r * p.in + c))
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
            const int64_t cb = (c0 + 128 * q) / 128;
#pragma unroll
            for (int rr = 0; rr < kRowsPerWarp; ++rr) {
                const float s = __ldg(p.scales + (min(o0 + rr, p.out - 1) / 128) * n_cb + cb);
                const float4 w4 = e4m3x4_to_float4(cur[rr][q]);
#pragma unroll
                for (int r = 0; r < N; ++r)
                    acc[rr][r] += s * (w4.x * xv[r].x + w4.y * xv[r].y + w4.z * xv[r].z + w4.w * xv[r].w);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
        for (int r = 0; r < N; ++r) {
            float v = acc[rr][r];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0 && o0 + rr < p.out && r < p.n) {
                if (gridDim.y > 1)
                    atomicAdd(p.y + r * p.out + o0 + rr, v);
                else
                    p.y[r * p.out + o0 + rr] = v;
            }
        }
    }
}

template <int N>
cudaError_t launch(const Fp8GemvParams& p, cudaStream_t stream) {
    static int n_sm = [] {
        int dev = 0, v = 132;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
        return v;
    }();
    const int64_t per_cta = kWarps * kRowsPerWarp, ctas = (p.out + per_cta - 1) / per_cta;
    const int64_t n_chunks = (p.in + kChunk - 1) / kChunk;
    const int64_t splits = std::clamp<int64_t>((2 * n_sm + ctas - 1) / ctas, 1, n_chunks);
    if (splits > 1) {
        const cudaError_t e = cudaMemsetAsync(p.y, 0, static_cast<size_t>(p.n * p.out) * sizeof(float), stream);
        if (e != cudaSuccess) return e;
    }
    fp8_gemv_kernel<N><<<dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(splits)), kWarps * 32, 0, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace

bool fp8_gemv_supported(int64_t n, int64_t in, int64_t block) {
    return n >= 1 && n <= kFp8GemvMaxRows && in > 0 && in % 4 == 0 && block == 128;
}

cudaError_t launch_fp8_gemv(const Fp8GemvParams& p, cudaStream_t stream) {
    if (p.n == 0 || p.out == 0) return cudaSuccess;
    if (!fp8_gemv_supported(p.n, p.in, p.block) || (reinterpret_cast<uintptr_t>(p.x) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(p.w) & 3) != 0)
        return cudaErrorInvalidValue;
    if (p.n == 1) return launch<1>(p, stream);
    if (p.n == 2) return launch<2>(p, stream);
    if (p.n <= 4) return launch<4>(p, stream);
    return launch<8>(p, stream);
}

}  // namespace megactx::cuda
