// Fills KV pools with random valid contents (see kv_fill.h). One thread per 4-byte word of the pool; each word
// knows from its byte offset whether it holds e4m3 codes, an fp32 scale or bf16 values.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_fill.h"

namespace megactx::cuda {
namespace {

__device__ __forceinline__ uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return static_cast<uint32_t>(x);
}

// Two bf16 values in [-1, 1) packed in a word.
__device__ __forceinline__ uint32_t bf16_pair(uint32_t r) {
    auto one = [](uint32_t bits) {
        const float f = static_cast<float>(bits & 0xffff) / 32768.0f - 1.0f;
        return __float_as_uint(f) >> 16;
    };
    return one(r) | (one(r >> 16) << 16);
}

// Four e4m3 codes of magnitude ≤ 240 (exponent field ≤ 14 with mantissa ≤ 7 excludes NaN 0x7f), random signs.
__device__ __forceinline__ uint32_t fp8_quad(uint32_t r) {
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) {
        uint32_t b = (r >> (8 * i)) & 0xff;
        if ((b & 0x7f) >= 0x77) b &= 0xf7;  // keep |value| ≤ 240 (codes 0x77..0x7f → 0x70..0x77 range)
        w |= b << (8 * i);
    }
    return w;
}

__global__ void fill_kernel(uint32_t* pool, int64_t n_words, int kind, int format, int64_t rank, int64_t rope,
                            uint64_t seed) {
    const float scale = 1.0f / 64.0f;
    for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < n_words;
         w += int64_t{gridDim.x} * blockDim.x) {
        const uint32_t r = mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(w));
        const int64_t byte = 4 * w;
        uint32_t v;
        if (format == 0) {
            v = bf16_pair(r);
        } else if (kind == 0) {  // FP8 latent row: [rank codes][rank/tile scales][rope bf16]
            const int64_t tile = rank % 128 == 0 ? 128 : rank, n_tile = rank / tile;
            const int64_t row_bytes = rank + 4 * n_tile + 2 * rope;
            const int64_t in_row = byte % row_bytes;
            v = in_row < rank ? fp8_quad(r) : in_row < rank + 4 * n_tile ? __float_as_uint(scale) : bf16_pair(r);
        } else {  // FP8 indexer block: [64 × rank codes][64 fp32 scales]
            const int64_t block_bytes = 64 * (rank + 4);
            v = byte % block_bytes < 64 * rank ? fp8_quad(r) : __float_as_uint(scale);
        }
        pool[w] = v;
    }
}

}  // namespace

void fill_kv_random(void* pool, KvFillKind kind, KvFillFormat format, int64_t n_slots, int64_t rank, int64_t rope,
                    uint64_t seed) {
    int64_t bytes;
    if (format == KvFillFormat::kBf16) {
        bytes = n_slots * (kind == KvFillKind::kLatent ? rank + rope : rank) * 2;
    } else if (kind == KvFillKind::kLatent) {
        const int64_t tile = rank % 128 == 0 ? 128 : rank;
        bytes = n_slots * (rank + 4 * (rank / tile) + 2 * rope);
    } else {
        bytes = (n_slots / 64) * 64 * (rank + 4);
    }
    // Every layout above is a whole number of 4-byte words per row (rank, rope even; FP8 latent rows 656 B).
    const int64_t n_words = bytes / 4;
    fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(pool), n_words, kind == KvFillKind::kLatent ? 0 : 1,
                               format == KvFillFormat::kBf16 ? 0 : 1, rank, rope, seed);
    cudaDeviceSynchronize();
}

}  // namespace megactx::cuda
