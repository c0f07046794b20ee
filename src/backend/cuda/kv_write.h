// Contract of the reference fused KV-cache writes (kv_write.cu), any geometry, one block per token:
//   latent:  row = [RMSNorm(kv_a[t, :rank]) · w | RoPE(kv_a[t, rank:])] stored at slots[t]
//   indexer: key = RoPE_[0, d_rope)(LayerNorm(k[t]) · w + b) stored at slots[t] (FP8: optionally H · key)
// Formats (kv_format.h): elem 0 = f32 rows, 1 = bf16 rows, 2 = FP8 (latent: e4m3 tiles + fp32 pow2 scales + bf16
// k_pe; indexer: paged 64-token blocks of e4m3 keys then fp32 scales). The FP8 bytes equal kv_format.cpp's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct LatentWriteParams {
    const float* kv_a = nullptr;     // [n, rank + rope]
    const float* norm_w = nullptr;   // [rank]
    const int32_t* pos = nullptr;    // [n]
    const int32_t* slots = nullptr;  // [n]
    void* cache = nullptr;           // the latent pool
    int elem = 0;
    const float* inv_freq = nullptr;  // [rope / 2] (rope.h), interleaved pairs
    float rope_scale = 1.0f;          // cos and sin times this (ops/rope.h)
    int64_t n = 0, rank = 0, rope = 0;
    float eps = 0;
};

struct IndexerWriteParams {
    const float* k = nullptr;        // [n, dim]
    const float* ln_w = nullptr;     // [dim]
    const float* ln_b = nullptr;     // [dim]
    const int32_t* pos = nullptr;    // [n]
    const int32_t* slots = nullptr;  // [n]
    void* cache = nullptr;           // the indexer pool
    int elem = 0;
    const float* inv_freq = nullptr;  // [d_rope / 2] (rope.h)
    float rope_scale = 1.0f;          // cos and sin times this (ops/rope.h)
    bool interleaved = true;          // pairs (2i, 2i+1); false: (i, i + d_rope/2)
    int64_t n = 0, dim = 0, d_rope = 0;
    float eps = 0;
    // > 0 (FP8 pools only): key = H · key before it is quantised, H the normalised Walsh–Hadamard matrix
    // (kv_format.h hadamard_transform; dim a power of two), this being hadamard_scale(dim).
    float hadamard_scale = 0;
};

cudaError_t launch_latent_write(const LatentWriteParams& p, cudaStream_t stream);
cudaError_t launch_indexer_write(const IndexerWriteParams& p, cudaStream_t stream);
// out[r] = H · in[r] for rows of `dim` values (a power of two): the indexer queries scored against keys stored
// rotated. kv_format.cpp's hadamard_transform bit for bit; scale = hadamard_scale(dim). in may equal out.
cudaError_t launch_hadamard_rows(const float* in, float* out, int64_t rows, int64_t dim, float scale,
                                 cudaStream_t stream);

}  // namespace megactx::cuda
