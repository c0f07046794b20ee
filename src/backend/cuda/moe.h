// Contract of the MoE router (moe.cu), one block per token: sigmoid scores, bias for choice only, group limit
// (group score = sum of its two best choice scores, keep topk_group groups), top-k by choice (ties to the
// lower expert id, in that order), weights = scores renormalised (optional) × routed_scaling_factor.
//   logits [n, n_exp] fp32, bias [n_exp], ids [n, top_k] int32, weights [n, top_k]
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct MoeRouteKernelParams {
    const float* logits = nullptr;
    const float* bias = nullptr;
    int32_t* ids = nullptr;
    float* weights = nullptr;
    int64_t n = 0, n_exp = 0, n_group = 1, topk_group = 1, top_k = 1;
    bool norm_topk_prob = true;
    float routed_scaling_factor = 1.0f;
};

cudaError_t launch_moe_route(const MoeRouteKernelParams& p, cudaStream_t stream);

// Routed experts of a few tokens without a host round trip (decode; capturable in a CUDA graph). Token t's
// j-th choice e = ids[t, j] runs expert e's SwiGLU MLP, its weights found through the device table
// experts[6 e + {0, 1, 2}] = gate [ff, d], up [ff, d], down [d, ff] (row-major; fp32, bf16 or e4m3 as `wtype`
// says) and, for e4m3, experts[6 e + {3, 4, 5}] = their fp32 128 × 128 block scales (null otherwise). A null gate:
// an expert this rank does not hold, contributing 0.
//   h[t, j, f] = silu(x̂_t · gate_e[f]) · (x̂_t · up_e[f])     (x̂ = x rounded to bf16 for bf16 weights, else x)
//   y[t, o]   = Σ_j w[t, j] · (ĥ_{t,j} · down_e[o])            (ĥ likewise; the k terms added in order j = 0..k-1)
// fp32 accumulation. bf16: the grouped GEMM path's products in another order; fp32 and e4m3 (weights read as
// they are, scales applied per 128-column block): the CPU oracle's to fp32 rounding.
//   x [n, d] fp32, ids [n, k] int32, w [n, k] fp32, h [n, k, ff] fp32 scratch, y [n, d] fp32
struct MoeSmallParams {
    const float* x = nullptr;
    const int32_t* ids = nullptr;
    const float* w = nullptr;
    const void* const* experts = nullptr;  // device [n_exp][6]
    float* h = nullptr;                    // [n, k, ff] scratch
    float* yk = nullptr;  // [n, k, d] scratch: each choice's weighted expert output, summed in order into y
    float* y = nullptr;
    int64_t n = 0, k = 0, d = 0, ff = 0, n_exp = 0;
    int wtype = 1;  // 0 fp32, 1 bf16, 2 e4m3
};
// cudaErrorInvalidValue when d or ff exceed kMoeSmallMaxRow (bf16 weights stage the activation row in shared memory,
// fp32; fp8 and fp32 weights read it through L1).
constexpr int64_t kMoeSmallMaxRow = 51200;
cudaError_t launch_moe_small(const MoeSmallParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
