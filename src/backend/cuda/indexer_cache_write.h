// indexer_cache_write: the DSA indexer key path from wk output to the paged FP8 key cache (model-spec §3.2, §3.4).
//   k = LayerNorm(k_raw; ln_w, ln_b, eps);  k[0:d_rope] = RoPE(pos; inv_freq, scale, interleaved or half-split
//   pairs);  optionally k = H·k (normalised Walsh–Hadamard, model-spec §3.3);  FP8-quantise per token
//   (one ue8m0 scale) into the pool at slots[i] (src/kv/kv_format.h: per 64-token block [64×128 B e4m3][64×fp32]).
// d_indexer 128 (GLM-5.2, DeepSeek-V3.2), d_rope a multiple of 8 up to 128.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx {

struct IndexerCacheWriteParams {
    const float* k_raw = nullptr;  // [n, 128] wk output (before LayerNorm)
    const float* ln_w = nullptr;   // [128]
    const float* ln_b = nullptr;   // [128]
    float eps = 1e-6f;
    const int32_t* pos = nullptr;    // [n] position of each token (RoPE angle)
    const int32_t* slots = nullptr;  // [n] destination slot = block · 64 + offset
    int64_t n = 0;
    int64_t d_rope = 64;
    const float* inv_freq = nullptr;  // [d_rope / 2] host memory (ops/rope.h)
    float rope_scale = 1.0f;          // cos and sin times this
    bool interleaved = true;          // pairs (2i, 2i+1); false: (i, i + d_rope/2), DeepSeek-V3.2's indexer
    uint8_t* pool = nullptr;          // [n_blocks, 8448] paged FP8 indexer cache
    // > 0: the key is rotated by the normalised Hadamard matrix before it is quantised (ModelConfig::
    // indexer_hadamard; kv_format.h hadamard_transform), this being hadamard_scale(128).
    float hadamard_scale = 0;
};

bool indexer_cache_write_supported(int64_t d_indexer, int64_t d_rope);
void launch_indexer_cache_write(const IndexerCacheWriteParams& p, cudaStream_t stream);

}  // namespace megactx
