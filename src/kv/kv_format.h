// KV cache formats (design.md §5, model-spec §3.4 and §6): how one token's MLA latent row and one token's
// indexer key are stored. The CPU backend keeps fp32 (the exact reference); CUDA stores bf16 or FP8.
//
// FP8 latent row, 656 bytes (FlashMLA "FP8 with scale", vLLM fp8_ds_mla):
//   bytes   0..511  c (kv_lora_rank 512) as e4m3, quantised in 4 tiles of 128 values
//   bytes 512..527  4 × fp32 tile scales (multiply to dequantise)
//   bytes 528..655  k_pe (64 values) as bf16, not quantised
// FP8 indexer keys, 132 bytes per token, paged per 64-token block as [64 × 128 B e4m3][64 × 4 B fp32 scale]
// (8448 B per block; DeepGEMM/SGLang paged layout). The slot of a token is block · 64 + offset, as everywhere.
// Scales: s = 2^ceil(log2(max(amax, 1e-4) / 448)) (ue8m0, rounded up to a power of two, so dequantising is
// exact scaling), stored as fp32; e4m3 codes are round-to-nearest-even, saturating (= cuda_fp8's satfinite).
#pragma once

#include <cstdint>

namespace megactx {

enum class KvFormat { F32, BF16, FP8 };

const char* kv_format_name(KvFormat f);

// The GLM-5.x / DeepSeek-V3.2 geometry the FP8 layouts are defined for.
constexpr int64_t kFp8LatentRank = 512, kFp8LatentRope = 64, kFp8LatentTile = 128;
constexpr int64_t kFp8LatentRowBytes = kFp8LatentRank + 4 * (kFp8LatentRank / kFp8LatentTile) + 2 * kFp8LatentRope;
static_assert(kFp8LatentRowBytes == 656);
constexpr int64_t kFp8IndexerDim = 128, kFp8IndexerBlock = 64;
constexpr int64_t kFp8IndexerTokenBytes = kFp8IndexerDim + 4;
constexpr int64_t kFp8IndexerBlockBytes = kFp8IndexerBlock * kFp8IndexerTokenBytes;
static_assert(kFp8IndexerBlockBytes == 8448);

// ue8m0 scale for a group whose largest |value| is amax.
float fp8_pow2_scale(float amax);

// One latent row [c (512) | k_pe (64)] (fp32) ↔ its 656 bytes.
void fp8_latent_pack(const float* row, uint8_t* out656);
void fp8_latent_unpack(const uint8_t* in656, float* row);

// One indexer key (128 fp32) ↔ its place in a paged FP8 block: the token at `slot` of a pool whose
// blocks are kFp8IndexerBlockBytes apart.
void fp8_indexer_pack(const float* key, int64_t slot, uint8_t* pool);
void fp8_indexer_unpack(const uint8_t* pool, int64_t slot, float* key);

}  // namespace megactx
