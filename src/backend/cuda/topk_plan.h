// Planning of the long-row top-k (topk.cu), in plain C++ that the kernels and CPU unit tests share
// (tests/unit/test_topk_plan.cpp):
// - the sample (step 1): which positions of a row it reads and which sample rank becomes the estimated threshold
//   T_est. The estimate must leave at least k and at most the candidate capacity of a row's items above T_est, or the
//   row falls back to the one-CTA whole-row select (~8x slower for a call of 64 rows of 1M);
// - the filter's work items (step 2).
#pragma once

#include <cstdint>

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

// Position of sample j (0 <= j < sample_count(len)): groups of kGroup neighbours at count / kGroup evenly strided
// places. Groups of 4 use 16 B of each 64-B DRAM burst, and the gathers are transaction-bound (64 x 1M: 15-17 us;
// groups of 16 took 11). Longer groups sample fewer independent places, and rows whose neighbours are correlated then
// get an estimate that is too high more often. The unit test's 150 rows of 1M with runs of 32 nearly equal values:
// groups of 4 fall back on 0-1 rows, groups of 8 on 3, groups of 16 on 5 (on the H200, one such row made a 64 x 1M call
// take 841 us instead of 99).
MEGACTX_HOST_DEVICE inline int64_t sample_position(int j, int len) {
    const int s = sample_count(len);
    return s < len
               ? static_cast<int64_t>(j >> kGroupLog2) * (len - (kGroup - 1)) / (s >> kGroupLog2) + (j & (kGroup - 1))
               : j;
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

}  // namespace megactx::topk_plan

#undef MEGACTX_HOST_DEVICE
