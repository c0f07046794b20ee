// RoPE in place (contract: rope.h; model-spec §2.3). One thread per (token, head, pair); the frequencies come
// from the host (ops/rope.h, in fp32 as transformers and the CPU oracle compute them).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/rope_pair.cuh"
#include "backend/cuda/rope.h"

namespace megactx::cuda {

namespace {

__global__ void rope_kernel(float* x, int64_t n, int64_t n_head, int64_t d_head, int64_t offset, int64_t dim,
                            const int32_t* pos, const float* inv_freq, float scale, int64_t stride, int64_t partner) {
    const int64_t half = dim / 2, total = n * n_head * half;
    for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
        const int64_t i = k % half, th = k / half, t = th / n_head;
        float* v = x + th * d_head + offset + stride * i;
        float x0 = v[0], x1 = v[partner];
        rope_rotate_pair(__fmul_rn(static_cast<float>(pos[t]), inv_freq[i]), scale, x0, x1);
        v[0] = x0;
        v[partner] = x1;
    }
}

}  // namespace

cudaError_t launch_rope(float* x, int64_t n, int64_t n_head, int64_t d_head, int64_t offset, int64_t dim,
                        const int32_t* pos, const float* inv_freq, float scale, bool interleaved, cudaStream_t stream) {
    const int64_t total = n * n_head * (dim / 2);
    if (total == 0) return cudaSuccess;
    const int64_t blocks = (total + 255) / 256;
    rope_kernel<<<static_cast<unsigned>(blocks > 65535 * 8 ? 65535 * 8 : blocks), 256, 0, stream>>>(
        x, n, n_head, d_head, offset, dim, pos, inv_freq, scale, interleaved ? 2 : 1, interleaved ? 1 : dim / 2);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
