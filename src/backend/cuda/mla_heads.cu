// mla_heads kernels (contract in mla_heads.h). Both read each weight row once per group of up to four tokens, 16
// columns (16 B of FP8, 32 B of BF16) per thread, every load of a thread issued before any is used.
//   expand: a CTA of 8 warps per (head, 128 rows of W_UV_h); a warp takes 16 rows, 8 at a time, lane l columns
//     16l..16l+15, the tokens' x slices in registers; each row's dot products are reduced across the warp by
//     shuffles.
//   absorb: a CTA per (head, 256 columns); thread (slice s, group g) accumulates rows j ≡ s (mod 16) of W_UK_h for
//     columns 16g..16g+15 of the CTA's, times x[t, h, j] (staged in shared memory); the 16 slices are summed by one
//     shuffle (two slices per warp) and through shared memory. The chunk-0 CTA also copies q_pe.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/mla_heads.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256, kR = 512, kMaxTok = 4;
constexpr int kExpandRows = 128;  // W_UV rows per expand CTA: GLM-5.2's 64 heads × 256 rows in one wave of 128 CTAs

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

// kTok: 1 (batch 1) or 4 tokens per launch; FP8 rows are all in flight at once (16 per warp), BF16 rows 8 at a time.
template <bool kFp8, int kTok>
__global__ void __launch_bounds__(kThreads) mla_expand_kernel(const MlaHeadsParams p, int t0) {
    constexpr int kInFlight = kFp8 ? 16 : 8;
    const int h = static_cast<int>(blockIdx.x), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nt = static_cast<int>(p.n - t0 < kTok ? p.n - t0 : kTok), c = 16 * lane;
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
#pragma unroll 1
    for (int part = 0; part < 16 / kInFlight; ++part) {
        const int v0 = static_cast<int>(blockIdx.y) * kExpandRows + warp * 16 + part * kInFlight;
        const int64_t row0 = h * (p.d_nope + p.d_v) + p.d_nope + v0;
        uint4 raw[kInFlight][2];
        float sc[kInFlight];
#pragma unroll
        for (int rr = 0; rr < kInFlight; ++rr) {
            sc[rr] = 1.f;
            if (v0 + rr < p.d_v) {
                load16<kFp8>(p.w, row0 + rr, c, raw[rr]);
                if constexpr (kFp8) sc[rr] = block_scale(p.scales, row0 + rr, c);
            }
        }
#pragma unroll
        for (int rr = 0; rr < kInFlight; ++rr) {
            if (v0 + rr >= p.d_v) break;
            float wv[16];
            unpack16<kFp8>(raw[rr], wv);
            const float s = sc[rr];
            float acc[kTok];
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
                float a = 0.f;
#pragma unroll
                for (int i = 0; i < 16; ++i) a = fmaf(wv[i], xr[t][i], a);
                acc[t] = a * s;
            }
#pragma unroll
            for (int t = 0; t < kTok; ++t)
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
            if (lane == 0)
                for (int t = 0; t < nt; ++t) p.y[((t0 + t) * p.n_head + h) * p.d_v + v0 + rr] = acc[t];
        }
    }
}

constexpr int kCols = 256, kGroups = kCols / 16, kSlices = kThreads / kGroups;  // 16 × 16
constexpr int kMaxNope = 256;

template <bool kFp8, int kTok>
__global__ void __launch_bounds__(kThreads) mla_absorb_kernel(const MlaHeadsParams p, int t0) {
    __shared__ float xs[kTok][kMaxNope];
    __shared__ float red[kThreads / 32][kTok][kCols];  // per warp: its two slices summed
    const int h = static_cast<int>(blockIdx.x), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = tid % kGroups, s = tid / kGroups;
    const int nt = static_cast<int>(p.n - t0 < kTok ? p.n - t0 : kTok), dn = static_cast<int>(p.d_nope);
    const int c = static_cast<int>(blockIdx.y) * kCols + 16 * g;
    const int64_t d_out = kR + p.d_qk - p.d_nope;
    for (int k = tid; k < kTok * dn; k += kThreads) {
        const int t = k / dn, j = k % dn;
        xs[t][j] = t < nt ? p.x[((t0 + t) * p.n_head + h) * p.d_qk + j] : 0.f;
    }
    if (blockIdx.y == 0)  // q_pe passes through
        for (int k = tid; k < nt * (p.d_qk - dn); k += kThreads) {
            const int t = k / static_cast<int>(p.d_qk - dn), e = k % static_cast<int>(p.d_qk - dn);
            p.y[((t0 + t) * p.n_head + h) * d_out + kR + e] = p.x[((t0 + t) * p.n_head + h) * p.d_qk + dn + e];
        }
    __syncthreads();
    float acc[kTok][16];
#pragma unroll
    for (int t = 0; t < kTok; ++t)
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[t][i] = 0.f;
    const int64_t row0 = h * (p.d_nope + p.d_v);
    constexpr int kBatch = kFp8 ? 12 : 6;  // rows in flight per thread (GLM-5.2's 192: all of a thread's rows)
    for (int j0 = s; j0 < dn; j0 += kBatch * kSlices) {
        uint4 raw[kBatch][2];
        float scb[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            scb[b] = 1.f;
            if (j0 + b * kSlices < dn) {
                load16<kFp8>(p.w, row0 + j0 + b * kSlices, c, raw[b]);
                if constexpr (kFp8) scb[b] = block_scale(p.scales, row0 + j0 + b * kSlices, c);
            }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int j = j0 + b * kSlices;
            if (j >= dn) break;
            float wv[16];
            unpack16<kFp8>(raw[b], wv);
            const float sc = scb[b];
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
                const float a = xs[t][j] * sc;
#pragma unroll
                for (int i = 0; i < 16; ++i) acc[t][i] = fmaf(a, wv[i], acc[t][i]);
            }
        }
    }
    // Slices s and s + 1 share a warp (lanes l and l ^ 16): one shuffle, then 8 partial sums through shared memory.
#pragma unroll
    for (int t = 0; t < kTok; ++t)
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[t][i] += __shfl_xor_sync(0xffffffffu, acc[t][i], 16);
    if (lane < 16)
#pragma unroll
        for (int t = 0; t < kTok; ++t)
#pragma unroll
            for (int i = 0; i < 16; i += 4)
                *reinterpret_cast<float4*>(&red[warp][t][16 * g + i]) =
                    make_float4(acc[t][i], acc[t][i + 1], acc[t][i + 2], acc[t][i + 3]);
    __syncthreads();
    const int col = static_cast<int>(blockIdx.y) * kCols + tid;
    for (int t = 0; t < nt; ++t) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) sum += red[w][t][tid];
        p.y[((t0 + t) * p.n_head + h) * d_out + col] = sum;
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
