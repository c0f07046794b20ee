// CUDA DSA lightning-indexer kernels vs CPU references (model-spec §3.2–3.4):
//   indexer_cache_write vs CpuOps-style LayerNorm + interleaved RoPE + fp8_indexer_pack (kv_format.cpp);
//   indexer_q_quant vs fp8_pow2_scale / f32_to_fp8e4m3;  both with the Hadamard rotation vs hadamard_transform,
//   bit for bit;  indexer_plan groups;
//   indexer_logits vs the same FP8 math in double (dequantised q8 · k8, folded weights);
//   indexer_topk (composition) vs exact top-k of the reference scores, tolerant only at near-ties.
// Needs a GPU: every test is skipped without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/indexer_cache_write.h"
#include "backend/cuda/indexer_logits.h"
#include "backend/cuda/indexer_q_quant.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/cuda/topk.h"
#include "core/dtype.h"
#include "kv/kv_format.h"
#include "ops/rope.h"

namespace megactx {
namespace {

bool has_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device"

template <typename T>
struct DevBuf {
    T* p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t count) : n(count) {
        EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    }
    explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    void upload(const std::vector<T>& h) { cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
    std::vector<T> download() const {
        std::vector<T> h(n);
        cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return h;
    }
};

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// The products and sums below must not be fused (the kernel uses __fmul_rn / __fadd_rn).
#if defined(__GNUC__) && !defined(__clang__)
#define NO_FMA __attribute__((optimize("fp-contract=off")))
#else
#define NO_FMA
#endif

// Sum of 128 values in the kernel's order: (x0 + x1) + (x2 + x3) per lane of 4, then an xor butterfly over the
// 32 lanes (o = 16, 8, 4, 2, 1); every lane ends with the same value.
NO_FMA float warp_order_sum(const float* part) {  // part: [32] per-lane partial sums
    float v[32];
    std::copy(part, part + 32, v);
    for (int o = 16; o > 0; o >>= 1) {
        float n[32];
        for (int l = 0; l < 32; ++l) n[l] = v[l] + v[l ^ o];
        std::copy(n, n + 32, v);
    }
    return v[0];
}

// CPU key path: CpuOps::layer_norm + CpuOps::rope (one token, one head) + fp8_indexer_pack. warp_order = true
// sums the LayerNorm statistics in the kernel's order (so the codes must match exactly up to the fp32 RoPE
// functions); false sums sequentially as CpuOps does: rows with a large offset and a small spread lose bits to
// cancellation in the mean, so some codes land an e4m3 step (or, near zero, a few subnormal steps) away.
NO_FMA void cpu_key(const float* raw, const std::vector<float>& w, const std::vector<float>& b, float eps, int32_t pos,
                    int64_t d_rope, float theta, int64_t slot, uint8_t* pool, bool warp_order, bool hadamard = false) {
    const int64_t d = 128;
    float y[128];
    float mean = 0.0f, var = 0.0f;
    if (warp_order) {
        float part[32];
        for (int l = 0; l < 32; ++l) part[l] = (raw[4 * l] + raw[4 * l + 1]) + (raw[4 * l + 2] + raw[4 * l + 3]);
        mean = warp_order_sum(part) / static_cast<float>(d);
        for (int l = 0; l < 32; ++l) {
            float d2 = 0.0f;
            for (int j = 0; j < 4; ++j) {
                const float dev = raw[4 * l + j] - mean;
                const float sq = dev * dev;
                d2 = d2 + sq;
            }
            part[l] = d2;
        }
        var = warp_order_sum(part) / static_cast<float>(d);
    } else {
        for (int64_t j = 0; j < d; ++j) mean += raw[j];
        mean /= static_cast<float>(d);
        for (int64_t j = 0; j < d; ++j) var += (raw[j] - mean) * (raw[j] - mean);
        var /= static_cast<float>(d);
    }
    const float r = 1.0f / std::sqrt(var + eps);
    for (int64_t j = 0; j < d; ++j) y[j] = (raw[j] - mean) * r * w[j] + b[j];
    for (int64_t i = 0; i < d_rope / 2; ++i) {
        const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d_rope));
        const float angle = static_cast<float>(pos) * inv_freq;
        const float c = std::cos(angle), s = std::sin(angle);
        const float x0 = y[2 * i], x1 = y[2 * i + 1];
        y[2 * i] = x0 * c - x1 * s;
        y[2 * i + 1] = x1 * c + x0 * s;
    }
    if (hadamard) hadamard_transform(y, d);
    fp8_indexer_pack(y, d, slot, pool);
}

// n distinct random slots of a pool of n_blocks 64-token blocks.
std::vector<int32_t> random_slots(int64_t n, int64_t n_blocks, std::mt19937& rng) {
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks * 64));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    perm.resize(static_cast<size_t>(n));
    return perm;
}

// launch_indexer_cache_write over keys raw [n, 128] at pos / slots (interleaved RoPE over d_rope dims, base theta)
// into a zeroed pool of pool_bytes, with the Hadamard rotation when hadamard > 0; the pool's bytes.
std::vector<uint8_t> gpu_cache_write(const std::vector<float>& raw, const std::vector<float>& ln_w,
                                     const std::vector<float>& ln_b, float eps, const std::vector<int32_t>& pos,
                                     const std::vector<int32_t>& slots, int64_t d_rope, float theta, size_t pool_bytes,
                                     float hadamard = 0) {
    DevBuf<float> d_raw(raw), d_w(ln_w), d_b(ln_b);
    DevBuf<int32_t> d_pos(pos), d_slots(slots);
    DevBuf<uint8_t> d_pool(pool_bytes);
    cudaMemset(d_pool.p, 0, pool_bytes);
    IndexerCacheWriteParams p;
    p.k_raw = d_raw.p;
    p.ln_w = d_w.p;
    p.ln_b = d_b.p;
    p.eps = eps;
    p.pos = d_pos.p;
    p.slots = d_slots.p;
    p.n = static_cast<int64_t>(pos.size());
    p.d_rope = d_rope;
    const Rope rope = Rope::plain(theta, d_rope);
    p.inv_freq = rope.inv_freq.data();
    p.pool = d_pool.p;
    p.hadamard_scale = hadamard;
    EXPECT_TRUE(indexer_cache_write_supported(128, d_rope));
    launch_indexer_cache_write(p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return d_pool.download();
}

TEST(IndexerCuda, CacheWriteMatchesCpu) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(1);
    const int64_t n = 777, n_blocks = 20, d_rope = 64;
    const float eps = 1e-6f, theta = 10000.0f;
    std::vector<float> raw(static_cast<size_t>(n * 128));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-3.0f, 3.0f);
    for (int64_t i = 0; i < n; ++i) {  // rows of very different scales and offsets
        const float sc = std::pow(10.0f, mag(rng)), off = nd(rng);
        for (int j = 0; j < 128; ++j) raw[static_cast<size_t>(i * 128 + j)] = off + sc * nd(rng);
    }
    const auto ln_w = randn(128, rng, 0.5f), ln_b = randn(128, rng, 0.2f);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> pd(0, 1 << 20);
    for (auto& p : pos) p = pd(rng);
    const std::vector<int32_t> slots = random_slots(n, n_blocks, rng);

    std::vector<uint8_t> ref(static_cast<size_t>(n_blocks * kFp8IndexerBlockBytes), 0), seq_ref(ref);
    for (int64_t i = 0; i < n; ++i) {
        cpu_key(raw.data() + i * 128, ln_w, ln_b, eps, pos[i], d_rope, theta, slots[i], ref.data(), true);
        cpu_key(raw.data() + i * 128, ln_w, ln_b, eps, pos[i], d_rope, theta, slots[i], seq_ref.data(), false);
    }

    const auto got = gpu_cache_write(raw, ln_w, ln_b, eps, pos, slots, d_rope, theta, ref.size());
    // Against the warp-order reference every code must match, up to one e4m3 step (ord() numbers the e4m3
    // values in order, ±0 → 0) where the fp32 RoPE functions round differently; against the sequential
    // (CpuOps-order) reference the differences are reported: they are the reference's own rounding in the mean.
    auto ord = [](uint8_t c) { return (c & 0x80) ? -static_cast<int>(c & 0x7f) : static_cast<int>(c & 0x7f); };
    int64_t same = 0, off_by_one = 0, bad = 0, scale_bad = 0, seq_diff = 0, seq_far = 0;
    double seq_worst = 0;  // largest |decoded difference| vs the sequential reference, in units of the row's scale
    for (int64_t i = 0; i < n; ++i) {
        const int64_t blk = slots[i] / 64, off = slots[i] % 64;
        const size_t base = static_cast<size_t>(blk * kFp8IndexerBlockBytes);
        for (int j = 0; j < 128; ++j) {
            const uint8_t a = got[base + off * 128 + j], e = ref[base + off * 128 + j],
                          q = seq_ref[base + off * 128 + j];
            if (a == e) {
                ++same;
            } else if (std::abs(ord(a) - ord(e)) <= 1) {
                ++off_by_one;
            } else {
                if (bad < 5)
                    std::printf("token %lld dim %d: got 0x%02x (%g) want 0x%02x (%g)\n", static_cast<long long>(i), j,
                                a, fp8e4m3_to_f32(a), e, fp8e4m3_to_f32(e));
                ++bad;
            }
            if (a != q) {
                ++seq_diff;
                const double dd = std::fabs(static_cast<double>(fp8e4m3_to_f32(a)) - fp8e4m3_to_f32(q));
                seq_worst = std::max(seq_worst, dd);
                if (std::abs(ord(a) - ord(q)) > 1) {
                    if (seq_far < 5)
                        std::printf("vs sequential order: token %lld dim %d: got 0x%02x (%g), sequential 0x%02x (%g)\n",
                                    static_cast<long long>(i), j, a, fp8e4m3_to_f32(a), q, fp8e4m3_to_f32(q));
                    ++seq_far;
                }
            }
        }
        if (std::memcmp(&got[base + 64 * 128 + off * 4], &ref[base + 64 * 128 + off * 4], 4) != 0) ++scale_bad;
    }
    std::printf(
        "cache_write: %lld identical codes, %lld one e4m3 step apart, %lld wrong, %lld scales differ; vs the "
        "sequential-order reference %lld differ (%lld by more than one step, worst %.3g of 448)\n",
        static_cast<long long>(same), static_cast<long long>(off_by_one), static_cast<long long>(bad),
        static_cast<long long>(scale_bad), static_cast<long long>(seq_diff), static_cast<long long>(seq_far),
        seq_worst);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(scale_bad, 0);
    EXPECT_GE(static_cast<double>(same), 0.999 * static_cast<double>(n * 128));
}

// The key write with the Hadamard rotation (ModelConfig::indexer_hadamard) against LayerNorm (warp order) + RoPE +
// hadamard_transform + fp8_indexer_pack. Tokens at position 0 (cos 1, sin 0: RoPE exact on both sides) must match
// byte for byte; elsewhere the device's fp32 RoPE may move a value by an ulp before the rotation, which can move a
// code by one e4m3 step. The pool must also differ from the unrotated write's (the rotation ran).
TEST(IndexerCuda, CacheWriteHadamardMatchesCpu) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(5);
    const int64_t n = 512, n_blocks = 12, d_rope = 64;
    const float eps = 1e-6f, theta = 10000.0f;
    const auto raw = randn(static_cast<size_t>(n * 128), rng, 3.0f);
    const auto ln_w = randn(128, rng, 0.5f), ln_b = randn(128, rng, 0.2f);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> pd(1, 1 << 20);
    for (int64_t i = 0; i < n; ++i) pos[i] = i % 4 == 0 ? 0 : pd(rng);
    const std::vector<int32_t> slots = random_slots(n, n_blocks, rng);
    std::vector<uint8_t> ref(static_cast<size_t>(n_blocks * kFp8IndexerBlockBytes), 0), plain(ref);
    for (int64_t i = 0; i < n; ++i) {
        cpu_key(raw.data() + i * 128, ln_w, ln_b, eps, pos[i], d_rope, theta, slots[i], ref.data(), true, true);
        cpu_key(raw.data() + i * 128, ln_w, ln_b, eps, pos[i], d_rope, theta, slots[i], plain.data(), true, false);
    }
    const auto got = gpu_cache_write(raw, ln_w, ln_b, eps, pos, slots, d_rope, theta, ref.size(), hadamard_scale(128));
    auto ord = [](uint8_t c) { return (c & 0x80) ? -static_cast<int>(c & 0x7f) : static_cast<int>(c & 0x7f); };
    int64_t at_zero_bad = 0, far = 0, same = 0, scale_bad = 0, unrotated_same = 0;
    for (int64_t i = 0; i < n; ++i) {
        const size_t base = static_cast<size_t>((slots[i] / 64) * kFp8IndexerBlockBytes), off = slots[i] % 64;
        for (size_t j = 0; j < 128; ++j) {
            const uint8_t a = got[base + off * 128 + j], e = ref[base + off * 128 + j];
            same += a == e;
            at_zero_bad += pos[i] == 0 && a != e;
            far += std::abs(ord(a) - ord(e)) > 1;
            unrotated_same += a == plain[base + off * 128 + j];
        }
        scale_bad += std::memcmp(&got[base + 64 * 128 + off * 4], &ref[base + 64 * 128 + off * 4], 4) != 0;
    }
    std::printf(
        "cache_write with Hadamard: %lld of %lld codes identical, %lld more than one step apart, %lld scales "
        "differ; %lld codes equal to the unrotated write's\n",
        static_cast<long long>(same), static_cast<long long>(n * 128), static_cast<long long>(far),
        static_cast<long long>(scale_bad), static_cast<long long>(unrotated_same));
    EXPECT_EQ(at_zero_bad, 0);
    EXPECT_EQ(far, 0);
    EXPECT_GE(static_cast<double>(same), 0.999 * static_cast<double>(n * 128));
    EXPECT_LE(scale_bad, n / 100);
    EXPECT_LT(unrotated_same, n * 128 / 4);
}

struct QuantQ {
    std::vector<uint8_t> q8;  // [n, heads, 128]
    std::vector<float> w8;    // [n, heads]
    int64_t heads = 32;
};

QuantQ gpu_q_quant(const std::vector<float>& q, const std::vector<float>& gates, int64_t n, float hs, float ss,
                   int64_t heads = 32, float hadamard = 0) {
    DevBuf<float> d_q(q), d_g(gates), d_w8(static_cast<size_t>(n * heads));
    DevBuf<uint8_t> d_q8(static_cast<size_t>(n * heads * 128));
    IndexerQQuantParams p;
    p.q = d_q.p;
    p.gates = d_g.p;
    p.n = n;
    p.n_head = heads;
    p.head_scale = hs;
    p.softmax_scale = ss;
    p.q8 = d_q8.p;
    p.w8 = d_w8.p;
    p.hadamard_scale = hadamard;
    launch_indexer_q_quant(p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {d_q8.download(), d_w8.download(), heads};
}

// Queries with per-head magnitudes spread over many decades (some under the 1e-4 floor).
std::vector<float> random_q(int64_t n, std::mt19937& rng, int64_t heads = 32) {
    std::vector<float> q(static_cast<size_t>(n * heads * 128));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-6.0f, 2.0f);
    for (int64_t ih = 0; ih < n * heads; ++ih) {
        const float sc = std::pow(10.0f, mag(rng));
        for (int j = 0; j < 128; ++j) q[static_cast<size_t>(ih * 128 + j)] = sc * nd(rng);
    }
    return q;
}

// Without and with the Hadamard rotation (each head vector rotated by hadamard_transform, then quantised): codes
// and folded weights bit for bit (the rotation's butterflies are rounded once each on both sides, in the same order).
void check_q_quant(int64_t heads) {
    std::mt19937 rng(2);
    const int64_t n = 97;
    const auto q = random_q(n, rng, heads);
    const auto gates = randn(static_cast<size_t>(n * heads), rng);
    const float hs = 1.0f / std::sqrt(static_cast<float>(heads)), ss = 1.0f / std::sqrt(128.0f);
    const auto plain = gpu_q_quant(q, gates, n, hs, ss, heads);
    for (bool hadamard : {false, true}) {
        const auto got = hadamard ? gpu_q_quant(q, gates, n, hs, ss, heads, hadamard_scale(128)) : plain;
        int64_t code_bad = 0, w_bad = 0, plain_same = 0;
        for (int64_t ih = 0; ih < n * heads; ++ih) {
            std::vector<float> x(q.begin() + ih * 128, q.begin() + (ih + 1) * 128);
            if (hadamard) hadamard_transform(x.data(), 128);
            float amax = 0;
            for (float v : x) amax = std::max(amax, std::fabs(v));
            const float s = fp8_pow2_scale(amax);
            for (int j = 0; j < 128; ++j) {
                const size_t e = static_cast<size_t>(ih * 128 + j);
                code_bad += got.q8[e] != f32_to_fp8e4m3(x[static_cast<size_t>(j)] / s);
                plain_same += got.q8[e] == plain.q8[e];
            }
            w_bad += got.w8[static_cast<size_t>(ih)] != gates[static_cast<size_t>(ih)] * hs * ss * s;
        }
        EXPECT_EQ(code_bad, 0) << heads << " heads, hadamard " << hadamard;
        EXPECT_EQ(w_bad, 0) << heads << " heads, hadamard " << hadamard;
        if (hadamard) {
            EXPECT_LT(plain_same, n * heads * 128 / 4);  // the rotation ran
        }
    }
}

TEST(IndexerCuda, QQuantMatchesCpu) {
    SKIP_WITHOUT_GPU();
    check_q_quant(32);
    check_q_quant(64);  // DeepSeek-V3.2
}

TEST(IndexerCuda, PlanGroupsRunsOfOneSequence) {
    SKIP_WITHOUT_GPU();
    // rows: seq 0 × 20, seq 1 × 1, seq 2 × 4, seq 3 × 33; plan over rows [2, 58).
    std::vector<int32_t> seq, pos;
    int s = 0;
    for (int len : {20, 1, 4, 33}) {
        for (int j = 0; j < len; ++j) seq.push_back(s), pos.push_back(100 + j);
        ++s;
    }
    DevBuf<int32_t> d_seq(seq), d_pos(pos), d_plan(static_cast<size_t>(indexer_plan_ints(56))), d_len(56);
    IndexerPlanParams p;
    p.pos = d_pos.p;
    p.seq = d_seq.p;
    p.row_begin = 2;
    p.row_end = 58;
    p.plan = d_plan.p;
    p.lengths = d_len.p;
    launch_indexer_plan(p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto plan = d_plan.download();
    const std::vector<int32_t> want = {2, 18, 20, 21, 25, 41, 57, 58};  // group starts, then row_end
    ASSERT_EQ(plan[0], static_cast<int32_t>(want.size()) - 1);
    for (size_t g = 0; g < want.size(); ++g) EXPECT_EQ(plan[1 + g], want[g]) << "group " << g;
    const auto len = d_len.download();
    for (int r = 0; r < 56; ++r) EXPECT_EQ(len[static_cast<size_t>(r)], pos[static_cast<size_t>(r + 2)] + 1);
}

// A batch of sequences over one paged pool: block tables are random permutations of pool blocks, keys are
// packed by the CPU (fp8_indexer_pack), and bytes of slots past each sequence's length are garbage (NaN codes
// included) that the kernels must never let into a selectable score.
struct Scenario {
    std::vector<int32_t> lens;          // [n_seq] cached tokens of each sequence
    std::vector<int32_t> table_offset;  // [n_seq]
    std::vector<int32_t> tables;
    std::vector<uint8_t> pool;
    std::vector<int32_t> pos, seq;  // [n] queries
    int64_t max_context = 0;
};

Scenario make_scenario(const std::vector<int32_t>& lens, const std::vector<int32_t>& queries_per_seq,
                       std::mt19937& rng) {
    Scenario sc;
    sc.lens = lens;
    int64_t n_blocks = 0;
    for (int32_t l : lens) n_blocks += (l + 63) / 64;
    n_blocks += 3;  // a few blocks no table uses
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    sc.pool.resize(static_cast<size_t>(n_blocks * kFp8IndexerBlockBytes));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : sc.pool) b = static_cast<uint8_t>(byte(rng));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-2.0f, 1.0f);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
        sc.table_offset.push_back(static_cast<int32_t>(sc.tables.size()));
        const int32_t nb = (lens[s] + 63) / 64;
        for (int32_t b = 0; b < nb; ++b) sc.tables.push_back(perm[next++]);
        float key[128];
        for (int32_t t = 0; t < lens[s]; ++t) {
            const float m = std::pow(10.0f, mag(rng));
            for (float& x : key) x = m * nd(rng);
            const int64_t slot = static_cast<int64_t>(sc.tables[sc.table_offset[s] + t / 64]) * 64 + t % 64;
            fp8_indexer_pack(key, 128, slot, sc.pool.data());
        }
        for (int32_t j = 0; j < queries_per_seq[s]; ++j) {
            sc.seq.push_back(static_cast<int32_t>(s));
            sc.pos.push_back(lens[s] - queries_per_seq[s] + j);  // last queries: pos ≤ len − 1
        }
        sc.max_context = std::max<int64_t>(sc.max_context, lens[s]);
    }
    return sc;
}

// Reference scores of row i over t ≤ pos[i] in double: k_scale(t) · Σ_h w8_h · relu(dq(q8_h) · dq(k8(t))), and
// k_scale(t) · Σ_h |w8_h| · Σ_c |q8_hc · k8_c| (the conditioning scale: the tensor cores add FP8 products with
// fewer than 24 mantissa bits, so the error is bounded relative to this sum, not to the score itself).
void reference_row(const Scenario& sc, const QuantQ& qq, int64_t i, std::vector<double>& val,
                   std::vector<double>& mag) {
    const int32_t s = sc.seq[static_cast<size_t>(i)], n_t = sc.pos[static_cast<size_t>(i)] + 1;
    val.assign(static_cast<size_t>(n_t), 0.0);
    mag.assign(static_cast<size_t>(n_t), 0.0);
    const int64_t heads = qq.heads;
    std::vector<float> qd(static_cast<size_t>(heads * 128));
    for (int64_t e = 0; e < heads * 128; ++e)
        qd[static_cast<size_t>(e)] = fp8e4m3_to_f32(qq.q8[static_cast<size_t>(i * heads * 128 + e)]);
    float kd[128];
    for (int32_t t = 0; t < n_t; ++t) {
        const int64_t blk = sc.tables[static_cast<size_t>(sc.table_offset[static_cast<size_t>(s)] + t / 64)];
        const uint8_t* b = sc.pool.data() + blk * kFp8IndexerBlockBytes;
        for (int c = 0; c < 128; ++c) kd[c] = fp8e4m3_to_f32(b[(t % 64) * 128 + c]);
        float ks;
        std::memcpy(&ks, b + 64 * 128 + (t % 64) * 4, 4);
        double v = 0, m = 0;
        for (int64_t h = 0; h < heads; ++h) {
            double dot = 0, abs_dot = 0;
            for (int c = 0; c < 128; ++c) {
                const double pr = static_cast<double>(qd[static_cast<size_t>(h * 128 + c)]) * kd[c];
                dot += pr;
                abs_dot += std::fabs(pr);
            }
            const double w = qq.w8[static_cast<size_t>(i * heads + h)];
            v += w * std::max(dot, 0.0);
            m += std::fabs(w) * abs_dot;
        }
        val[static_cast<size_t>(t)] = v * ks;
        mag[static_cast<size_t>(t)] = m * ks;
    }
}

struct DevScenario {
    DevBuf<uint8_t> pool;
    DevBuf<int32_t> pos, seq, table_offset, tables;
    explicit DevScenario(const Scenario& sc)
        : pool(sc.pool), pos(sc.pos), seq(sc.seq), table_offset(sc.table_offset), tables(sc.tables) {}
};

void check_logits(const std::vector<int32_t>& lens, const std::vector<int32_t>& qps, int64_t row_begin, int64_t row_end,
                  uint32_t seed, int kernel, int64_t heads = 32) {
    std::mt19937 rng(seed);
    const Scenario sc = make_scenario(lens, qps, rng);
    const auto n = static_cast<int64_t>(sc.pos.size());
    if (row_end < 0) row_end = n;
    const auto q = random_q(n, rng, heads);
    const auto gates = randn(static_cast<size_t>(n * heads), rng);
    const QuantQ qq =
        gpu_q_quant(q, gates, n, 1.0f / std::sqrt(static_cast<float>(heads)), 1.0f / std::sqrt(128.0f), heads);
    DevScenario ds(sc);
    DevBuf<uint8_t> d_q8(qq.q8);
    DevBuf<float> d_w8(qq.w8);
    const int64_t rows = row_end - row_begin, stride = sc.max_context + 5;
    DevBuf<int32_t> d_plan(static_cast<size_t>(indexer_plan_ints(rows)));
    DevBuf<float> d_out(static_cast<size_t>(rows * stride));
    cudaMemset(d_out.p, 0xff, d_out.n * 4);  // NaN: every entry t ≤ pos must be written
    IndexerPlanParams pp;
    pp.pos = ds.pos.p;
    pp.seq = ds.seq.p;
    pp.row_begin = row_begin;
    pp.row_end = row_end;
    pp.plan = d_plan.p;
    pp.table_offset = ds.table_offset.p;
    launch_indexer_plan(pp, nullptr);
    IndexerLogitsParams p;
    p.q8 = d_q8.p;
    p.w8 = d_w8.p;
    p.pool = ds.pool.p;
    p.pos = ds.pos.p;
    p.seq = ds.seq.p;
    p.table_offset = ds.table_offset.p;
    p.tables = ds.tables.p;
    p.row_begin = row_begin;
    p.row_end = row_end;
    p.n_seq = static_cast<int64_t>(lens.size());
    // Odd seeds pass the most queries of one sequence (the tight grid bound BatchPlan gives), even seeds leave it
    // unknown (the bound from the totals): both must score every row.
    p.max_seq_rows = seed % 2 ? *std::max_element(qps.begin(), qps.end()) : 0;
    p.max_context = sc.max_context;
    p.out = d_out.p;
    p.out_stride = stride;
    p.plan = d_plan.p;
    p.pool_blocks = static_cast<int64_t>(sc.pool.size()) / 8448;
    p.kernel = static_cast<int16_t>(kernel);
    p.n_head = static_cast<int16_t>(heads);
    // no silent fallback to another kernel (64 heads: kernel 2 for kernel 0 and 2 alike)
    ASSERT_EQ(launch_indexer_logits(p, nullptr), heads == 64 ? 2 : kernel);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = d_out.download();
    // mma.sync accumulates the FP8 products in fp32 (measured worst 4.7e-8); wgmma's FP8 path adds its products
    // with fewer mantissa bits (about 14), so kernels 2 and 3 are held to 1e-3 of the conditioning sum.
    const double tol = kernel == 1 ? 1e-5 : 1e-3;
    double worst = 0;
    int64_t bad = 0, checked = 0;
    std::vector<double> val, mag;
    for (int64_t i = row_begin; i < row_end; ++i) {
        reference_row(sc, qq, i, val, mag);
        const float* o = out.data() + (i - row_begin) * stride;
        for (size_t t = 0; t < val.size(); ++t) {
            const double err = std::fabs(static_cast<double>(o[t]) - val[t]);
            const double rel = err / (mag[t] + 1e-30);
            worst = std::max(worst, std::isnan(rel) ? 1e30 : rel);
            if (!(err <= tol * mag[t] + 1e-30)) {
                if (bad < 5)
                    std::printf("row %lld t %zu: got %.8g want %.8g (|terms| %.3g)\n", static_cast<long long>(i), t,
                                o[t], val[t], mag[t]);
                ++bad;
            }
            ++checked;
        }
    }
    std::printf(
        "logits kernel %d, %lld heads: %lld scores checked, worst error %.3g of the conditioning sum "
        "(tolerance %g)\n",
        kernel, static_cast<long long>(heads), static_cast<long long>(checked), worst, tol);
    EXPECT_EQ(bad, 0);
}

TEST(IndexerCuda, LogitsDecodeSeveralSequences) {
    SKIP_WITHOUT_GPU();
    // Lengths below, at and above 2048, not multiples of 64; 1–4 queries per sequence (MTP verification).
    for (int kernel : {1, 2, 3})
        check_logits({1, 63, 64, 65, 2048, 3001, 100003}, {1, 2, 1, 4, 3, 1, 4}, 0, -1, 3, kernel);
    // One query per sequence (the single-query decode path), several lengths.
    for (int kernel : {1, 2, 3}) check_logits({5000, 130, 64, 70003}, {1, 1, 1, 1}, 0, -1, 6, kernel);
    // Rows per sequence estimated at 4 (13 rows, 4 sequences) while one group has 10: kernel 2 stages the
    // group's queries in chunks of 4 (4 + 4 + 2) and streams its pages once per chunk.
    for (int kernel : {1, 2, 3}) check_logits({3000, 500, 200, 100}, {10, 1, 1, 1}, 0, -1, 8, kernel);
    // MTP verification, 4 queries for each of 6 sequences, with the most rows per sequence known: a grid of exactly
    // 6 groups (the totals alone allow 7).
    for (int kernel : {1, 2, 3}) check_logits({5000, 300, 70, 129, 2049, 64}, {4, 4, 4, 4, 4, 4}, 0, -1, 11, kernel);
}

TEST(IndexerCuda, LogitsPrefillChunkWithRowRange) {
    SKIP_WITHOUT_GPU();
    // Two sequences, 40 + 37 queries (groups of 16 and remainders), scored rows 3 .. 75 of the batch.
    for (int kernel : {1, 2, 3}) check_logits({2500, 5000}, {40, 37}, 3, 75, 4, kernel);
    // 5–8 queries per sequence (the 8-query tile, one sub-tile).
    for (int kernel : {1, 2, 3}) check_logits({3000, 777, 129}, {8, 5, 7}, 0, -1, 7, kernel);
    // Kernel 3 (prefill's): a 20,001-token sequence has 313 pages, so its groups span two work items of up to 256
    // pages and go round the 16-stage ring many times; 33 queries = two full groups of 16 and one of 1.
    for (int kernel : {2, 3}) check_logits({20001, 700}, {33, 16}, 0, -1, 9, kernel);
}

// DeepSeek-V3.2's 64 heads: kernel 2, each query as two 32-head units summed before the store; kernel 0 takes the
// tile by shape, kernel 2 the batch-invariant mode's one tile for every shape.
TEST(IndexerCuda, LogitsSixtyFourHeads) {
    SKIP_WITHOUT_GPU();
    for (int kernel : {0, 2}) {
        const auto run = [&](const std::vector<int32_t>& lens, const std::vector<int32_t>& qps, int64_t b, int64_t e,
                             uint32_t seed) { check_logits(lens, qps, b, e, seed, kernel, 64); };
        run({1, 63, 64, 65, 2048, 3001, 100003}, {1, 2, 1, 4, 3, 1, 4}, 0, -1, 3);  // decode and MTP verification
        run({5000, 130, 64, 70003}, {1, 1, 1, 1}, 0, -1, 6);                        // one query per sequence
        run({3000, 500, 200, 100}, {10, 1, 1, 1}, 0, -1, 8);                        // a group past the estimate
        run({2500, 5000}, {40, 37}, 3, 75, 4);                                      // prefill rows 3 .. 75
        run({3000, 777, 129}, {8, 5, 7}, 0, -1, 7);
    }
}

// Rows of `out` (slots from the composition) whose top-k set differs from the CPU reference beyond fp32 near-ties.
int64_t rows_off_reference(const Scenario& sc, const QuantQ& qq, const std::vector<int32_t>& out, int64_t n,
                           int64_t topk) {
    std::vector<double> val, mag;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        reference_row(sc, qq, i, val, mag);
        const int32_t s = sc.seq[static_cast<size_t>(i)];
        const auto n_t = static_cast<int64_t>(val.size()), k = std::min(topk, n_t);
        // slot → position of this sequence
        std::vector<int32_t> got;
        for (int64_t j = 0; j < topk; ++j) {
            const int32_t slot = out[static_cast<size_t>(i * topk + j)];
            if (slot < 0) continue;
            int32_t t = -1;
            for (int32_t b = 0; b * 64 < sc.lens[static_cast<size_t>(s)]; ++b)
                if (sc.tables[static_cast<size_t>(sc.table_offset[static_cast<size_t>(s)] + b)] == slot / 64)
                    t = b * 64 + slot % 64;
            got.push_back(t);
        }
        std::vector<int32_t> order(static_cast<size_t>(n_t));
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return val[a] > val[b]; });
        const double kth = val[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
        const double mag_kth = mag[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
        std::vector<char> picked(static_cast<size_t>(n_t), 0);
        bool ok = static_cast<int64_t>(got.size()) == k;
        for (int32_t t : got) {
            if (t < 0 || t >= n_t || picked[static_cast<size_t>(t)]) {
                ok = false;
                continue;
            }
            picked[static_cast<size_t>(t)] = 1;
            // A pick below the k-th reference value must be a near-tie (within the fp32 rounding of the sums).
            if (val[static_cast<size_t>(t)] < kth - 2e-3 * (mag[static_cast<size_t>(t)] + mag_kth)) ok = false;
        }
        for (int64_t r = 0; r < k; ++r) {  // everything clearly above the k-th must be picked
            const int32_t t = order[static_cast<size_t>(r)];
            if (!picked[static_cast<size_t>(t)] &&
                val[static_cast<size_t>(t)] > kth + 2e-3 * (mag[static_cast<size_t>(t)] + mag_kth))
                ok = false;
        }
        if (!ok) {
            ++bad;
            std::printf("row %lld (seq %d, pos %d): top-k set differs from the reference\n", static_cast<long long>(i),
                        s, sc.pos[static_cast<size_t>(i)]);
        }
    }
    return bad;
}

// launch_indexer_topk over the scenario, rows_per_group rows scored at once; returns the slots.
std::vector<int32_t> run_composition(const Scenario& sc, const std::vector<float>& q, const std::vector<float>& gates,
                                     int64_t n_seq, int64_t max_seq_rows, int64_t rows_per_group, int64_t topk,
                                     int64_t heads = 32, int logits_kernel = 0) {
    const auto n = static_cast<int64_t>(sc.pos.size());
    DevScenario ds(sc);
    DevBuf<float> d_q(q), d_g(gates);
    DevBuf<int32_t> d_out(static_cast<size_t>(n * topk));
    EXPECT_TRUE(indexer_topk_supported(heads, 128, 64, topk, sc.max_context));
    const size_t scratch = indexer_topk_scratch_bytes(rows_per_group, sc.max_context, topk);
    DevBuf<uint8_t> d_scratch(scratch);
    EXPECT_EQ(cudaMemset(d_scratch.p, 0xff, scratch), cudaSuccess);  // no zero words by chance
    IndexerTopkCudaParams p;
    p.q = d_q.p;
    p.gates = d_g.p;
    p.n_head = heads;
    p.logits_kernel = logits_kernel;
    p.pool = ds.pool.p;
    p.pos = ds.pos.p;
    p.seq = ds.seq.p;
    p.table_offset = ds.table_offset.p;
    p.tables = ds.tables.p;
    p.n = n;
    p.n_seq = n_seq;
    p.max_seq_rows = max_seq_rows;
    p.max_context = sc.max_context;
    p.softmax_scale = 1.0f / std::sqrt(128.0f);
    p.head_scale = 1.0f / std::sqrt(static_cast<float>(heads));
    p.topk = topk;
    p.max_rows_per_group = rows_per_group;
    p.out_slots = d_out.p;
    p.scratch = d_scratch.p;
    p.scratch_bytes = scratch;
    EXPECT_TRUE(launch_indexer_topk(p, nullptr));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return d_out.download();
}

TEST(IndexerCuda, TopkCompositionSelectsReferenceTopk) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(5);
    const std::vector<int32_t> lens = {700, 2048, 2049, 5003, 70001}, qps = {2, 1, 3, 4, 2};
    const Scenario sc = make_scenario(lens, qps, rng);
    const auto n = static_cast<int64_t>(sc.pos.size());
    const auto q = random_q(n, rng);
    const auto gates = randn(static_cast<size_t>(n * 32), rng);
    const QuantQ qq = gpu_q_quant(q, gates, n, 1.0f / std::sqrt(32.0f), 1.0f / std::sqrt(128.0f));
    // Groups of 5 rows (three-kernel top-k), and of 1 and 3 rows (the few-rows grid-wide top-k of decode).
    for (const int64_t rows_per_group : {int64_t{5}, int64_t{1}, int64_t{3}}) {
        const auto out = run_composition(sc, q, gates, static_cast<int64_t>(lens.size()), 4, rows_per_group, 2048);
        EXPECT_EQ(rows_off_reference(sc, qq, out, n, 2048), 0) << "rows_per_group " << rows_per_group;
    }
}

// Decode, one query per sequence (max_seq_rows 1) at contexts past 8K and batches of <= 4: the plan kernel zeroes
// the few-rows select's control words and kernel 2 counts its first histogram while it writes the scores. The
// result must be the reference's and the same slots as without that preparation (max_seq_rows unknown).
TEST(IndexerCuda, TopkDecodeWithPreparedSelect) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(6);
    for (const std::vector<int32_t>& lens :
         {std::vector<int32_t>{131072}, std::vector<int32_t>{9000, 70001, 2000, 40000}, std::vector<int32_t>{8200}}) {
        const Scenario sc = make_scenario(lens, std::vector<int32_t>(lens.size(), 1), rng);
        const auto n = static_cast<int64_t>(sc.pos.size());
        const auto q = random_q(n, rng);
        const auto gates = randn(static_cast<size_t>(n * 32), rng);
        const QuantQ qq = gpu_q_quant(q, gates, n, 1.0f / std::sqrt(32.0f), 1.0f / std::sqrt(128.0f));
        const auto n_seq = static_cast<int64_t>(lens.size());
        const auto fused = run_composition(sc, q, gates, n_seq, 1, n, 2048);
        const auto plain = run_composition(sc, q, gates, n_seq, 0, n, 2048);
        EXPECT_EQ(rows_off_reference(sc, qq, fused, n, 2048), 0) << "batch " << n;
        EXPECT_EQ(fused, plain) << "batch " << n;
    }
}

// The composition at 64 heads: decode with the prepared select (one query per sequence), MTP verification rows
// and prefill groups, against the reference top-k; the batch-invariant mode's fixed tile gives the same slots.
TEST(IndexerCuda, TopkCompositionSixtyFourHeads) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(12);
    const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> cases = {
        {{131072}, {1}}, {{9000, 70001, 2000}, {1, 1, 1}}, {{700, 2049, 5003, 70001}, {2, 3, 4, 1}}, {{6000}, {37}}};
    for (const auto& [lens, qps] : cases) {
        const Scenario sc = make_scenario(lens, qps, rng);
        const auto n = static_cast<int64_t>(sc.pos.size());
        const auto q = random_q(n, rng, 64);
        const auto gates = randn(static_cast<size_t>(n * 64), rng);
        const QuantQ qq = gpu_q_quant(q, gates, n, 1.0f / 8.0f, 1.0f / std::sqrt(128.0f), 64);
        const auto n_seq = static_cast<int64_t>(lens.size());
        const int64_t most = *std::max_element(qps.begin(), qps.end());
        const auto out = run_composition(sc, q, gates, n_seq, most, n, 2048, 64);
        EXPECT_EQ(rows_off_reference(sc, qq, out, n, 2048), 0) << n << " rows";
        const auto fixed = run_composition(sc, q, gates, n_seq, most, n, 2048, 64, 2);
        EXPECT_EQ(rows_off_reference(sc, qq, fixed, n, 2048), 0) << n << " rows, fixed tile";
    }
}

}  // namespace
}  // namespace megactx
