// launch_topk against a CPU reference (std::nth_element with ties to the lowest positions, then sorted): the exact
// result, order included, on tie-free rows and rows with ties at the k-th value, -1 padding, short rows
// (one CTA per row), long rows (sampled threshold, candidate buffer, and the whole-row fallback) and the
// few-rows kernel of decode (<= 4 long rows, one grid-wide kernel: the default there; FewRows* tests).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/topk.h"
#include "backend/cuda/topk_plan.h"

namespace {

using megactx::cuda::launch_topk;
using megactx::cuda::topk_grid_ctl;
using megactx::cuda::TopkGridCtl;
namespace topk_plan = megactx::topk_plan;
using megactx::cuda::topk_scratch_bytes;
using megactx::cuda::topk_set_tuning;
using megactx::cuda::topk_supported;
using megactx::cuda::TopkParams;
using megactx::cuda::TopkTuning;

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Batch {
    int64_t n_rows = 0, row_stride = 0;
    std::vector<float> values;     // [n_rows, row_stride]
    std::vector<int32_t> lengths;  // [n_rows]
};

// Tie-free values: a random permutation of distinct floats (spread over many binades, both signs).
void fill_distinct(float* row, int len, std::mt19937& rng, bool negative_only = false) {
    std::vector<int> perm(len);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::normal_distribution<float> nd(0.f, 1.f);
    // Sorted distinct normal-ish values assigned by the permutation: value(rank) strictly increasing.
    std::vector<float> v(len);
    for (auto& x : v) x = nd(rng);
    std::sort(v.begin(), v.end());
    for (int i = 1; i < len; ++i)
        if (!(v[i] > v[i - 1])) v[i] = std::nextafter(v[i - 1], 1e30f);
    if (negative_only) {
        const float top = v.empty() ? 0.f : v.back();
        for (auto& x : v) x = x - top - 1.0f;  // all < 0, still increasing (may create ties: fix below)
        for (int i = 1; i < len; ++i)
            if (!(v[i] > v[i - 1])) v[i] = std::nextafter(v[i - 1], 1e30f);
    }
    for (int i = 0; i < len; ++i) row[i] = v[perm[i]];
}

// tables (optional): per row, row_stride / 64 (rounded up) block ids; the output then holds slots (TopkSlotMap).
// prepared (few-rows select only, no graph): as the decode indexer calls it (topk_grid_ctl), 1: control words zeroed
// here instead of by the init kernel; 2: also round 0's histogram of each row, counted here on the host.
std::vector<int32_t> run_gpu(const Batch& b, int64_t k, bool graph = false,
                             const std::vector<int32_t>* tables = nullptr, int prepared = 0) {
    std::vector<int32_t> out(static_cast<size_t>(b.n_rows * k), 12345);
    float* d_values = nullptr;
    int32_t* d_len = nullptr;
    int32_t* d_out = nullptr;
    void* d_scratch = nullptr;
    const size_t scratch = topk_scratch_bytes(b.n_rows, b.row_stride, k);
    EXPECT_EQ(cudaMalloc(&d_values, std::max<size_t>(4, b.values.size() * sizeof(float))), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_len, b.lengths.size() * sizeof(int32_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_out, out.size() * sizeof(int32_t)), cudaSuccess);
    if (scratch) {
        EXPECT_EQ(cudaMalloc(&d_scratch, scratch), cudaSuccess);
    }
    EXPECT_EQ(cudaMemcpy(d_values, b.values.data(), b.values.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d_len, b.lengths.data(), b.lengths.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(d_out, 0x7f, out.size() * sizeof(int32_t)), cudaSuccess);
    TopkParams p;
    p.values = d_values;
    p.lengths = d_len;
    p.n_rows = b.n_rows;
    p.row_stride = b.row_stride;
    p.k = k;
    p.out_idx = d_out;
    p.scratch = d_scratch;
    p.scratch_bytes = scratch;
    int32_t *d_seq = nullptr, *d_toff = nullptr, *d_tables = nullptr;
    if (tables != nullptr) {
        const int64_t nb = (b.row_stride + 63) / 64;
        std::vector<int32_t> seq(b.n_rows), toff(b.n_rows);
        for (int64_t r = 0; r < b.n_rows; ++r) {
            seq[r] = static_cast<int32_t>(r);
            toff[r] = static_cast<int32_t>(r * nb);
        }
        EXPECT_EQ(cudaMalloc(&d_seq, seq.size() * sizeof(int32_t)), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&d_toff, toff.size() * sizeof(int32_t)), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&d_tables, tables->size() * sizeof(int32_t)), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(d_seq, seq.data(), seq.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(d_toff, toff.data(), toff.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(d_tables, tables->data(), tables->size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                  cudaSuccess);
        p.slots.seq = d_seq;
        p.slots.table_offset = d_toff;
        p.slots.tables = d_tables;
        p.slots.block = 64;
    }
    if (prepared > 0) {
        EXPECT_FALSE(graph);
        if (d_scratch) {
            EXPECT_EQ(cudaMemset(d_scratch, 0xff, scratch), cudaSuccess);  // no zero words by chance
        }
        const TopkGridCtl gc = topk_grid_ctl(p);
        EXPECT_NE(gc.ctl, nullptr) << "the few-rows select does not run on this batch";
        if (gc.ctl != nullptr) {
            std::vector<int32_t> ctl(static_cast<size_t>(gc.n_ints), 0);
            for (int64_t r = 0; prepared == 2 && r < b.n_rows; ++r)
                for (int i = 0; i < b.lengths[r]; ++i) {
                    const float v = b.values[static_cast<size_t>(r * b.row_stride + i)];
                    ++ctl[static_cast<size_t>(gc.hist0 - gc.ctl + r * gc.row_stride +
                                              topk_plan::grid_bin0(topk_plan::float_key(v)))];
                }
            EXPECT_EQ(cudaMemcpy(gc.ctl, ctl.data(), ctl.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                      cudaSuccess);
            p.grid_prepared = prepared;
        }
    }
    if (graph) {  // capture once (after a warm-up call outside capture), replay twice
        cudaStream_t s = nullptr;
        EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        launch_topk(p, s);
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        EXPECT_EQ(cudaMemset(d_out, 0x7f, out.size() * sizeof(int32_t)), cudaSuccess);
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
        launch_topk(p, s);
        EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
        EXPECT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
        EXPECT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
    } else {
        launch_topk(p, nullptr);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), d_out, out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_values);
    cudaFree(d_len);
    cudaFree(d_out);
    if (d_scratch) cudaFree(d_scratch);
    cudaFree(d_seq);
    cudaFree(d_toff);
    cudaFree(d_tables);
    return out;
}

// Row r of the result must equal the CPU reference exactly (CpuOps::indexer_topk's selection): the m = min(len, k)
// largest values, ties at the k-th value going to the lowest positions, ascending by position, then -1s. Order is
// part of the contract (the sparse attention sums in it: a timing-dependent order makes decode irreproducible).
void check_row(const Batch& b, int64_t r, int64_t k, const int32_t* got, const std::vector<int32_t>* tables = nullptr) {
    const int len = b.lengths[r];
    const float* row = b.values.data() + r * b.row_stride;
    const int m = static_cast<int>(std::min<int64_t>(len, k));
    std::vector<int32_t> ref(len);
    std::iota(ref.begin(), ref.end(), 0);
    if (m < len) {
        std::nth_element(ref.begin(), ref.begin() + m, ref.end(),
                         [&](int a, int c) { return row[a] > row[c] || (row[a] == row[c] && a < c); });
        ref.resize(m);
        std::sort(ref.begin(), ref.end());
    }
    ref.resize(k, -1);
    if (tables != nullptr) {  // positions → slots through the row's block table
        const int64_t nb = (b.row_stride + 63) / 64;
        for (auto& x : ref)
            if (x >= 0) x = (*tables)[r * nb + x / 64] * 64 + x % 64;
    }
    for (int64_t i = 0; i < k; ++i)
        ASSERT_EQ(got[i], ref[i]) << "row " << r << " len " << len << " k " << k << ": first difference at slot " << i;
}

void check_batch(const Batch& b, int64_t k, bool graph = false) {
    ASSERT_TRUE(topk_supported(k, b.row_stride));
    const std::vector<int32_t> out = run_gpu(b, k, graph);
    for (int64_t r = 0; r < b.n_rows; ++r) {
        check_row(b, r, k, out.data() + r * k);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

Batch distinct_batch(const std::vector<int>& lengths, int64_t row_stride, uint32_t seed, bool negative = false) {
    std::mt19937 rng(seed);
    Batch b;
    b.n_rows = static_cast<int64_t>(lengths.size());
    b.row_stride = row_stride;
    b.lengths.assign(lengths.begin(), lengths.end());
    b.values.assign(static_cast<size_t>(b.n_rows * row_stride), 1e30f);  // garbage beyond length: must be ignored
    for (int64_t r = 0; r < b.n_rows; ++r) fill_distinct(b.values.data() + r * row_stride, lengths[r], rng, negative);
    return b;
}

class Topk : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    }
};

TEST_F(Topk, ShortRowsEachLength) {
    const std::vector<int> lens = {1, 7, 63, 64, 2047, 2048, 2049, 5000, 0, 32768, 30001};
    for (int64_t k : {2048, 1, 5, 100}) check_batch(distinct_batch(lens, 32768, 1 + k), k);
}

TEST_F(Topk, ShortStrideNotMultipleOf4) { check_batch(distinct_batch({4099, 1, 4097, 3000, 2500}, 4099, 7), 2048); }

TEST_F(Topk, LongRowsEachLength) {
    const std::vector<int> lens = {1, 7, 63, 64, 2047, 2048, 2049, 5000, 65536 + 3, 1 << 20, 0, 8192, 8193, 100000};
    for (int64_t k : {2048, 1, 37}) check_batch(distinct_batch(lens, 1 << 20, 11 + k), k);
}

TEST_F(Topk, LongStrideUnaligned) {  // scalar filter path
    check_batch(distinct_batch({65539, 40000, 65539, 3}, 65539, 21), 2048);
}

TEST_F(Topk, NegativeValues) {
    check_batch(distinct_batch({5000, 20000}, 20000, 31, true), 2048);
    check_batch(distinct_batch({200000, 70000, 1 << 20}, 1 << 20, 32, true), 2048);
}

TEST_F(Topk, ManyRowsPrefillShape) {
    std::vector<int> lens(1000);
    for (int i = 0; i < 1000; ++i) lens[i] = 1 + (i * 37) % 6000;
    check_batch(distinct_batch(lens, 6000, 41), 2048);
}

TEST_F(Topk, LongBatchOf64Rows) {
    std::vector<int> lens(64);
    for (int i = 0; i < 64; ++i) lens[i] = (1 << 17) - (i * 977) % 5000;
    check_batch(distinct_batch(lens, 1 << 17, 51), 2048);
}

// Ties: values from a tiny set (incl. +0 and -0, many zeros): any valid top-k set passes.
Batch tied_batch(const std::vector<int>& lengths, int64_t row_stride, uint32_t seed, int n_levels, float zero_frac) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::uniform_int_distribution<int> lev(0, n_levels - 1);
    Batch b;
    b.n_rows = static_cast<int64_t>(lengths.size());
    b.row_stride = row_stride;
    b.lengths.assign(lengths.begin(), lengths.end());
    b.values.assign(static_cast<size_t>(b.n_rows * row_stride), 0.f);
    for (int64_t r = 0; r < b.n_rows; ++r)
        for (int i = 0; i < lengths[r]; ++i) {
            float x = u(rng) < zero_frac ? ((i & 1) ? 0.f : -0.f) : 0.5f * static_cast<float>(lev(rng) - n_levels / 2);
            b.values[r * row_stride + i] = x;
        }
    return b;
}

// Ties spread along the row: distinct values, then every `every`-th position set to 5 and `above` positions (spread
// too) above it, so the top k = the `above` items + the lowest-positioned k - above of the 5s, far apart: the order
// kernel's ranges (32K positions each) must agree on which ties are in.
Batch spread_ties_batch(const std::vector<int>& lengths, int64_t row_stride, uint32_t seed, int every, int above) {
    Batch b = distinct_batch(lengths, row_stride, seed, true);  // all < 0
    for (int64_t r = 0; r < b.n_rows; ++r) {
        float* row = b.values.data() + r * row_stride;
        for (int i = 3 + static_cast<int>(r); i < lengths[r]; i += every) row[i] = 5.0f;
        for (int j = 0; j < above; ++j) row[(static_cast<int64_t>(j) * 7919 + 11) % lengths[r]] = 6.0f + 0.001f * j;
    }
    return b;
}

// every 997th of 1M: ~1050 fives, 1500 above, k 2048: 548 fives over ~546K positions (17 ranges); k 100: none.
TEST_F(Topk, TiesSpreadAcrossOrderRanges) {
    for (int64_t k : {2048, 2500, 100}) {
        check_batch(spread_ties_batch({1 << 20}, 1 << 20, 301, 997, 1500), k);                  // few-rows kernel
        check_batch(spread_ties_batch({1 << 20, 700001, 200000}, 1 << 20, 302, 997, 1500), k);  // chain
        check_batch(spread_ties_batch({1 << 20}, 1 << 20, 303, 331, 1900), k, true);            // in a graph
        if (HasFatalFailure()) return;
    }
    TopkTuning t;
    t.few_rows = 0;  // one row on the three-kernel chain
    topk_set_tuning(t);
    check_batch(spread_ties_batch({1 << 20}, 1 << 20, 304, 997, 1500), 2048);
    topk_set_tuning(TopkTuning{});
}

TEST_F(Topk, TiesShort) {
    check_batch(tied_batch({5000, 30000, 2049, 100}, 30000, 61, 5, 0.9f), 2048);
    check_batch(tied_batch({5000, 30000, 2049, 100}, 30000, 62, 1, 0.0f), 2048);  // all equal
}

TEST_F(Topk, TiesLong) {
    // ReLU-like: 99.9 % zeros, a few positives: the k-th value is 0 (fallback over the whole row).
    check_batch(tied_batch({1 << 20, 300000, 70000}, 1 << 20, 71, 3, 0.999f), 2048);
    // Few distinct levels: the candidate buffer overflows.
    check_batch(tied_batch({1 << 20, 100000}, 1 << 20, 72, 7, 0.5f), 2048);
    check_batch(tied_batch({1 << 20}, 1 << 20, 73, 1, 0.0f), 2048);  // all equal
}

// Adversarial for the sample (topk_plan::sample_position: 8192 places per 1M row, at offsets that differ per row):
// 64K big values all off the sampled positions (candidates overflow), or big values exactly on them (too few
// candidates): both take the fallback; 16K big values off the sample: more candidates than shared memory holds
// (selected from global).
TEST_F(Topk, SampleMissesOrOverestimates) {
    const int len = 1 << 20;
    for (int mode = 0; mode < 3; ++mode) {
        Batch b = distinct_batch({len, len}, len, 81 + mode);
        for (int r = 0; r < 2; ++r) {
            float* row = b.values.data() + static_cast<int64_t>(r) * len;
            std::vector<char> sampled(len, 0);
            for (int j = 0; j < topk_plan::sample_count(len); ++j) sampled[topk_plan::sample_position(j, len, r)] = 1;
            int n_big = 0;
            for (int i = 0; i < len; ++i) {
                const bool big = mode == 1 ? sampled[i] != 0 : !sampled[i] && i % (mode == 0 ? 16 : 64) == 1;
                if (big) {
                    row[i] += 1000.f;  // shifts a distinct set upward, stays distinct (mostly); check exactness
                    ++n_big;
                }
            }
            EXPECT_GE(n_big, mode == 0 ? 60000 : (mode == 1 ? 8192 : 16000)) << "mode " << mode;
        }
        check_batch(b, 2048);
    }
}

// The chain's select when the bin that holds the k-th key is crowded: 3000 candidates within 0.003 of 10 and one far
// above them (1e6) make the candidates' key range wide, so one radix level leaves the 3000 in one or two bins of
// more than select_sorted's 1024 (it hands over to the radix levels); 8 rows: the chain, not the few-rows kernel.
TEST_F(Topk, ChainCrowdedBin) {
    const int len = 1 << 20;
    Batch b = distinct_batch(std::vector<int>(8, len), len, 121);
    std::mt19937 rng(122);
    for (int r = 0; r < 8; ++r) {
        float* row = b.values.data() + static_cast<int64_t>(r) * len;
        for (int c = 0; c < 3000; ++c) row[rng() % len] = 10.f + 1e-6f * static_cast<float>(c);
        row[rng() % len] = 1e6f;
    }
    check_batch(b, 2048);
}

// The chain's filter on rows with long runs of candidates (sinks and recent tokens, as real indexer scores have):
// a thread then flags more items of a batch than it keeps in shared memory, and re-reads the rest.
TEST_F(Topk, ChainHotWindows) {
    const int len = 1 << 20;
    Batch b = distinct_batch({len, len, len - 333, len, 500000, len, len, len}, len, 131);
    for (int r = 0; r < 8; ++r) {
        float* row = b.values.data() + static_cast<int64_t>(r) * len;
        const int n = b.lengths[r];
        for (int i = 0; i < n; ++i)
            if (i < 300 || i >= n - 1500 - 100 * r) row[i] += 8.f;
    }
    check_batch(b, 2048);
}

TEST_F(Topk, InsideCudaGraph) {  // both paths captured and replayed
    check_batch(distinct_batch({1 << 20, 70000, 1000}, 1 << 20, 91), 2048, true);
    check_batch(distinct_batch({5000, 30000, 1000}, 30000, 92), 2048, true);
}

// Decode shapes: one long row (the filter spreads it over 1K-element work items), just above the short limit.
TEST_F(Topk, SingleLongRow) {
    check_batch(distinct_batch({131072}, 131072, 101), 2048);
    check_batch(distinct_batch({131072 - 5}, 131072, 102), 2048);
    check_batch(distinct_batch({40000}, 40000, 103), 2048);
    check_batch(distinct_batch({32769}, 32772, 104), 2048);
}

// Rows of 32K..128K in small batches on the three-kernel path: ties, zeros, graphs, mixed lengths.
TEST_F(Topk, MediumRowsTiesAndGraph) {
    TopkTuning t;
    t.few_rows = 0;  // the three-kernel path (TopkFew covers the default for <= 4 rows)
    topk_set_tuning(t);
    check_batch(tied_batch({131072, 100000, 3000, 2049}, 131072, 131, 5, 0.9f), 2048);
    check_batch(tied_batch({131072, 65536}, 131072, 132, 3, 0.999f), 2048);  // k-th value is 0
    check_batch(tied_batch({131072}, 131072, 133, 1, 0.0f), 2048);           // all equal
    check_batch(distinct_batch({131072, 16385, 1, 2048, 98304 + 7}, 131072, 134), 2048, true);
    check_batch(distinct_batch({65539, 65539}, 65539, 135, true), 37);
    for (int64_t k : {1, 100, 16384}) check_batch(distinct_batch({131072, 50000, 20000}, 131072, 136 + k), k);
    topk_set_tuning(TopkTuning{});
}

// The sample -> filter -> select path on small inputs (racecheck-sized): scalar and 16-B filter loads.
TEST_F(Topk, ThreeKernelPathSmall) {
    for (int fv : {0, 1}) {
        TopkTuning t;
        t.few_rows = 0;
        t.filter_variant = fv;
        topk_set_tuning(t);
        check_batch(distinct_batch({65539, 40000, 3}, 65539, 141), 2048);
        check_batch(distinct_batch({40000, 33001}, 40000, 142), 2048);
        check_batch(tied_batch({40000, 36000}, 40000, 143, 3, 0.99f), 2048);
        check_batch(distinct_batch({40000, 40000}, 40000, 144 + fv), 2048, true);
        topk_set_tuning(TopkTuning{});
        if (HasFatalFailure()) return;
    }
}

// Key-range extremes for the range-relative radix: ±inf, ±FLT_MAX, denormals, ±0 (span up to 2^32 - 1).
TEST_F(Topk, ExtremeValues) {
    for (int64_t stride : {int64_t{9000}, int64_t{200000}}) {
        Batch b = distinct_batch({static_cast<int>(stride), 5000}, stride, 111);
        std::mt19937 rng(112);
        const float specials[] = {INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1e-45f, -1e-45f, 1e-40f, 0.f, -0.f};
        for (int64_t r = 0; r < b.n_rows; ++r)
            for (int i = 0; i < b.lengths[r]; i += 3) b.values[r * stride + i] = specials[rng() % 9];
        check_batch(b, 2048);
        check_batch(b, 1);
    }
}

// Every filter variant the benchmark sweeps (PDL off/on, work-item sizes, persistent grid) is exact.
TEST_F(Topk, TuningVariantsLong) {
    const Batch b = distinct_batch({1 << 20, 131072, 70001, 5}, 1 << 20, 121);
    const Batch tied = tied_batch({1 << 20, 131072}, 1 << 20, 122, 3, 0.999f);
    const Batch mid = distinct_batch({131072, 131000, 40000, 2500}, 131072, 123);
    {  // medium rows
        TopkTuning t;
        t.few_rows = 0;
        topk_set_tuning(t);
        check_batch(mid, 2048);
        check_batch(distinct_batch({131072}, 131072, 124), 2048);
        topk_set_tuning(TopkTuning{});
        if (HasFatalFailure()) return;
    }
    for (int pdl : {0, 1})
        for (int chunk : {0, 1024, 4096, 32768})
            for (int cps : {0, 1, 8}) {
                TopkTuning t;
                t.pdl = pdl;
                t.filter_chunk = chunk;
                t.filter_ctas_per_sm = cps;
                t.filter_variant = (chunk / 1024 + cps) & 1;  // both filter bodies over the grid shapes
                t.few_rows = 0;                               // <= 4 rows would take the few-rows kernel
                topk_set_tuning(t);
                check_batch(b, 2048, pdl == 1 && cps == 8);
                check_batch(tied, 2048);
                topk_set_tuning(TopkTuning{});
                if (HasFatalFailure()) return;
            }
    for (int range : {32768, 65536, 1 << 20}) {  // the order kernel's CTA ranges
        TopkTuning t;
        t.order_range = range;
        t.few_rows = 0;
        topk_set_tuning(t);
        check_batch(b, 2048);
        check_batch(tied, 2048);
        topk_set_tuning(TopkTuning{});
        if (HasFatalFailure()) return;
    }
}

// ---- few long rows (<= 4 rows of > 32K: decode): one kernel of G CTAs per row, default there ----
class TopkFew : public Topk {
  protected:
    void SetUp() override {
        Topk::SetUp();
        topk_set_tuning(tuning());
    }
    void TearDown() override { topk_set_tuning(TopkTuning{}); }
    // The few-rows kernel on batches of up to 4 rows (the default takes it for <= 2).
    static TopkTuning tuning() {
        TopkTuning t;
        t.few_max_rows = 4;
        return t;
    }
};
// Lengths below / at / above k, not multiples of 64, mixed in one batch; 1..4 rows (G = SMs / rows CTAs per
// row, up to ~32K elements each at 4 x 1M); k from 1 to 16384.
TEST_F(TopkFew, FewRowsExactSets) {
    check_batch(distinct_batch({131072}, 131072, 201), 2048);
    check_batch(distinct_batch({131072 - 5}, 131072, 202), 2048);
    check_batch(distinct_batch({(1 << 18) - 37}, 1 << 18, 203), 2048);
    check_batch(distinct_batch({1 << 20}, 1 << 20, 204), 2048);
    check_batch(distinct_batch({32769}, 32772, 205), 2048);
    check_batch(distinct_batch({1 << 20, 500001, 2049}, 1 << 20, 206), 2048);
    check_batch(distinct_batch({1 << 20, (1 << 20) - 63, 2048, 2047}, 1 << 20, 207), 2048);
    check_batch(distinct_batch({0, 1, 40000, 4097}, 40000, 208), 2048);
    check_batch(distinct_batch({300007, 3, 99999, 65536 + 1}, 300007, 209), 2048);  // unaligned stride
    for (int64_t k : {1, 37, 100, 4096, 16384})
        check_batch(distinct_batch({1 << 20, 131072 + 7, 20000}, 1 << 20, 210 + k), k);
}

TEST_F(TopkFew, FewRowsNegativeAndExtremes) {
    check_batch(distinct_batch({200000, 70000, 1 << 20}, 1 << 20, 221, true), 2048);
    Batch b = distinct_batch({200000, 150001}, 200000, 222);
    std::mt19937 rng(223);
    const float specials[] = {INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1e-45f, -1e-45f, 1e-40f, 0.f, -0.f};
    for (int64_t r = 0; r < b.n_rows; ++r)
        for (int i = 0; i < b.lengths[r]; i += 3) b.values[r * b.row_stride + i] = specials[rng() % 9];
    check_batch(b, 2048);
    check_batch(b, 1);
}

// Rows of 8K..32K in batches of <= 4 (decode at those contexts; the kernel is chosen by kFewMinStride): exact rows,
// ties (zeros and spread), inside a graph, k from 1 to 4096.
TEST_F(TopkFew, FewRowsShortStrides) {
    check_batch(distinct_batch({8193, 9000, 2049}, 9001, 270), 2048);
    check_batch(distinct_batch({32768}, 32768, 271), 2048);
    check_batch(distinct_batch({20000, 16385}, 20001, 272), 2048, true);
    check_batch(distinct_batch({32768, 1000, 2049}, 32768, 273), 2048);
    check_batch(tied_batch({32768, 30000}, 32768, 274, 3, 0.99f), 2048);
    check_batch(spread_ties_batch({32768}, 32768, 275, 13, 1500), 2048);
    for (int64_t k : {1, 37, 4096}) check_batch(distinct_batch({24000}, 24000, 276 + k), k);
}

// As the decode indexer runs it: control words zeroed by an earlier kernel (no init kernel), and with round 0's
// histogram already counted (no histogram, no first barrier). A histogram the kernel ignored, or counted twice,
// would select from the wrong bin.
TEST_F(TopkFew, FewRowsPreparedControlWords) {
    for (int prepared : {1, 2}) {
        SCOPED_TRACE(prepared);
        const std::vector<Batch> batches = {
            distinct_batch({1 << 20}, 1 << 20, 281), distinct_batch({131072, 2000, 99999, 40000}, 131072, 282),
            distinct_batch({9000}, 9001, 283, true), tied_batch({1 << 20, 300000}, 1 << 20, 284, 3, 0.999f),
            spread_ties_batch({131072}, 131072, 285, 13, 1500)};
        for (const Batch& b : batches) {
            const std::vector<int32_t> out = run_gpu(b, 2048, false, nullptr, prepared);
            for (int64_t r = 0; r < b.n_rows; ++r) {
                check_row(b, r, 2048, out.data() + r * 2048);
                if (HasFatalFailure()) return;
            }
        }
    }
}

// Ties: k-th value 0 of a ReLU-like row, all equal, few levels: the bin that holds the k-th key ends as one key value
// with more items than the candidate list holds, so the ties are shared out by the slices' published counts.
TEST_F(TopkFew, FewRowsTies) {
    check_batch(tied_batch({1 << 20, 300000, 70000}, 1 << 20, 231, 3, 0.999f), 2048);
    check_batch(tied_batch({131072}, 131072, 232, 1, 0.0f), 2048);
    check_batch(tied_batch({1 << 20, 100000}, 1 << 20, 233, 7, 0.5f), 2048);
    check_batch(tied_batch({131072, 100000, 3000, 2049}, 131072, 234, 5, 0.9f), 2048);
}

// Strided-sample adversaries on one row: the big values all off the sampled positions, or only on them.
TEST_F(TopkFew, FewRowsSampleAdversaries) {
    const int len = 1 << 20;
    for (int period : {128, 64, 7944}) {
        Batch b = distinct_batch({len}, len, 241 + period);
        for (int i = 0; i < len; ++i)
            if (i % period == 1 || i % period == 0) b.values[i] += 1000.f;
        check_batch(b, 2048);
    }
    // Ascending row (the top k all in the last CTA's slice), descending (all in the first).
    for (int dir : {0, 1}) {
        Batch b = distinct_batch({len}, len, 245 + dir);
        std::sort(b.values.begin(), b.values.end());
        if (dir) std::reverse(b.values.begin(), b.values.end());
        check_batch(b, 2048);
    }
}

// Hot slices: windows of large values (attention sinks at the start, the most recent tokens at the end, a
// block in the middle) give some CTAs far more of the top k than their share (a kernel with per-CTA thresholds
// must re-read them; 8e82caf..5d775bb). Shifted values stay distinct (tie-free check).
TEST_F(TopkFew, FewRowsHotSlices) {
    const auto heat = [](Batch& b, int64_t r, int64_t begin, int64_t count) {
        for (int64_t i = begin; i < begin + count; ++i) b.values[r * b.row_stride + i] += 1000.f;
    };
    Batch b = distinct_batch({1 << 20, 300007}, 1 << 20, 271);
    heat(b, 0, 0, 300);                  // sinks
    heat(b, 0, (1 << 20) - 1500, 1500);  // recent window: ~1500 of the top 2048 in one slice
    heat(b, 1, 300007 - 900, 900);
    heat(b, 1, 150000, 700);
    check_batch(b, 2048);
    check_batch(b, 4096);
    check_batch(b, 37);          // every hot slice holds more than k
    check_batch(b, 2048, true);  // inside a CUDA graph
    Batch c = distinct_batch({131072 - 3}, 131072, 272);
    for (int64_t w = 0; w < 6; ++w) heat(c, 0, 5000 + w * 20000, 400);  // six hot slices of a 128K row
    check_batch(c, 2048);
}

// Narrow ranges: the top-11-bit bin that holds the k-th key holds most of the row, so the select takes further
// rounds of 8-bit digits before it stages candidates: consecutive floats (every key distinct), shuffled.
TEST_F(TopkFew, FewRowsNarrowRange) {
    Batch b = distinct_batch({1 << 20, 300001}, 1 << 20, 281);
    std::mt19937 rng(282);
    for (int64_t r = 0; r < b.n_rows; ++r) {
        std::vector<float> v(static_cast<size_t>(b.lengths[r]));
        float x = 1.0f + static_cast<float>(r);
        for (float& e : v) {
            e = x;
            x = std::nextafter(x, 10.0f);
        }
        std::shuffle(v.begin(), v.end(), rng);
        std::copy(v.begin(), v.end(), b.values.begin() + r * b.row_stride);
    }
    check_batch(b, 2048);
    check_batch(b, 16384);
    check_batch(b, 2048, true);
}

// Graph replays (the control words are re-zeroed by each call), the same scratch over successive calls of
// different inputs, and the same results as the three-kernel path.
TEST_F(TopkFew, FewRowsGraphAndAgreesWithChain) {
    check_batch(distinct_batch({1 << 20, 70000, 1000}, 1 << 20, 251), 2048, true);
    check_batch(distinct_batch({131072 - 5}, 131072, 252), 2048, true);
    check_batch(tied_batch({1 << 20}, 1 << 20, 253, 3, 0.999f), 2048, true);
    const Batch b = distinct_batch({(1 << 19) + 11, 131072, 2049, 1 << 19}, 1 << 19, 254);
    const std::vector<int32_t> few = run_gpu(b, 2048);
    TopkTuning t = tuning();
    t.few_rows = 0;
    topk_set_tuning(t);
    const std::vector<int32_t> chain = run_gpu(b, 2048);
    for (int64_t r = 0; r < b.n_rows; ++r) {
        const std::vector<int32_t> x(few.begin() + r * 2048, few.begin() + (r + 1) * 2048);
        const std::vector<int32_t> y(chain.begin() + r * 2048, chain.begin() + (r + 1) * 2048);
        ASSERT_EQ(x, y) << "row " << r;  // same selection, same order
    }
    // PDL off: plain stream order.
    t = tuning();
    t.pdl = 0;
    topk_set_tuning(t);
    check_batch(b, 2048);
}

// G from the slice-size knob: 8 .. 128 CTAs per 128K row, 33 per row of 4 x 1M (~32K keys each).
TEST_F(TopkFew, FewRowsSliceSizes) {
    const Batch b = distinct_batch({131072, 131072 - 3, 70001}, 131072, 261);
    for (int slice : {1024, 4096, 16384}) {
        TopkTuning t = tuning();
        t.few_slice_min = slice;
        topk_set_tuning(t);
        check_batch(b, 2048);
        if (HasFatalFailure()) return;
    }
    TopkTuning t = tuning();
    topk_set_tuning(t);
    check_batch(distinct_batch({1 << 20, (1 << 20) - 1, 1 << 19, 40000}, 1 << 20, 262), 2048);
    t.few_threads = 512;
    topk_set_tuning(t);
    check_batch(b, 2048);
    check_batch(distinct_batch({1 << 20, 70001}, 1 << 20, 263), 2048, true);
    check_batch(tied_batch({131072, 100000}, 131072, 264, 5, 0.9f), 2048);
}

// Rows written through a block table (the indexer's positions → cache slots), on every path that emits: the
// select kernel's own ordered emission (rows <= 1M), the order kernel (rows > 1M, ties), short rows, few rows.
TEST_F(Topk, SlotMapEveryPath) {
    const auto check_mapped = [&](const Batch& b, int64_t k) {
        const int64_t nb = (b.row_stride + 63) / 64;
        std::vector<int32_t> tables(static_cast<size_t>(b.n_rows * nb));
        std::mt19937 rng(static_cast<uint32_t>(b.row_stride));
        for (int64_t r = 0; r < b.n_rows; ++r) {
            auto first = tables.begin() + r * nb;
            std::iota(first, first + nb, static_cast<int32_t>(3 * nb * r + 5));
            std::shuffle(first, first + nb, rng);
        }
        const std::vector<int32_t> out = run_gpu(b, k, false, &tables);
        for (int64_t r = 0; r < b.n_rows; ++r) {
            check_row(b, r, k, out.data() + r * k, &tables);
            if (::testing::Test::HasFatalFailure()) return;
        }
    };
    check_mapped(distinct_batch({200000, 150001, 70000, 100, 199999}, 200000, 401), 2048);  // chain, ordered select
    check_mapped(distinct_batch({(1 << 20) + 5, 1500000, 2000000, 900000}, 2000000, 402), 2048);  // > 1M: order kernel
    check_mapped(tied_batch({300000, 250000, 70000}, 300000, 403, 3, 0.999f), 2048);              // ties
    check_mapped(distinct_batch({30000, 2000, 32768}, 32768, 404), 2048);                         // short rows
    check_mapped(distinct_batch({1 << 20}, 1 << 20, 405), 2048);                                  // few rows
}

}  // namespace
