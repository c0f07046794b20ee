// MoE router selection (contract: moe.h; model-spec §1.2 MoE). Reference: one thread per token walks the CPU
// oracle's steps in the same order and fp32 operations, so ids match exactly and weights to rounding.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe.h"

namespace megactx::cuda {

namespace {

__global__ void moe_route_kernel(MoeRouteKernelParams p) {
    extern __shared__ float smem[];
    float* s = smem;                     // [n_exp] sigmoid scores
    float* choice = smem + p.n_exp;      // [n_exp] choice scores (then −inf once taken or masked)
    float* gscore = smem + 2 * p.n_exp;  // [n_group]
    const int64_t i = blockIdx.x, E = p.n_exp;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        s[e] = 1.0f / (1.0f + expf(-p.logits[i * E + e]));
        choice[e] = s[e] + p.bias[e];
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (p.n_group > 1) {
        const int64_t per = E / p.n_group;
        for (int64_t g = 0; g < p.n_group; ++g) {
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
        // keep the topk_group best groups by (score desc, index asc): a group with ≥ topk_group better ones is masked
        for (int64_t g = 0; g < p.n_group; ++g) {
            int64_t better = 0;
            for (int64_t h = 0; h < p.n_group; ++h) {
                if (gscore[h] > gscore[g] || (gscore[h] == gscore[g] && h < g)) ++better;
            }
            if (better >= p.topk_group) {
                for (int64_t e = g * per; e < (g + 1) * per; ++e) choice[e] = -INFINITY;
            }
        }
    }
    const int64_t k = p.top_k;
    int32_t* ids = p.ids + i * k;
    float* w = p.weights + i * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
            if (isnan(choice[e])) continue;  // taken
            if (best < 0 || choice[e] > choice[best]) best = e;
        }
        ids[j] = static_cast<int32_t>(best);
        choice[best] = NAN;
        sum += s[best];
    }
    for (int64_t j = 0; j < k; ++j) {
        float wj = s[ids[j]];
        if (p.norm_topk_prob) wj /= (sum + 1e-20f);
        w[j] = wj * p.routed_scaling_factor;
    }
}

}  // namespace

cudaError_t launch_moe_route(const MoeRouteKernelParams& p, cudaStream_t stream) {
    if (p.n == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(2 * p.n_exp + p.n_group) * 4;
    moe_route_kernel<<<static_cast<unsigned>(p.n), 128, smem, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
