// fp8_gemv: y = x · Wᵀ for a few rows of x against FP8 weights read as FP8 (decode: half the bytes of the bf16
// copy the GEMMs use). W is e4m3 [out, in] with fp32 block scales s [ceil(out / B), ceil(in / B)]:
// W[o, c] = e4m3(o, c) · s[o / B, c / B] (GLM-5.2-FP8's 128 × 128 weight blocks). x stays fp32 (not rounded to
// bf16); fp32 accumulation, the scale applied once per row and block of B columns.
//   x [n, in] fp32, y [n, out] fp32
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
