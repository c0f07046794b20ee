// indexer_cache_write: the DSA indexer key path from wk output to the paged FP8 key cache (model-spec §3.2, §3.4).
//   k = LayerNorm(k_raw; ln_w, ln_b, eps);  k[0:d_rope] = interleaved RoPE(pos, theta);  FP8-quantise per token
//   (one ue8m0 scale) into the pool at slots[i] (src/kv/kv_format.h: per 64-token block [64×128 B e4m3][64×fp32]).
// GLM-5.2 geometry only: d_indexer 128, d_rope 64.
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
    float theta = 10000.0f;
    uint8_t* pool = nullptr;  // [n_blocks, 8448] paged FP8 indexer cache
};

bool indexer_cache_write_supported(int64_t d_indexer, int64_t d_rope);
void launch_indexer_cache_write(const IndexerCacheWriteParams& p, cudaStream_t stream);

}  // namespace megactx
