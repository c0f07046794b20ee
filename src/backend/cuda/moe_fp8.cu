// moe_fp8 (contract: moe_fp8.h): the plan, SwiGLU + quantisation and combine kernels around two grouped GEMMs.
#include "backend/cuda/moe_fp8.h"

#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/fp8_gemm_small.h"

namespace megactx::cuda {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int64_t max_groups(int64_t n, int64_t k, int64_t n_exp) { return std::min(n * k, n_exp); }

struct Layout {
    size_t plan, xq, xs, gu, hq, hs, yk, total;
};
Layout layout(int64_t n, int64_t k, int64_t d, int64_t ff, int64_t n_exp) {
    const int64_t nk = n * k;
    Layout l{};
    size_t at = 0;
    l.plan = at, at += align_up(static_cast<size_t>(1 + 3 * max_groups(n, k, n_exp) + nk) * 4);
    l.xq = at, at += align_up(static_cast<size_t>(n * d));
    l.xs = at, at += align_up(static_cast<size_t>(d / 128 * n) * 4);
    l.gu = at, at += align_up(static_cast<size_t>(nk * 2 * ff) * 4);
    l.hq = at, at += align_up(static_cast<size_t>(nk * ff));
    l.hs = at, at += align_up(static_cast<size_t>(ff / 128 * nk) * 4);
    l.yk = at, at += align_up(static_cast<size_t>(nk * d) * 4);
    l.total = at;
    return l;
}

// One CTA: count each expert's choices, number the active experts (count > 0) in ascending id, and place every slot
// s = t · k + j after the earlier slots of its expert. Plan layout: fp8_gemm_small.h (Fp8GemmGroupedParams::plan).
// has_cond (the device choice, launch_moe_fp8_plan): the graph conditional `cond` is set to 1 (per choice) when more
// than max_active experts are active, else 0.
constexpr int kPlanThreads = 256;
__global__ void __launch_bounds__(kPlanThreads)
    moe_fp8_plan_kernel(const int32_t* __restrict__ ids, int nk, int n_exp, int groups, int32_t* __restrict__ plan,
                        int max_active, bool has_cond, cudaGraphConditionalHandle cond) {
    extern __shared__ int smem[];
    int* cnt = smem;            // [n_exp]
    int* off = smem + n_exp;    // [n_exp] first slot-list position of each expert
    int* s_ids = off + n_exp;   // [nk]
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) cnt[e] = 0;
    for (int i = threadIdx.x; i < nk; i += blockDim.x) s_ids[i] = ids[i];
    __syncthreads();
    for (int i = threadIdx.x; i < nk; i += blockDim.x) atomicAdd(&cnt[s_ids[i]], 1);
    __syncthreads();
    if (threadIdx.x < 32) {  // one warp scans the experts: slot offsets and active numbers
        const int lane = threadIdx.x, per = (n_exp + 31) / 32, e0 = lane * per, e1 = min(n_exp, e0 + per);
        int sum = 0, act = 0;
        for (int e = e0; e < e1; ++e) sum += cnt[e], act += cnt[e] > 0;
        int sum_in = sum, act_in = act;  // inclusive scans over the lanes
        for (int o = 1; o < 32; o <<= 1) {
            const int s = __shfl_up_sync(0xffffffffu, sum_in, o), a = __shfl_up_sync(0xffffffffu, act_in, o);
            if (lane >= o) sum_in += s, act_in += a;
        }
        int base = sum_in - sum, a = act_in - act;
        for (int e = e0; e < e1; ++e) {
            off[e] = base;
            if (cnt[e] > 0) {
                plan[1 + 3 * a] = e;
                plan[2 + 3 * a] = base;
                plan[3 + 3 * a] = cnt[e];
                ++a;
            }
            base += cnt[e];
        }
        if (lane == 31) {
            plan[0] = act_in;
            if (has_cond) cudaGraphSetConditional(cond, act_in > max_active ? 1u : 0u);  // the branch that runs
        }
    }
    __syncthreads();
    int32_t* list = plan + 1 + 3 * groups;
    for (int i = threadIdx.x; i < nk; i += blockDim.x) {
        const int e = s_ids[i];
        int before = 0;
        for (int j = 0; j < i; ++j) before += s_ids[j] == e;
        list[off[e] + before] = i;
    }
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// h[s, f] = silu(gate) · up from gu [nk, 2 ff], quantised per 128-group as act_quant does (one warp per row and group).
constexpr int kQuantThreads = 256;
__global__ void __launch_bounds__(kQuantThreads) moe_fp8_swiglu_quant_kernel(const float* __restrict__ gu, int64_t nk,
                                                                             int64_t ff, uint8_t* __restrict__ hq,
                                                                             float* __restrict__ hs) {
    // The down GEMM behind it (under PDL) may start fetching its weights; it waits for this grid before reading hq.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int64_t groups = ff / 128;
    const int64_t item = static_cast<int64_t>(blockIdx.x) * (kQuantThreads / 32) + (threadIdx.x >> 5);
    if (item >= nk * groups) return;
    const int lane = threadIdx.x & 31;
    const int64_t s = item / groups, b = item % groups;
    const float* g = gu + s * 2 * ff + b * 128;
    float v[4], amax = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        v[j] = silu(g[lane + 32 * j]) * g[ff + lane + 32 * j];
        amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = amax > 0.f ? amax / 448.f : 1.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
        hq[s * ff + b * 128 + lane + 32 * j] = __nv_cvt_float_to_fp8(v[j] / sc, __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) hs[b * nk + s] = sc;
}

// y[t, o] = Σ_j w[t, j] · yk[t · k + j, o], j = 0 .. k-1 in order.
__global__ void moe_fp8_combine_kernel(const float* __restrict__ yk, const float* __restrict__ w, int64_t n, int64_t k,
                                       int64_t d, float* __restrict__ y) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    const int64_t t = i / d, o = i % d;
    float v = 0.f;
    for (int64_t j = 0; j < k; ++j) v += w[t * k + j] * yk[(t * k + j) * d + o];
    y[i] = v;
}

}  // namespace

bool moe_fp8_supported(int64_t n, int64_t k, int64_t d, int64_t ff, int64_t n_exp) {
    return n >= 1 && k >= 1 && n * k <= kMoeFp8MaxChoices && n_exp >= 1 && n_exp <= kMoeFp8MaxExperts && d >= 128 &&
           d % 128 == 0 && ff >= 128 && ff % 128 == 0;
}

size_t moe_fp8_scratch_bytes(int64_t n, int64_t k, int64_t d, int64_t ff, int64_t n_exp) {
    return layout(n, k, d, ff, n_exp).total;
}

namespace {

// The scratch carve-up of one call (checked).
struct Scratch {
    int32_t* plan;
    uint8_t *xq, *hq;
    float *xs, *gu, *hs, *yk;
};
bool carve(const MoeFp8Params& p, Scratch& sc) {
    if (!moe_fp8_supported(p.n, p.k, p.d, p.ff, p.n_exp) || p.experts == nullptr || p.scratch == nullptr ||
        (reinterpret_cast<uintptr_t>(p.scratch) & (kAlign - 1)) != 0)
        return false;
    const Layout l = layout(p.n, p.k, p.d, p.ff, p.n_exp);
    if (p.scratch_bytes < l.total) return false;
    auto* base = static_cast<uint8_t*>(p.scratch);
    sc.plan = reinterpret_cast<int32_t*>(base + l.plan);
    sc.xq = base + l.xq;
    sc.xs = reinterpret_cast<float*>(base + l.xs);
    sc.gu = reinterpret_cast<float*>(base + l.gu);
    sc.hq = base + l.hq;
    sc.hs = reinterpret_cast<float*>(base + l.hs);
    sc.yk = reinterpret_cast<float*>(base + l.yk);
    return true;
}

}  // namespace

cudaError_t launch_moe_fp8_plan(const MoeFp8Params& p, cudaStream_t stream, bool has_cond,
                                cudaGraphConditionalHandle cond) {
    Scratch sc;
    if (!carve(p, sc)) return cudaErrorInvalidValue;
    const int64_t nk = p.n * p.k, groups = max_groups(p.n, p.k, p.n_exp);
    const size_t plan_smem = static_cast<size_t>(2 * p.n_exp + nk) * sizeof(int);
    if (plan_smem > 48 * 1024) return cudaErrorInvalidValue;  // kMoeFp8MaxExperts / MaxChoices keep it below
    moe_fp8_plan_kernel<<<1, kPlanThreads, plan_smem, stream>>>(
        p.ids, static_cast<int>(nk), static_cast<int>(p.n_exp), static_cast<int>(groups), sc.plan,
        static_cast<int>(std::min<int64_t>(p.grouped_max_active, nk)), has_cond, cond);
    return cudaGetLastError();
}

cudaError_t launch_moe_fp8_experts(const MoeFp8Params& p, int n_sm, cudaStream_t stream) {
    Scratch sc;
    if (!carve(p, sc)) return cudaErrorInvalidValue;
    int32_t* plan = sc.plan;
    uint8_t *xq = sc.xq, *hq = sc.hq;
    float *xs = sc.xs, *gu = sc.gu, *hs = sc.hs, *yk = sc.yk;
    const int64_t nk = p.n * p.k, groups = max_groups(p.n, p.k, p.n_exp);
    if (cudaError_t e = launch_act_quant_fp8(p.x, p.n, p.d, p.n, xq, xs, stream); e != cudaSuccess) return e;
    Fp8GemmGroupedParams g;  // gate ‖ up: gu[s] = [x_t · gate_eᵀ, x_t · up_eᵀ], t = s / k
    g.xq = xq;
    g.xs = xs;
    g.xs_stride = p.n;
    g.in = p.d;
    g.experts = p.experts;
    g.w0 = 0;
    g.w1 = 1;
    g.out0 = p.ff;
    g.out1 = p.ff;
    g.plan = plan;
    g.max_groups = groups;
    g.max_count = p.n;  // an expert is chosen at most once per token
    g.k = p.k;
    g.by_token = true;
    g.y = gu;
    if (cudaError_t e = launch_fp8_gemm_grouped(g, n_sm, stream); e != cudaSuccess) return e;

    const int64_t items = nk * (p.ff / 128), per_cta = kQuantThreads / 32;
    moe_fp8_swiglu_quant_kernel<<<static_cast<unsigned>((items + per_cta - 1) / per_cta), kQuantThreads, 0,
                                  stream>>>(gu, nk, p.ff, hq, hs);

    Fp8GemmGroupedParams dn = g;  // down: yk[s] = h_s · down_eᵀ
    dn.xq = hq;
    dn.xs = hs;
    dn.xs_stride = nk;
    dn.in = p.ff;
    dn.w0 = 2;
    dn.w1 = -1;
    dn.out0 = p.d;
    dn.out1 = 0;
    dn.by_token = false;
    dn.y = yk;
    if (cudaError_t e = launch_fp8_gemm_grouped(dn, n_sm, stream); e != cudaSuccess) return e;

    const int64_t total = p.n * p.d;
    moe_fp8_combine_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(yk, p.w, p.n, p.k, p.d,
                                                                                            p.y);
    return cudaGetLastError();
}

cudaError_t launch_moe_fp8(const MoeFp8Params& p, int n_sm, cudaStream_t stream) {
    if (cudaError_t e = launch_moe_fp8_plan(p, stream); e != cudaSuccess) return e;
    return launch_moe_fp8_experts(p, n_sm, stream);
}

}  // namespace megactx::cuda
