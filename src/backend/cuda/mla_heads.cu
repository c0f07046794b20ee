// mla_heads kernels (contract in mla_heads.h). Both read each weight row once per group of up to four tokens, 16
// columns (16 B of FP8, 32 B of BF16) per thread, every load of a thread issued before any is used, in grids of two
// CTAs per SM or more (GLM-5.2: 256 CTAs each), so that a warp has few rows to reduce after its loads land.
//   expand: a CTA of 8 warps per (head, 64 rows of W_UV_h); a warp takes 8 rows, lane l columns 16l..16l+15, the
//     tokens' x slices in registers; the 8 rows' dot products are reduced across the warp by a reduce-scatter.
//   absorb: a CTA per (head, 128 columns); thread (slice s, group g) accumulates rows j ≡ s (mod 32) of W_UK_h for
//     columns 16g..16g+15 of the CTA's, times x[t, h, j]; the 32 slices are summed by shuffles within a warp and
//     through shared memory across warps. The chunk-0 CTA also copies q_pe.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/mla_heads.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256, kR = 512, kMaxTok = 4;
// W_UV rows per expand warp and CTA: GLM-5.2's 64 heads × 256 rows are 256 CTAs, two or three resident per SM.
constexpr int kWarpRows = 8, kExpandRows = kWarpRows * kThreads / 32;

// 16 weights of row `row` from column c (a multiple of 16), unscaled, as fp32.
template <bool kFp8>
__device__ __forceinline__ void load16(const void* w, int64_t row, int c, uint4 (&raw)[2]) {
    if constexpr (kFp8) {
        raw[0] = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w) + row * kR + c));
    } else {
        const uint4* p = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(w) + row * kR + c);
        raw[0] = __ldg(p);
        raw[1] = __ldg(p + 1);
    }
}
template <bool kFp8>
__device__ __forceinline__ void unpack16(const uint4 (&raw)[2], float (&v)[16]) {
    if constexpr (kFp8) {
        const uint32_t u[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const __half2_raw hr =
                    __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[k] >> (16 * h)), __NV_E4M3);
                const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
                v[4 * k + 2 * h] = f.x;
                v[4 * k + 2 * h + 1] = f.y;
            }
        }
    } else {
        const uint32_t u[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[k]));
            v[2 * k] = f.x;
            v[2 * k + 1] = f.y;
        }
    }
}
// Loaded with the weights, before any is used: in the loop that stores the results a plain load of the scale could
// not move above the previous row's store, and each row then waited for its own round trip.
__device__ __forceinline__ float block_scale(const float* scales, int64_t row, int c) {
    return __ldg(scales + (row >> 7) * (kR / 128) + (c >> 7));
}

// A warp's 8 per-lane partial sums v[0..7] of rows 0..7, reduced over the warp's 32 lanes: afterwards lane l holds
// the whole sum of row 4·b4 + 2·b3 + b2 (b_i: bit i of l) in v[0], in every lane of its group of four. Nine
// shuffles instead of 8 × 5: each of the first three steps hands half of what a lane still holds to its partner.
__device__ __forceinline__ void reduce8_scatter(float (&v)[8], int lane) {
    const bool hi16 = lane & 16, hi8 = lane & 8, hi4 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float send = hi16 ? v[i] : v[4 + i], keep = hi16 ? v[4 + i] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float send = hi8 ? v[i] : v[2 + i], keep = hi8 ? v[2 + i] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    {
        const float send = hi4 ? v[0] : v[1], keep = hi4 ? v[1] : v[0];
        v[0] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    }
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
}

// kTok: 1 (batch 1) or 4 tokens per launch. A warp's 8 rows are one group of 8 (d_nope, d_v multiples of 8), so they
// are all in W_UV_h or all past it, and share one 128-row scale block.
template <bool kFp8, int kTok>
__global__ void __launch_bounds__(kThreads) mla_expand_kernel(const MlaHeadsParams p, int t0) {
    const int h = static_cast<int>(blockIdx.x), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int v0 = static_cast<int>(blockIdx.y) * kExpandRows + warp * kWarpRows;
    if (v0 >= p.d_v) return;
    const int nt = static_cast<int>(p.n - t0 < kTok ? p.n - t0 : kTok), c = 16 * lane;
    const int64_t row0 = h * (p.d_nope + p.d_v) + p.d_nope + v0;
    uint4 raw[kWarpRows][2];
#pragma unroll
    for (int rr = 0; rr < kWarpRows; ++rr) load16<kFp8>(p.w, row0 + rr, c, raw[rr]);
    const float s = kFp8 ? block_scale(p.scales, row0, c) : 1.f;
    float xr[kTok][16];
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
        const float4* xs = reinterpret_cast<const float4*>(p.x + ((t0 + t) * p.n_head + h) * kR + c);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float4 f = t < nt ? __ldg(xs + k) : make_float4(0.f, 0.f, 0.f, 0.f);
            xr[t][4 * k] = f.x, xr[t][4 * k + 1] = f.y, xr[t][4 * k + 2] = f.z, xr[t][4 * k + 3] = f.w;
        }
    }
    float acc[kTok][kWarpRows];
#pragma unroll
    for (int rr = 0; rr < kWarpRows; ++rr) {
        float wv[16];
        unpack16<kFp8>(raw[rr], wv);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
            float a = 0.f, b = 0.f;  // two chains of 8
#pragma unroll
            for (int i = 0; i < 16; i += 2) {
                a = fmaf(wv[i], xr[t][i], a);
                b = fmaf(wv[i + 1], xr[t][i + 1], b);
            }
            acc[t][rr] = (a + b) * s;
        }
    }
    const int row = 4 * ((lane >> 4) & 1) + 2 * ((lane >> 3) & 1) + ((lane >> 2) & 1);
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
        reduce8_scatter(acc[t], lane);
        if ((lane & 3) == 0 && t < nt) p.y[((t0 + t) * p.n_head + h) * p.d_v + v0 + row] = acc[t][0];
    }
}

// Absorb: thread (slice s, group g) of a CTA covering 128 columns takes rows j ≡ s (mod 32) of W_UK_h, columns
// 16g..16g+15 of the CTA's; the four slices of a warp are summed by a reduce-scatter of 12 shuffles, the eight warps
// through shared memory.
constexpr int kCols = 128, kGroups = kCols / 16, kSlices = kThreads / kGroups;  // 8 × 32
constexpr int kMaxNope = 256, kAbsorbRows = kMaxNope / kSlices;                // rows per thread, at most

template <bool kFp8, int kTok>
__global__ void __launch_bounds__(kThreads) mla_absorb_kernel(const MlaHeadsParams p, int t0) {
    __shared__ float red[kThreads / 32][kTok][kCols];
    const int h = static_cast<int>(blockIdx.x), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = tid % kGroups, s = tid / kGroups;
    const int nt = static_cast<int>(p.n - t0 < kTok ? p.n - t0 : kTok), dn = static_cast<int>(p.d_nope);
    const int c = static_cast<int>(blockIdx.y) * kCols + 16 * g;
    const int64_t d_out = kR + p.d_qk - p.d_nope, row0 = h * (p.d_nope + p.d_v);
    uint4 raw[kAbsorbRows][2];
    float scb[kAbsorbRows], xv[kAbsorbRows][kTok];
#pragma unroll
    for (int b = 0; b < kAbsorbRows; ++b) {
        const int j = s + b * kSlices;
        scb[b] = 0.f;  // rows past d_nope add nothing
        if (j < dn) {
            load16<kFp8>(p.w, row0 + j, c, raw[b]);
            scb[b] = kFp8 ? block_scale(p.scales, row0 + j, c) : 1.f;
        } else {
            raw[b][0] = raw[b][1] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
#pragma unroll
    for (int b = 0; b < kAbsorbRows; ++b) {
        const int j = s + b * kSlices;
#pragma unroll
        for (int t = 0; t < kTok; ++t)
            xv[b][t] = j < dn && t < nt ? p.x[((t0 + t) * p.n_head + h) * p.d_qk + j] : 0.f;
    }
    if (blockIdx.y == 0)  // q_pe passes through
        for (int k = tid; k < nt * (p.d_qk - dn); k += kThreads) {
            const int t = k / static_cast<int>(p.d_qk - dn), e = k % static_cast<int>(p.d_qk - dn);
            p.y[((t0 + t) * p.n_head + h) * d_out + kR + e] = p.x[((t0 + t) * p.n_head + h) * p.d_qk + dn + e];
        }
    float acc[kTok][16];
#pragma unroll
    for (int t = 0; t < kTok; ++t)
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[t][i] = 0.f;
#pragma unroll
    for (int b = 0; b < kAbsorbRows; ++b) {
        if (s + b * kSlices >= dn) break;  // this thread's rows end (for GLM-5.2's 192 rows: all threads at 6)
        float wv[16];
        unpack16<kFp8>(raw[b], wv);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
            const float a = xv[b][t] * scb[b];
#pragma unroll
            for (int i = 0; i < 16; ++i) acc[t][i] = fmaf(a, wv[i], acc[t][i]);
        }
    }
    // Lanes g, g + 8, g + 16, g + 24 hold the same columns: halve what each holds twice (xor 16, then xor 8), so lane
    // l ends with columns 16g + 8·b4 + 4·b3 .. + 3 summed over the warp's four slices.
    const bool hi16 = lane & 16, hi8 = lane & 8;
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float send = hi16 ? acc[t][i] : acc[t][8 + i], keep = hi16 ? acc[t][8 + i] : acc[t][i];
            acc[t][i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float send = hi8 ? acc[t][i] : acc[t][4 + i], keep = hi8 ? acc[t][4 + i] : acc[t][i];
            acc[t][i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
        }
        *reinterpret_cast<float4*>(&red[warp][t][16 * g + 8 * hi16 + 4 * hi8]) =
            make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    }
    __syncthreads();
    for (int k = tid; k < nt * kCols; k += kThreads) {
        const int t = k / kCols, col = k % kCols;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) sum += red[w][t][col];
        p.y[((t0 + t) * p.n_head + h) * d_out + static_cast<int>(blockIdx.y) * kCols + col] = sum;
    }
}

}  // namespace

bool mla_heads_supported(const MlaHeadsParams& p) {
    return p.x && p.w && p.y && (!p.fp8 || p.scales) && p.r == kR && p.n >= 1 && p.n <= kMlaHeadsMaxTokens &&
           p.n_head >= 1 && p.n_head <= 65535 && p.d_nope >= 1 && p.d_nope <= kMaxNope && p.d_v >= 1 &&
           p.d_nope % 8 == 0 && p.d_v % 8 == 0 && p.d_qk >= p.d_nope;
}

namespace {
// One launch at batch 1 (kTok 1), else passes of kMaxTok tokens; Kernel<kFp8, kTok> picks the instantiation.
template <template <bool, int> class Kernel>
cudaError_t launch_passes(const MlaHeadsParams& p, dim3 grid, cudaStream_t stream) {
    if (!mla_heads_supported(p)) return cudaErrorInvalidValue;
    if (p.n == 1) {
        (p.fp8 ? Kernel<true, 1>::fn : Kernel<false, 1>::fn)<<<grid, kThreads, 0, stream>>>(p, 0);
        return cudaGetLastError();
    }
    for (int64_t t0 = 0; t0 < p.n; t0 += kMaxTok)
        (p.fp8 ? Kernel<true, kMaxTok>::fn : Kernel<false, kMaxTok>::fn)<<<grid, kThreads, 0, stream>>>(
            p, static_cast<int>(t0));
    return cudaGetLastError();
}
template <bool kFp8, int kTok>
struct Absorb {
    static constexpr auto fn = mla_absorb_kernel<kFp8, kTok>;
};
template <bool kFp8, int kTok>
struct Expand {
    static constexpr auto fn = mla_expand_kernel<kFp8, kTok>;
};
}  // namespace

cudaError_t launch_mla_absorb(const MlaHeadsParams& p, cudaStream_t stream) {
    return launch_passes<Absorb>(p, dim3(static_cast<unsigned>(p.n_head), kR / kCols), stream);
}

cudaError_t launch_mla_expand(const MlaHeadsParams& p, cudaStream_t stream) {
    const auto row_blocks = static_cast<unsigned>((p.d_v + kExpandRows - 1) / kExpandRows);
    return launch_passes<Expand>(p, dim3(static_cast<unsigned>(p.n_head), row_blocks), stream);
}

}  // namespace megactx::cuda
