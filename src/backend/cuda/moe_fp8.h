// moe_fp8: the routed experts of a few tokens (batched decode) with FP8 experts, grouped by expert on the device.
// Each expert that the step's tokens chose is read once for all of them, on the tensor cores. launch_moe_small
// (moe.h) instead reads an expert once per (token, choice) that picked it. That costs little when every choice is
// a different expert. At GLM-5.2's 8 of 256 experts, 32 tokens make 256 choices but touch ~160 experts, and a small
// expert count (the glm52-shape preset's 2 of 4) re-reads the same weights many times.
//
// It computes the function of moe.h, the SwiGLU expert MLPs and the weighted sum over each token's k choices
// (added in order j = 0..k-1), as W8A8. x (before gate / up) and h (before down) are quantised per 1 × 128 group
// (act_quant.h), and the GEMMs are fp8_gemm_small.h's grouped form. Expert table and shapes as in moe.h; a null
// weight (an expert another rank holds) contributes 0. Six launches, no host round trip (capturable):
//   plan: the active experts and their slots (slot = token · k + choice), in ascending expert and slot order;
//   act_quant(x); gate ‖ up (one grouped GEMM, 2 ff rows); SwiGLU + act_quant(h); down; the ordered weighted sum.
//   x [n, d] fp32, ids [n, k] int32 (valid expert ids), w [n, k] fp32, y [n, d] fp32
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megactx::cuda {

struct MoeFp8Params {
    const float* x = nullptr;
    const int32_t* ids = nullptr;
    const float* w = nullptr;
    const void* const* experts = nullptr;  // device [n_exp][6]: e4m3 gate, up, down, then their block scales
    float* y = nullptr;
    int64_t n = 0, k = 0, d = 0, ff = 0, n_exp = 0;
    void* scratch = nullptr;  // moe_fp8_scratch_bytes(n, k, d, ff, n_exp), 256-byte aligned
    size_t scratch_bytes = 0;
    // The choice on the device (moe_plan.h, launch_moe_fp8_plan with has_cond): per choice when the step's distinct
    // experts exceed this.
    int64_t grouped_max_active = 0;
};

constexpr int64_t kMoeFp8MaxChoices = 1024;  // n · k
constexpr int64_t kMoeFp8MaxExperts = 4096;
// n · k <= kMoeFp8MaxChoices, n_exp <= kMoeFp8MaxExperts, d and ff positive multiples of 128.
bool moe_fp8_supported(int64_t n, int64_t k, int64_t d, int64_t ff, int64_t n_exp);
size_t moe_fp8_scratch_bytes(int64_t n, int64_t k, int64_t d, int64_t ff, int64_t n_exp);
cudaError_t launch_moe_fp8(const MoeFp8Params& p, int n_sm, cudaStream_t stream);
// launch_moe_fp8 in two parts, for the device choice inside a CUDA graph: the plan kernel, which also sets the graph
// conditional `cond` (when has_cond) to 1 for per choice, 0 for grouped; then the grouped kernels (both with the same p).
cudaError_t launch_moe_fp8_plan(const MoeFp8Params& p, cudaStream_t stream, bool has_cond = false,
                                cudaGraphConditionalHandle cond = 0);
cudaError_t launch_moe_fp8_experts(const MoeFp8Params& p, int n_sm, cudaStream_t stream);

}  // namespace megactx::cuda
