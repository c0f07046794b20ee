// RMSNorm and LayerNorm over the last dim (contract: norm.h; model-spec §1.2, §3.1). One block per row, block
// reductions in fp32; the per-element formula is the CPU oracle's (w · (x · r) and (x − mean) · r · w + b).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/norm.h"

namespace megactx::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t d, float* y) {
    __shared__ float red[32];
    const float* xi = x + blockIdx.x * d;
    float* yi = y + blockIdx.x * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
    ss = block_reduce<false>(ss, red);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yi[j] = w[j] * (xi[j] * r);
}

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float eps, int64_t d, float* y) {
    __shared__ float red[32];
    const float* xi = x + blockIdx.x * d;
    float* yi = y + blockIdx.x * d;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xi[j];
    const float mean = block_reduce<false>(s, red) / static_cast<float>(d);
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v += (xi[j] - mean) * (xi[j] - mean);
    const float var = block_reduce<false>(v, red) / static_cast<float>(d);
    const float r = 1.0f / sqrtf(var + eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yi[j] = (xi[j] - mean) * r * w[j] + b[j];
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t d, float* y,
                            cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, eps, d, y);
    return cudaGetLastError();
}

cudaError_t launch_layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n, int64_t d, float* y,
                              cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    layer_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, b, eps, d, y);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
