// MoE router selection and the few-token expert MLPs (contract: moe.h; model-spec §1.2 MoE).
// Router: one CTA per token computes the scores in the CPU oracle's fp32 operations; one warp then makes the same
// choices in the same order (group scores, masking, k argmaxes with the lowest index among equals), so ids match
// exactly and weights to rounding.
// Few-token experts: two warp-per-output GEMV kernels (gate/up with SwiGLU, then down with the weighted sum over
// the token's choices) that read the expert ids on the device, so decode needs no host sync and can be captured.
// Weights are streamed once per (token, choice) with 16-B loads; the activation row sits in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launch_ex.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/per_device.cuh"

namespace megactx::cuda {

namespace {

__global__ void moe_route_kernel(MoeRouteKernelParams p) {
    extern __shared__ float smem[];
    float* s = smem;                     // [n_exp] sigmoid scores
    float* choice = smem + p.n_exp;      // [n_exp] choice scores (then NaN once taken, −inf once masked)
    float* gscore = smem + 2 * p.n_exp;  // [n_group]
    const int64_t i = blockIdx.x, E = p.n_exp;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        s[e] = 1.0f / (1.0f + expf(-p.logits[i * E + e]));
        choice[e] = s[e] + p.bias[e];
    }
    __syncthreads();
    // One warp from here on: the selection is a chain of k argmaxes (GLM-5.2: 8 of 256), each a lane-local scan
    // and a butterfly reduction, instead of one thread scanning all experts k times.
    if (threadIdx.x >= 32) return;
    const unsigned lane = threadIdx.x;
    if (p.n_group > 1) {
        const int64_t per = E / p.n_group;
        for (int64_t g = lane; g < p.n_group; g += 32) {  // a group's score: the sum of its two best
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; ++e) {
                const float v = choice[e];
                if (v > m1) {
                    m2 = m1;
                    m1 = v;
                } else if (v > m2) {
                    m2 = v;
                }
            }
            gscore[g] = m1 + m2;
        }
        __syncwarp();
        // keep the topk_group best groups by (score desc, index asc): a group with ≥ topk_group better ones is masked
        for (int64_t g = lane; g < p.n_group; g += 32) {
            int64_t better = 0;
            for (int64_t h = 0; h < p.n_group; ++h) {
                if (gscore[h] > gscore[g] || (gscore[h] == gscore[g] && h < g)) ++better;
            }
            if (better >= p.topk_group) {
                for (int64_t e = g * per; e < (g + 1) * per; ++e) choice[e] = -INFINITY;
            }
        }
        __syncwarp();
    }
    // The oracle's order: the largest choice score not yet taken, the lowest index among equals (a strict total
    // order, so every lane ends the butterfly with the same expert).
    const int64_t k = p.top_k;
    int32_t* ids = p.ids + i * k;
    for (int64_t j = 0; j < k; ++j) {
        float bv = 0.0f;
        int be = -1;
        for (int e = static_cast<int>(lane); e < E; e += 32) {
            const float v = choice[e];
            if (isnan(v)) continue;  // taken
            if (be < 0 || v > bv) {
                bv = v;
                be = e;
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oe = __shfl_xor_sync(0xffffffffu, be, off);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) {
                bv = ov;
                be = oe;
            }
        }
        if (lane == 0) {
            ids[j] = be;
            choice[be] = NAN;
        }
        __syncwarp();
    }
    if (lane != 0) return;
    float* w = p.weights + i * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += s[ids[j]];
    for (int64_t j = 0; j < k; ++j) {
        float wj = s[ids[j]];
        if (p.norm_topk_prob) wj /= (sum + 1e-20f);
        w[j] = wj * p.routed_scaling_factor;
    }
}

constexpr int kSmallWarps = 8;     // warps per CTA
constexpr int kGateUpPerWarp = 2;  // features per warp (a gate and an up row each)
constexpr int kGateUpPerCta = kSmallWarps * kGateUpPerWarp;
constexpr int kDownPerWarp = 4;  // outputs per warp
constexpr int kDownSteps = 4;    // 16-B loads per row and lane in flight at once (warp_dots' U)
constexpr int kDownPerCta = kSmallWarps * kDownPerWarp;
constexpr int kSmallSmem = kMoeSmallMaxRow * 4;  // the activation row staged: d or ff floats
// Only bf16 weights stage the activation row in shared memory (rounded to bf16 once); fp8 and fp32 weights read it
// through L1 (the weights bypass L1): no staging pass and barrier before a CTA's first weight load. One MoE layer at
// one token (256 experts, 8 per token, FP8): 98.4 -> 87.2 µs, 3.07 -> 3.46 TB/s (bench_gemm --moe-tokens, H200,
// bench/results/cuda-h200-2026-12-01-d3e8f6e-moe-small-nostage-ab.txt).
template <class W>
constexpr bool kSmallStaged = std::is_same_v<W, __nv_bfloat16>;
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// Dots of the shared-memory row a[len] (already rounded like the weights) with R weight rows, by one warp: each
// step loads 16 B of every row, U steps' loads of all R rows in flight at once, then sums over the warp. Every lane
// gets the R results. (The order of the additions does not depend on U.)
template <class W, int R, int U = 2>
__device__ __forceinline__ void warp_dots(const float* a, const W* const (&wr)[R], const float* const (&sr)[R],
                                          int64_t len, float (&out)[R]) {
    float acc[R];
#pragma unroll
    for (int q = 0; q < R; ++q) acc[q] = 0.0f;
    const int lane = threadIdx.x & 31;
    bool vec = true;
#pragma unroll
    for (int q = 0; q < R; ++q) vec = vec && (reinterpret_cast<uintptr_t>(wr[q]) & 15) == 0;
    vec = vec && (reinterpret_cast<uintptr_t>(a) & 15) == 0;
    constexpr int kPer = 16 / sizeof(W);  // elements per 16-B load
    // acc[q] += row q's 16-B chunk `raw` at column c · a[c .. c + kPer)
    const auto accum = [&](int q, const uint4& raw, int64_t c) {
        float xa[kPer];
#pragma unroll
        for (int e = 0; e < kPer / 4; ++e) {  // c is a multiple of kPer here: 16-B aligned
            const float4 v = *reinterpret_cast<const float4*>(a + c + 4 * e);
            xa[4 * e] = v.x, xa[4 * e + 1] = v.y, xa[4 * e + 2] = v.z, xa[4 * e + 3] = v.w;
        }
        if constexpr (std::is_same_v<W, uint8_t>) {  // e4m3, the scale of the 128-column block
            const uint32_t* u = reinterpret_cast<const uint32_t*>(&raw);
            float part = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float4 f = e4m3x4_to_float4(u[e]);
                part += f.x * xa[4 * e] + f.y * xa[4 * e + 1] + f.z * xa[4 * e + 2] + f.w * xa[4 * e + 3];
            }
            acc[q] = fmaf(sr[q][c / 128], part, acc[q]);
        } else if constexpr (std::is_same_v<W, __nv_bfloat16>) {
            const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 f = __bfloat1622float2(b[e]);
                acc[q] = fmaf(xa[2 * e], f.x, acc[q]);
                acc[q] = fmaf(xa[2 * e + 1], f.y, acc[q]);
            }
        } else {
            const float* f = reinterpret_cast<const float*>(&raw);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[q] = fmaf(xa[e], f[e], acc[q]);
        }
    };
    if (vec && len % kPer == 0) {
        constexpr int kStep = 32 * kPer;
        int64_t c = lane * kPer;
        for (; c + (U - 1) * kStep < len; c += U * kStep) {  // U steps' loads of every row in flight
            uint4 r[U][R];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int q = 0; q < R; ++q) r[u][q] = load_weights16(wr[q] + c + u * kStep);
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int q = 0; q < R; ++q) accum(q, r[u][q], c + u * kStep);
        }
        for (; c < len; c += kStep) {
            uint4 r0[R];
#pragma unroll
            for (int q = 0; q < R; ++q) r0[q] = load_weights16(wr[q] + c);
#pragma unroll
            for (int q = 0; q < R; ++q) accum(q, r0[q], c);
        }
    } else {
        for (int64_t c = lane; c < len; c += 32) {
#pragma unroll
            for (int q = 0; q < R; ++q) {
                float wv;
                if constexpr (std::is_same_v<W, uint8_t>)
                    wv = fp8_to_f32(wr[q][c]) * sr[q][c / 128];
                else if constexpr (std::is_same_v<W, __nv_bfloat16>)
                    wv = __bfloat162float(wr[q][c]);
                else
                    wv = wr[q][c];
                acc[q] = fmaf(a[c], wv, acc[q]);
            }
        }
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], off);
        out[q] = acc[q];
    }
}

template <class W>
__device__ __forceinline__ float round_like(float v) {
    if constexpr (std::is_same_v<W, __nv_bfloat16>)
        return __bfloat162float(__float2bfloat16_rn(v));
    else
        return v;
}

// The three kernels run under programmatic dependent launch: each lets the next one's CTAs start at once
// (griddepcontrol.launch_dependents), and the down kernel pulls its weight rows towards L2 before it waits for h
// (griddepcontrol.wait), so it streams them while the gate/up kernel's last CTAs finish (pdl_* in launch_ex.cuh).

// grid (ceil(ff / kGateUpPerCta), n · k): h[row, f] for the row's expert; each warp kGateUpPerWarp features.
template <class W>
__global__ void __launch_bounds__(kSmallWarps * 32, 1) moe_small_gate_up_kernel(MoeSmallParams p) {
    extern __shared__ float s_x[];  // [d], bf16 weights only (kSmallStaged)
    pdl_trigger();
    const int64_t row = blockIdx.y, t = row / p.k;
    const int32_t e = p.ids[row];
    const W* gate = e >= 0 && e < p.n_exp ? static_cast<const W*>(p.experts[6 * e]) : nullptr;
    const W* up = gate ? static_cast<const W*>(p.experts[6 * e + 1]) : nullptr;
    const float* sg = gate ? static_cast<const float*>(p.experts[6 * e + 3]) : nullptr;  // fp8: block scales
    const float* su = gate ? static_cast<const float*>(p.experts[6 * e + 4]) : nullptr;
    const int64_t ncb = (p.d + 127) / 128;
    constexpr bool kStage = kSmallStaged<W>;
    if constexpr (kStage) {
        for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) s_x[c] = round_like<W>(p.x[t * p.d + c]);
        __syncthreads();
    }
    const float* xa = kStage ? s_x : p.x + t * p.d;
    const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kGateUpPerCta + (threadIdx.x >> 5) * kGateUpPerWarp;
    if (f0 >= p.ff) return;
    float hv[kGateUpPerWarp] = {};
    if (gate != nullptr) {
        const W* rows[2 * kGateUpPerWarp];
        const float* srows[2 * kGateUpPerWarp];
#pragma unroll
        for (int q = 0; q < kGateUpPerWarp; ++q) {
            const int64_t f = min(f0 + q, p.ff - 1);  // a past-the-end feature reads the last row, unused
            rows[2 * q] = gate + f * p.d;
            rows[2 * q + 1] = up + f * p.d;
            srows[2 * q] = sg ? sg + (f / 128) * ncb : nullptr;
            srows[2 * q + 1] = su ? su + (f / 128) * ncb : nullptr;
        }
        float dots[2 * kGateUpPerWarp];
        warp_dots<W, 2 * kGateUpPerWarp>(xa, rows, srows, p.d, dots);
#pragma unroll
        for (int q = 0; q < kGateUpPerWarp; ++q) hv[q] = silu(dots[2 * q]) * dots[2 * q + 1];
    }
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int q = 0; q < kGateUpPerWarp; ++q)
            if (f0 + q < p.ff) p.h[row * p.ff + f0 + q] = hv[q];
    }
}

// grid (ceil(d / kDownPerCta), n, k): yk[t, j, o] = w[t, j] · (ĥ_{t,j} · down_e[o]) for choice j = blockIdx.z, 0
// for an expert held elsewhere; moe_small_sum_kernel then adds the k choices in order (float atomics into y made
// the sum's order, and decode, depend on timing). Each warp kDownPerWarp outputs.
// Each warp has all 4 steps of its 4 rows in flight at once for GLM-5.2's 2-KB FP8 rows (kDownSteps; the gate/up
// kernel's rows are 6 KB): one MoE layer at one token 85.9 -> 85.0 µs, 2 tokens 165.2 -> 164.1, 4 tokens 315.4 ->
// 313.5 (H200, bench/results/cuda-h200-2026-12-01-c589eed-moe-down-steps-ab.txt). That needs the bound of 2 CTAs per
// SM: with 1, ptxas takes 154 registers, and one CTA per SM. (Three steps for gate/up gained nothing.)
template <class W>
__global__ void __launch_bounds__(kSmallWarps * 32, 2) moe_small_down_kernel(MoeSmallParams p) {
    extern __shared__ float s_h[];  // [ff], bf16 weights only
    const int64_t t = blockIdx.y, j = blockIdx.z;
    const int32_t e = p.ids[t * p.k + j];
    const W* down = e >= 0 && e < p.n_exp ? static_cast<const W*>(p.experts[6 * e + 2]) : nullptr;
    const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kDownPerCta + (threadIdx.x >> 5) * kDownPerWarp;
    float* yk = p.yk + (t * p.k + j) * p.d;
    pdl_trigger();
    if (down == nullptr) {  // (yk is not the gate/up kernel's: no need to wait for it)
        if ((threadIdx.x & 31) < kDownPerWarp && o0 + (threadIdx.x & 31) < p.d) yk[o0 + (threadIdx.x & 31)] = 0.f;
        return;
    }
    if (o0 < p.d) {  // this warp's weight rows towards L2, one 128-B line per lane and step
        const uint8_t* first = reinterpret_cast<const uint8_t*>(down + o0 * p.ff);
        const int64_t bytes = min(static_cast<int64_t>(kDownPerWarp), p.d - o0) * p.ff * static_cast<int64_t>(sizeof(W));
        for (int64_t b = (threadIdx.x & 31) * 128; b < bytes; b += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(first + b));
    }
    pdl_wait();  // h
    constexpr bool kStage = kSmallStaged<W>;
    if constexpr (kStage) {
        for (int64_t c = threadIdx.x; c < p.ff; c += blockDim.x)
            s_h[c] = round_like<W>(p.h[(t * p.k + j) * p.ff + c]);
        __syncthreads();
    }
    const float* ha = kStage ? s_h : p.h + (t * p.k + j) * p.ff;
    if (o0 >= p.d) return;
    const float* sd = static_cast<const float*>(p.experts[6 * e + 5]);
    const int64_t ncb = (p.ff + 127) / 128;
    const W* rows[kDownPerWarp];
    const float* srows[kDownPerWarp];
#pragma unroll
    for (int q = 0; q < kDownPerWarp; ++q) {
        const int64_t o = min(o0 + q, p.d - 1);
        rows[q] = down + o * p.ff;
        srows[q] = sd ? sd + (o / 128) * ncb : nullptr;
    }
    float dots[kDownPerWarp];
    warp_dots<W, kDownPerWarp, kDownSteps>(ha, rows, srows, p.ff, dots);
    const float wj = p.w[t * p.k + j];
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int q = 0; q < kDownPerWarp; ++q)
            if (o0 + q < p.d) yk[o0 + q] = wj * dots[q];
    }
}

// y[t, o] = Σ_j yk[t, j, o], j = 0 .. k-1 in order.
__global__ void moe_small_sum_kernel(const float* __restrict__ yk, float* __restrict__ y, int64_t n, int64_t k,
                                     int64_t d) {
    pdl_wait();  // yk
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    const int64_t t = i / d, o = i % d;
    float v = 0.f;
    for (int64_t j = 0; j < k; ++j) v += yk[(t * k + j) * d + o];
    y[i] = v;
}

template <class W>
cudaError_t launch_small(const MoeSmallParams& p, cudaStream_t stream) {
    const size_t smem_x = kSmallStaged<W> ? static_cast<size_t>(p.d) * 4 : 0;
    const size_t smem_h = kSmallStaged<W> ? static_cast<size_t>(p.ff) * 4 : 0;
    const cudaError_t e = per_device_once([] {
        const cudaError_t e1 = cudaFuncSetAttribute(moe_small_gate_up_kernel<W>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallSmem);
        return e1 != cudaSuccess ? e1
                                 : cudaFuncSetAttribute(moe_small_down_kernel<W>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallSmem);
    });
    if (e != cudaSuccess) return e;
    const dim3 g1(static_cast<unsigned>((p.ff + kGateUpPerCta - 1) / kGateUpPerCta), static_cast<unsigned>(p.n * p.k));
    moe_small_gate_up_kernel<W><<<g1, kSmallWarps * 32, smem_x, stream>>>(p);
    const dim3 g2(static_cast<unsigned>((p.d + kDownPerCta - 1) / kDownPerCta), static_cast<unsigned>(p.n),
                  static_cast<unsigned>(p.k));
    // MEGACTX_MOE_PDL=0 launches the down and sum kernels plainly (A/B; their griddepcontrol.wait is then a no-op).
    static const bool pdl = [] {
        const char* v = std::getenv("MEGACTX_MOE_PDL");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    cudaError_t le = launch_ex(moe_small_down_kernel<W>, g2, dim3(kSmallWarps * 32), smem_h, stream, pdl, p);
    if (le != cudaSuccess) return le;
    const int64_t total = p.n * p.d;
    le = launch_ex(moe_small_sum_kernel, dim3(static_cast<unsigned>((total + 255) / 256)), dim3(256), 0, stream, pdl,
                   p.yk, p.y, p.n, p.k, p.d);
    if (le != cudaSuccess) return le;
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_moe_route(const MoeRouteKernelParams& p, cudaStream_t stream) {
    if (p.n == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(2 * p.n_exp + p.n_group) * 4;
    moe_route_kernel<<<static_cast<unsigned>(p.n), 128, smem, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t launch_moe_small(const MoeSmallParams& p, cudaStream_t stream) {
    if (p.n == 0) return cudaSuccess;
    if (p.d > kMoeSmallMaxRow || p.ff > kMoeSmallMaxRow) return cudaErrorInvalidValue;
    if (p.wtype == 2) return launch_small<uint8_t>(p, stream);
    return p.wtype == 1 ? launch_small<__nv_bfloat16>(p, stream) : launch_small<float>(p, stream);
}

}  // namespace megactx::cuda
