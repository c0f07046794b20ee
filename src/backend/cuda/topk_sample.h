// The long-row top-k's sample (topk.cu, step 1): which positions of a row it reads and which sample rank becomes the
// estimated threshold T_est. Plain C++ that the kernel and a CPU unit test share (tests/unit/test_topk_sample.cpp):
// the estimate must leave at least k and at most the candidate capacity of a row's items above T_est, or the row
// falls back to the one-CTA whole-row select (~8x slower for a call of 64 rows of 1M).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MEGACTX_HOST_DEVICE __host__ __device__
#else
#define MEGACTX_HOST_DEVICE
#endif

namespace megactx::topk_sample {

constexpr int kSize = 8192;  // samples per row (all of a shorter row)
constexpr int kGroupLog2 = 2;
constexpr int kGroup = 1 << kGroupLog2;  // neighbours per sampled place

// Samples of a row of len items.
MEGACTX_HOST_DEVICE inline int count(int len) { return len < kSize ? len : kSize; }

// Position of sample j (0 <= j < count(len)): groups of kGroup neighbours at count / kGroup evenly strided places.
// Groups of 4 use 16 B of each 64-B DRAM burst, and the gathers are transaction-bound (64 x 1M: 15-17 us; groups of
// 16 took 11). Longer groups sample fewer independent places, and rows whose neighbours are correlated then get an
// estimate that is too high more often. The unit test's 150 rows of 1M with runs of 32 nearly equal values: groups of
// 4 fall back on 0-1 rows, groups of 8 on 3, groups of 16 on 5 (on the H200, one such row made a 64 x 1M call take
// 841 us instead of 99).
MEGACTX_HOST_DEVICE inline int64_t position(int j, int len) {
    const int s = count(len);
    return s < len
               ? static_cast<int64_t>(j >> kGroupLog2) * (len - (kGroup - 1)) / (s >> kGroupLog2) + (j & (kGroup - 1))
               : j;
}

// Rank (1-based, from the top) of the sample taken as T_est: the exact k-th value when the whole row is sampled,
// else the rank expected to leave ~2k row items above it, plus 16 samples of margin.
MEGACTX_HOST_DEVICE inline int rank(int k, int len) {
    const int s = count(len);
    if (s >= len) return k;
    const int64_t want = (2 * static_cast<int64_t>(k) * s + len - 1) / len + 16;
    return want < s ? static_cast<int>(want) : s;
}

}  // namespace megactx::topk_sample

#undef MEGACTX_HOST_DEVICE
