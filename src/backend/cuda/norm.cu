// RMSNorm and LayerNorm over the last dim (contract: norm.h; model-spec §1.2, §3.1). One block per row, block
// reductions in fp32 (RMSNorm: float4 rows held in registers when d is a multiple of 4 up to 16384); the per-element
// formula is the CPU oracle's (w · (x · r) and (x − mean) · r · w + b).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/norm.h"

namespace megactx::cuda {

namespace {

constexpr int kThreads = 256;

// kAdd: x += delta first (written back to x_out, which is x), then the norm of the sum: the pre-norm residual step
// in one pass instead of an add kernel and a norm kernel (a decode step runs two per layer, ~3 µs each at one row).
template <bool kAdd>
__global__ void rms_norm_kernel(const float* x, const float* delta, float* x_out, const float* w, float eps, int64_t d,
                                float* y) {
    __shared__ float red[32];
    const float* xi = x + blockIdx.x * d;
    float* yi = y + blockIdx.x * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float v = xi[j];
        if constexpr (kAdd) {
            v += delta[blockIdx.x * d + j];
            x_out[blockIdx.x * d + j] = v;  // each thread re-reads only what it wrote
        }
        ss = fmaf(v, v, ss);
    }
    ss = block_reduce<false>(ss, red);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    const float* xs = kAdd ? x_out + blockIdx.x * d : xi;  // the sum, as written
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yi[j] = w[j] * (xs[j] * r);
}

// Rows of d = 4 · d4 floats, 16-B aligned: each thread keeps its V float4s in registers between the sum of
// squares and the scaling (one read of the row), 512 threads. A decode step runs ~3 norms per layer on one row of
// 6144: latency, not bandwidth, is what counts there.
constexpr int kVecThreads = 512;

template <int V, bool kAdd>
__global__ void __launch_bounds__(kVecThreads) rms_norm_vec_kernel(const float4* x, const float4* delta, float4* x_out,
                                                                   const float4* w, float eps, int64_t d4, float4* y) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x * d4;
    float4 v[V];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < V; ++u) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(u) * kVecThreads;
        v[u] = j < d4 ? x[row + j] : make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (kAdd) {
            if (j < d4) {
                const float4 e = delta[row + j];
                v[u] = make_float4(v[u].x + e.x, v[u].y + e.y, v[u].z + e.z, v[u].w + e.w);  // as add: x + delta
                x_out[row + j] = v[u];
            }
        }
        // Explicit FMAs: the fused (kAdd) and plain instantiations must round alike, whatever nvcc contracts. A change
        // elsewhere in this kernel once made them differ (CudaOpsTest.AddRmsNorm compares them bit for bit).
        ss = fmaf(v[u].x, v[u].x, ss);
        ss = fmaf(v[u].y, v[u].y, ss);
        ss = fmaf(v[u].z, v[u].z, ss);
        ss = fmaf(v[u].w, v[u].w, ss);
    }
    ss = block_reduce<false>(ss, red);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(4 * d4) + eps);
#pragma unroll
    for (int u = 0; u < V; ++u) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(u) * kVecThreads;
        if (j < d4) {
            const float4 g = w[j];
            y[row + j] = make_float4(g.x * (v[u].x * r), g.y * (v[u].y * r), g.z * (v[u].z * r), g.w * (v[u].w * r));
        }
    }
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

template <bool kAdd>
cudaError_t launch_norm(const float* x, const float* delta, float* x_out, const float* w, float eps, int64_t n,
                        int64_t d, float* y, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const auto aligned = [](const void* p) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    const int64_t d4 = d / 4, per = (d4 + kVecThreads - 1) / kVecThreads;
    const unsigned grid = static_cast<unsigned>(n);
    if (d % 4 == 0 && per <= 8 && aligned(x) && aligned(w) && aligned(y) && aligned(delta)) {
        const auto* x4 = reinterpret_cast<const float4*>(x);
        const auto* d4p = reinterpret_cast<const float4*>(delta);
        auto* xo4 = reinterpret_cast<float4*>(x_out);
        const auto* w4 = reinterpret_cast<const float4*>(w);
        auto* y4 = reinterpret_cast<float4*>(y);
        if (per <= 1)
            rms_norm_vec_kernel<1, kAdd><<<grid, kVecThreads, 0, stream>>>(x4, d4p, xo4, w4, eps, d4, y4);
        else if (per <= 2)
            rms_norm_vec_kernel<2, kAdd><<<grid, kVecThreads, 0, stream>>>(x4, d4p, xo4, w4, eps, d4, y4);
        else if (per <= 4)
            rms_norm_vec_kernel<4, kAdd><<<grid, kVecThreads, 0, stream>>>(x4, d4p, xo4, w4, eps, d4, y4);
        else
            rms_norm_vec_kernel<8, kAdd><<<grid, kVecThreads, 0, stream>>>(x4, d4p, xo4, w4, eps, d4, y4);
        return cudaGetLastError();
    }
    rms_norm_kernel<kAdd><<<grid, kThreads, 0, stream>>>(x, delta, x_out, w, eps, d, y);
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t d, float* y,
                            cudaStream_t stream) {
    return launch_norm<false>(x, nullptr, nullptr, w, eps, n, d, y, stream);
}

cudaError_t launch_add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t d, float* y,
                                cudaStream_t stream) {
    return launch_norm<true>(x, delta, x, w, eps, n, d, y, stream);
}

cudaError_t launch_layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n, int64_t d, float* y,
                              cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    layer_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, b, eps, d, y);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
