// KV cache formats (design.md §5, model-spec §3.4 and §6): how one token's MLA latent row and one token's
// indexer key are stored. The CPU backend keeps fp32 (the exact reference); CUDA stores bf16 or FP8.
//
// FP8 latent row, 656 bytes (FlashMLA "FP8 with scale", vLLM fp8_ds_mla):
//   bytes   0..511  c (kv_lora_rank 512) as e4m3, quantised in 4 tiles of 128 values
//   bytes 512..527  4 × fp32 tile scales (multiply to dequantise)
//   bytes 528..655  k_pe (64 values) as bf16, not quantised
// FP8 indexer keys, 132 bytes per token, paged per 64-token block as [64 × 128 B e4m3][64 × 4 B fp32 scale]
// (8448 B per block; DeepGEMM/SGLang paged layout). The slot of a token is block · 64 + offset, as everywhere.
// Other geometries (the small test models) use the same layouts with their own sizes: the latent is quantised in
// tiles of 128 values (or one tile when kv_lora_rank is not a multiple of 128), then the tile scales, then bf16 k_pe;
// an indexer token is d_indexer e4m3 + one fp32 scale. The fast CUDA kernels take the GLM-5.2 geometry only.
// Scales: s = 2^ceil(log2(max(amax, 1e-4) / 448)) (ue8m0, rounded up to a power of two, so dequantising is
// exact scaling), stored as fp32; e4m3 codes are round-to-nearest-even, saturating (= cuda_fp8's satfinite).
// With ModelConfig::indexer_hadamard the indexer's keys and queries are rotated by the normalised Walsh–Hadamard
// matrix before they are quantised (model-spec §3.3, DeepSeek's rotate_activation): hadamard_transform below.
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

// Latent geometry: tile size and bytes per row for kv_lora_rank `rank` and `rope` RoPE dims.
inline int64_t fp8_latent_tile(int64_t rank) { return rank % kFp8LatentTile == 0 ? kFp8LatentTile : rank; }
inline int64_t fp8_latent_row_bytes(int64_t rank, int64_t rope) {
    return rank + 4 * (rank / fp8_latent_tile(rank)) + 2 * rope;
}
// Indexer geometry: bytes per 64-token block for keys of `dim` values.
inline int64_t fp8_indexer_block_bytes(int64_t dim) { return kFp8IndexerBlock * (dim + 4); }

// One latent row [c (rank) | k_pe (rope)] (fp32) ↔ its fp8_latent_row_bytes bytes.
void fp8_latent_pack(const float* row, int64_t rank, int64_t rope, uint8_t* out);
void fp8_latent_unpack(const uint8_t* in, int64_t rank, int64_t rope, float* row);

// One indexer key (dim fp32) ↔ its place in a paged FP8 pool: the token at `slot`, in block slot / 64 whose
// bytes are [64 × dim e4m3][64 × fp32 scale].
void fp8_indexer_pack(const float* key, int64_t dim, int64_t slot, uint8_t* pool);
void fp8_indexer_unpack(const uint8_t* pool, int64_t dim, int64_t slot, float* key);

// The normalised Walsh–Hadamard transform in place, x ← H_n · x with H_n the Sylvester (natural order) Hadamard
// matrix times n^-0.5 (DeepSeek's hadamard_transform(x, scale=n**-0.5)); n a power of two. The fixed fp32
// arithmetic the CUDA kernels repeat bit for bit: butterfly stages of stride 1, 2, 4, … n/2, each pair
// (i, i + h) with i & h = 0 becoming (x_i + x_{i+h}, x_i − x_{i+h}), then every value times hadamard_scale(n).
// H_n is symmetric and orthogonal, so the transform is its own inverse (up to rounding).
void hadamard_transform(float* x, int64_t n);
// n^-0.5 rounded once to fp32 (the factor of the last step above); n not a power of two is an error.
float hadamard_scale(int64_t n);

}  // namespace megactx
