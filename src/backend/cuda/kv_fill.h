// Random but valid KV-pool contents, for benchmarks that need a long context without prefilling it (a 1M-token
// prefill of the indexer alone is O(L²)). Plain C++ contract; the kernel is in kv_fill.cu.
//   latent pools: rows of `rank + rope` values — BF16: values in [-1, 1); FP8 (kv_format.h): e4m3 codes of
//                 magnitude ≤ 240, tile scales 2^-6, k_pe bf16 in [-1, 1)
//   indexer pools: keys of `rank` values (rope unused) — BF16 as above; FP8: paged blocks, codes as above,
//                 scales 2^-6
// Deterministic in (seed, byte offset). Synchronises the device before returning.
#pragma once

#include <cstdint>

namespace megactx::cuda {

enum class KvFillKind { kLatent, kIndexer };
enum class KvFillFormat { kBf16, kFp8 };

// n_slots: rows in the pool (for FP8 indexer pools, a multiple of 64).
void fill_kv_random(void* pool, KvFillKind kind, KvFillFormat format, int64_t n_slots, int64_t rank, int64_t rope,
                    uint64_t seed);

}  // namespace megactx::cuda
