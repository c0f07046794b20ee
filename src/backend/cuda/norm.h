// Contract of the row normalisations (norm.cu), one CUDA block per row, fp32:
//   rms_norm:   y = x · rsqrt(mean(x²) + eps) · w            x, y [n, d], w [d]
//   add_rms_norm: x += delta, then rms_norm (x updated in place; the same values as add then rms_norm)
//   layer_norm: y = (x − mean) · rsqrt(var + eps) · w + b     x, y [n, d], w, b [d]
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

cudaError_t launch_rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t d, float* y,
                            cudaStream_t stream);
cudaError_t launch_add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t d, float* y,
                                cudaStream_t stream);
cudaError_t launch_layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n, int64_t d, float* y,
                              cudaStream_t stream);

}  // namespace megactx::cuda
