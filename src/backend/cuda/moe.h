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

}  // namespace megactx::cuda
