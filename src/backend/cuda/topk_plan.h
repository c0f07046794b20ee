// Planning of the long-row top-k (topk.cu), in plain C++ that the kernels and CPU unit tests share
// (tests/unit/test_topk_plan.cpp):
// - the sample (step 1): which positions of a row it reads and which sample rank becomes the estimated threshold
//   T_est. The estimate must leave at least k and at most the candidate capacity of a row's items above T_est, or the
//   row falls back to the one-CTA whole-row select (~8x slower for a call of 64 rows of 1M);
// - the filter's work items (step 2);
// - the few-rows kernel's shared radix select (topk_few_grid_kernel): its digit rounds, bins and slices.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define MEGACTX_HOST_DEVICE __host__ __device__
#else
#define MEGACTX_HOST_DEVICE
#endif

namespace megactx::topk_plan {

constexpr int kSampleSize = 8192;  // samples per row (all of a shorter row)
constexpr int kGroupLog2 = 2;
constexpr int kGroup = 1 << kGroupLog2;  // neighbours per sampled place

// Samples of a row of len items.
MEGACTX_HOST_DEVICE inline int sample_count(int len) { return len < kSampleSize ? len : kSampleSize; }

// Position of sample j (0 <= j < sample_count(len)) in row `row`: groups of kGroup neighbours at count / kGroup places,
// one place in each of count / kGroup equal strata of the row's aligned kGroup-item blocks, at a hashed offset
// inside its stratum (stratified sampling; the offsets differ between rows). Evenly strided places (until 084b658)
// sat a power of two of bytes apart (2 KB at 1M) at the same offsets in every row, and the gathers of a 64-row call
// crowded onto few DRAM channels. A group never straddles a 32-B sector: its first item is a multiple of kGroup
// from the row's start (rows that start 16-B aligned). Groups of 4 use 16 B of each DRAM burst; longer groups
// sample fewer independent places, and rows whose neighbours are correlated then get an estimate that is too high
// more often. The unit test's 150 rows of 1M with runs of 32 nearly equal values: groups of 4 fall back on 0-1 rows,
// groups of 8 on 3, groups of 16 on 5 (on the H200, one such row made a 64 x 1M call take 841 us instead of 99).
MEGACTX_HOST_DEVICE inline uint32_t sample_hash(uint32_t x) {  // murmur3's finalizer
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}
// A sampled row has len > kSampleSize, so its count is kSampleSize and the places a power of two: shifts, not the
// 64-bit divisions (a software routine on the GPU) that made the sample kernel's 8 positions per thread cost ~4 us.
MEGACTX_HOST_DEVICE inline int64_t sample_position(int j, int len, int64_t row) {
    if (sample_count(len) >= len) return j;
    constexpr int kPlacesLog2 = 13 - kGroupLog2;  // kSampleSize / kGroup places
    static_assert(kSampleSize == 1 << 13, "kPlacesLog2");
    const uint64_t blocks = static_cast<uint64_t>(len) >> kGroupLog2;  // >= the places: len > kSampleSize
    const uint64_t place = static_cast<uint64_t>(j) >> kGroupLog2;
    const int64_t lo = static_cast<int64_t>((place * blocks) >> kPlacesLog2);
    const int64_t width = static_cast<int64_t>(((place + 1) * blocks) >> kPlacesLog2) - lo;
    const uint32_t h = sample_hash(static_cast<uint32_t>(place) * 0x9e3779b9u + static_cast<uint32_t>(row) * 0x7feb352du);
    const int64_t block = lo + static_cast<int64_t>((static_cast<uint64_t>(h) * static_cast<uint64_t>(width)) >> 32);
    return (block << kGroupLog2) + (j & (kGroup - 1));
}

// Rank (1-based, from the top) of the sample taken as T_est: the exact k-th value when the whole row is sampled,
// else the rank expected to leave ~2k row items above it, plus 16 samples of margin.
MEGACTX_HOST_DEVICE inline int sample_rank(int k, int len) {
    const int s = sample_count(len);
    if (s >= len) return k;
    const int64_t want = (2 * static_cast<int64_t>(k) * s + len - 1) / len + 16;
    return want < s ? static_cast<int>(want) : s;
}

// Elements per filter work item for n_rows rows of row_stride: the smallest power-of-two multiple of chunk_min up to
// chunk_max whose items fit one wave of 4 CTAs on each of n_sm SMs, else chunk_max. Short-lived CTAs cost a launch,
// two dependent loads and three barriers each, so big batches want long items (H200, 64 x 1M whole call: 4K items
// 143 us, 16K 113; 16K 103.8 vs 64K 98.8 once the select ordered its rows, with the since-reverted 16-wide sample),
// while a batch that fits one wave wants enough CTAs to fill it (64 x 128K: 16K items 39.2 us, 32K 47.9, 64K 56.8).
inline int filter_chunk(int64_t n_rows, int64_t row_stride, int64_t n_sm, int chunk_min, int chunk_max) {
    int chunk = chunk_min;
    while (chunk < chunk_max && n_rows * ((row_stride + chunk - 1) / chunk) > 4 * n_sm) chunk *= 2;
    return chunk;
}

// ---- few rows (decode): the radix select that a row's G CTAs run together (topk_few_grid_kernel) ----
// Rounds of digits of the order-preserving 32-bit keys, from the top: round 0 takes the top kGridDigit0 bits (sign,
// exponent, 2 mantissa bits: 1/8 of a binade), later rounds kGridDigit bits of the keys that carry the digits chosen
// so far. The rounds stop once the bin that holds the k-th key has at most kGridCand keys (they are then selected
// among exactly) or is a single key value (they all tie).
constexpr int kGridDigit0 = 11;
constexpr int kGridDigit = 8;
constexpr int kGridRounds = 1 + (32 - kGridDigit0 + kGridDigit - 1) / kGridDigit;  // at most
constexpr int kGridCand = 8192;
constexpr int kGridHist = 32;  // where round 0's histogram starts in a row's control words (ints; topk.cu)

// The order-preserving 32-bit key of a float: a > b as floats iff key(a) > key(b); -0 and +0 are one key, so ReLU
// zeros of either sign tie. NaN is not supported.
MEGACTX_HOST_DEVICE inline uint32_t float_key(float f) {
#ifdef __CUDA_ARCH__
    uint32_t u = __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
#endif
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Round 0's bin of a key: its top kGridDigit0 bits.
MEGACTX_HOST_DEVICE constexpr uint32_t grid_bin0(uint32_t key) { return key >> (32 - kGridDigit0); }

// Bits of round `round`'s digit, with rem low key bits still undecided (32 before round 0).
MEGACTX_HOST_DEVICE inline int grid_digit_bits(int round, int rem) {
    return round == 0 ? kGridDigit0 : (rem < kGridDigit ? rem : kGridDigit);
}

// Whether another round runs, after `round` rounds left rem undecided bits and bin_n keys in the chosen bin.
MEGACTX_HOST_DEVICE inline bool grid_more_rounds(int round, int rem, int bin_n) {
    return round == 0 || (rem > 0 && bin_n > kGridCand);
}

// The keys [lo, hi] of the bin whose keys carry `prefix` above their rem low bits (rem <= 32): hi from lo.
MEGACTX_HOST_DEVICE inline uint32_t grid_bin_lo(uint32_t prefix, int rem) { return rem >= 32 ? 0u : prefix << rem; }
MEGACTX_HOST_DEVICE inline uint32_t grid_bin_hi(uint32_t lo, int rem) {
    return static_cast<uint32_t>(static_cast<uint64_t>(lo) + ((uint64_t{1} << rem) - 1));
}

// Row elements per CTA for a row of len over G CTAs: a multiple of 4, so that each slice of a row whose start is 16-B
// aligned is too (the kernel's 16-B loads).
MEGACTX_HOST_DEVICE constexpr int64_t few_slice(int64_t len, int64_t G) {
    return ((len + G - 1) / G + 3) & ~int64_t{3};
}

}  // namespace megactx::topk_plan

#undef MEGACTX_HOST_DEVICE
