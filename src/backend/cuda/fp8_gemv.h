// fp8_gemv: y = x · Wᵀ for a few rows of x against FP8 weights read as FP8 (decode: half the bytes of the bf16
// copy the GEMMs use). W is e4m3 [out, in] with fp32 block scales s [ceil(out / B), ceil(in / B)]:
// W[o, c] = e4m3(o, c) · s[o / B, c / B] (GLM-5.2-FP8's 128 × 128 weight blocks). x stays fp32 (not rounded to
// bf16); fp32 accumulation, the scale applied once per row and block of B columns.
//   x [n, in] fp32, y [n, out] fp32
// CudaOps sends one or two rows here (CudaOptions::fp8_gemv_max_rows) and 3-16 rows to fp8_gemm_small.h: one row of
// o_proj streams at ~3.8 TB/s, but the CUDA-core time grows with the rows (o_proj at 8 rows: 148 µs here against
// 38 µs on the tensor cores; bench_gemm --decode-rows). Launched plainly, not under PDL: fetching the first weights
// before griddepcontrol.wait cost registers in the loop (up to 20% slower decode steps as graphs) or gained nothing
// (bench/results/cuda-h200-2026-12-01-c21dfff-decode-pdl-lab.txt).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct Fp8GemvParams {
    const float* x = nullptr;
    const uint8_t* w = nullptr;
    const float* scales = nullptr;
    float* y = nullptr;
    int64_t n = 0, out = 0, in = 0, block = 128;
};

constexpr int64_t kFp8GemvMaxRows = 8;
// n <= kFp8GemvMaxRows, in a multiple of 4, block 128.
bool fp8_gemv_supported(int64_t n, int64_t in, int64_t block);
cudaError_t launch_fp8_gemv(const Fp8GemvParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
