// FP8 block-scaled GEMV for decode (contract: fp8_gemv.h). Two kernels:
//
// Segmented (one or two rows of x, or up to 8 when in ≥ 4096): a warp owns 4 output rows and one column
// segment; per 512-column step a lane loads 16 e4m3 of each of its 4 rows (16-B loads that skip L1, a warp's
// load is 512 contiguous bytes) and the 16 matching values of each row of x once (through L1), used for the 4
// rows. A CTA is 8 warps: RC row groups × (8 / RC) column segments, RC the largest of 8, 4, 2, 1 that still
// gives 2 CTAs per SM for one row of x, 4 for two, 8 for more. The segments' sums meet in shared memory and add
// up in segment order (deterministic, no atomics, no staging barriers in the loop). Measured in a lab on the
// H200 (graphs of launches over rotating weight copies, cold L2; bench/results/cuda-h200-2026-11-30-gemv-lab.txt),
// against the staged kernel below:
//   one row:  o_proj 6144 × 16384 43.0 → 26.0 µs (3.9 TB/s), q_b 16384 × 2048 17.6 → 10.2, q_a 2048 × 6144
//             12.9 → 6.2, kv_a 576 × 6144 6.4 → 3.8, dense gate 12288 × 6144 31.7 → 20.2 µs;
//   2 rows:   o_proj 65.6 → 38.6, dense gate 47.7 → 30.4, q_a 19.5 → 9.0, q_b 19.7 → 18.1 µs (two steps
//             unrolled, 2 CTAs per SM; one step and 3 CTAs per SM: 43.4, 37.7, 10.9, 25.0);
//   3-4 rows: o_proj 98.7 → 50.6 / 66.2, q_a 29.4 → 10.1 / 12.2, dense gate 72.1 → 39.7 / 58.0 µs;
//   8 rows:   o_proj 140.4 → 123.9, q_a 47.2 → 20.7, dense gate 109.3 → 94.3 µs;
// but with 2048 input columns (q_b, the indexer's wq_b) the staged kernel is as fast or faster from 3 rows on
// (q_b, 4 rows: 29.0 against 40.6 µs), so there it stays.
//
// Staged (the other shapes, up to 8 rows): CTA = 8 warps, each warp four output rows for all n rows of x; x is
// staged in shared memory 1024 columns at a time. Per chunk a lane loads 4 e4m3 (one 32-bit word) of each row at
// columns lane·4 + 128·q, q = 0..7: a warp's load is 128 contiguous bytes, the 8 × 4 loads of a chunk are all in
// flight (32 KB per CTA), and each q lies in one 128-column scale block, so the scale is one warp-uniform load per
// (row, q). It reaches 2.3 TB/s on o_proj with one row, 1.5 TB/s with two: x is read once per chunk for 32 rows,
// but the chunk's barriers drain the loads.
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
// bounds pinned it (H200, 2026-11-30).
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

// ---- the segmented kernel --------------------------------------------------------------------------------
constexpr int kSegRows = 4;  // output rows per warp; 128 / kSegRows groups share one scale row

__device__ __forceinline__ uint4 load_stream16(const void* ptr) {  // 16 B, not kept in L1 (x is)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
}

// Σ of 16 e4m3 (a 16-B word) × 16 fp32 x values, in column order.
__device__ __forceinline__ float dot16(const uint4& w, const float4& x0, const float4& x1, const float4& x2,
                                       const float4& x3) {
    const float4 a = e4m3x4_to_float4(w.x), b = e4m3x4_to_float4(w.y), c = e4m3x4_to_float4(w.z),
                 d = e4m3x4_to_float4(w.w);
    float s = a.x * x0.x;
    s = fmaf(a.y, x0.y, s);
    s = fmaf(a.z, x0.z, s);
    s = fmaf(a.w, x0.w, s);
    s = fmaf(b.x, x1.x, s);
    s = fmaf(b.y, x1.y, s);
    s = fmaf(b.z, x1.z, s);
    s = fmaf(b.w, x1.w, s);
    s = fmaf(c.x, x2.x, s);
    s = fmaf(c.y, x2.y, s);
    s = fmaf(c.z, x2.z, s);
    s = fmaf(c.w, x2.w, s);
    s = fmaf(d.x, x3.x, s);
    s = fmaf(d.y, x3.y, s);
    s = fmaf(d.z, x3.z, s);
    return fmaf(d.w, x3.w, s);
}

// N rows of x; RC row groups of kSegRows rows × (8 / RC) column segments of seg_len columns per CTA; U 512-column
// steps unrolled (their loads all in flight). Needs in % 16 == 0 and 16-B aligned w and x.
// CTAs per SM the registers must allow: one row of x 4 (64 registers), two rows with one step 3, else 2.
template <int N, int U>
constexpr int seg_min_blocks() {
    return N == 1 ? 4 : N == 2 && U == 1 ? 3 : 2;
}

template <int N, int RC, int U>
__global__ void __launch_bounds__(kWarps * 32, seg_min_blocks<N, U>())
    fp8_gemv_seg_kernel(Fp8GemvParams p, int64_t seg_len) {
    constexpr int S = kWarps / RC;
    __shared__ float s_part[RC * kSegRows][S][N];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rg = warp % RC, seg = warp / RC;
    const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * RC + rg) * kSegRows;
    const int64_t n_cb = (p.in + 127) / 128;
    const int64_t c_begin = seg * seg_len, c_end = min(p.in, c_begin + seg_len);
    // Rows past the end read the last row (unused); all of a warp's rows lie in o0's 128-row scale block.
    const int64_t o0c = min(o0, p.out - 1);
    const int rlim = static_cast<int>(min(static_cast<int64_t>(kSegRows - 1), p.out - 1 - o0c));
    const uint8_t* w0 = p.w + o0c * p.in;
    const float* srow = p.scales + (o0c / 128) * n_cb;
    float acc[kSegRows][N] = {};
    for (int64_t c = c_begin + 16 * lane; c < c_end; c += 512 * U) {
        uint4 wv[U][kSegRows];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t cc = c + 512 * u;
#pragma unroll
            for (int r = 0; r < kSegRows; ++r)
                wv[u][r] = cc < c_end ? load_stream16(w0 + min(r, rlim) * p.in + cc) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t cc = c + 512 * u;
            if (cc >= c_end) break;
            const float sc = __ldg(srow + cc / 128);
#pragma unroll
            for (int j = 0; j < N; ++j) {
                // N = 4 and 8 also serve 3 and 5-7 rows: rows past n re-read the last one, unused.
                const int64_t jx = N <= 2 || j < p.n ? j : p.n - 1;
                const float4* xp = reinterpret_cast<const float4*>(p.x + jx * p.in + cc);
                const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1), x2 = __ldg(xp + 2), x3 = __ldg(xp + 3);
#pragma unroll
                for (int r = 0; r < kSegRows; ++r) acc[r][j] = fmaf(sc, dot16(wv[u][r], x0, x1, x2, x3), acc[r][j]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kSegRows; ++r)
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = acc[r][j];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0) s_part[rg * kSegRows + r][seg][j] = v;
        }
    __syncthreads();
    if (threadIdx.x < RC * kSegRows * N) {
        const int rr = threadIdx.x / N, j = threadIdx.x % N;
        const int64_t o = static_cast<int64_t>(blockIdx.x) * RC * kSegRows + rr;
        float v = 0.f;
#pragma unroll
        for (int sg = 0; sg < S; ++sg) v += s_part[rr][sg][j];
        if (o < p.out && j < p.n) p.y[j * p.out + o] = v;
    }
}

// ctas_per_sm: rows per CTA are the most that still give that many CTAs per SM (the rest of the warps split
// columns); measured best: 2 for one row of x, 4 for two (two steps unrolled), 8 for more.
template <int N, int U>
cudaError_t launch_seg(const Fp8GemvParams& p, int ctas_per_sm, cudaStream_t stream) {
    int rc = kWarps;
    while (rc > 1 && (p.out + rc * kSegRows - 1) / (rc * kSegRows) < ctas_per_sm * device_sm_count()) rc /= 2;
    const int segs = kWarps / rc;
    const int64_t seg_len = ((p.in + segs - 1) / segs + 15) / 16 * 16;
    const dim3 grid(static_cast<unsigned>((p.out + rc * kSegRows - 1) / (rc * kSegRows)));
    switch (rc) {
        case 8:
            fp8_gemv_seg_kernel<N, 8, U><<<grid, kWarps * 32, 0, stream>>>(p, seg_len);
            break;
        case 4:
            fp8_gemv_seg_kernel<N, 4, U><<<grid, kWarps * 32, 0, stream>>>(p, seg_len);
            break;
        case 2:
            fp8_gemv_seg_kernel<N, 2, U><<<grid, kWarps * 32, 0, stream>>>(p, seg_len);
            break;
        default:
            fp8_gemv_seg_kernel<N, 1, U><<<grid, kWarps * 32, 0, stream>>>(p, seg_len);
            break;
    }
    return cudaGetLastError();
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
    // The segmented kernel for one or two rows, and for up to 8 from 4096 columns (measured: below that the staged
    // kernel wins from 3 rows on, on q_b and the indexer's wq_b).
    if (p.in % 16 == 0 && (reinterpret_cast<uintptr_t>(p.w) & 15) == 0 && (p.n <= 2 || p.in >= 4096)) {
        if (p.n == 1) return launch_seg<1, 2>(p, 2, stream);
        if (p.n == 2) return launch_seg<2, 2>(p, 4, stream);
        if (p.n <= 4) return launch_seg<4, 1>(p, 8, stream);
        return launch_seg<8, 1>(p, 8, stream);
    }
    if (p.n == 1) return launch<1>(p, stream);
    if (p.n == 2) return launch<2>(p, stream);
    if (p.n <= 4) return launch<4>(p, stream);
    return launch<8>(p, stream);
}

}  // namespace megactx::cuda
