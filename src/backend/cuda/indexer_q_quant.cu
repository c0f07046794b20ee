// indexer_q_quant kernel: one warp per (token, head), 4 consecutive dims per lane.
//   q [n, H, 128] fp32, gates [n, H] → q8 [n, H, 128] e4m3, w8 [n, H] fp32, H = 32 or 64 (see indexer_q_quant.h)
// Reference: (hadamard_transform +) fp8_pow2_scale + f32_to_fp8e4m3 (kv_format.cpp, core/dtype.cpp), model-spec §3.3.
#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/indexer_q_quant.h"

namespace megactx {

using namespace cuda_indexer;

namespace {

__global__ void __launch_bounds__(256) indexer_q_quant_kernel(IndexerQQuantParams p) {
    // The kernel launched next (programmatic dependent launch: the plan kernel, or the logits kernel, which waits for
    // this grid) may become resident now.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    if (p.plan != nullptr && blockIdx.x == 0) {  // one row per sequence: the plan indexer_plan_kernel would write
        const int n = static_cast<int>(p.n);
        int32_t* ext = p.plan + n + 2;
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            const int i = static_cast<int>(p.row_begin) + r;
            p.plan[1 + r] = i;
            ext[2 * r] = p.table_offset[p.seq[i]];
            ext[2 * r + 1] = p.pos[i];
            if (p.lengths) p.lengths[r] = p.pos[i] + 1;
        }
        if (threadIdx.x == 0) {
            p.plan[0] = n;
            p.plan[1 + n] = static_cast<int>(p.row_begin) + n;
        }
        for (int64_t j = threadIdx.x; j < p.zero_n; j += blockDim.x) p.zero[j] = 0;
    }
    const int lane = threadIdx.x & 31;
    const int64_t ih = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // token · H + head
    if (ih >= p.n * p.n_head) return;
    const float4 x4 = reinterpret_cast<const float4*>(p.q + ih * kDim)[lane];
    float x[4] = {x4.x, x4.y, x4.z, x4.w};
    if (p.hadamard_scale > 0.0f) warp_hadamard128(x, lane, p.hadamard_scale);  // uniform over the warp
    const float amax = warp_max(fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3]))));
    const float scale = fp8_pow2_scale(amax);
    reinterpret_cast<uint32_t*>(p.q8 + ih * kDim)[lane] = fp8_pack4(x[0], x[1], x[2], x[3], 1.0f / scale);
    if (lane == 0) p.w8[ih] = p.gates[ih] * p.head_scale * p.softmax_scale * scale;
}

}  // namespace

bool indexer_q_quant_supported(int64_t n_head, int64_t d_indexer) {
    return (n_head == kHeads || n_head == 2 * kHeads) && d_indexer == kDim;
}

void launch_indexer_q_quant(const IndexerQQuantParams& p, cudaStream_t stream) {
    if (p.n <= 0) return;
    constexpr int kWarps = 8;
    const auto grid = static_cast<unsigned>((p.n * p.n_head + kWarps - 1) / kWarps);
    // Launched plainly (no PDL): it starts once every earlier kernel of the stream has completed, which the plan
    // kernel behind it relies on when it zeroes the top-k's control words (IndexerPlanParams::zero).
    indexer_q_quant_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
}

}  // namespace megactx
