// The top-k's plan (src/backend/cuda/topk_plan.h), without a GPU:
// - long rows: the filter's work items, and the sample: sample positions stay inside the row, and on rows of 1M the
//   estimated threshold leaves between k and the candidate capacity of items above it, also on rows whose neighbours
//   are correlated. A row outside that range takes the one-CTA whole-row select, ~8x slower for a call of 64 rows
//   (at 19e6c1d: sampling groups of 16 neighbours instead of 4 did that on correlated rows);
// - few rows: a step-by-step CPU model of topk_few_grid_kernel's shared select (its digit rounds, bins and slices come
//   from the same header) against the reference on spread, hot, tied, narrow, clustered and extreme rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/topk_plan.h"

namespace megactx {
namespace {

namespace ts = topk_plan;

constexpr int kK = 2048;
constexpr int kLen = 1 << 20;
constexpr int64_t kCap = 32768;  // topk.cu's candidate capacity for rows of 1M (max(4k, 32768))

// Deterministic deviates from mt19937 words (the same on every standard library): normal (Box-Muller) and a cheap
// zero-mean uniform one for small noise.
struct Normal {
    std::mt19937 rng;
    explicit Normal(uint32_t seed) : rng(seed) {}
    float operator()() {
        const double u1 = (rng() + 0.5) / 4294967296.0, u2 = (rng() + 0.5) / 4294967296.0;
        return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    float centered() { return static_cast<float>(rng()) * (1.0f / 4294967296.0f) - 0.5f; }  // variance 1/12
};

// Items of the row strictly above the sample's estimate (the filter's candidates; the rows here have no ties there).
int64_t candidates(const std::vector<float>& row, int64_t r) {
    const int len = static_cast<int>(row.size());
    const int s = ts::sample_count(len);
    std::vector<float> sample(static_cast<size_t>(s));
    for (int j = 0; j < s; ++j) {
        const int64_t p = ts::sample_position(j, len, r);
        EXPECT_TRUE(p >= 0 && p < len) << "sample " << j << " at " << p;
        sample[static_cast<size_t>(j)] = row[static_cast<size_t>(p)];
    }
    const int m = ts::sample_rank(kK, len);
    std::nth_element(sample.begin(), sample.begin() + (m - 1), sample.end(), std::greater<float>());
    const float t_est = sample[static_cast<size_t>(m - 1)];
    return std::count_if(row.begin(), row.end(), [&](float v) { return v > t_est; });
}

// Fills rows of a profile and checks each one's candidate count; at most `allowed` rows may fall back.
void check_profile(const char* name, int rows, const std::function<void(std::vector<float>&, Normal&, int)>& fill,
                   int allowed = 0) {
    std::vector<float> row(kLen);
    int64_t lo = INT64_MAX, hi = 0;
    int fallbacks = 0;
    for (int r = 0; r < rows; ++r) {
        Normal nd(1000u * static_cast<uint32_t>(rows) + static_cast<uint32_t>(r));
        fill(row, nd, r);
        const int64_t c = candidates(row, r);
        lo = std::min(lo, c);
        hi = std::max(hi, c);
        fallbacks += c < kK || c > kCap;
    }
    std::printf("%-20s %3d rows of 1M: candidates %lld .. %lld (k %d, capacity %lld), %d whole-row fallbacks\n", name,
                rows, static_cast<long long>(lo), static_cast<long long>(hi), kK, static_cast<long long>(kCap),
                fallbacks);
    EXPECT_LE(fallbacks, allowed) << name;
}

TEST(TopkPlan, SampleShape) {
    for (const int len : {1, 100, 8191, 8192, 8193, 32769, 131072, 1000003, kLen, 1 << 24}) {
        const int s = ts::sample_count(len);
        EXPECT_EQ(s, std::min(len, ts::kSampleSize));
        for (const int64_t row : {0, 1, 63, 100000}) {
            int64_t prev = -1;
            for (int j = 0; j < s; ++j) {
                const int64_t p = ts::sample_position(j, len, row);
                // Increasing (distinct items), a group's first item a multiple of the group from the row's start, and
                // its place inside its stratum of the row.
                ASSERT_GT(p, prev) << "len " << len << " sample " << j;
                ASSERT_LT(p, len) << "len " << len << " sample " << j;
                if (s < len) {
                    const int64_t place = j / ts::kGroup, places = s / ts::kGroup, blocks = len / ts::kGroup;
                    ASSERT_EQ(p % ts::kGroup, j % ts::kGroup);
                    ASSERT_GE(p / ts::kGroup, place * blocks / places);
                    ASSERT_LT(p / ts::kGroup, (place + 1) * blocks / places);
                }
                prev = p;
            }
        }
        if (len >= 8 * ts::kSampleSize) {  // rows sample at different offsets (strata of >= 8 blocks)
            int same = 0;
            for (int j = 0; j < s; j += ts::kGroup) same += ts::sample_position(j, len, 0) == ts::sample_position(j, len, 1);
            EXPECT_LT(same, s / ts::kGroup / 2) << "len " << len;
        }
        const int m = ts::sample_rank(kK, len);  // rows of <= k items never sample (all of them are the top k)
        EXPECT_GE(m, 1);
        if (len > kK) {
            EXPECT_LE(m, s);
        }
    }
    EXPECT_EQ(ts::sample_rank(kK, 5000), kK);  // the whole row sampled: the exact k-th value
    EXPECT_EQ(ts::sample_rank(kK, kLen), 48);  // ~2k of 1M expected above it, + 16 samples of margin
}

TEST(TopkPlan, SampleEstimateKeepsRowsOffTheFallback) {
    check_profile("independent normal", 10, [](std::vector<float>& row, Normal& nd, int) {
        for (auto& v : row) v = nd();
    });
    // Attention sinks and recent tokens, raised far above the rest (as real indexer scores have them).
    check_profile("hot windows", 10, [](std::vector<float>& row, Normal& nd, int) {
        for (int i = 0; i < kLen; ++i) row[static_cast<size_t>(i)] = nd() + (i < 300 || i >= kLen - 1500 ? 8.f : 0.f);
    });
    // Correlated neighbours: a slowly wandering AR(1) process, and runs of nearly equal values (offset per row, not
    // aligned with the sample's groups). Each group of 4 neighbours then counts as ~1 independent sample, so the
    // estimate rests on ~2048 places instead of 8192 and varies ~2x more. Groups of 16 failed ~2% of these rows.
    check_profile("AR(1), rho 0.99", 40, [](std::vector<float>& row, Normal& nd, int) {
        float x = nd();
        for (auto& v : row) v = x = 0.99f * x + 0.4887f * nd.centered();  // sqrt((1 - 0.99^2) * 12)
    });
    const auto runs = [](int len_run) {
        return [len_run](std::vector<float>& row, Normal& nd, int r) {
            float base = nd();
            for (int i = 0; i < kLen; ++i) {
                if ((i + 5 * r) % len_run == 0) base = nd();
                row[static_cast<size_t>(i)] = base + 0.01f * nd.centered();
            }
        };
    };
    check_profile("runs of 16", 150, runs(16));
    // Known limit (f06b768): with runs of 32, about 1 row in 150 still leaves fewer than k items above the
    // estimate and takes the one-CTA whole-row select (~760 us at 1M). Groups of 16 failed 4 in 250.
    check_profile("runs of 32", 150, runs(32), 1);
}

// The work-item sizes measured best on the H200 (132 SMs), and the rule's general shape.
TEST(TopkPlan, FilterChunk) {
    EXPECT_EQ(ts::filter_chunk(64, 1 << 20, 132, 1024, 65536), 65536);  // 64 x 1M: 1024 items, two waves
    EXPECT_EQ(ts::filter_chunk(64, 1 << 17, 132, 1024, 65536), 16384);  // 64 x 128K: 512 items, one wave
    EXPECT_EQ(ts::filter_chunk(4, 1 << 20, 132, 1024, 65536), 8192);    // 4 x 1M: 512 items
    EXPECT_EQ(ts::filter_chunk(512, 1 << 16, 132, 1024, 65536), 65536);
    EXPECT_EQ(ts::filter_chunk(64, 1 << 20, 132, 1024, 4096), 4096);  // the append body's cap
    EXPECT_EQ(ts::filter_chunk(1, 40000, 132, 1024, 65536), 1024);
    for (int64_t rows = 1; rows <= 4096; rows *= 3)
        for (int64_t stride = 33000; stride <= (int64_t{1} << 24); stride *= 5) {
            const int c = ts::filter_chunk(rows, stride, 132, 1024, 65536);
            ASSERT_TRUE(c >= 1024 && c <= 65536 && (c & (c - 1)) == 0) << rows << " x " << stride;
            const int64_t items = rows * ((stride + c - 1) / c);
            EXPECT_TRUE(c == 65536 || items <= 4 * 132) << rows << " x " << stride << ": " << items << " items";
            if (c > 1024) {
                EXPECT_GT(rows * ((stride + c / 2 - 1) / (c / 2)), 4 * 132) << "not the smallest";
            }
        }
}

// ---- the few-rows kernel's shared select (topk_few_grid_kernel), modelled step by step on the CPU ----
// Order-preserving key (topk.cu's float_key: -0 and +0 are one key).
uint32_t key_of(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The kernel's algorithm over a row split into G slices of few_slice(len, G): the digit rounds on summed slice
// histograms, the per-slice counts above and in the final bin, the exact k-th key among the candidates (or the bin's
// single value), and each slice's emission at its published offsets. Returns the row's output (k indices, -1 padded).
std::vector<int32_t> grid_select_model(const std::vector<float>& row, int k, int G, int* rounds_out = nullptr) {
    const int len = static_cast<int>(row.size());
    std::vector<int32_t> out(static_cast<size_t>(k), -1);
    if (len <= k) {
        for (int i = 0; i < len; ++i) out[static_cast<size_t>(i)] = i;
        return out;
    }
    std::vector<uint32_t> keys(row.size());
    for (size_t i = 0; i < row.size(); ++i) keys[i] = key_of(row[i]);
    int rem = 32, need = k, bin_n = len, round = 0;
    uint32_t prefix = 0;
    while (ts::grid_more_rounds(round, rem, bin_n)) {
        const int w = ts::grid_digit_bits(round, rem), shift = rem - w;
        std::vector<int64_t> hist(size_t{1} << w, 0);
        for (const uint32_t key : keys)
            if ((static_cast<uint64_t>(key) >> rem) == prefix) ++hist[(key >> shift) & ((1u << w) - 1)];
        int64_t above = 0;
        int b = static_cast<int>(hist.size()) - 1;
        while (above + hist[static_cast<size_t>(b)] < need) above += hist[static_cast<size_t>(b--)];
        prefix = (prefix << w) | static_cast<uint32_t>(b);
        need -= static_cast<int>(above);
        bin_n = static_cast<int>(hist[static_cast<size_t>(b)]);
        rem = shift;
        ++round;
        EXPECT_LE(round, ts::kGridRounds);
    }
    if (rounds_out) *rounds_out = round;
    const uint32_t bl = ts::grid_bin_lo(prefix, rem), bh = ts::grid_bin_hi(bl, rem);
    const bool cands = bin_n <= ts::kGridCand;
    if (!cands) {
        EXPECT_EQ(rem, 0) << "a bin over the candidate capacity must be a single key value";
    }
    const int per = static_cast<int>(ts::few_slice(len, G));
    EXPECT_GE(static_cast<int64_t>(per) * G, len);
    std::vector<int> n_above(static_cast<size_t>(G), 0), n_in(static_cast<size_t>(G), 0);
    std::vector<std::pair<uint32_t, int>> cand;
    for (int c = 0; c < G; ++c)
        for (int i = c * per; i < std::min(len, (c + 1) * per); ++i) {
            const uint32_t key = keys[static_cast<size_t>(i)];
            n_above[static_cast<size_t>(c)] += key > bh;
            if (key >= bl && key <= bh) {
                ++n_in[static_cast<size_t>(c)];
                if (cands) cand.emplace_back(key, i);
            }
        }
    EXPECT_EQ(std::accumulate(n_in.begin(), n_in.end(), 0), bin_n);
    uint32_t t = bl;  // the k-th key
    int n_eq = need;  // the items == t that belong to the top k
    if (cands) {
        std::vector<uint32_t> ck;
        for (const auto& e : cand) ck.push_back(e.first);
        std::nth_element(ck.begin(), ck.begin() + (need - 1), ck.end(), std::greater<uint32_t>());
        t = ck[static_cast<size_t>(need - 1)];
        n_eq = need - static_cast<int>(std::count_if(ck.begin(), ck.end(), [&](uint32_t x) { return x > t; }));
    }
    std::vector<int> written(static_cast<size_t>(k), 0);
    for (int c = 0; c < G; ++c) {
        const int b0 = c * per;
        int gt = 0, eq = 0;  // items > t and == t before this slice
        for (int j = 0; j < c; ++j) gt += n_above[static_cast<size_t>(j)];
        if (cands) {
            for (const auto& e : cand)
                if (e.second < b0) {
                    gt += e.first > t;
                    eq += e.first == t;
                }
        } else {
            for (int j = 0; j < c; ++j) eq += n_in[static_cast<size_t>(j)];
        }
        for (int i = b0; i < std::min(len, b0 + per); ++i) {
            const uint32_t key = keys[static_cast<size_t>(i)];
            int slot = -1;
            if (key > t) slot = gt++ + std::min(eq, n_eq);
            else if (key == t && eq++ < n_eq) slot = gt + eq - 1;
            if (slot < 0) continue;
            EXPECT_TRUE(slot >= 0 && slot < k) << "slot " << slot;
            if (slot < 0 || slot >= k) return out;
            out[static_cast<size_t>(slot)] = i;
            ++written[static_cast<size_t>(slot)];
        }
    }
    for (int s = 0; s < k; ++s) EXPECT_EQ(written[static_cast<size_t>(s)], 1) << "output slot " << s;
    return out;
}

// The reference: the k largest, ties to the lowest indices, ascending.
std::vector<int32_t> reference_topk(const std::vector<float>& row, int k) {
    const int len = static_cast<int>(row.size());
    std::vector<int32_t> idx(row.size());
    std::iota(idx.begin(), idx.end(), 0);
    const int m = std::min(k, len);
    std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), [&](int32_t a, int32_t b) {
        const uint32_t ka = key_of(row[static_cast<size_t>(a)]), kb = key_of(row[static_cast<size_t>(b)]);
        return ka != kb ? ka > kb : a < b;
    });
    std::vector<int32_t> out(idx.begin(), idx.begin() + m);
    std::sort(out.begin(), out.end());
    out.resize(static_cast<size_t>(k), -1);
    return out;
}

void check_grid(const char* name, const std::vector<float>& row, int k, int G, int want_rounds = 0) {
    int rounds = 0;
    const std::vector<int32_t> got = grid_select_model(row, k, G, &rounds);
    EXPECT_EQ(got, reference_topk(row, k)) << name << ", k " << k << ", G " << G;
    if (want_rounds > 0) {
        EXPECT_EQ(rounds, want_rounds) << name;
    }
}

TEST(TopkPlan, GridSelectDigits) {
    EXPECT_EQ(ts::grid_digit_bits(0, 32), 11);
    EXPECT_EQ(ts::grid_digit_bits(1, 21), 8);
    EXPECT_EQ(ts::grid_digit_bits(3, 5), 5);  // 11 + 8 + 8 + 5 = 32 bits in kGridRounds = 4 rounds
    EXPECT_EQ(ts::kGridRounds, 4);
    EXPECT_EQ(ts::grid_bin_lo(0, 32), 0u);
    EXPECT_EQ(ts::grid_bin_lo(0x7ffu, 21), 0xffe00000u);
    EXPECT_EQ(ts::grid_bin_hi(0xffe00000u, 21), 0xffffffffu);  // the top bin: no overflow
    EXPECT_EQ(ts::grid_bin_hi(0x12345678u, 0), 0x12345678u);
    for (const int64_t len : {8193, 9000, 131072, 131075, 1 << 20})
        for (const int64_t g : {1, 4, 7, 64, 128, 132}) {
            const int64_t per = ts::few_slice(len, g);
            EXPECT_EQ(per % 4, 0);
            EXPECT_GE(per * g, len);
            EXPECT_LT((per - 4) * g, len) << "slices no longer than needed";
        }
}

// Spread rows take one round; ties, narrow ranges and extremes take more, or end in a single tied value.
TEST(TopkPlan, GridSelectModelMatchesReference) {
    Normal nd(77);
    std::vector<float> row(300007);
    for (float& v : row) v = nd();
    check_grid("normal", row, 2048, 128, 1);
    check_grid("normal", row, 1, 7);
    check_grid("normal", row, 16384, 33);
    std::vector<float> hot = row;  // sinks and a recent window: a few slices hold most of the top k
    for (int i = 0; i < 300; ++i) hot[static_cast<size_t>(i)] += 8.f;
    for (size_t i = hot.size() - 1500; i < hot.size(); ++i) hot[i] += 8.f;
    check_grid("hot windows", hot, 2048, 128);
    std::vector<float> relu(row.size(), 0.f);  // 99.9% zeros of either sign: the k-th key ties with ~300K others
    for (size_t i = 0; i < relu.size(); ++i) relu[i] = i % 1000 == 7 ? std::fabs(row[i]) : (i % 2 ? 0.f : -0.f);
    check_grid("relu zeros", relu, 2048, 64);
    check_grid("all equal", std::vector<float>(70001, 3.5f), 2048, 16);
    std::vector<float> narrow(1 << 18);  // consecutive floats: every key distinct, all in one top-11-bit bin
    float x = 1.0f;
    for (float& v : narrow) {
        v = x;
        x = std::nextafter(x, 2.0f);
    }
    std::shuffle(narrow.begin(), narrow.end(), nd.rng);
    check_grid("consecutive floats", narrow, 2048, 128, 2);
    std::vector<float> clustered(200003);  // values in 65536 steps of one ulp, each ~3 times: ties inside the bin
    for (float& v : clustered) v = std::bit_cast<float>(0x3f800000u + static_cast<uint32_t>(nd.rng() & 0xffffu));
    check_grid("clustered", clustered, 2048, 100);
    check_grid("clustered", clustered, 9000, 100);
    std::vector<float> extreme = row;
    const float specials[] = {INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1e-45f, -1e-45f, 1e-40f, 0.f, -0.f};
    for (size_t i = 0; i < extreme.size(); i += 3) extreme[i] = specials[nd.rng() % 9];
    check_grid("extremes", extreme, 2048, 128);
    check_grid("extremes", extreme, 1, 3);
    check_grid("short", std::vector<float>(row.begin(), row.begin() + 2049), 2048, 1);
    check_grid("at k", std::vector<float>(row.begin(), row.begin() + 2048), 2048, 4);
}

}  // namespace
}  // namespace megactx
