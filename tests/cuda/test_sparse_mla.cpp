// Tests of the sparse MLA CUDA kernels (src/backend/cuda/sparse_mla.h, latent_cache.h) against plain CPU loops:
// latent_cache_write vs RMSNorm + RoPE + kv_format's fp8_latent_pack; sparse_mla vs a double-precision softmax over
// the dequantised cache rows (queries rounded to bf16 for BF16 caches, as the kernel multiplies). Skipped without a
// GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/latent_cache.h"
#include "backend/cuda/sparse_mla.h"
#include "core/dtype.h"
#include "kv/kv_format.h"
#include "ops/rope.h"

namespace megactx::cuda {
namespace {

constexpr int kD = 576, kDv = 512, kRank = 512, kRope = 64, kFp8Row = 656;

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CK(x) ASSERT_EQ((x), cudaSuccess)

template <class T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) { cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)); }
    Dev(const std::vector<T>& v) : Dev(v.size()) {
        cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
    ~Dev() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> v(n);
        cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return v;
    }
};

// ---- latent_cache_write -----------------------------------------------------------------------------------------

void cpu_latent_row(const float* x, const std::vector<float>& w, float eps, int32_t pos, float theta, float* row) {
    float ss = 0;
    for (int j = 0; j < kRank; ++j) ss += x[j] * x[j];
    const float r = 1.0f / std::sqrt(ss / kRank + eps);
    for (int j = 0; j < kRank; ++j) row[j] = w[j] * (x[j] * r);
    for (int j = 0; j < kRope / 2; ++j) {
        const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(kRope));
        const float a = static_cast<float>(pos) * inv_freq, c = std::cos(a), s = std::sin(a);
        const float x0 = x[kRank + 2 * j], x1 = x[kRank + 2 * j + 1];
        row[kRank + 2 * j] = x0 * c - x1 * s;
        row[kRank + 2 * j + 1] = x1 * c + x0 * s;
    }
}

TEST(LatentCacheWrite, Fp8AndBf16MatchCpu) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const int n = 500, n_slots = 1200;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0.5f, 1.5f);
    std::vector<float> kv(static_cast<size_t>(n) * kD), w(kRank);
    for (int i = 0; i < n; ++i) {
        const float mag = std::pow(10.0f, static_cast<float>(i % 7) - 3.0f);  // 1e-3 .. 1e3 rows
        for (int j = 0; j < kD; ++j) kv[static_cast<size_t>(i) * kD + j] = nd(rng) * mag * (j % 128 == 5 ? 9.f : 1.f);
    }
    for (auto& x : w) x = ud(rng);
    std::vector<int32_t> pos(n), slots(n);
    std::vector<int32_t> perm(n_slots);
    for (int i = 0; i < n_slots; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n; ++i) {
        pos[i] = static_cast<int32_t>(rng() % 300000);
        slots[i] = i == 17 ? -1 : perm[i];
    }
    const float eps = 1e-6f, theta = 8e6f;
    Dev<float> d_kv(kv), d_w(w);
    Dev<int32_t> d_pos(pos), d_slots(slots);
    for (LatentCacheFormat fmt : {LatentCacheFormat::FP8, LatentCacheFormat::BF16}) {
        const size_t row_bytes = fmt == LatentCacheFormat::FP8 ? kFp8Row : 2 * kD;
        std::vector<uint8_t> init(n_slots * row_bytes, 0xAB);
        Dev<uint8_t> d_cache(init);
        LatentCacheWriteParams p;
        p.kv_raw = d_kv.p;
        p.norm_w = d_w.p;
        p.pos = d_pos.p;
        p.slots = d_slots.p;
        p.cache = d_cache.p;
        p.format = fmt;
        p.n = n;
        p.eps = eps;
        const Rope rope = Rope::plain(theta, kRope);
        p.inv_freq = rope.inv_freq.data();
        CK(launch_latent_cache_write(p, nullptr));
        CK(cudaDeviceSynchronize());
        const std::vector<uint8_t> got = d_cache.get();
        int64_t n_codes = 0, n_same = 0, n_bad_pe = 0, n_bad_c = 0;
        std::vector<float> row(kD);
        std::vector<uint8_t> ref(kFp8Row);
        for (int i = 0; i < n; ++i) {
            if (slots[i] < 0) continue;
            cpu_latent_row(&kv[static_cast<size_t>(i) * kD], w, eps, pos[i], theta, row.data());
            const uint8_t* g = got.data() + static_cast<size_t>(slots[i]) * row_bytes;
            float pe_got[kRope];
            if (fmt == LatentCacheFormat::FP8) {
                fp8_latent_pack(row.data(), kRank, kRope, ref.data());
                for (int t = 0; t < 4; ++t) {
                    float sg, sr;
                    std::memcpy(&sg, g + kRank + 4 * t, 4);
                    std::memcpy(&sr, ref.data() + kRank + 4 * t, 4);
                    ASSERT_EQ(sg, sr) << "row " << i << " tile " << t;
                }
                for (int j = 0; j < kRank; ++j) {
                    ++n_codes;
                    if (g[j] == ref[j]) {
                        ++n_same;
                    } else {
                        // A 1-code difference from a different last bit of the normed value (same sign).
                        ASSERT_EQ(g[j] & 0x80, ref[j] & 0x80) << "row " << i << " j " << j;
                        ASSERT_LE(std::abs((g[j] & 0x7f) - (ref[j] & 0x7f)), 1) << "row " << i << " j " << j;
                    }
                }
                for (int j = 0; j < kRope; ++j) {
                    uint16_t h;
                    std::memcpy(&h, g + kRank + 16 + 2 * j, 2);
                    pe_got[j] = bf16_to_f32(h);
                }
            } else {
                for (int j = 0; j < kRank; ++j) {
                    uint16_t h;
                    std::memcpy(&h, g + 2 * j, 2);
                    const float v = bf16_to_f32(h);
                    if (std::fabs(v - row[j]) > std::fabs(row[j]) * 0.0079f + 1e-30f) ++n_bad_c;
                }
                for (int j = 0; j < kRope; ++j) {
                    uint16_t h;
                    std::memcpy(&h, g + 2 * (kRank + j), 2);
                    pe_got[j] = bf16_to_f32(h);
                }
            }
            float pe_max = 0;
            for (int j = 0; j < kRope; ++j) pe_max = std::max(pe_max, std::fabs(row[kRank + j]));
            // bf16 rounding (2^-8 relative) plus the fp32 sin/cos of angles up to 3e5 rad (~1e-5 relative).
            for (int j = 0; j < kRope; ++j)
                if (std::fabs(pe_got[j] - row[kRank + j]) > 0.0079f * std::fabs(row[kRank + j]) + 1e-4f * pe_max)
                    ++n_bad_pe;
        }
        EXPECT_EQ(n_bad_pe, 0);
        EXPECT_EQ(n_bad_c, 0);
        // The row skipped (slot -1) must leave the cache untouched: untouched rows keep the 0xAB fill.
        const uint8_t* untouched = got.data() + static_cast<size_t>(perm[17]) * row_bytes;
        EXPECT_EQ(untouched[0], 0xAB);
        if (fmt == LatentCacheFormat::FP8) {
            const double same = static_cast<double>(n_same) / static_cast<double>(n_codes);
            std::printf("latent_cache_write fp8: %.5f of codes identical to the CPU pack\n", same);
            EXPECT_GE(same, 0.999);
        }
    }
}

// ---- sparse_mla -----------------------------------------------------------------------------------------------

struct Case {
    int n_head;
    MlaCacheFormat fmt;
    float q_mul = 1.0f;  // queries × q_mul, softmax scale ÷ q_mul (same scores); 1e5 puts |q| beyond f16's range
    int n_tok = 5;       // 1: decode batch 1 (its host plan: 32 splits)
};

// Slot lists: token 0 full (2048 distinct), token 1 a short context (1000 valid, rest −1), token 2 full with
// ~10% scattered −1, token 3 only 37 valid slots at the end of its list, token 4 none valid (output 0).
std::vector<int32_t> make_slots(int n_tok, int topk, int n_slots, std::mt19937& rng) {
    std::vector<int32_t> s(static_cast<size_t>(n_tok) * topk, -1);
    std::vector<int32_t> perm(n_slots);
    for (int i = 0; i < n_slots; ++i) perm[i] = i;
    for (int t = 0; t < n_tok; ++t) {
        std::shuffle(perm.begin(), perm.end(), rng);
        int32_t* r = &s[static_cast<size_t>(t) * topk];
        switch (t % 5) {
            case 0:
                for (int j = 0; j < topk; ++j) r[j] = perm[j];
                break;
            case 1:
                for (int j = 0; j < 1000; ++j) r[j] = perm[j];
                break;
            case 2:
                for (int j = 0; j < topk; ++j) r[j] = (rng() % 10 == 0) ? -1 : perm[j];
                break;
            case 3:
                for (int j = topk - 37; j < topk; ++j) r[j] = perm[j];
                break;
            default:
                break;
        }
    }
    return s;
}

void run_case(const Case& c) {
    const int n_tok = c.n_tok, topk = 2048, n_slots = 6000, h = c.n_head;
    std::mt19937 rng(1234 + h + static_cast<int>(c.fmt));
    std::normal_distribution<float> nd;
    // Cache rows: fp32 values → stored format; the reference uses the dequantised rows.
    std::vector<float> rows(static_cast<size_t>(n_slots) * kD);
    for (auto& x : rows) x = nd(rng);
    std::vector<uint8_t> cache;
    std::vector<float> deq(rows.size());
    if (c.fmt == MlaCacheFormat::FP8) {
        cache.resize(static_cast<size_t>(n_slots) * kFp8Row);
        for (int s = 0; s < n_slots; ++s) {
            fp8_latent_pack(&rows[static_cast<size_t>(s) * kD], kRank, kRope, &cache[static_cast<size_t>(s) * kFp8Row]);
            fp8_latent_unpack(&cache[static_cast<size_t>(s) * kFp8Row], kRank, kRope,
                              &deq[static_cast<size_t>(s) * kD]);
        }
    } else {
        cache.resize(static_cast<size_t>(n_slots) * kD * 2);
        for (size_t k = 0; k < rows.size(); ++k) {
            const uint16_t b = f32_to_bf16(rows[k]);
            std::memcpy(&cache[2 * k], &b, 2);
            deq[k] = bf16_to_f32(b);
        }
    }
    std::vector<float> q(static_cast<size_t>(n_tok) * h * kD);
    for (auto& x : q) x = 1.5f * c.q_mul * nd(rng);
    const std::vector<int32_t> slots = make_slots(n_tok, topk, n_slots, rng);
    const float scale = 1.0f / 16.0f / c.q_mul;

    // Reference: double softmax over the valid slots. BF16 caches: q rounded to bf16 as the kernel does. FP8 caches:
    // q as given (the kernel rounds the latent dims to f16, 2^-11 relative, and the RoPE dims to bf16).
    const bool q_bf16 = c.fmt == MlaCacheFormat::BF16;
    std::vector<double> ref(static_cast<size_t>(n_tok) * h * kDv, 0.0);
    double ref_max = 0;
    for (int t = 0; t < n_tok; ++t)
        for (int hh = 0; hh < h; ++hh) {
            const float* qr = &q[(static_cast<size_t>(t) * h + hh) * kD];
            double qb[kD];
            for (int k = 0; k < kD; ++k) qb[k] = q_bf16 ? bf16_to_f32(f32_to_bf16(qr[k])) : qr[k];
            std::vector<double> sc;
            std::vector<int32_t> ids;
            for (int j = 0; j < topk; ++j) {
                const int32_t s = slots[static_cast<size_t>(t) * topk + j];
                if (s < 0) continue;
                const float* kr = &deq[static_cast<size_t>(s) * kD];
                double d = 0;
                for (int k = 0; k < kD; ++k) d += qb[k] * kr[k];
                sc.push_back(d * scale);
                ids.push_back(s);
            }
            if (sc.empty()) continue;
            const double m = *std::max_element(sc.begin(), sc.end());
            double l = 0;
            for (auto& x : sc) l += (x = std::exp(x - m));
            double* o = &ref[(static_cast<size_t>(t) * h + hh) * kDv];
            for (size_t j = 0; j < sc.size(); ++j) {
                const float* v = &deq[static_cast<size_t>(ids[j]) * kD];
                const double p = sc[j] / l;
                for (int k = 0; k < kDv; ++k) o[k] += p * v[k];
            }
            for (int k = 0; k < kDv; ++k) ref_max = std::max(ref_max, std::fabs(o[k]));
        }

    Dev<float> d_q(q);
    Dev<uint8_t> d_cache(cache);
    Dev<int32_t> d_slots(slots);
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    // The host plan for this n (splits), no split, an uneven split (5 splits of 7,7,7,7,4 chunks) through the combine
    // kernel, and splits merged in clusters: all of a token's splits in one cluster (16, 8, 2), and clusters whose
    // partials the combine kernel merges (32 = 2 × 16, 8 = 4 × 2, 16 = 4 × 4); then value dims divided over two CTAs
    // per split (through the combine, the uneven split, and without splits).
    std::vector<SparseMlaPlan> plans(12);
    plans[0] = sparse_mla_plan(n_tok, h, topk, n_sm);
    plans[1].n_split = 1;
    plans[2].n_split = 5;
    const int clustered[6][2] = {{16, 16}, {8, 8}, {2, 2}, {32, 16}, {8, 2}, {16, 4}};
    for (int k = 0; k < 6; ++k) {
        plans[3 + k].n_split = clustered[k][0];
        plans[3 + k].cluster = clustered[k][1];
    }
    for (int k : {32, 5, 1}) {
        plans[k == 32 ? 9 : k == 5 ? 10 : 11].n_split = k;
        plans[k == 32 ? 9 : k == 5 ? 10 : 11].v_split = 2;
    }
    EXPECT_GT(plans[0].n_split, 1);
    // Hopper holds 5 clusters of 16 of these CTAs at once; were it less, the clustered plans would quietly run smaller
    // ones (each case below prints the cluster size it ran).
    EXPECT_EQ(sparse_mla_launch_cluster(n_tok, 64, plans[3]), 16);
    for (const SparseMlaPlan& plan : plans) {
        Dev<uint8_t> d_scratch(sparse_mla_scratch_bytes(n_tok, h, plan));
        Dev<float> d_out(static_cast<size_t>(n_tok) * h * kDv);
        cudaMemset(d_out.p, 0xFF, d_out.n * sizeof(float));  // NaN: every output must be written
        SparseMlaRunParams p;
        p.q = d_q.p;
        p.cache = d_cache.p;
        p.slots = d_slots.p;
        p.out = d_out.p;
        p.scratch = d_scratch.p;
        p.format = c.fmt;
        p.n = n_tok;
        p.n_head = h;
        p.topk = topk;
        p.scale = scale;
        p.plan = plan;
        CK(launch_sparse_mla(p, nullptr));
        CK(cudaDeviceSynchronize());
        const std::vector<float> got = d_out.get();
        double err = 0;
        for (size_t k = 0; k < got.size(); ++k) {
            ASSERT_TRUE(std::isfinite(got[k])) << "index " << k;
            err = std::max(err, std::fabs(got[k] - ref[k]));
        }
        // Token 4 has no valid slot: exactly zero.
        if (n_tok > 4) {
            for (int k = 0; k < h * kDv; ++k) ASSERT_EQ(got[static_cast<size_t>(4) * h * kDv + k], 0.0f);
        }
        std::printf(
            "sparse_mla h=%d %s q×%g n_split=%d cluster=%d v_split=%d (ran %d): max abs err %.3e, "
            "max|ref| %.3e (rel %.2e)\n",
            h, c.fmt == MlaCacheFormat::FP8 ? "fp8" : "bf16", c.q_mul, plan.n_split, plan.cluster, plan.v_split,
            sparse_mla_launch_cluster(n_tok, h, plan), err, ref_max, err / ref_max);
        // P is rounded to bf16 (BF16 caches) or f16 (FP8) before the PV product. Measured on the H200 (2026-11-29,
        // bf16 P and q everywhere): 7.4e-4 .. 1.04e-3 of max|ref| over all cases and splits.
        EXPECT_LE(err, 3e-3 * ref_max);
    }
}

TEST(SparseMla, Fp8Heads64) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    run_case({64, MlaCacheFormat::FP8});
}
TEST(SparseMla, Fp8LargeQueries) {  // |q| up to ~1e6: the f16 latent queries are scaled by a power of two
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    run_case({64, MlaCacheFormat::FP8, 1e5f});
}
TEST(SparseMla, OneToken) {  // batch 1 under every plan (the host's: 32 splits through the combine)
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    run_case({64, MlaCacheFormat::FP8, 1.0f, 1});
    run_case({128, MlaCacheFormat::BF16, 1.0f, 1});
}
TEST(SparseMla, Bf16Heads64) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    run_case({64, MlaCacheFormat::BF16});
}
TEST(SparseMla, Fp8Heads128) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    run_case({128, MlaCacheFormat::FP8});
}
TEST(SparseMla, Bf16Heads128) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    run_case({128, MlaCacheFormat::BF16});
}

TEST(SparseMla, PlanFillsTheGpu) {
    EXPECT_EQ(sparse_mla_plan(1, 64, 2048, 132).n_split, 32);
    EXPECT_EQ(sparse_mla_plan(1, 64, 2048, 132).cluster, 1);
    EXPECT_EQ(sparse_mla_plan(16, 64, 2048, 132).cluster, 1);
    EXPECT_EQ(sparse_mla_plan(64, 64, 2048, 132).cluster, 2);
    EXPECT_EQ(sparse_mla_plan(128, 64, 2048, 132).cluster, 1);
    EXPECT_EQ(sparse_mla_plan(16, 64, 2048, 132).n_split, 8);
    EXPECT_EQ(sparse_mla_plan(64, 64, 2048, 132).n_split, 2);
    EXPECT_EQ(sparse_mla_plan(128, 64, 2048, 132).n_split, 1);
    // Value-dim splits only for split grids of at most a quarter of the SMs: batch 1 with 64 heads (32 splits).
    EXPECT_EQ(sparse_mla_plan(1, 64, 2048, 132).v_split, 2);
    EXPECT_EQ(sparse_mla_plan(2, 64, 2048, 132).v_split, 1);
    EXPECT_EQ(sparse_mla_plan(1, 128, 2048, 132).v_split, 1);
    EXPECT_EQ(sparse_mla_plan(16, 64, 2048, 132).v_split, 1);
    EXPECT_EQ(sparse_mla_plan(64, 64, 2048, 132).v_split, 1);
    EXPECT_EQ(sparse_mla_plan(4096, 64, 2048, 132).n_split, 1);
    EXPECT_EQ(sparse_mla_scratch_bytes(128, 64, sparse_mla_plan(128, 64, 2048, 132)), 0u);
    EXPECT_FALSE(sparse_mla_supported(32, 2048));
    EXPECT_FALSE(sparse_mla_supported(64, 2000));
}

}  // namespace
}  // namespace megactx::cuda
