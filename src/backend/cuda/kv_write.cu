// Reference fused KV-cache writes (contract: kv_write.h; model-spec §2.2, §3.1, §6; kv_format.h). One block per
// token: the row is normalised and rotated in shared memory with the CPU oracle's formulas, then stored in the
// pool's format. FP8 quantisation uses the same fp32 operations as kv_format.cpp (pow2 scale from the amax,
// x / s, RNE satfinite e4m3), so the bytes match the host packer.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kv_write.h"
#include "backend/cuda/rope_pair.cuh"

namespace megactx::cuda {

namespace {

constexpr int kThreads = 256;

// RoPE of v[0, dim) in shared memory at position p (one head): pairs (2i, 2i+1), or (i, i + dim/2) when not
// interleaved; cos and sin times `scale`.
__device__ void rope_shared(float* v, int64_t dim, int32_t p, const float* inv_freq, float scale, bool interleaved) {
    const int64_t stride = interleaved ? 2 : 1, partner = interleaved ? 1 : dim / 2;
    for (int64_t i = threadIdx.x; i < dim / 2; i += blockDim.x) {
        float* x = v + stride * i;
        float x0 = x[0], x1 = x[partner];
        rope_rotate_pair(__fmul_rn(static_cast<float>(p), inv_freq[i]), scale, x0, x1);
        x[0] = x0;
        x[partner] = x1;
    }
}

// v ← H · v over the block (all threads call it): hadamard_transform's butterflies (strides 1, 2, … dim/2) in its
// order, each rounded once, then × scale.
__device__ void hadamard_shared(float* v, int64_t dim, float scale) {
    for (int64_t h = 1; h < dim; h *= 2) {
        for (int64_t j = threadIdx.x; j < dim / 2; j += blockDim.x) {
            const int64_t i = (j / h) * 2 * h + j % h;  // the j-th index with bit h clear
            const float a = v[i], b = v[i + h];
            v[i] = __fadd_rn(a, b);
            v[i + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) v[j] = __fmul_rn(v[j], scale);
    __syncthreads();
}

__global__ void hadamard_rows_kernel(const float* in, float* out, int64_t dim, float scale) {
    extern __shared__ float v[];  // [dim]
    const int64_t r = blockIdx.x;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) v[j] = in[r * dim + j];
    __syncthreads();
    hadamard_shared(v, dim, scale);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) out[r * dim + j] = v[j];
}

__global__ void latent_write_kernel(LatentWriteParams p) {
    extern __shared__ float row[];  // [rank + rope]
    __shared__ float red[32];
    const int64_t t = blockIdx.x, d = p.rank + p.rope;
    const float* x = p.kv_a + t * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        row[j] = x[j];
        if (j < p.rank) ss += x[j] * x[j];
    }
    ss = block_reduce<false>(ss, red);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(p.rank) + p.eps);
    for (int64_t j = threadIdx.x; j < p.rank; j += blockDim.x) row[j] = p.norm_w[j] * (row[j] * r);
    __syncthreads();
    rope_shared(row + p.rank, p.rope, p.pos[t], p.inv_freq, p.rope_scale, true);
    __syncthreads();
    const int64_t slot = p.slots[t];
    if (slot < 0) return;  // the token's block is in the other tier (the whole block returns: one token each)
    if (p.elem == 0) {
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) static_cast<float*>(p.cache)[slot * d + j] = row[j];
        return;
    }
    if (p.elem == 1) {
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            static_cast<uint16_t*>(p.cache)[slot * d + j] = __bfloat16_as_ushort(__float2bfloat16_rn(row[j]));
        }
        return;
    }
    const int64_t tile = p.rank % 128 == 0 ? 128 : p.rank, n_tile = p.rank / tile;
    uint8_t* out = static_cast<uint8_t*>(p.cache) + slot * (p.rank + 4 * n_tile + 2 * p.rope);
    for (int64_t tl = 0; tl < n_tile; ++tl) {
        float amax = 0.0f;
        for (int64_t j = threadIdx.x; j < tile; j += blockDim.x) amax = fmaxf(amax, fabsf(row[tl * tile + j]));
        amax = block_reduce<true>(amax, red);
        const float s = fp8_pow2_scale_dev(amax);
        for (int64_t j = threadIdx.x; j < tile; j += blockDim.x)
            out[tl * tile + j] = f32_to_fp8(row[tl * tile + j] / s);
        if (threadIdx.x == 0) reinterpret_cast<float*>(out + p.rank)[tl] = s;
    }
    // Typed stores (rows, rank and the scales are all 4-byte multiples, so these are aligned): on the H200 the
    // byte-wise memcpy of each bf16 left every low byte wrong (test_cuda_ops, FusedCacheWrites).
    uint16_t* k_pe = reinterpret_cast<uint16_t*>(out + p.rank + 4 * n_tile);
    for (int64_t j = threadIdx.x; j < p.rope; j += blockDim.x) {
        k_pe[j] = __bfloat16_as_ushort(__float2bfloat16_rn(row[p.rank + j]));
    }
}

__global__ void indexer_write_kernel(IndexerWriteParams p) {
    extern __shared__ float key[];  // [dim]
    __shared__ float red[32];
    const int64_t t = blockIdx.x, d = p.dim;
    const float* x = p.k + t * d;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += x[j];
    const float mean = block_reduce<false>(s, red) / static_cast<float>(d);
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v += (x[j] - mean) * (x[j] - mean);
    const float var = block_reduce<false>(v, red) / static_cast<float>(d);
    const float r = 1.0f / sqrtf(var + p.eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) key[j] = (x[j] - mean) * r * p.ln_w[j] + p.ln_b[j];
    __syncthreads();
    rope_shared(key, p.d_rope, p.pos[t], p.inv_freq, p.rope_scale, p.interleaved);
    __syncthreads();
    if (p.elem == 2 && p.hadamard_scale > 0.0f) hadamard_shared(key, d, p.hadamard_scale);
    const int64_t slot = p.slots[t];
    if (slot < 0) return;  // the token's block is in the other tier (the whole block returns: one token each)
    if (p.elem == 0) {
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) static_cast<float*>(p.cache)[slot * d + j] = key[j];
        return;
    }
    if (p.elem == 1) {
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            static_cast<uint16_t*>(p.cache)[slot * d + j] = __bfloat16_as_ushort(__float2bfloat16_rn(key[j]));
        }
        return;
    }
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) amax = fmaxf(amax, fabsf(key[j]));
    amax = block_reduce<true>(amax, red);
    const float sc = fp8_pow2_scale_dev(amax);
    uint8_t* block = static_cast<uint8_t*>(p.cache) + (slot / 64) * int64_t{64} * (d + 4);
    const int64_t off = slot % 64;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) block[off * d + j] = f32_to_fp8(key[j] / sc);
    if (threadIdx.x == 0) memcpy(block + 64 * d + 4 * off, &sc, 4);
}

}  // namespace

cudaError_t launch_latent_write(const LatentWriteParams& p, cudaStream_t stream) {
    if (p.n == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(p.rank + p.rope) * 4;
    latent_write_kernel<<<static_cast<unsigned>(p.n), kThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t launch_indexer_write(const IndexerWriteParams& p, cudaStream_t stream) {
    if (p.n == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(p.dim) * 4;
    indexer_write_kernel<<<static_cast<unsigned>(p.n), kThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t launch_hadamard_rows(const float* in, float* out, int64_t rows, int64_t dim, float scale,
                                 cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(dim) * 4;
    hadamard_rows_kernel<<<static_cast<unsigned>(rows), kThreads, smem, stream>>>(in, out, dim, scale);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
