// fp8_gemm_small: y = x · Wᵀ for a few rows of x (batched decode, up to 16 tokens) against FP8 weights, W8A8 on the
// tensor cores. The activations come quantised by act_quant (1 × 128 groups, act_quant.h) and W is e4m3 [out, in] with
// fp32 block scales s [ceil(out / 128), in / 128] (fp8_gemv.h's layout):
//   y[t, o] = Σ_b s[o / 128, b] · xs[b, t] · Σ_{c in block b} e4m3(o, c) · xq(t, c)
// which is what the cuBLASLt W8A8 GEMM computes (CudaOptions::fp8_gemm), up to the order of the fp32 sums: each block
// of 128 columns is summed on the tensor cores (mma.sync e4m3, fp32 accumulate), then scaled and added in fp32.
// It exists because at these row counts that GEMM reads a large weight at ~2.5 TB/s and costs ~16 µs on a small one,
// and the CUDA-core GEMV (fp8_gemv.h) slows down linearly with the rows (H200: bench_gemm --decode-rows).
// Launched with programmatic dependent launch: it may start while the previous kernel of the stream (act_quant) runs,
// and reads xq / xs only after griddepcontrol.wait.
//   xq [n_pad, in] e4m3, xs [in / 128, n_pad] fp32: act_quant's output for this n_pad (fp8_gemm_small_pad)
//   y  [n, out] fp32, written for the n real rows only
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct Fp8GemmSmallParams {
    const uint8_t* xq = nullptr;
    const float* xs = nullptr;
    const uint8_t* w = nullptr;
    const float* scales = nullptr;
    float* y = nullptr;
    int64_t n = 0, n_pad = 0, out = 0, in = 0;
};

constexpr int64_t kFp8GemmSmallMaxRows = 16;
// The rows act_quant must produce for n rows: n rounded up to a multiple of 8 (one tensor-core tile of tokens).
int64_t fp8_gemm_small_pad(int64_t n);
// 1 <= n <= kFp8GemmSmallMaxRows, in a positive multiple of 128, out >= 1, 128 × 128 weight blocks.
bool fp8_gemm_small_supported(int64_t n, int64_t out, int64_t in, int64_t block);
// cudaErrorInvalidValue for an unsupported shape, a wrong n_pad, or W / xq not 16-byte aligned.
cudaError_t launch_fp8_gemm_small(const Fp8GemmSmallParams& p, int n_sm, cudaStream_t stream);

// Grouped form, for the few-token MoE (moe_fp8.h): the same kernel over the experts a step's tokens chose, each
// expert's weight read once for all of its tokens. `plan` (device, written by the MoE plan kernel):
//   plan[0] = number of active experts A (<= max_groups);
//   plan[1 + 3a .. 3 + 3a] = expert id, offset into the slot list, slot count (<= max_count), for a < A;
//   plan[1 + 3 max_groups + i] = the slot list: slot s = token · k + choice, each expert's slots in ascending order.
// Expert e's weights come from the device table experts[6e + {0, 1, 2}] (e4m3 [rows, in], 128 × 128 blocks) and
// their scales experts[6e + 3 + {0, 1, 2}]; output rows [0, out0) use table column w0, rows [out0, out0 + out1)
// column w1 (e.g. gate and up side by side). A null weight (an expert another rank holds) gives zeros.
//   activations: row s / k of xq (by_token) or row s, xs [in / 128, xs_stride];  y [slots, out0 + out1] fp32, row s
struct Fp8GemmGroupedParams {
    const uint8_t* xq = nullptr;
    const float* xs = nullptr;
    int64_t xs_stride = 0, in = 0;
    const void* const* experts = nullptr;
    int w0 = 0, w1 = -1;
    int64_t out0 = 0, out1 = 0;
    const int32_t* plan = nullptr;
    int64_t max_groups = 0, max_count = 0;
    int64_t k = 1;
    bool by_token = true;
    float* y = nullptr;
};
// out0 a positive multiple of 16, out1 a multiple of 16 (0: one weight), in a positive multiple of 128.
bool fp8_gemm_grouped_supported(int64_t out0, int64_t out1, int64_t in);
cudaError_t launch_fp8_gemm_grouped(const Fp8GemmGroupedParams& p, int n_sm, cudaStream_t stream);

}  // namespace megactx::cuda
