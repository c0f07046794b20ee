// Grid planning of the indexer logits kernels (src/backend/cuda/indexer_grid.h), without a GPU: the bound on query
// groups holds for every way of splitting a row block into sequences (a bound too small leaves rows unscored), and
// kernel 3's work items fill whole waves with at most kWsMaxPages pages each.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cuda/indexer_grid.h"

namespace megactx {
namespace {

constexpr int64_t kGroup = 16, kMaxItem = 256;

int64_t groups_of(const std::vector<int64_t>& rows_per_seq) {
    int64_t g = 0;
    for (int64_t r : rows_per_seq) g += (r + kGroup - 1) / kGroup;
    return g;
}

TEST(IndexerGrid, MaxGroupsBoundsEveryPartition) {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 20000; ++trial) {
        const int64_t n_seq = 1 + static_cast<int64_t>(rng() % 40);
        std::vector<int64_t> rows(static_cast<size_t>(n_seq));
        int64_t n_rows = 0;
        for (auto& r : rows) {
            // Mostly decode / MTP-sized counts, some prefill chunks, some sequences absent from the block (0).
            const uint32_t kind = rng() % 4;
            r = kind == 0 ? 0 : kind == 1 ? 1 + rng() % 4 : kind == 2 ? 1 + rng() % 40 : 1 + rng() % 300;
            n_rows += r;
        }
        if (n_rows == 0) continue;
        const int64_t most = *std::max_element(rows.begin(), rows.end());
        const int64_t g = groups_of(rows);
        EXPECT_GE(indexer_grid::max_groups(n_rows, n_seq, kGroup), g) << "n_rows " << n_rows << " n_seq " << n_seq;
        // With the most rows of one sequence known (exactly, or any larger bound), still a bound, and never looser.
        for (const int64_t bound : {most, most + static_cast<int64_t>(rng() % 50)}) {
            const int64_t tight = indexer_grid::max_groups(n_rows, n_seq, kGroup, bound);
            EXPECT_GE(tight, g) << "n_rows " << n_rows << " n_seq " << n_seq << " max_seq_rows " << bound;
            EXPECT_LE(tight, indexer_grid::max_groups(n_rows, n_seq, kGroup));
        }
    }
}

TEST(IndexerGrid, MaxGroupsOnKnownBatches) {
    EXPECT_EQ(indexer_grid::max_groups(64, 64, kGroup), 64);  // batch 64, 1 query each
    // Batch 64 with 4 queries each (MTP verification) makes 64 groups, but the bound only knows the totals: one of
    // the 64 sequences could hold 193 of the 256 rows (13 groups), so 76.
    EXPECT_EQ(indexer_grid::max_groups(256, 64, kGroup), 76);
    EXPECT_EQ(indexer_grid::max_groups(256, 64, kGroup, 4), 64);  // ... and knowing that none has more than 4: exact
    EXPECT_EQ(indexer_grid::max_groups(4096, 1, kGroup, 4096), 256);
    EXPECT_EQ(indexer_grid::max_groups(4099, 4, kGroup, 4096), 259);  // a prefill chunk and 3 decode rows: 256 + 3
    EXPECT_EQ(indexer_grid::max_groups(12, 5, kGroup, 4), 5);
    EXPECT_EQ(indexer_grid::max_groups(4, 1, kGroup), 1);       // batch 1, 4 queries
    EXPECT_EQ(indexer_grid::max_groups(4096, 1, kGroup), 256);  // one prefill chunk
    EXPECT_EQ(indexer_grid::max_groups(59, 1, kGroup), 4);      // the model's row block at 1M
    EXPECT_EQ(indexer_grid::max_groups(12, 5, kGroup), 5);      // 2 + 1 + 4 + 3 + 2 queries
    EXPECT_EQ(indexer_grid::max_groups(0, 3, kGroup), 0);
    EXPECT_EQ(indexer_grid::max_groups(3, 10, kGroup), 3);  // more sequences than rows
}

TEST(IndexerGrid, WsChunksFillWholeWaves) {
    for (const int64_t n_sm : {132, 114, 1}) {
        for (int64_t max_pages = 1; max_pages <= 20000; max_pages = max_pages * 3 / 2 + 1) {
            for (const int64_t groups : {1, 2, 3, 4, 5, 16, 21, 64, 256, 300}) {
                const int64_t chunks = indexer_grid::ws_chunks(max_pages, groups, n_sm, kMaxItem);
                ASSERT_GE(chunks, 1);
                ASSERT_LE(chunks, max_pages);
                const int64_t per_item = (max_pages + chunks - 1) / chunks;
                EXPECT_LE(per_item, kMaxItem) << max_pages << " pages, " << groups << " groups";
                // The grid takes w waves, and no split into fewer waves has items of ≤ kMaxItem pages.
                const int64_t w = (chunks * groups + n_sm - 1) / n_sm;
                for (int64_t fewer = 1; fewer < w; ++fewer) {
                    const int64_t c = std::min<int64_t>(fewer * n_sm / groups, max_pages);
                    EXPECT_FALSE(c >= 1 && (max_pages + c - 1) / c <= kMaxItem)
                        << max_pages << " pages, " << groups << " groups: " << w << " waves where " << fewer << " do";
                }
                // Within those waves it takes as many items per group as fit (smaller items balance better).
                EXPECT_EQ(chunks, std::min<int64_t>(w * n_sm / groups, max_pages));
            }
        }
    }
}

TEST(IndexerGrid, WsChunksOnMeasuredShapes) {
    // H200 (132 SMs): 128K keys with 21 groups took 13 items per group (273 CTAs: 3 waves) before 4119fe9.
    EXPECT_EQ(indexer_grid::ws_chunks(2048, 21, 132, kMaxItem), 12);
    EXPECT_EQ(indexer_grid::ws_chunks(16384, 4, 132, kMaxItem), 66);   // 59 rows at 1M: 2 waves of 249 pages
    EXPECT_EQ(indexer_grid::ws_chunks(16384, 1, 132, kMaxItem), 132);  // batch 1 × 4 queries at 1M
    EXPECT_EQ(indexer_grid::ws_chunks(1024, 256, 132, kMaxItem), 4);   // 4096 rows at 64K
}

}  // namespace
}  // namespace megactx
