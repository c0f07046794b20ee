// Grid planning of the indexer logits kernels (indexer_logits.cu): how many query groups a launch may see, and how
// kernel 3 splits each group's pages into work items. Host-only plain C++, so the unit tests check it without a GPU
// (tests/unit/test_indexer_grid.cpp): a bound that is too small would leave rows unscored.
#pragma once

#include <algorithm>
#include <cstdint>

namespace megactx::indexer_grid {

// Upper bound on the plan's groups (the grid's height) for n_rows rows of at most n_seq sequences, each sequence's
// rows scored in runs of `group`. A sequence with r ≥ 1 rows makes ceil(r / group) = 1 + floor((r − 1) / group)
// groups, so m sequences make at most m + floor((n_rows − m) / group), which does not shrink as m grows: m = n_seq
// (capped at n_rows) bounds every partition. Exact for decode and one-sequence prefill. When the most rows of any one
// sequence is known (max_seq_rows > 0), the m sequences make at most m · ceil(max_seq_rows / group): exact for
// batches of equal sequences, e.g. MTP verification (64 × 4 rows: 64 groups, where the totals alone allow 76).
inline int64_t max_groups(int64_t n_rows, int64_t n_seq, int64_t group, int64_t max_seq_rows = 0) {
    if (n_rows <= 0) return 0;
    const int64_t m = std::min<int64_t>(std::max<int64_t>(n_seq, 1), n_rows);
    const int64_t by_totals = m + (n_rows - m) / group;
    return max_seq_rows > 0 ? std::min(by_totals, m * ((max_seq_rows + group - 1) / group)) : by_totals;
}

// Kernel 3 (one CTA per SM): work items per group for groups × max_pages pages on n_sm SMs. The fewest whole waves
// of n_sm CTAs whose items hold ≤ max_item pages, and within them as many items per group as fit, so the grid never
// spills into one more wave. (Rounding pages per item up first and items per group after, as before 4119fe9, made
// 13 × 21 = 273 CTAs for 2 waves of 132 at 128K keys.)
inline int64_t ws_chunks(int64_t max_pages, int64_t groups, int64_t n_sm, int64_t max_item) {
    for (int64_t waves = std::max<int64_t>(1, (max_pages * groups + n_sm * max_item - 1) / (n_sm * max_item));;
         ++waves) {
        const int64_t chunks = std::min<int64_t>(waves * n_sm / groups, max_pages);
        if (chunks >= 1 && (max_pages + chunks - 1) / chunks <= max_item) return chunks;
    }
}

}  // namespace megactx::indexer_grid
