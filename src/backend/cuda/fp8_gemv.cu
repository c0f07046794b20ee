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
// the columns (at most 8). The splits of a CTA's rows run as one thread-block cluster, and split 0 adds their sums
// from distributed shared memory in split order: deterministic, no memset, no global round trip. (Float atomics
// into a zeroed y made the sum's order, and decode, depend on timing; a last-CTA reduction through global memory
// cost ~2 us per GEMV.)
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/per_device.cuh"

namespace megactx::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kChunk = 1024;  // columns of x per stage
constexpr int kQ = kChunk / 128;
constexpr int64_t kMaxSplits = 8;  // a portable cluster

namespace cg = cooperative_groups;

// Occupancy is bandwidth here: N = 1 must stay at <= 80 registers (3 CTAs per SM), the others at <= 128 (2). The
// split-K epilogue pushed N = 1 to 97 registers (2 CTAs per SM) and the decode step from 1.00 to 1.17 ms until these
// bounds pinned it (H200, session 6).
template <int N>
__global__ void __launch_bounds__(kWarps * 32, N == 1 ? 3 : 2) fp8_gemv_kernel(Fp8GemvParams p) {
    __shared__ float4 s_x[N][kChunk / 4];
    __shared__ float s_part[kWarps * kRowsPerWarp][N];  // split-K: this split's sums of the CTA's rows
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
            if (lane == 0) {
                if (gridDim.y > 1)
                    s_part[warp * kRowsPerWarp + rr][r] = v;
                else if (o0 + rr < p.out && r < p.n)
                    p.y[r * p.out + o0 + rr] = v;
            }
        }
    }
    if (gridDim.y == 1) return;
    // Split-K: the column splits of these rows form one cluster; split 0 adds the others' sums from their shared
    // memory (DSMEM) in split order.
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's sums are in its shared memory
    if (cluster.block_rank() == 0) {
        constexpr int kRows = kWarps * kRowsPerWarp;
        for (int i = threadIdx.x; i < kRows * N; i += kWarps * 32) {
            const int rr = i / N, r = i % N;
            const int64_t o = static_cast<int64_t>(blockIdx.x) * kRows + rr;
            float v = 0.f;
            for (unsigned sp = 0; sp < gridDim.y; ++sp) v += cluster.map_shared_rank(&s_part[0][0], sp)[i];
            if (o < p.out && r < p.n) p.y[r * p.out + o] = v;
        }
    }
    cluster.sync();  // the other splits keep their shared memory until split 0 has read it
}

template <int N>
cudaError_t launch(const Fp8GemvParams& p, cudaStream_t stream) {
    const int64_t ctas = (p.out + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp);
    const int64_t n_chunks = (p.in + kChunk - 1) / kChunk;
    // Column splits: enough CTAs for two per SM, at most one per chunk of x and kMaxSplits.
    const int64_t splits =
        std::clamp<int64_t>((2 * device_sm_count() + ctas - 1) / ctas, 1, std::min(n_chunks, kMaxSplits));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(splits));
    cfg.blockDim = dim3(kWarps * 32);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = static_cast<unsigned>(splits);
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = splits > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, fp8_gemv_kernel<N>, p);
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
