// act_quant: the activation side of the W8A8 block-scaled FP8 GEMM (GLM-5.2-FP8 checkpoints, model-spec §7.2):
// each row of x is cut into groups of 128 columns (the last may be partial) and each group quantised to e4m3 with
// its own fp32 scale, s = amax / 448 (1 for an all-zero group), q = e4m3(x / s) rounded to nearest, saturating;
// the transformers / DeepSeek `act_quant` formula. The layouts are the ones cuBLASLt's VEC128_32F mode reads for
// the B operand (measured on the H200, bench/results/cuda-h200-2026-11-30-fp8-gemm-probe.txt):
//   x       [n, k] fp32, row-major
//   q       [n_pad, k] e4m3 codes, row-major; rows n .. n_pad-1 are zero
//   scales  [ceil(k / 128), n_pad] fp32, the token index fastest; padded rows get 1
// n_pad ≥ n is the caller's choice (cuBLASLt wants the token count a multiple of 4 here).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// One warp per (row, 128-column group); returns cudaGetLastError() (cudaErrorInvalidValue when n_pad < n).
cudaError_t launch_act_quant_fp8(const float* x, int64_t n, int64_t k, int64_t n_pad, uint8_t* q, float* scales,
                                 cudaStream_t stream);

}  // namespace megactx::cuda
