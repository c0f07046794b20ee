#include "kv/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace megactx {

const char* kv_format_name(KvFormat f) {
    switch (f) {
        case KvFormat::F32:
            return "f32";
        case KvFormat::BF16:
            return "bf16";
        case KvFormat::FP8:
            return "fp8";
    }
    return "?";
}

float fp8_pow2_scale(float amax) {
    const float s = std::max(amax, 1e-4f) / 448.0f;
    return std::exp2(std::ceil(std::log2(s)));
}

void fp8_latent_pack(const float* row, int64_t rank, int64_t rope, uint8_t* out) {
    const int64_t tile = fp8_latent_tile(rank), n_tile = rank / tile;
    for (int64_t t = 0; t < n_tile; ++t) {
        const float* x = row + t * tile;
        float amax = 0;
        for (int64_t i = 0; i < tile; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float s = fp8_pow2_scale(amax);
        for (int64_t i = 0; i < tile; ++i) out[t * tile + i] = f32_to_fp8e4m3(x[i] / s);
        std::memcpy(out + rank + 4 * t, &s, 4);
    }
    for (int64_t i = 0; i < rope; ++i) {
        const uint16_t h = f32_to_bf16(row[rank + i]);
        std::memcpy(out + rank + 4 * n_tile + 2 * i, &h, 2);
    }
}

void fp8_latent_unpack(const uint8_t* in, int64_t rank, int64_t rope, float* row) {
    const int64_t tile = fp8_latent_tile(rank), n_tile = rank / tile;
    for (int64_t t = 0; t < n_tile; ++t) {
        float s;
        std::memcpy(&s, in + rank + 4 * t, 4);
        for (int64_t i = 0; i < tile; ++i) row[t * tile + i] = fp8e4m3_to_f32(in[t * tile + i]) * s;
    }
    for (int64_t i = 0; i < rope; ++i) {
        uint16_t h;
        std::memcpy(&h, in + rank + 4 * n_tile + 2 * i, 2);
        row[rank + i] = bf16_to_f32(h);
    }
}

void fp8_indexer_pack(const float* key, int64_t dim, int64_t slot, uint8_t* pool) {
    uint8_t* block = pool + (slot / kFp8IndexerBlock) * fp8_indexer_block_bytes(dim);
    const int64_t off = slot % kFp8IndexerBlock;
    float amax = 0;
    for (int64_t i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(key[i]));
    const float s = fp8_pow2_scale(amax);
    for (int64_t i = 0; i < dim; ++i) block[off * dim + i] = f32_to_fp8e4m3(key[i] / s);
    std::memcpy(block + kFp8IndexerBlock * dim + 4 * off, &s, 4);
}

void fp8_indexer_unpack(const uint8_t* pool, int64_t dim, int64_t slot, float* key) {
    const uint8_t* block = pool + (slot / kFp8IndexerBlock) * fp8_indexer_block_bytes(dim);
    const int64_t off = slot % kFp8IndexerBlock;
    float s;
    std::memcpy(&s, block + kFp8IndexerBlock * dim + 4 * off, 4);
    for (int64_t i = 0; i < dim; ++i) key[i] = fp8e4m3_to_f32(block[off * dim + i]) * s;
}

float hadamard_scale(int64_t n) {
    MEGACTX_CHECK(n > 0 && (n & (n - 1)) == 0, "the Hadamard transform of {} values: not a power of two", n);
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
}

void hadamard_transform(float* x, int64_t n) {
    const float s = hadamard_scale(n);  // checks n
    for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t i = 0; i < n; ++i) {
            if ((i & h) != 0) continue;
            const float a = x[i], b = x[i + h];
            x[i] = a + b;
            x[i + h] = a - b;
        }
    }
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace megactx
