// latent_cache_write: the MLA latent cache row of each new token (model-spec §2.6 step 2-3, §6).
// kv_raw [n, 576] fp32 (kv_a_proj output: c_raw 512 | k_pe_raw 64) → c = RMSNorm(c_raw)·w, k_pe = interleaved
// RoPE(k_pe_raw, pos; inv_freq, rope_scale) → stored at cache row slots[i] as BF16 [576] or the 656-B FP8 row of
// kv/kv_format.h. Plain C++ contract header (no CUDA device code).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

enum class LatentCacheFormat { BF16, FP8 };

struct LatentCacheWriteParams {
    const float* kv_raw = nullptr;   // [n, 576]   c_raw (512) | k_pe_raw (64), fp32
    const float* norm_w = nullptr;   // [512]      kv_a_layernorm weight
    const int32_t* pos = nullptr;    // [n]        token positions (RoPE angle)
    const int32_t* slots = nullptr;  // [n]        destination rows; -1 = skip
    void* cache = nullptr;           // BF16: [n_slots, 576] bf16; FP8: [n_slots, 656] bytes
    LatentCacheFormat format = LatentCacheFormat::FP8;
    int64_t n = 0;
    float eps = 1e-6f;
    const float* inv_freq = nullptr;  // [32] host memory: the k_pe pairs' frequencies (ops/rope.h), interleaved
    float rope_scale = 1.0f;          // cos and sin times this (YaRN's attention factor)
};

bool latent_cache_write_supported(const LatentCacheWriteParams& p);
// Launches on `stream`; returns cudaErrorInvalidValue when unsupported, else the launch error.
cudaError_t launch_latent_cache_write(const LatentCacheWriteParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
