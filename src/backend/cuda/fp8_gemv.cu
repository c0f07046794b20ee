// FP8 block-scaled GEMV for decode (contract: fp8_gemv.h).
// CTA = 8 warps, each warp four output rows for all n rows of x; x is staged in shared memory 1024 columns at a
// time. Per chunk a lane loads 4 e4m3 (one 32-bit word) of each row at columns lane·4 + 128·q, q = 0..7: a warp's
// load is 128 contiguous bytes, the 8 × 4 loads of a chunk are all in flight (32 KB per CTA), and each q lies in
// one 128-column scale block, so the scale is one warp-uniform load per (row, q).
// Measured (ncu, H200, base clocks, cold caches): ~1.9 TB/s on the o_proj shape, where cuBLASLt's bf16 GEMV of the
// same rows reaches ~4 TB/s, so the FP8 bytes saved buy ~10% of the decode step, not 2× on these GEMVs. A variant
// without the staging barriers (x through L1, the next step's weights prefetched into registers: 127-223
// registers) was slower still (1.4 TB/s): fewer warps per SM. Closing that gap is open work.
// Split-K: HBM needs ~4 MB in flight, so when the output rows give fewer than two CTAs per SM, blockIdx.y splits
// the columns. Each CTA stores its partial sums in the scratch, and the last CTA of a column of splits (a counter
// per blockIdx.x, zeroed first) adds them in split order: the result does not depend on which CTA finished first
// (float atomics into y did, and made decode irreproducible run to run).
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fp8_gemv.h"

namespace megactx::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kChunk = 1024;  // columns of x per stage
constexpr int kQ = kChunk / 128;

template <int N>
__global__ void __launch_bounds__(kWarps * 32) fp8_gemv_kernel(Fp8GemvParams p) {
    __shared__ float4 s_x[N][kChunk / 4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
    const int64_t n_cb = (p.in + 127) / 128;  // scale blocks per row
    float acc[kRowsPerWarp][N] = {};
    const int64_t n_chunks = (p.in + kChunk - 1) / kChunk, per = (n_chunks + gridDim.y - 1) / gridDim.y;
    const int64_t c_begin = blockIdx.y * per * kChunk, c_end = min(p.in, (blockIdx.y + 1) * per * kChunk);
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kChunk) {
        __syncthreads();  // the previous chunk's reads of s_x are done
        for (int i = threadIdx.x; i < N * kChunk / 4; i += kWarps * 32) {
            const int r = i / (kChunk / 4), c4 = i % (kChunk / 4);
            const int64_t c = c0 + 4 * c4;
            s_x[r][c4] = r < p.n && c < p.in ? *reinterpret_cast<const float4*>(p.x + r * p.in + c)
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        __syncthreads();
        uint32_t wv[kRowsPerWarp][kQ];
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t o = min(o0 + rr, p.out - 1);  // a past-the-end row reads the last one, unused
#pragma unroll
            for (int q = 0; q < kQ; ++q) {
                const int64_t c = c0 + 128 * q + 4 * lane;
                wv[rr][q] = c < p.in ? __ldg(reinterpret_cast<const uint32_t*>(p.w + o * p.in + c)) : 0u;
            }
        }
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t o = min(o0 + rr, p.out - 1);
#pragma unroll
            for (int q = 0; q < kQ; ++q) {
                const int64_t cb = (c0 + 128 * q) / 128;
                if (cb >= n_cb) break;
                const float s = __ldg(p.scales + (o / 128) * n_cb + cb);
                const float4 w4 = e4m3x4_to_float4(wv[rr][q]);
#pragma unroll
                for (int r = 0; r < N; ++r) {
                    const float4 xv = s_x[r][32 * q + lane];
                    acc[rr][r] += s * (w4.x * xv.x + w4.y * xv.y + w4.z * xv.z + w4.w * xv.w);
                }
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
                    p.partial[(blockIdx.y * p.n + r) * p.out + o0 + rr] = v;
                else
                    p.y[r * p.out + o0 + rr] = v;
            }
        }
    }
    if (gridDim.y == 1) return;
    __shared__ bool s_last;
    __threadfence();  // this thread's partials are visible before the counter moves
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(p.counters + blockIdx.x, 1) == static_cast<int>(gridDim.y) - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    constexpr int kRows = kWarps * kRowsPerWarp;
    for (int i = threadIdx.x; i < kRows * p.n; i += kWarps * 32) {
        const int64_t r = i / kRows, o = static_cast<int64_t>(blockIdx.x) * kRows + i % kRows;
        if (o >= p.out) continue;
        float v = 0.f;
        for (unsigned sp = 0; sp < gridDim.y; ++sp) v += __ldcg(p.partial + (sp * p.n + r) * p.out + o);
        p.y[r * p.out + o] = v;
    }
}

int n_sms() {
    static const int n = [] {
        int dev = 0, v = 132;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
        return v;
    }();
    return n;
}

int64_t n_ctas(int64_t out) { return (out + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp); }

// Column splits: enough CTAs for two per SM, at most one per chunk of x.
int64_t n_splits(int64_t out, int64_t in) {
    const int64_t ctas = n_ctas(out), n_chunks = (in + kChunk - 1) / kChunk;
    return std::clamp<int64_t>((2 * n_sms() + ctas - 1) / ctas, 1, n_chunks);
}

size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

template <int N>
cudaError_t launch(Fp8GemvParams p, cudaStream_t stream) {
    const int64_t ctas = n_ctas(p.out), splits = n_splits(p.out, p.in);
    if (splits > 1) {
        if (p.scratch_bytes < fp8_gemv_scratch_bytes(p.n, p.out, p.in)) return cudaErrorInvalidValue;
        p.counters = static_cast<int*>(p.scratch);
        p.partial = reinterpret_cast<float*>(static_cast<char*>(p.scratch) + align256(ctas * sizeof(int)));
        const cudaError_t e = cudaMemsetAsync(p.counters, 0, static_cast<size_t>(ctas) * sizeof(int), stream);
        if (e != cudaSuccess) return e;
    }
    fp8_gemv_kernel<N><<<dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(splits)), kWarps * 32, 0, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace

size_t fp8_gemv_scratch_bytes(int64_t n, int64_t out, int64_t in) {
    const int64_t splits = n_splits(out, in);
    if (splits <= 1) return 0;
    return align256(static_cast<size_t>(n_ctas(out)) * sizeof(int)) +
           static_cast<size_t>(splits * n * out) * sizeof(float);
}

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
