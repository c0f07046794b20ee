// CudaOps against the CPU oracle, op by op (ggml test-backend-ops style): every case builds random inputs, runs
// CpuOps and CudaOps on the same values and compares with a stated tolerance relative to max |CPU result|.
// KV formats: the CPU reference reads an F32 cache holding the same rows round-tripped through the format
// (bf16 rounding, kv_format.cpp pack/unpack); the fused cache writes are compared byte for byte where the format
// is quantised. Top-k sets must be equal except for candidates whose scores tie the k-th within 1e-5.
// Skips when there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/moe_plan.h"
#include "kv/kv_format.h"

namespace megactx {
namespace {

class CudaOpsTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
        gpu_ = make_cuda_ops(CudaOptions{});
    }

    // Host buffers stay alive for the whole test: CudaOps caches weights and vectors by their host address.
    std::vector<float>& keep(std::vector<float> v) { return floats_.emplace_back(std::move(v)); }
    std::vector<float> randv(int64_t n, float scale = 1.0f) {
        std::normal_distribution<float> d(0.0f, scale);
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = d(rng_);
        return v;
    }
    // A tensor of `ops` holding v (uploaded through upload_i32: same bytes).
    static Tensor put(Ops& ops, const std::vector<float>& v, std::vector<int64_t> shape) {
        std::vector<int32_t> bits(v.size());
        std::memcpy(bits.data(), v.data(), v.size() * 4);
        Tensor t = ops.upload_i32(bits);
        t.dtype = DType::F32;
        t.shape = std::move(shape);
        return t;
    }
    static Tensor put_i32(Ops& ops, const std::vector<int32_t>& v, std::vector<int64_t> shape) {
        Tensor t = ops.upload_i32(v);
        t.shape = std::move(shape);
        return t;
    }
    static std::vector<float> get(Ops& ops, const Tensor& t) {
        std::vector<float> v(static_cast<size_t>(t.numel()));
        ops.download(t, v.data());
        return v;
    }
    static std::vector<int32_t> get_i32(Ops& ops, const Tensor& t) {
        std::vector<int32_t> v(static_cast<size_t>(t.numel()));
        ops.download(t, v.data());
        return v;
    }
    // Weight [rows, cols] of `dtype` with random values (FP8: 128×128 block scales).
    Weight make_weight(DType dtype, int64_t rows, int64_t cols, float scale = 0.1f) {
        Weight w;
        w.name = "test";
        w.dtype = dtype;
        w.rows = rows;
        w.cols = cols;
        const std::vector<float> v = randv(rows * cols, scale);
        auto& bytes = bytes_.emplace_back();
        if (dtype == DType::F32) {
            bytes.resize(v.size() * 4);
            std::memcpy(bytes.data(), v.data(), bytes.size());
        } else if (dtype == DType::BF16) {
            bytes.resize(v.size() * 2);
            for (size_t i = 0; i < v.size(); ++i) {
                const uint16_t h = f32_to_bf16(v[i]);
                std::memcpy(bytes.data() + 2 * i, &h, 2);
            }
        } else {
            bytes.resize(v.size());
            const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
            w.scale_inv.resize(static_cast<size_t>(br * bc));
            std::uniform_real_distribution<float> s(0.5f, 2.0f);
            for (float& x : w.scale_inv) x = s(rng_) * scale / 100.0f;
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t c = 0; c < cols; ++c) {
                    const float sc = w.scale_inv[static_cast<size_t>((r / 128) * bc + c / 128)];
                    bytes[static_cast<size_t>(r * cols + c)] =
                        f32_to_fp8e4m3(v[static_cast<size_t>(r * cols + c)] / sc);
                }
            }
        }
        w.data = bytes.data();
        return w;
    }

    // max |a − b| ≤ tol · max |b|, with a printout either way.
    static void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
                             const std::string& what) {
        ASSERT_EQ(gpu.size(), cpu.size()) << what;
        double scale = 0, err = 0;
        size_t worst = 0;
        for (size_t i = 0; i < cpu.size(); ++i) {
            scale = std::max(scale, static_cast<double>(std::fabs(cpu[i])));
            const double d = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
            if (!(d <= err)) {
                err = std::isnan(d) ? INFINITY : d;
                worst = i;
            }
        }
        std::printf("  %-60s max err %.3e, relative %.3e (tol %.1e)\n", what.c_str(), err,
                    scale > 0 ? err / scale : err, tol);
        EXPECT_LE(err, tol * std::max(scale, 1e-30))
            << what << ": worst at " << worst << " gpu " << gpu[worst] << " cpu " << cpu[worst];
    }

    std::mt19937 rng_{1234};
    CpuOps cpu_;
    std::unique_ptr<Ops> gpu_;
    std::deque<std::vector<float>> floats_;
    std::deque<std::vector<uint8_t>> bytes_;
};

TEST_F(CudaOpsTest, Norms) {
    for (auto [n, d] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {7, 576}, {33, 512}, {5, 6144}, {3, 100}}) {
        const auto x = randv(n * d);
        auto& w = keep(randv(d));
        auto& b = keep(randv(d));
        for (int k = 0; k < 2; ++k) {
            std::vector<float> out[2];
            int i = 0;
            for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
                Tensor tx = put(*ops, x, {n, d});
                Tensor ty = ops->alloc(DType::F32, {n, d});
                if (k == 0)
                    ops->rms_norm(tx, w, 1e-6f, ty);
                else
                    ops->layer_norm(tx, w, b, 1e-6f, ty);
                out[i++] = get(*ops, ty);
            }
            expect_close(out[1], out[0], 1e-5,
                         (k == 0 ? "rms_norm " : "layer_norm ") + std::to_string(n) + "x" + std::to_string(d));
        }
    }
}

// The pre-norm residual step: against the CPU (x after the add, and y), and bitwise against the CUDA add followed by
// the CUDA rms_norm (the fused kernel must not change a value). d = 100 takes the scalar kernel.
TEST_F(CudaOpsTest, AddRmsNorm) {
    // 12288: six float4s per thread (the V = 8 kernel); 70 rows of 2052
    for (auto [n, d] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 6144}, {7, 576}, {33, 512}, {3, 100}, {2, 12288}, {70, 2052}}) {
        const auto x = randv(n * d), delta = randv(n * d);
        auto& w = keep(randv(d));
        std::vector<float> xs[3], ys[3];
        for (int k = 0; k < 3; ++k) {
            Ops& ops = k == 0 ? static_cast<Ops&>(cpu_) : *gpu_;
            Tensor tx = put(ops, x, {n, d});
            Tensor td = put(ops, delta, {n, d});
            Tensor ty = ops.alloc(DType::F32, {n, d});
            if (k < 2) {
                ops.add_rms_norm(tx, td, w, 1e-6f, ty);
            } else {
                ops.add(tx, td);
                ops.rms_norm(tx, w, 1e-6f, ty);
            }
            xs[k] = get(ops, tx);
            ys[k] = get(ops, ty);
        }
        const std::string what = "add_rms_norm " + std::to_string(n) + "x" + std::to_string(d);
        expect_close(xs[1], xs[0], 0.0, what + " (x + delta)");
        expect_close(ys[1], ys[0], 1e-5, what);
        EXPECT_EQ(xs[1], xs[2]) << what;
        EXPECT_EQ(ys[1], ys[2]) << what << ": fused and unfused differ";
    }
}

TEST_F(CudaOpsTest, Linear) {
    CudaOptions gemv_opts;
    gemv_opts.fp8_gemv_max_rows = 8;
    const auto gemv8 = make_cuda_ops(gemv_opts);
    struct C {
        DType t;
        int64_t n, in, out;
        double tol;
    };
    // fp32 weights: fp32 GEMM; bf16: activations rounded to bf16. fp8, up to 8 rows (an Ops whose GEMV takes up to
    // 8 rows; the default stops at 2): the FP8 GEMV (fp8_gemv.h, staged or segmented kernel) reads the e4m3 weights
    // and scales with fp32 activations, like the CPU: fp32 rounding only. Its cases cover partial 128-blocks in both
    // directions, inputs beyond one 1024-column stage, and 1..8 rows. fp8, more rows:
    // the W8A8 GEMM (LinearFp8W8A8 below), except where cuBLASLt refuses the shape (an input width that is not a
    // multiple of 16, 130 output rows): then a bf16 copy of the weight and bf16 activations, 1.5e-2.
    for (const C c :
         {C{DType::F32, 1, 64, 48, 1e-5}, C{DType::F32, 37, 256, 320, 1e-5}, C{DType::F32, 5, 200, 130, 1e-5},
          C{DType::BF16, 1, 64, 48, 1e-2}, C{DType::BF16, 37, 512, 320, 1e-2}, C{DType::BF16, 5, 200, 130, 1e-2},
          C{DType::F8_E4M3, 3, 256, 384, 1e-5}, C{DType::F8_E4M3, 9, 300, 200, 1.5e-2},
          C{DType::F8_E4M3, 1, 2500, 130, 1e-5}, C{DType::F8_E4M3, 8, 1028, 257, 1e-5},
          C{DType::F8_E4M3, 2, 132, 1, 1e-5}, C{DType::F8_E4M3, 5, 4096, 96, 1e-5},
          C{DType::F8_E4M3, 2, 130, 64, 1.5e-2}, C{DType::F8_E4M3, 37, 256, 130, 1.5e-2},
          // the segmented GEMV (one row; up to 8 from 4096 columns): 1 to 8 column segments, output rows not a
          // multiple of 4 (a warp's last rows clamped), partial scale blocks, a segment end inside a 512-column
          // step, 3 and 5 rows through the 4- and 8-row kernels
          C{DType::F8_E4M3, 1, 6144, 576, 1e-5}, C{DType::F8_E4M3, 1, 2048, 4102, 1e-5},
          C{DType::F8_E4M3, 1, 384, 200, 1e-5}, C{DType::F8_E4M3, 1, 16384, 6, 1e-5},
          C{DType::F8_E4M3, 2, 4096, 1001, 1e-5}, C{DType::F8_E4M3, 2, 6144, 64, 1e-5},
          C{DType::F8_E4M3, 2, 2048, 300, 1e-5}, C{DType::F8_E4M3, 3, 6144, 576, 1e-5},
          C{DType::F8_E4M3, 4, 4096, 260, 1e-5}, C{DType::F8_E4M3, 5, 4096, 130, 1e-5},
          C{DType::F8_E4M3, 8, 8192, 1000, 1e-5}, C{DType::F8_E4M3, 4, 2048, 300, 1e-5}}) {
        const Weight w = make_weight(c.t, c.out, c.in);
        const auto x = randv(c.n * c.in);
        std::vector<float> out[3];
        int i = 0;
        Ops* gpu = c.t == DType::F8_E4M3 ? gemv8.get() : gpu_.get();
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu, gpu}) {
            Tensor tx = put(*ops, x, {c.n, c.in});
            Tensor ty = ops->alloc(DType::F32, {c.n, c.out});
            ops->linear(tx, w, ty);
            out[i++] = get(*ops, ty);
        }
        // Reproducible bit for bit (the FP8 GEMV's column splits add up in a fixed order).
        EXPECT_EQ(out[2], out[1]) << "linear " << dtype_name(c.t) << " " << c.n << "x" << c.in << " differs run to run";
        expect_close(out[1], out[0], c.tol,
                     std::string("linear ") + dtype_name(c.t) + " " + std::to_string(c.n) + "x" + std::to_string(c.in) +
                         "->" + std::to_string(c.out));
    }
}

// FP8 weights with more than 2 rows run W8A8: the activations are quantised per 1 × 128 group to e4m3 (s = amax /
// 448, act_quant.h), as transformers' FP8Linear and DeepGEMM do, and the block-scaled GEMM runs on the tensor cores:
// up to 16 rows (input a multiple of 128) the few-row kernel (fp8_gemm_small.h), else cuBLASLt. Each case runs
// through both (the default Ops, and one with the few-row kernel off) where cuBLASLt takes the shape. The reference is
// the CPU's fp32 linear on the same quantised activations, so what is left is the tensor cores' FP8 accumulation
// (measured 2-5e-4 of max |y| on the H200) and a wrong scale layout, padding, fragment or block moves results by
// O(1). Shapes: token counts that are not multiples of 4 or 8 (padded, output staged), ceil(k / 128) not a multiple
// of 4 (padded weight scales), partial 128-blocks in rows and columns, output rows not a multiple of 16, inputs of
// one 128-column block and odd numbers of blocks, and GLM-5.2 widths.
TEST_F(CudaOpsTest, LinearFp8W8A8) {
    CudaOptions lt_opts;
    lt_opts.fp8_gemm_small_max_rows = 0;
    const auto lt = make_cuda_ops(lt_opts);
    struct C {
        int64_t n, in, out;
    };
    for (const C c : {C{9, 384, 200}, C{16, 6144, 576}, C{37, 896, 640}, C{40, 2048, 1024}, C{12, 320, 64},
                      C{130, 512, 384}, C{3, 6144, 576}, C{4, 128, 40}, C{5, 2048, 1001}, C{8, 16384, 130},
                      C{13, 1152, 4100}, C{16, 256, 16}, C{24, 256, 16}, C{32, 1024, 48}, C{15, 640, 7}}) {
        const Weight w = make_weight(DType::F8_E4M3, c.out, c.in);
        auto x = randv(c.n * c.in);
        for (int64_t i = 0; i < c.n * c.in; i += 97)
            x[static_cast<size_t>(i)] *= 40.0f;  // outliers set the group scales
        // act_quant on the host: the codes must equal the kernel's (same fp32 division, round to nearest even).
        std::vector<float> xq(x.size());
        for (int64_t r = 0; r < c.n; ++r)
            for (int64_t g0 = 0; g0 < c.in; g0 += 128) {
                const int64_t g1 = std::min(c.in, g0 + 128);
                float amax = 0.0f;
                for (int64_t j = g0; j < g1; ++j)
                    amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * c.in + j)]));
                const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
                for (int64_t j = g0; j < g1; ++j) {
                    const size_t at = static_cast<size_t>(r * c.in + j);
                    xq[at] = fp8e4m3_to_f32(f32_to_fp8e4m3(x[at] / sc)) * sc;
                }
            }
        Tensor cx = put(cpu_, xq, {c.n, c.in});
        Tensor cy = cpu_.alloc(DType::F32, {c.n, c.out});
        cpu_.linear(cx, w, cy);
        const std::vector<float> want = get(cpu_, cy);
        std::vector<float> got[3];
        int i = 0;
        for (Ops* ops : {gpu_.get(), gpu_.get(), lt.get()}) {
            Tensor tx = put(*ops, x, {c.n, c.in});
            Tensor ty = ops->alloc(DType::F32, {c.n, c.out});
            ops->linear(tx, w, ty);
            got[i++] = get(*ops, ty);
        }
        const std::string tag =
            "linear fp8 W8A8 " + std::to_string(c.n) + "x" + std::to_string(c.in) + "->" + std::to_string(c.out);
        EXPECT_EQ(got[1], got[0]) << tag << " differs run to run";
        expect_close(got[0], want, 2e-3, tag);
        // cuBLASLt refuses fp32 outputs whose rows are not 16-byte aligned; linear then takes the bf16 copy.
        if (c.out % 4 == 0) expect_close(got[2], want, 2e-3, tag + " (cuBLASLt)");
    }
}

TEST_F(CudaOpsTest, EmbeddingRopeAndCopies) {
    for (DType t : {DType::F32, DType::BF16, DType::F8_E4M3}) {
        const Weight table = make_weight(t, 300, 72);
        const std::vector<int32_t> ids = {0, 5, 299, 17, 17, 150};
        std::vector<float> out[2];
        int i = 0;
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
            Tensor tid = put_i32(*ops, ids, {6});
            Tensor ty = ops->alloc(DType::F32, {6, 72});
            ops->embedding(tid, table, ty);
            out[i++] = get(*ops, ty);
        }
        expect_close(out[1], out[0], 0.0, std::string("embedding ") + dtype_name(t));
    }
    // rope on part of each head, large positions: interleaved (GLM, attention), half-split with a cos/sin scale
    // (DeepSeek-V3.2's indexer under YaRN)
    for (const bool interleaved : {true, false}) {
        const int64_t n = 9, h = 4, dh = 40;
        const auto x = randv(n * h * dh);
        std::vector<int32_t> pos = {0, 1, 2, 63, 64, 1000, 4095, 65537, 1048575};
        Rope rope = Rope::plain(10000.0f, 16, interleaved);
        if (!interleaved) rope.scale = 1.125f;
        std::vector<float> out[2];
        int i = 0;
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
            Tensor tx = put(*ops, x, {n, h, dh});
            Tensor tp = put_i32(*ops, pos, {n});
            ops->rope(tx, 24, tp, rope);
            out[i++] = get(*ops, tx);
        }
        expect_close(out[1], out[0], 2e-5,
                     std::string("rope offset 24 dim 16 (positions up to 2^20), ") +
                         (interleaved ? "interleaved" : "half-split, scale 1.125"));
    }
    {  // add, slice, concat, gather
        const int64_t n = 13, d = 70;
        const auto a = randv(n * d), b = randv(n * d);
        std::vector<int32_t> rows = {12, 0, 5, 5, 7};
        std::vector<float> out[2][4];
        int i = 0;
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
            Tensor ta = put(*ops, a, {n, d}), tb = put(*ops, b, {n, d});
            ops->add(ta, tb);
            out[i][0] = get(*ops, ta);
            Tensor ts = ops->alloc(DType::F32, {n, 23});
            ops->slice_cols(tb, 31, ts);
            out[i][1] = get(*ops, ts);
            Tensor tc = ops->alloc(DType::F32, {n, d + 23});
            ops->concat_cols(ta, ts, tc);
            out[i][2] = get(*ops, tc);
            Tensor tg = ops->alloc(DType::F32, {5, d});
            ops->gather_rows(ta, put_i32(*ops, rows, {5}), tg);
            out[i][3] = get(*ops, tg);
            ++i;
        }
        const char* names[4] = {"add", "slice_cols", "concat_cols", "gather_rows"};
        for (int k = 0; k < 4; ++k) expect_close(out[1][k], out[0][k], 0.0, names[k]);
    }
    {  // argmax over vocabulary-sized rows, ties to the lowest index; gather of int32 rows (top-k slots)
        const int64_t n = 5, d = 8193;
        auto x = randv(n * d);
        x[1 * d + 7000] = 9.0f;  // row 1: a tie between 17 and 7000 → 17
        x[1 * d + 17] = 9.0f;
        x[2 * d + d - 1] = 9.0f;                              // row 2: the last column
        for (int64_t c = 0; c < d; ++c) x[3 * d + c] = 0.5f;  // row 3: all equal → 0
        std::vector<int32_t> ids[2], gathered[2];
        std::vector<int32_t> slots = {4, -1, 70000, 3, 9, 8, 2, 1};
        int i = 0;
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
            Tensor out = ops->alloc(DType::I32, {n});
            ops->argmax_rows(put(*ops, x, {n, d}), out);
            ids[i].resize(n);
            ops->download(out, ids[i].data());
            Tensor g = ops->alloc(DType::I32, {2, 4});
            ops->gather_rows(put_i32(*ops, slots, {2, 4}), put_i32(*ops, {1, 0}, {2}), g);
            gathered[i].resize(8);
            ops->download(g, gathered[i].data());
            ++i;
        }
        EXPECT_EQ(ids[1], ids[0]);
        EXPECT_EQ(ids[0][1], 17);
        EXPECT_EQ(ids[0][2], d - 1);
        EXPECT_EQ(ids[0][3], 0);
        EXPECT_EQ(gathered[1], gathered[0]);
        EXPECT_EQ(gathered[0], (std::vector<int32_t>{9, 8, 2, 1, 4, -1, 70000, 3}));
    }
    {  // grammar masks on vocabulary-sized rows: random bits, a mask shorter than the row, then the argmax
        const int64_t n = 6, d = 8193, w = 200;  // 6,400 columns have bits; 6,400.. are cleared
        auto x = randv(n * d);
        std::mt19937 rng(11);
        std::vector<int32_t> bits(3 * w);
        for (int32_t& b : bits) b = static_cast<int32_t>(rng() & rng());  // about a quarter of the bits set
        std::vector<float> masked[2];
        std::vector<int32_t> ids[2];
        int i = 0;
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
            Tensor t = put(*ops, x, {n, d});
            ops->mask_rows(t, put_i32(*ops, {4, 0, 5}, {3}), put_i32(*ops, bits, {3, w}));
            masked[i] = get(*ops, t);
            Tensor out = ops->alloc(DType::I32, {n});
            ops->argmax_rows(t, out);
            ids[i].resize(n);
            ops->download(out, ids[i].data());
            ++i;
        }
        EXPECT_EQ(masked[1], masked[0]);
        EXPECT_EQ(ids[1], ids[0]);
        EXPECT_TRUE(std::isinf(masked[0][4 * d + d - 1]));
        EXPECT_EQ(masked[0][1 * d + d - 1], x[1 * d + d - 1]);  // an unmasked row
    }
}

// Geometry of the MLA cases: (rank, rope) of the latent, heads, nope/v dims.
struct MlaGeom {
    int64_t rank, rope, n_head, d_nope, d_v;
};

// Rank 512 with FP8 or BF16 kv_b and up to 16 tokens takes the decode kernels (mla_heads.h), which read kv_b as
// stored with fp32 activations: they must match the CPU to fp32 rounding. The others (rank 32, fp32 weights, 17
// tokens) take cuBLAS's batched GEMM over a bf16 copy with bf16 activations.
TEST_F(CudaOpsTest, AbsorbAndExpand) {
    struct Case {
        MlaGeom g;
        int64_t n;
    };
    // odd: d_nope 40 and d_v 72 leave the heads kernels' slices and warps partly empty (rows of 32 slices, CTAs of 64)
    const MlaGeom small{32, 16, 4, 24, 32}, mid{512, 64, 16, 128, 128}, glm52{512, 64, 64, 192, 256},
        odd{512, 3, 8, 40, 72};
    for (const Case cs : {Case{small, 5}, Case{mid, 5}, Case{mid, 1}, Case{mid, 16}, Case{mid, 17}, Case{glm52, 1},
                          Case{glm52, 6}, Case{odd, 1}, Case{odd, 3}}) {
        const MlaGeom g = cs.g;
        for (DType t : {DType::F32, DType::BF16, DType::F8_E4M3}) {
            const int64_t n = cs.n, d_qk = g.d_nope + g.rope;
            const Weight kv_b = make_weight(t, g.n_head * (g.d_nope + g.d_v), g.rank);
            const auto q = randv(n * g.n_head * d_qk), lat = randv(n * g.n_head * g.rank);
            std::vector<float> out[2][2];
            int i = 0;
            for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
                Tensor tq = put(*ops, q, {n, g.n_head, d_qk});
                Tensor to = ops->alloc(DType::F32, {n, g.n_head, g.rank + g.rope});
                ops->mla_absorb_q(tq, kv_b, g.d_nope, g.d_v, to);
                out[i][0] = get(*ops, to);
                Tensor tl = put(*ops, lat, {n, g.n_head, g.rank});
                Tensor tv = ops->alloc(DType::F32, {n, g.n_head * g.d_v});
                ops->mla_expand_v(tl, kv_b, g.d_nope, g.d_v, tv);
                out[i][1] = get(*ops, tv);
                ++i;
            }
            const bool heads_kernels = g.rank == 512 && n <= 16 && t != DType::F32;
            const double tol = t == DType::F32 || heads_kernels ? 1e-5 : 1e-2;
            const std::string tag = std::string(dtype_name(t)) + " H" + std::to_string(g.n_head) + " r" +
                                    std::to_string(g.rank) + " n" + std::to_string(n);
            expect_close(out[1][0], out[0][0], tol, "mla_absorb_q " + tag);
            expect_close(out[1][1], out[0][1], tol, "mla_expand_v " + tag);
        }
    }
}

TEST_F(CudaOpsTest, MlpAndMoe) {
    const int64_t n = 11, d = 64, ff = 32;
    const auto x = randv(n * d);
    {
        MlpWeights m{make_weight(DType::F32, ff, d), make_weight(DType::F32, ff, d), make_weight(DType::F32, d, ff)};
        std::vector<float> out[2];
        int i = 0;
        for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
            Tensor tx = put(*ops, x, {n, d});
            Tensor ty = ops->alloc(DType::F32, {n, d});
            ops->swiglu_mlp(tx, m, ty);
            out[i++] = get(*ops, ty);
        }
        expect_close(out[1], out[0], 1e-5, "swiglu_mlp");
    }
    struct R {
        int64_t n_exp, n_group, topk_group, top_k;
        bool norm;
    };
    // n = 11 tokens: the few-token expert kernels (device-side ids, no host sync); 40: the grouped GEMMs. bf16
    // weights round the activations to bf16 on the GPU (the CPU keeps fp32): 1e-2. fp8: d = 64, ff = 32 are
    // partial 128-blocks. Empty experts: held by another
    // rank (expert parallel), they contribute 0 on both backends.
    for (const int64_t nt : {int64_t{11}, int64_t{40}})
        for (const DType wt : {DType::F32, DType::BF16, DType::F8_E4M3})
            for (const R r : {R{8, 1, 1, 2, true}, R{16, 4, 2, 4, true}, R{32, 8, 3, 6, false}, R{256, 1, 1, 8, true},
                              R{256, 8, 4, 8, true}}) {  // GLM-5.2, DeepSeek-V3 routing
                const auto xt = randv(nt * d);
                const Weight gate = make_weight(DType::F32, r.n_exp, d, 0.3f);
                auto& bias = keep(randv(r.n_exp, 0.05f));
                MoeRouteParams p;
                p.n_group = r.n_group;
                p.topk_group = r.topk_group;
                p.top_k = r.top_k;
                p.norm_topk_prob = r.norm;
                p.routed_scaling_factor = 2.5f;
                std::vector<MlpWeights> experts;
                for (int64_t e = 0; e < r.n_exp; ++e) {
                    if (r.n_exp == 16 && e % 5 == 3) {
                        experts.emplace_back();
                        continue;
                    }
                    experts.push_back({make_weight(wt, ff, d), make_weight(wt, ff, d), make_weight(wt, d, ff)});
                }
                std::vector<int32_t> ids[2];
                std::vector<float> w[2], y[2];
                int i = 0;
                for (Ops* ops : {static_cast<Ops*>(&cpu_), gpu_.get()}) {
                    Tensor tx = put(*ops, xt, {nt, d});
                    Tensor ti = ops->alloc(DType::I32, {nt, r.top_k});
                    Tensor tw = ops->alloc(DType::F32, {nt, r.top_k});
                    ops->moe_route(tx, gate, bias, p, ti, tw);
                    ids[i] = get_i32(*ops, ti);
                    w[i] = get(*ops, tw);
                    // Both backends run the experts on the CPU's routing (computed first), so the expert check
                    // does not depend on the router.
                    Tensor ti_ref = put_i32(*ops, ids[0], {nt, r.top_k});
                    Tensor tw_ref = put(*ops, w[0], {nt, r.top_k});
                    Tensor ty = ops->alloc(DType::F32, {nt, d});
                    ops->moe_experts(tx, ti_ref, tw_ref, experts, ty);
                    y[i] = get(*ops, ty);
                    if (i == 1) {  // reproducible bit for bit: the k choices add up in order
                        ops->moe_experts(tx, ti_ref, tw_ref, experts, ty);
                        EXPECT_EQ(get(*ops, ty), y[1]) << "moe_experts differs run to run, n " << nt;
                    }
                    ++i;
                }
                const std::string tag = "E" + std::to_string(r.n_exp) + " groups " + std::to_string(r.n_group) + " n " +
                                        std::to_string(nt) + " " + dtype_name(wt);
                EXPECT_EQ(ids[1], ids[0]) << "moe_route ids " << tag;
                expect_close(w[1], w[0], 1e-5, "moe_route weights " + tag);
                // fp8 experts: the few-token kernels read e4m3 + scales with fp32 activations (1e-5); the grouped
                // GEMMs are W8A8 (activations quantised to e4m3 per 128 group, ~3% per value before the sums),
                // against the CPU's fp32 activations: 5e-2.
                const double tol = wt == DType::F32 || (wt == DType::F8_E4M3 && nt <= 32) ? 1e-5
                                   : wt == DType::BF16                                    ? 1e-2
                                                                                          : 5e-2;
                expect_close(y[1], y[0], tol, "moe_experts " + tag);
            }
}

// FP8 experts, 3-32 tokens, d and ff multiples of 128: grouped by expert on the tensor cores (moe_fp8.h, W8A8).
// The reference quantises as the kernels do: x per 1 × 128 group before gate / up, h likewise before down (on the
// host, with the codes act_quant makes), then the CPU's fp32 linears. What is left is fp32 order and a rare e4m3
// rounding flip of h: 2e-3 of max |y| (a wrong slot, expert, scale or pass moves results by O(1)). Cases: an expert
// chosen by more than 16 tokens (its weight read in two passes), experts held by another rank (null: 0), more
// experts than choices, and a sanity check against the per-choice kernels (moe_fp8_min_tokens above 32, fp32
// activations) on the same inputs: the two roundings of the activations differ by up to ~6e-2 of max |y| here.
TEST_F(CudaOpsTest, MoeExpertsFp8Grouped) {
    CudaOptions per_choice_opts, grouped_opts;
    per_choice_opts.moe_fp8_min_tokens = 33;
    grouped_opts.moe_fp8_min_tokens = 1;  // grouped whatever the automatic rule (moe_plan.h) would choose
    const auto per_choice = make_cuda_ops(per_choice_opts);
    const auto grouped = make_cuda_ops(grouped_opts);
    auto quant_rows = [](std::vector<float> v, int64_t rows, int64_t cols) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t g0 = 0; g0 < cols; g0 += 128) {
                float amax = 0.0f;
                for (int64_t j = g0; j < g0 + 128; ++j)
                    amax = std::max(amax, std::fabs(v[static_cast<size_t>(r * cols + j)]));
                const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
                for (int64_t j = g0; j < g0 + 128; ++j) {
                    float& x = v[static_cast<size_t>(r * cols + j)];
                    x = fp8e4m3_to_f32(f32_to_fp8e4m3(x / sc)) * sc;
                }
            }
        return v;
    };
    struct C {
        int64_t n, n_exp, k, d, ff;
    };
    std::mt19937 rng(5);
    for (const C c : {C{3, 8, 2, 256, 384}, C{8, 4, 2, 256, 128}, C{32, 4, 2, 128, 256}, C{11, 16, 4, 384, 256},
                      C{32, 300, 8, 128, 128}, C{20, 6, 3, 256, 384}}) {
        std::vector<MlpWeights> experts;
        for (int64_t e = 0; e < c.n_exp; ++e) {
            if (c.n_exp == 16 && e % 5 == 3) {
                experts.emplace_back();
                continue;
            }
            experts.push_back({make_weight(DType::F8_E4M3, c.ff, c.d), make_weight(DType::F8_E4M3, c.ff, c.d),
                               make_weight(DType::F8_E4M3, c.d, c.ff)});
        }
        // k distinct experts per token; with 4 experts and 32 tokens some expert takes more than 16.
        std::vector<int32_t> ids;
        std::vector<float> wts;
        for (int64_t t = 0; t < c.n; ++t) {
            std::vector<int32_t> all(static_cast<size_t>(c.n_exp));
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            for (int64_t j = 0; j < c.k; ++j) {
                ids.push_back(all[static_cast<size_t>(j)]);
                wts.push_back(0.2f + 0.1f * static_cast<float>(j));
            }
        }
        const auto x = randv(c.n * c.d);
        // Reference: per (token, choice), the quantised x through gate / up, SwiGLU, quantised h through down.
        const std::vector<float> xq = quant_rows(x, c.n, c.d);
        std::vector<float> want(static_cast<size_t>(c.n * c.d), 0.0f);
        for (int64_t t = 0; t < c.n; ++t)
            for (int64_t j = 0; j < c.k; ++j) {
                const MlpWeights& m = experts[static_cast<size_t>(ids[static_cast<size_t>(t * c.k + j)])];
                if (m.gate.empty()) continue;
                Tensor tx = put(cpu_, std::vector<float>(xq.begin() + t * c.d, xq.begin() + (t + 1) * c.d), {1, c.d});
                Tensor tg = cpu_.alloc(DType::F32, {1, c.ff}), tu = cpu_.alloc(DType::F32, {1, c.ff});
                cpu_.linear(tx, m.gate, tg);
                cpu_.linear(tx, m.up, tu);
                const std::vector<float> g = get(cpu_, tg), u = get(cpu_, tu);
                std::vector<float> h(static_cast<size_t>(c.ff));
                for (size_t f = 0; f < h.size(); ++f) h[f] = g[f] / (1.0f + std::exp(-g[f])) * u[f];
                Tensor th = put(cpu_, quant_rows(h, 1, c.ff), {1, c.ff});
                Tensor ty = cpu_.alloc(DType::F32, {1, c.d});
                cpu_.linear(th, m.down, ty);
                const std::vector<float> yv = get(cpu_, ty);
                for (int64_t o = 0; o < c.d; ++o)
                    want[static_cast<size_t>(t * c.d + o)] +=
                        wts[static_cast<size_t>(t * c.k + j)] * yv[static_cast<size_t>(o)];
            }
        std::vector<float> got[3];
        int i = 0;
        for (Ops* ops : {grouped.get(), grouped.get(), per_choice.get()}) {
            Tensor tx = put(*ops, x, {c.n, c.d});
            Tensor ti = put_i32(*ops, ids, {c.n, c.k});
            Tensor tw = put(*ops, wts, {c.n, c.k});
            Tensor ty = ops->alloc(DType::F32, {c.n, c.d});
            ops->moe_experts(tx, ti, tw, experts, ty);
            got[i++] = get(*ops, ty);
        }
        const std::string tag = "moe fp8 grouped n " + std::to_string(c.n) + " E " + std::to_string(c.n_exp) + " k " +
                                std::to_string(c.k) + " d " + std::to_string(c.d) + " ff " + std::to_string(c.ff);
        EXPECT_EQ(got[1], got[0]) << tag << " differs run to run";
        expect_close(got[0], want, 2e-3, tag);
        expect_close(got[0], got[2], 1e-1, tag + " against the per-choice kernels");
    }
}

// The device choice (moe_fp8_min_tokens = 0, the default; moe_plan.h) for 3-6 FP8 tokens inside a CUDA graph: the
// grouped path's plan kernel counts the distinct experts and sets a conditional node whose branches are the two paths.
// 4 tokens × 8 of 64 experts: all 32 distinct (above the bound of 28) must give the per-choice kernels' result bit for
// bit, all tokens on the same 8 the grouped one's; the two differ (fp32 against quantised activations), so a wrong
// pick, or both paths writing y, fails. One graph is replayed with the routing changed between replays, so the node
// is set anew each time. Outside a graph the grouped path runs.
TEST_F(CudaOpsTest, MoeExpertsFp8DeviceChoice) {
    CudaOptions per_choice_opts, grouped_opts;
    per_choice_opts.moe_fp8_min_tokens = 33;
    grouped_opts.moe_fp8_min_tokens = 1;
    const auto per_choice = make_cuda_ops(per_choice_opts);
    const auto grouped = make_cuda_ops(grouped_opts);
    const auto automatic = make_cuda_ops(CudaOptions{});
    constexpr int64_t n = 4, n_exp = 64, k = 8, d = 256, ff = 384;
    ASSERT_EQ(moe_plan::moe_path(n, k, n_exp, CudaOptions{}.moe_fp8_min_tokens), moe_plan::MoePath::kOnDevice);
    std::vector<MlpWeights> experts;
    for (int64_t e = 0; e < n_exp; ++e)
        experts.push_back({make_weight(DType::F8_E4M3, ff, d), make_weight(DType::F8_E4M3, ff, d),
                           make_weight(DType::F8_E4M3, d, ff)});
    std::vector<int32_t> apart, shared;
    std::vector<float> wts;
    for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < k; ++j) {
            apart.push_back(static_cast<int32_t>(t * k + j));
            shared.push_back(static_cast<int32_t>(3 * j + 1));
            wts.push_back(0.05f + 0.02f * static_cast<float>(j));
        }
    const auto x = randv(n * d);
    auto run = [&](Ops& ops, const std::vector<int32_t>& ids) {
        Tensor tx = put(ops, x, {n, d});
        Tensor ti = put_i32(ops, ids, {n, k});
        Tensor tw = put(ops, wts, {n, k});
        Tensor ty = ops.alloc(DType::F32, {n, d});
        ops.moe_experts(tx, ti, tw, experts, ty);
        return get(ops, ty);
    };
    const std::vector<float> want_apart = run(*per_choice, apart), want_shared = run(*grouped, shared);
    ASSERT_NE(run(*grouped, apart), want_apart) << "the two paths must differ for this test to tell them apart";
    ASSERT_NE(run(*per_choice, shared), want_shared);
    EXPECT_EQ(run(*automatic, apart), run(*grouped, apart)) << "outside a graph: grouped";
    EXPECT_EQ(run(*automatic, shared), want_shared) << "outside a graph: grouped";
    Tensor tx = put(*automatic, x, {n, d});
    Tensor tw = put(*automatic, wts, {n, k});
    Tensor ty = automatic->alloc(DType::F32, {n, d});
    auto graph = automatic->record([&] {
        Tensor ti = automatic->upload_i32(apart);
        ti.shape = {n, k};
        automatic->moe_experts(tx, ti, tw, experts, ty);
    });
    ASSERT_EQ(graph->inputs.size(), 1u);
    for (int round = 0; round < 4; ++round) {
        const bool is_apart = round % 2 == 0;
        graph->inputs[0] = is_apart ? apart : shared;
        automatic->replay(*graph);
        EXPECT_EQ(get(*automatic, ty), is_apart ? want_apart : want_shared)
            << (is_apart ? "32 distinct experts: the per-choice kernels" : "8 shared experts: the grouped path")
            << ", replay " << round;
    }
}

// --- KV cache ops --------------------------------------------------------------------------------------------

// A latent row through the format (what the CPU reference reads).
std::vector<float> roundtrip_latent(const std::vector<float>& row, int64_t rank, int64_t rope, KvFormat f) {
    std::vector<float> out = row;
    if (f == KvFormat::BF16) {
        for (float& v : out) v = bf16_to_f32(f32_to_bf16(v));
    } else if (f == KvFormat::FP8) {
        std::vector<uint8_t> b(static_cast<size_t>(fp8_latent_row_bytes(rank, rope)));
        fp8_latent_pack(row.data(), rank, rope, b.data());
        fp8_latent_unpack(b.data(), rank, rope, out.data());
    }
    return out;
}

std::vector<float> roundtrip_key(const std::vector<float>& key, KvFormat f) {
    std::vector<float> out = key;
    if (f == KvFormat::BF16) {
        for (float& v : out) v = bf16_to_f32(f32_to_bf16(v));
    } else if (f == KvFormat::FP8) {
        const auto dim = static_cast<int64_t>(key.size());
        std::vector<uint8_t> pool(static_cast<size_t>(fp8_indexer_block_bytes(dim)));
        fp8_indexer_pack(key.data(), dim, 5, pool.data());
        fp8_indexer_unpack(pool.data(), dim, 5, out.data());
    }
    return out;
}

// The batch-invariant mode (CudaOptions::batch_invariant): a row's result is the same bits whatever rows share the
// call. Each op runs on a batch of N rows, then on parts of it — one row alone, 3, 4, 17 and 67 rows: counts at which
// the default paths (and the invariant GEMM's launch shape, the invariant sparse MLA's passes) change kernel, tiling,
// split or pass — whose rows must equal the whole batch's bit for bit. The whole batch is also within fp32 rounding
// of the CPU: the mode keeps activations fp32 and widens the weights as the CPU does (linears and MLA's per-head
// products: invariant_gemm.h; routed experts: per choice, in passes of 32); sparse MLA within its bf16-query bound.
TEST_F(CudaOpsTest, BatchInvariantRowsDoNotDependOnTheBatch) {
    CudaOptions o;
    o.batch_invariant = true;
    const auto inv = make_cuda_ops(o);
    struct Part {
        int64_t r0, n;
    };
    const std::vector<Part> parts = {{0, 1}, {37, 1}, {69, 1}, {5, 3}, {3, 4}, {10, 17}, {2, 67}};
    auto slice = [](const std::vector<float>& v, int64_t r0, int64_t n, int64_t width) {
        return std::vector<float>(v.begin() + r0 * width, v.begin() + (r0 + n) * width);
    };
    const DType types[] = {DType::F32, DType::BF16, DType::F8_E4M3};
    {  // linear: partial k steps, partial output tiles, one output, GLM-5.2's q_a width
        const int64_t N = 150;
        struct S {
            int64_t in, out;
        };
        for (const DType t : types)
            for (const S sh : {S{1000, 300}, S{256, 64}, S{129, 1}, S{6144, 96}}) {
                const Weight w = make_weight(t, sh.out, sh.in);
                const auto x = randv(N * sh.in);
                auto run = [&](Ops& ops, int64_t r0, int64_t n) {
                    Tensor tx = put(ops, slice(x, r0, n, sh.in), {n, sh.in});
                    Tensor ty = ops.alloc(DType::F32, {n, sh.out});
                    ops.linear(tx, w, ty);
                    return get(ops, ty);
                };
                const std::string tag = std::string("invariant linear ") + dtype_name(t) + " " + std::to_string(sh.in) +
                                        "->" + std::to_string(sh.out);
                const auto full = run(*inv, 0, N);
                expect_close(full, run(cpu_, 0, N), 1e-5, tag);
                for (const Part pt : parts)
                    EXPECT_EQ(run(*inv, pt.r0, pt.n), slice(full, pt.r0, pt.n, sh.out))
                        << tag << ", rows " << pt.r0 << " + " << pt.n;
            }
    }
    {  // mla_absorb_q / mla_expand_v: GLM-5.2's head geometry and a ragged one
        const int64_t N = 80;
        for (const MlaGeom g : {MlaGeom{512, 64, 16, 192, 256}, MlaGeom{512, 3, 8, 40, 72}, MlaGeom{32, 16, 4, 24, 32}})
            for (const DType t : types) {
                const int64_t d_qk = g.d_nope + g.rope;
                const Weight kv_b = make_weight(t, g.n_head * (g.d_nope + g.d_v), g.rank);
                const auto q = randv(N * g.n_head * d_qk), lat = randv(N * g.n_head * g.rank);
                auto run = [&](Ops& ops, int64_t r0, int64_t n) {
                    Tensor tq = put(ops, slice(q, r0, n, g.n_head * d_qk), {n, g.n_head, d_qk});
                    Tensor to = ops.alloc(DType::F32, {n, g.n_head, g.rank + g.rope});
                    ops.mla_absorb_q(tq, kv_b, g.d_nope, g.d_v, to);
                    Tensor tl = put(ops, slice(lat, r0, n, g.n_head * g.rank), {n, g.n_head, g.rank});
                    Tensor tv = ops.alloc(DType::F32, {n, g.n_head * g.d_v});
                    ops.mla_expand_v(tl, kv_b, g.d_nope, g.d_v, tv);
                    return std::make_pair(get(ops, to), get(ops, tv));
                };
                const std::string tag = std::string(dtype_name(t)) + " H" + std::to_string(g.n_head) + " r" +
                                        std::to_string(g.rank) + " d_nope " + std::to_string(g.d_nope);
                const auto full = run(*inv, 0, N), ref = run(cpu_, 0, N);
                expect_close(full.first, ref.first, 1e-5, "invariant mla_absorb_q " + tag);
                expect_close(full.second, ref.second, 1e-5, "invariant mla_expand_v " + tag);
                for (const Part pt : parts) {
                    const auto part = run(*inv, pt.r0, pt.n);
                    EXPECT_EQ(part.first, slice(full.first, pt.r0, pt.n, g.n_head * (g.rank + g.rope)))
                        << "mla_absorb_q " << tag << ", rows " << pt.r0 << " + " << pt.n;
                    EXPECT_EQ(part.second, slice(full.second, pt.r0, pt.n, g.n_head * g.d_v))
                        << "mla_expand_v " << tag << ", rows " << pt.r0 << " + " << pt.n;
                }
            }
    }
    {  // moe_experts: 70 tokens = passes of 32, 32 and 6; the CPU's routing for both backends
        const int64_t N = 70, d = 256, ff = 128, n_exp = 16, top_k = 4;
        for (const DType t : types) {
            std::vector<MlpWeights> experts;
            for (int64_t e = 0; e < n_exp; ++e)
                experts.push_back({make_weight(t, ff, d), make_weight(t, ff, d), make_weight(t, d, ff)});
            const auto x = randv(N * d);
            std::vector<int32_t> ids(static_cast<size_t>(N * top_k));
            std::vector<float> w(ids.size());
            std::uniform_int_distribution<int32_t> pick(0, n_exp - 1);
            std::uniform_real_distribution<float> weight(0.1f, 1.0f);
            for (int64_t i = 0; i < N; ++i)
                for (int64_t j = 0; j < top_k; ++j) {  // distinct experts per token
                    int32_t e = pick(rng_);
                    while (std::find(ids.begin() + i * top_k, ids.begin() + i * top_k + j, e) !=
                           ids.begin() + i * top_k + j)
                        e = pick(rng_);
                    ids[static_cast<size_t>(i * top_k + j)] = e;
                    w[static_cast<size_t>(i * top_k + j)] = weight(rng_);
                }
            auto run = [&](Ops& ops, int64_t r0, int64_t n) {
                Tensor tx = put(ops, slice(x, r0, n, d), {n, d});
                Tensor ti = put_i32(ops, std::vector<int32_t>(ids.begin() + r0 * top_k, ids.begin() + (r0 + n) * top_k),
                                    {n, top_k});
                Tensor tw = put(ops, slice(w, r0, n, top_k), {n, top_k});
                Tensor ty = ops.alloc(DType::F32, {n, d});
                ops.moe_experts(tx, ti, tw, experts, ty);
                return get(ops, ty);
            };
            const std::string tag = std::string("invariant moe_experts ") + dtype_name(t);
            const auto full = run(*inv, 0, N);
            // bf16 experts: the per-choice kernels round x and h to bf16, as the grouped bf16 GEMMs do (the
            // default-mode check above allows 1e-2 for the same reason); batch invariance is the EXPECT_EQ below.
            expect_close(full, run(cpu_, 0, N), t == DType::BF16 ? 1e-2 : 1e-5, tag);
            for (const Part pt : parts)
                EXPECT_EQ(run(*inv, pt.r0, pt.n), slice(full, pt.r0, pt.n, d))
                    << tag << ", rows " << pt.r0 << " + " << pt.n;
        }
    }
    {  // sparse_mla: GLM-5.2's geometry over FP8 rows, 70 rows = launches of 64 and 6 (kInvariantSplits splits each)
        const int64_t N = 70, n_head = 64, rank = 512, rope = 64, d = rank + rope, topk = 2048, n_slots = 3000;
        const int64_t rb = fp8_latent_row_bytes(rank, rope);
        const auto rows = randv(n_slots * d), q = randv(N * n_head * d, 0.3f);
        std::vector<float> rows_rt(rows.size());
        std::vector<int32_t> packed(static_cast<size_t>(n_slots * rb + 3) / 4);
        for (int64_t i = 0; i < n_slots; ++i) {
            const std::vector<float> r(rows.begin() + i * d, rows.begin() + (i + 1) * d);
            const auto rt = roundtrip_latent(r, rank, rope, KvFormat::FP8);
            std::copy(rt.begin(), rt.end(), rows_rt.begin() + i * d);
            fp8_latent_pack(r.data(), rank, rope, reinterpret_cast<uint8_t*>(packed.data()) + i * rb);
        }
        std::vector<int32_t> sel(static_cast<size_t>(N * topk), -1);  // distinct slots, some rows short of topk
        std::vector<int32_t> all(static_cast<size_t>(n_slots));
        std::iota(all.begin(), all.end(), 0);
        for (int64_t t = 0; t < N; ++t) {
            std::shuffle(all.begin(), all.end(), rng_);
            const int64_t m = t % 5 == 0 ? 700 + t : topk;
            std::copy(all.begin(), all.begin() + m, sel.begin() + t * topk);
        }
        auto run = [&](Ops& ops, int64_t r0, int64_t n) {
            Tensor tq = put(ops, slice(q, r0, n, n_head * d), {n, n_head, d});
            Tensor ts =
                put_i32(ops, std::vector<int32_t>(sel.begin() + r0 * topk, sel.begin() + (r0 + n) * topk), {n, topk});
            Tensor tc;
            if (&ops == &cpu_) {
                tc = put(ops, rows_rt, {n_slots, d});
            } else {
                tc = ops.upload_i32(packed);
                tc.dtype = DType::F8_E4M3;
                tc.shape = {n_slots, rb};
            }
            Tensor to = ops.alloc(DType::F32, {n, n_head, rank});
            SparseMlaParams p;
            p.q = &tq;
            p.cache = &tc;
            p.slots = &ts;
            p.d_v = rank;
            p.scale = 1.0f / std::sqrt(static_cast<float>(d));
            p.out = &to;
            ops.sparse_mla(p);
            return get(ops, to);
        };
        const auto full = run(*inv, 0, N);
        expect_close(full, run(cpu_, 0, N), 3e-3, "invariant sparse_mla");  // bf16 queries, as in SparseMla tests
        for (const Part pt : parts)
            EXPECT_EQ(run(*inv, pt.r0, pt.n), slice(full, pt.r0, pt.n, n_head * rank))
                << "invariant sparse_mla, rows " << pt.r0 << " + " << pt.n;
    }
}

// The tokens of the cache-write tests: n distinct random slots of n_slots, and positions i · 37 + 3.
std::pair<std::vector<int32_t>, std::vector<int32_t>> cache_write_tokens(int64_t n, int64_t n_slots,
                                                                         std::mt19937& rng) {
    std::vector<int32_t> slots(static_cast<size_t>(n_slots));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(static_cast<size_t>(n));
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 37 + 3);
    return {slots, pos};
}

TEST_F(CudaOpsTest, FusedCacheWrites) {
    const int64_t n_blocks = 4, n_slots = n_blocks * 64, n = 70;
    const auto [slots, pos] = cache_write_tokens(n, n_slots, rng_);
    for (auto [rank, rope] : std::vector<std::pair<int64_t, int64_t>>{{512, 64}, {32, 16}, {48, 16}}) {
        const int64_t d = rank + rope;
        const auto kv_a = randv(n * d, 2.0f);
        auto& w = keep(randv(rank));
        // CPU: the F32 cache rows.
        Tensor cc = cpu_.alloc(DType::F32, {n_slots, d});
        Rope rp = Rope::plain(10000.0f, rope);
        rp.scale = rank == 48 ? 0.875f : 1.0f;  // YaRN's cos/sin factor on one geometry
        cpu_.latent_cache_write(put(cpu_, kv_a, {n, d}), w, 1e-6f, put_i32(cpu_, pos, {n}), rp,
                                put_i32(cpu_, slots, {n}), cc);
        const std::vector<float> cache_cpu = get(cpu_, cc);
        for (KvFormat f : {KvFormat::F32, KvFormat::BF16, KvFormat::FP8}) {
            const int64_t row_bytes = fp8_latent_row_bytes(rank, rope);
            Tensor gc = f == KvFormat::F32    ? gpu_->alloc(DType::F32, {n_slots, d})
                        : f == KvFormat::BF16 ? gpu_->alloc(DType::BF16, {n_slots, d})
                                              : gpu_->alloc(DType::F8_E4M3, {n_slots, row_bytes});
            gpu_->latent_cache_write(put(*gpu_, kv_a, {n, d}), w, 1e-6f, put_i32(*gpu_, pos, {n}), rp,
                                     put_i32(*gpu_, slots, {n}), gc);
            const size_t esize = f == KvFormat::F32 ? 4 : f == KvFormat::BF16 ? 2 : 1;
            std::vector<uint8_t> raw(static_cast<size_t>(gc.numel()) * esize);
            gpu_->download(gc, raw.data());
            std::vector<float> got, want;
            int64_t bytes_differ = 0, bytes_total = 0;
            for (int64_t i = 0; i < n; ++i) {
                const int64_t s = slots[static_cast<size_t>(i)];
                std::vector<float> ref(cache_cpu.begin() + s * d, cache_cpu.begin() + (s + 1) * d), row(d);
                if (f == KvFormat::F32) {
                    std::memcpy(row.data(), raw.data() + s * d * 4, static_cast<size_t>(d) * 4);
                } else if (f == KvFormat::BF16) {
                    for (int64_t c = 0; c < d; ++c) {
                        uint16_t h;
                        std::memcpy(&h, raw.data() + (s * d + c) * 2, 2);
                        row[c] = bf16_to_f32(h);
                    }
                } else {
                    std::vector<uint8_t> packed(static_cast<size_t>(row_bytes));
                    fp8_latent_pack(ref.data(), rank, rope, packed.data());
                    const uint8_t* g = raw.data() + s * row_bytes;
                    for (int64_t b = 0; b < row_bytes; ++b) bytes_differ += g[b] != packed[static_cast<size_t>(b)];
                    bytes_total += row_bytes;
                    fp8_latent_unpack(g, rank, rope, row.data());
                }
                const auto rt = roundtrip_latent(ref, rank, rope, f);
                got.insert(got.end(), row.begin(), row.end());
                want.insert(want.end(), rt.begin(), rt.end());
            }
            const std::string tag = std::string("latent_cache_write ") + kv_format_name(f) + " rank " +
                                    std::to_string(rank) + " rope " + std::to_string(rope);
            // An fp32 input off by an ulp may round to the neighbouring code: one bf16 step (2^-8 of the value) or
            // one e4m3 step (at most 1/16 of the tile's amax), nothing more.
            expect_close(got, want, f == KvFormat::F32 ? 1e-5 : f == KvFormat::BF16 ? 8e-3 : 0.07, tag);
            if (f == KvFormat::FP8) {
                std::printf("    fp8 bytes differing from kv_format.cpp's packer: %lld of %lld\n",
                            static_cast<long long>(bytes_differ), static_cast<long long>(bytes_total));
                EXPECT_LE(bytes_differ, bytes_total / 200) << tag;
            }
        }
    }
    // GLM's interleaved pairs and DeepSeek-V3.2's half-split pairs (with a YaRN-like cos/sin factor)
    for (auto [dim, d_rope, interleaved] : std::vector<std::tuple<int64_t, int64_t, bool>>{
             {128, 64, true}, {32, 16, true}, {128, 64, false}, {32, 16, false}}) {
        const auto k = randv(n * dim, 2.0f);
        auto& w = keep(randv(dim));
        auto& b = keep(randv(dim));
        Rope rp = Rope::plain(10000.0f, d_rope, interleaved);
        if (!interleaved) rp.scale = 1.125f;
        Tensor cc = cpu_.alloc(DType::F32, {n_slots, dim});
        cpu_.indexer_cache_write(put(cpu_, k, {n, dim}), w, b, 1e-6f, put_i32(cpu_, pos, {n}), rp,
                                 put_i32(cpu_, slots, {n}), cc, false);
        const std::vector<float> cache_cpu = get(cpu_, cc);
        for (KvFormat f : {KvFormat::F32, KvFormat::BF16, KvFormat::FP8}) {
            Tensor gc = f == KvFormat::F32    ? gpu_->alloc(DType::F32, {n_slots, dim})
                        : f == KvFormat::BF16 ? gpu_->alloc(DType::BF16, {n_slots, dim})
                                              : gpu_->alloc(DType::F8_E4M3, {n_blocks, fp8_indexer_block_bytes(dim)});
            gpu_->indexer_cache_write(put(*gpu_, k, {n, dim}), w, b, 1e-6f, put_i32(*gpu_, pos, {n}), rp,
                                      put_i32(*gpu_, slots, {n}), gc, false);
            const size_t esize = f == KvFormat::F32 ? 4 : f == KvFormat::BF16 ? 2 : 1;
            std::vector<uint8_t> raw(static_cast<size_t>(gc.numel()) * esize);
            gpu_->download(gc, raw.data());
            std::vector<uint8_t> ref_pool(f == KvFormat::FP8 ? raw.size() : 0);
            std::vector<float> got, want;
            int64_t bytes_differ = 0, bytes_total = 0;
            for (int64_t i = 0; i < n; ++i) {
                const int64_t s = slots[static_cast<size_t>(i)];
                std::vector<float> ref(cache_cpu.begin() + s * dim, cache_cpu.begin() + (s + 1) * dim), row(dim);
                if (f == KvFormat::F32) {
                    std::memcpy(row.data(), raw.data() + s * dim * 4, static_cast<size_t>(dim) * 4);
                } else if (f == KvFormat::BF16) {
                    for (int64_t c = 0; c < dim; ++c) {
                        uint16_t h;
                        std::memcpy(&h, raw.data() + (s * dim + c) * 2, 2);
                        row[c] = bf16_to_f32(h);
                    }
                } else {
                    fp8_indexer_pack(ref.data(), dim, s, ref_pool.data());
                    fp8_indexer_unpack(raw.data(), dim, s, row.data());
                }
                const auto rt = roundtrip_key(ref, f);
                got.insert(got.end(), row.begin(), row.end());
                want.insert(want.end(), rt.begin(), rt.end());
            }
            if (f == KvFormat::FP8) {
                for (int64_t i = 0; i < n; ++i) {  // compare the written tokens' bytes (codes and scale)
                    const int64_t s = slots[static_cast<size_t>(i)], blk = s / 64, off = s % 64;
                    const size_t base = static_cast<size_t>(blk * fp8_indexer_block_bytes(dim));
                    for (int64_t c = 0; c < dim; ++c) {
                        bytes_differ += raw[base + off * dim + c] != ref_pool[base + off * dim + c];
                    }
                    bytes_differ +=
                        std::memcmp(&raw[base + 64 * dim + 4 * off], &ref_pool[base + 64 * dim + 4 * off], 4) != 0;
                    bytes_total += dim + 1;
                }
            }
            const std::string tag =
                std::string("indexer_cache_write ") + kv_format_name(f) + " dim " + std::to_string(dim);
            expect_close(got, want, f == KvFormat::FP8 ? 0.07 : f == KvFormat::BF16 ? 8e-3 : 1e-5, tag);
            if (f == KvFormat::FP8) {
                std::printf("    fp8 codes/scales differing from kv_format.cpp's packer: %lld of %lld\n",
                            static_cast<long long>(bytes_differ), static_cast<long long>(bytes_total));
                EXPECT_LE(bytes_differ, bytes_total / 200) << tag;
            }
        }
    }
}

// indexer_cache_write with the Hadamard rotation into an FP8 pool (the fast kernel at 128 dims, kv_write.cu's at 32):
// the CPU's key, rotated by hadamard_transform and packed by kv_format.cpp, byte for byte but for rare one-step
// codes where the device's RoPE rounds an ulp apart; F32 and BF16 pools ignore the rotation.
TEST_F(CudaOpsTest, IndexerCacheWriteHadamard) {
    const int64_t n_blocks = 4, n_slots = n_blocks * 64, n = 70;
    const auto [slots, pos] = cache_write_tokens(n, n_slots, rng_);
    for (auto [dim, d_rope, interleaved] :
         std::vector<std::tuple<int64_t, int64_t, bool>>{{128, 64, true}, {128, 64, false}, {32, 16, false}}) {
        const auto k = randv(n * dim, 2.0f);
        auto& w = keep(randv(dim));
        auto& b = keep(randv(dim));
        const Rope rp = Rope::plain(10000.0f, d_rope, interleaved);
        Tensor cc = cpu_.alloc(DType::F32, {n_slots, dim});
        cpu_.indexer_cache_write(put(cpu_, k, {n, dim}), w, b, 1e-6f, put_i32(cpu_, pos, {n}), rp,
                                 put_i32(cpu_, slots, {n}), cc, true);  // an F32 cache: the key unrotated
        const std::vector<float> cache_cpu = get(cpu_, cc);
        Tensor gc = gpu_->alloc(DType::F8_E4M3, {n_blocks, fp8_indexer_block_bytes(dim)});
        gpu_->indexer_cache_write(put(*gpu_, k, {n, dim}), w, b, 1e-6f, put_i32(*gpu_, pos, {n}), rp,
                                  put_i32(*gpu_, slots, {n}), gc, true);
        std::vector<uint8_t> raw(static_cast<size_t>(gc.numel())), ref(raw.size());
        gpu_->download(gc, raw.data());
        int64_t differ = 0, total = 0;
        std::vector<float> got, want;
        for (int64_t i = 0; i < n; ++i) {
            const int64_t s = slots[static_cast<size_t>(i)];
            std::vector<float> key(cache_cpu.begin() + s * dim, cache_cpu.begin() + (s + 1) * dim), row(dim);
            hadamard_transform(key.data(), dim);
            fp8_indexer_pack(key.data(), dim, s, ref.data());
            fp8_indexer_unpack(raw.data(), dim, s, row.data());
            got.insert(got.end(), row.begin(), row.end());
            want.insert(want.end(), key.begin(), key.end());
            const size_t base = static_cast<size_t>((s / 64) * fp8_indexer_block_bytes(dim)), off = s % 64;
            for (int64_t c = 0; c < dim; ++c) differ += raw[base + off * dim + c] != ref[base + off * dim + c];
            differ += std::memcmp(&raw[base + 64 * dim + 4 * off], &ref[base + 64 * dim + 4 * off], 4) != 0;
            total += dim + 1;
        }
        const std::string tag = "indexer_cache_write hadamard dim " + std::to_string(dim);
        std::printf("    %s: %lld of %lld codes/scales differ from kv_format.cpp's\n", tag.c_str(),
                    static_cast<long long>(differ), static_cast<long long>(total));
        EXPECT_LE(differ, total / 200) << tag;
        expect_close(got, want, 0.07, tag);  // H·key within FP8 error
    }
}

// A ragged batch over paged caches: sequences of the given lengths, the last `q_per_seq` positions of each as
// queries, block tables shuffled over the pool.
struct PagedBatch {
    std::vector<int32_t> pos, seq, offsets, tables;
    int64_t n_blocks = 0;
};

PagedBatch make_paged(const std::vector<int64_t>& lens, int64_t q_per_seq, std::mt19937& rng) {
    PagedBatch b;
    for (int64_t len : lens) b.n_blocks += (len + 63) / 64;
    std::vector<int32_t> perm(static_cast<size_t>(b.n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
        b.offsets.push_back(static_cast<int32_t>(b.tables.size()));
        for (int64_t k = 0; k < (lens[s] + 63) / 64; ++k) b.tables.push_back(perm[next++]);
        for (int64_t p = std::max<int64_t>(0, lens[s] - q_per_seq); p < lens[s]; ++p) {
            b.pos.push_back(static_cast<int32_t>(p));
            b.seq.push_back(static_cast<int32_t>(s));
        }
    }
    return b;
}

struct TopkCase {
    int64_t n_head, dim, topk;
    std::vector<int64_t> lens;
};

TEST_F(CudaOpsTest, IndexerTopk) {
    const std::vector<TopkCase> cases = {
        {4, 32, 16, {1, 15, 16, 17, 100, 130}},
        // 48 heads: outside the FP8 scoring kernels (32 or 64 heads, test_indexer), so the exact path is compared.
        {48, 128, 2048, {1, 2047, 2048, 2049, 3001}},
        {48, 128, 2048, {5000, 700}},
        // Geometries outside the FP8 kernels select with topk.cu: its few-rows kernel (<= 4 rows over a stride
        // above 8K) and its long-row chain (more rows, stride above 32K).
        {4, 32, 512, {40000}},
        {4, 32, 512, {40000, 9000, 600}},
    };
    for (const TopkCase& tc : cases) {
        const PagedBatch pb = make_paged(tc.lens, 3, rng_);
        const int64_t n = static_cast<int64_t>(pb.pos.size()), n_slots = pb.n_blocks * 64;
        const auto q = randv(n * tc.n_head * tc.dim);
        std::vector<float> gates = randv(n * tc.n_head);
        const auto keys = randv(n_slots * tc.dim);
        for (KvFormat f : {KvFormat::F32, KvFormat::BF16, KvFormat::FP8}) {
            // CPU reads the round-tripped keys; the GPU pool holds them in format f.
            std::vector<float> keys_rt(keys.size());
            for (int64_t s = 0; s < n_slots; ++s) {
                std::vector<float> k(keys.begin() + s * tc.dim, keys.begin() + (s + 1) * tc.dim);
                const auto rt = roundtrip_key(k, f);
                std::copy(rt.begin(), rt.end(), keys_rt.begin() + s * tc.dim);
            }
            std::vector<int32_t> out[2];
            for (int i = 0; i < 2; ++i) {
                Ops& ops = i == 0 ? static_cast<Ops&>(cpu_) : *gpu_;
                Tensor tq = put(ops, q, {n, tc.n_head, tc.dim});
                Tensor tw = put(ops, gates, {n, tc.n_head});
                Tensor tpos = put_i32(ops, pb.pos, {n}), tseq = put_i32(ops, pb.seq, {n});
                Tensor toff = put_i32(ops, pb.offsets, {static_cast<int64_t>(pb.offsets.size())});
                Tensor ttab = put_i32(ops, pb.tables, {static_cast<int64_t>(pb.tables.size())});
                Tensor tk;
                if (i == 0 || f == KvFormat::F32) {
                    tk = put(ops, i == 0 ? keys_rt : keys, {n_slots, tc.dim});
                } else {
                    // Fill the pool through the fused write: LayerNorm with w = 1, b = 0 would change the keys, so
                    // instead write raw rows: bf16 through cache_write, fp8 through host packing + upload.
                    if (f == KvFormat::BF16) {
                        tk = ops.alloc(DType::BF16, {n_slots, tc.dim});
                        std::vector<int32_t> all(static_cast<size_t>(n_slots));
                        std::iota(all.begin(), all.end(), 0);
                        ops.cache_write(put(ops, keys, {n_slots, tc.dim}), put_i32(ops, all, {n_slots}), tk);
                    } else {
                        const int64_t bb = fp8_indexer_block_bytes(tc.dim);
                        std::vector<int32_t> pool(static_cast<size_t>(pb.n_blocks * bb + 3) / 4);
                        auto* p8 = reinterpret_cast<uint8_t*>(pool.data());
                        for (int64_t s = 0; s < n_slots; ++s) fp8_indexer_pack(keys.data() + s * tc.dim, tc.dim, s, p8);
                        tk = ops.upload_i32(pool);
                        tk.dtype = DType::F8_E4M3;
                        tk.shape = {pb.n_blocks, bb};
                    }
                }
                Tensor to = ops.alloc(DType::I32, {n, tc.topk});
                IndexerTopkParams p;
                p.q = &tq;
                p.weights = &tw;
                p.keys = &tk;
                p.map.block_size = 64;
                p.map.pos = tpos.i32();
                p.map.seq = tseq.i32();
                p.map.table_offset = toff.i32();
                p.map.tables = ttab.i32();
                p.map.n_seq = static_cast<int64_t>(pb.offsets.size());
                p.map.max_context = *std::max_element(pb.pos.begin(), pb.pos.end()) + 1;
                p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(tc.dim));
                p.head_scale = 1.0f / std::sqrt(static_cast<float>(tc.n_head));
                p.topk = tc.topk;
                p.out_slots = &to;
                ops.indexer_topk(p);
                out[i] = get_i32(ops, to);
            }
            // Compare per token as sets; a difference is allowed only for candidates whose score (double) ties the
            // k-th best within 1e-5 of the score range.
            int64_t n_diff = 0, n_bad = 0;
            for (int64_t t = 0; t < n; ++t) {
                std::vector<int32_t> a(out[0].begin() + t * tc.topk, out[0].begin() + (t + 1) * tc.topk);
                std::vector<int32_t> b(out[1].begin() + t * tc.topk, out[1].begin() + (t + 1) * tc.topk);
                if (a == b) continue;
                std::set<int32_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
                std::vector<int32_t> diff;
                std::set_symmetric_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(diff));
                if (diff.empty()) {  // same set, different order: the contract fixes ascending candidate order
                    ++n_bad;
                    continue;
                }
                // scores in double over this token's candidates
                const int64_t n_cand = pb.pos[static_cast<size_t>(t)] + 1;
                const int32_t* table =
                    pb.tables.data() + pb.offsets[static_cast<size_t>(pb.seq[static_cast<size_t>(t)])];
                std::vector<double> sc(static_cast<size_t>(n_cand));
                std::map<int32_t, double> by_slot;
                for (int64_t c = 0; c < n_cand; ++c) {
                    const int64_t slot = static_cast<int64_t>(table[c / 64]) * 64 + c % 64;
                    double s = 0;
                    for (int64_t h = 0; h < tc.n_head; ++h) {
                        double dot = 0;
                        for (int64_t e = 0; e < tc.dim; ++e) {
                            dot += static_cast<double>(q[static_cast<size_t>((t * tc.n_head + h) * tc.dim + e)]) *
                                   keys_rt[static_cast<size_t>(slot * tc.dim + e)];
                        }
                        s += gates[static_cast<size_t>(t * tc.n_head + h)] / std::sqrt(static_cast<double>(tc.n_head)) *
                             std::max(dot / std::sqrt(static_cast<double>(tc.dim)), 0.0);
                    }
                    sc[static_cast<size_t>(c)] = s;
                    by_slot[static_cast<int32_t>(slot)] = s;
                }
                std::vector<double> sorted = sc;
                std::sort(sorted.begin(), sorted.end(), std::greater<double>());
                const double kth = sorted[static_cast<size_t>(tc.topk - 1)];
                const double range = sorted.front() - sorted.back();
                for (int32_t s : diff) {
                    ++n_diff;
                    if (s < 0 || std::fabs(by_slot[s] - kth) > 1e-5 * range) ++n_bad;
                }
            }
            std::printf("  indexer_topk %-5s H%-3lld d%-3lld topk %-5lld n %-3lld: %lld boundary swaps, %lld wrong\n",
                        kv_format_name(f), static_cast<long long>(tc.n_head), static_cast<long long>(tc.dim),
                        static_cast<long long>(tc.topk), static_cast<long long>(n), static_cast<long long>(n_diff),
                        static_cast<long long>(n_bad));
            EXPECT_EQ(n_bad, 0) << "indexer_topk " << kv_format_name(f) << " topk " << tc.topk;
        }
    }
}

struct MlaCase {
    int64_t n_head, rank, rope, topk;
    std::vector<int64_t> lens;
};

TEST_F(CudaOpsTest, SparseMla) {
    const std::vector<MlaCase> cases = {
        {4, 32, 16, 16, {1, 10, 16, 40}},
        {64, 512, 64, 2048, {3000, 100}},
        {128, 512, 64, 2048, {2049}},
    };
    for (const MlaCase& mc : cases) {
        const PagedBatch pb = make_paged(mc.lens, 2, rng_);
        const int64_t n = static_cast<int64_t>(pb.pos.size()), n_slots = pb.n_blocks * 64, d = mc.rank + mc.rope;
        const auto q = randv(n * mc.n_head * d, 0.3f);
        const auto rows = randv(n_slots * d);
        // selected slots: the first min(pos + 1, topk) candidates' slots of a random subset, −1 padded
        std::vector<int32_t> sel(static_cast<size_t>(n * mc.topk), -1);
        for (int64_t t = 0; t < n; ++t) {
            const int32_t* table = pb.tables.data() + pb.offsets[static_cast<size_t>(pb.seq[static_cast<size_t>(t)])];
            std::vector<int32_t> cand;
            for (int64_t c = 0; c <= pb.pos[static_cast<size_t>(t)]; ++c) cand.push_back(table[c / 64] * 64 + c % 64);
            std::shuffle(cand.begin(), cand.end(), rng_);
            cand.resize(std::min<size_t>(cand.size(), static_cast<size_t>(mc.topk)));
            std::sort(cand.begin(), cand.end());
            std::copy(cand.begin(), cand.end(), sel.begin() + t * mc.topk);
        }
        for (KvFormat f : {KvFormat::F32, KvFormat::BF16, KvFormat::FP8}) {
            std::vector<float> rows_rt(rows.size());
            const int64_t rb = fp8_latent_row_bytes(mc.rank, mc.rope);
            std::vector<int32_t> packed(static_cast<size_t>(n_slots * rb + 3) / 4);
            auto* p8 = reinterpret_cast<uint8_t*>(packed.data());
            for (int64_t s = 0; s < n_slots; ++s) {
                std::vector<float> r(rows.begin() + s * d, rows.begin() + (s + 1) * d);
                const auto rt = roundtrip_latent(r, mc.rank, mc.rope, f);
                std::copy(rt.begin(), rt.end(), rows_rt.begin() + s * d);
                if (f == KvFormat::FP8) fp8_latent_pack(r.data(), mc.rank, mc.rope, p8 + s * rb);
            }
            std::vector<float> out[2];
            for (int i = 0; i < 2; ++i) {
                Ops& ops = i == 0 ? static_cast<Ops&>(cpu_) : *gpu_;
                Tensor tq = put(ops, q, {n, mc.n_head, d});
                Tensor ts = put_i32(ops, sel, {n, mc.topk});
                Tensor tc;
                if (i == 0 || f == KvFormat::F32) {
                    tc = put(ops, i == 0 ? rows_rt : rows, {n_slots, d});
                } else if (f == KvFormat::BF16) {
                    tc = ops.alloc(DType::BF16, {n_slots, d});
                    std::vector<int32_t> all(static_cast<size_t>(n_slots));
                    std::iota(all.begin(), all.end(), 0);
                    ops.cache_write(put(ops, rows, {n_slots, d}), put_i32(ops, all, {n_slots}), tc);
                } else {
                    tc = ops.upload_i32(packed);
                    tc.dtype = DType::F8_E4M3;
                    tc.shape = {n_slots, rb};
                }
                Tensor to = ops.alloc(DType::F32, {n, mc.n_head, mc.rank});
                SparseMlaParams p;
                p.q = &tq;
                p.cache = &tc;
                p.slots = &ts;
                p.d_v = mc.rank;
                p.scale = 1.0f / std::sqrt(static_cast<float>(d));
                p.out = &to;
                ops.sparse_mla(p);
                out[i] = get(ops, to);
            }
            // GLM-5.2 geometry over bf16 / FP8 rows runs the fast kernel (sparse_mla.cu), which multiplies bf16
            // queries (tests/cuda/test_sparse_mla.cpp: ≤ 1.04e-3 measured against a double reference).
            const bool fast = f != KvFormat::F32 && mc.rank == 512 && mc.rope == 64;
            expect_close(out[1], out[0], fast ? 3e-3 : 1e-4,
                         std::string("sparse_mla ") + kv_format_name(f) + " H" + std::to_string(mc.n_head) + " topk " +
                             std::to_string(mc.topk));
        }
    }
}

// The host KV tier's ops: a selection over blocks in both tiers resolved to device rows (hits counted by atomics),
// write slots split, selected rows gathered from pinned host memory (FP8 rows of 656 B and odd-sized rows), and
// blocks moved between host and device memory in one call. All exact: the CPU oracle's values, byte for byte.
TEST_F(CudaOpsTest, HostTierOps) {
    CpuOps cpu;
    const int64_t n_blocks = 40, n = 5, k = 96, R = 2, staging_base = 20 * kBlockSize;
    std::vector<int32_t> loc(n_blocks), slots(static_cast<size_t>(n * k)), write(37);
    for (int64_t b = 0; b < n_blocks; ++b)
        loc[static_cast<size_t>(b)] = b % 3 == 0 ? -(b / 3 + 1) : static_cast<int32_t>(b / 3);
    std::uniform_int_distribution<int32_t> slot(-20, static_cast<int32_t>(n_blocks * kBlockSize - 1));
    for (auto& x : slots) x = std::max(slot(rng_), -1);
    for (auto& x : write) x = std::max(slot(rng_), -1);
    std::vector<int32_t> dev_c[2], host_c[2], fetch_c[2], hits_c[2], split_d[2], split_h[2];
    for (int side = 0; side < 2; ++side) {
        Ops& ops = side == 0 ? static_cast<Ops&>(cpu) : *gpu_;
        const Tensor s = put_i32(ops, slots, {n, k}), l = put_i32(ops, loc, {n_blocks});
        Tensor dev = ops.alloc(DType::I32, {n, k}), fetch = ops.alloc(DType::I32, {n * k});
        Tensor hits = put_i32(ops, std::vector<int32_t>(static_cast<size_t>(n_blocks), 5), {n_blocks});
        KvResolveParams rp;
        rp.slots = &s;
        rp.loc = &l;
        rp.staging_base = staging_base;
        rp.rows_per_pass = R;
        rp.weight = 3;
        rp.device_slots = &dev;
        rp.fetch = &fetch;
        rp.block_hits = &hits;
        ops.kv_resolve(rp);
        dev_c[side] = get_i32(ops, dev);
        fetch_c[side] = get_i32(ops, fetch);
        hits_c[side] = get_i32(ops, hits);
        const Tensor w = put_i32(ops, write, {static_cast<int64_t>(write.size())});
        Tensor wd = ops.alloc(DType::I32, {w.numel()}), wh = ops.alloc(DType::I32, {w.numel()});
        ops.kv_split_slots(w, l, wd, wh);
        split_d[side] = get_i32(ops, wd);
        split_h[side] = get_i32(ops, wh);
    }
    EXPECT_EQ(dev_c[1], dev_c[0]);
    EXPECT_EQ(fetch_c[1], fetch_c[0]);
    EXPECT_EQ(hits_c[1], hits_c[0]);
    EXPECT_EQ(split_d[1], split_d[0]);
    EXPECT_EQ(split_h[1], split_h[0]);

    // Gathers from host memory: FP8 latent rows (16-B vectors) and 7-byte rows (byte path).
    for (const int64_t rb : {int64_t{656}, int64_t{7}}) {
        const int64_t n_src = 300, m = 257;
        Tensor src = gpu_->alloc_host(DType::F8_E4M3, {n_src, rb});
        auto* sp = static_cast<uint8_t*>(src.data);
        for (int64_t i = 0; i < n_src * rb; ++i) sp[i] = static_cast<uint8_t>(rng_());
        std::vector<int32_t> rows(static_cast<size_t>(m));
        std::uniform_int_distribution<int32_t> row(-1, static_cast<int32_t>(n_src - 1));
        for (auto& r : rows) r = row(rng_);
        const Tensor rt = put_i32(*gpu_, rows, {m});
        Tensor dst = gpu_->alloc(DType::F8_E4M3, {m + 3, rb});
        const std::vector<uint8_t> fill(static_cast<size_t>((m + 3) * rb), 0xA5);
        gpu_->upload(fill.data(), dst);
        const int64_t stall0 = gpu_->kv_fetch_stall_ns();
        gpu_->kv_fetch_rows(src, rt, dst);
        std::vector<uint8_t> got(fill.size());
        gpu_->download(dst, got.data());
        // The fetch stall: a gather on the compute stream is all stall; a wait for the copy stream adds its own.
        const int64_t stall1 = gpu_->kv_fetch_stall_ns();
        EXPECT_GT(stall1, stall0) << "row bytes " << rb;
        gpu_->kv_fetch_wait(gpu_->kv_fetch_rows_async(src, rt, dst));
        std::vector<uint8_t> again(fill.size());
        gpu_->download(dst, again.data());
        EXPECT_GE(gpu_->kv_fetch_stall_ns(), stall1);
        EXPECT_EQ(again, got);
        for (int64_t t = 0; t < m; ++t) {
            const int32_t r = rows[static_cast<size_t>(t)];
            for (int64_t c = 0; c < rb; ++c) {
                const uint8_t want = r < 0 ? 0xA5 : sp[r * rb + c];
                ASSERT_EQ(got[static_cast<size_t>(t * rb + c)], want) << "row bytes " << rb << " entry " << t;
            }
        }
    }

    // Blocks moving: device → host, host → device, device → device, in one call.
    const int64_t rb = 656, rows = 4 * kBlockSize, bb = kBlockSize * rb;
    Tensor dev = gpu_->alloc(DType::F8_E4M3, {rows, rb});
    Tensor host = gpu_->alloc_host(DType::F8_E4M3, {rows, rb});
    std::vector<uint8_t> d0(static_cast<size_t>(rows * rb));
    for (auto& x : d0) x = static_cast<uint8_t>(rng_());
    gpu_->upload(d0.data(), dev);
    auto* hp = static_cast<uint8_t*>(host.data);
    for (int64_t i = 0; i < rows * rb; ++i) hp[i] = static_cast<uint8_t>(rng_());
    const std::vector<uint8_t> h0(hp, hp + rows * rb);
    auto* dp = static_cast<uint8_t*>(dev.data);
    gpu_->copy_blocks({{dp, hp + 2 * bb, bb}, {hp, dp + 3 * bb, bb}, {dp + bb, dp + 2 * bb, bb}});
    std::vector<uint8_t> d1(d0.size());
    gpu_->download(dev, d1.data());
    EXPECT_EQ(0, std::memcmp(hp + 2 * bb, d0.data(), bb));              // device block 0 → host block 2
    EXPECT_EQ(0, std::memcmp(d1.data() + 3 * bb, h0.data(), bb));       // host block 0 → device block 3
    EXPECT_EQ(0, std::memcmp(d1.data() + 2 * bb, d0.data() + bb, bb));  // device block 1 → device block 2
    EXPECT_EQ(0, std::memcmp(d1.data(), d0.data(), 2 * bb));            // the sources are untouched
    EXPECT_EQ(0, std::memcmp(hp, h0.data(), 2 * bb));
}

// Graph ownership in the caching allocator: blocks handed out while recording belong to the graph once recording
// ends; released ones (during or after the recording) stay out of the free lists until the graph gives them back
// (unown), and a block still held when unowned returns on its holder's release.
TEST(CudaAllocator, GraphOwnedBlocksWaitForUnown) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    cuda::DeviceAllocator a(0, 0, nullptr);
    size_t cap = 0;
    void* before = a.allocate(4096, &cap);
    a.release(before, cap);  // cached: reused below
    a.begin_record();
    void* x = a.allocate(4096, &cap);  // the cached block
    EXPECT_EQ(x, before);
    void* y = a.allocate(4096, &cap);  // a new one
    a.release(y, cap);                 // released during the recording
    const auto blocks = a.end_record();
    ASSERT_EQ(blocks.size(), 2u);
    const int64_t mallocs = a.stats().n_cuda_malloc;
    void* z = a.allocate(4096, &cap);  // neither graph block may come back
    EXPECT_NE(z, x);
    EXPECT_NE(z, y);
    EXPECT_EQ(a.stats().n_cuda_malloc, mallocs + 1);
    a.release(x, cap);  // x: released after the recording, parked
    a.release(z, cap);
    a.unown(blocks);  // x and y back to the free lists, z already there
    std::set<void*> got;
    for (int i = 0; i < 3; ++i) got.insert(a.allocate(4096, &cap));
    EXPECT_EQ(got, (std::set<void*>{x, y, z}));
    EXPECT_EQ(a.stats().n_cuda_malloc, mallocs + 1);  // all three from the cache
    // A graph block still held when the graph goes returns on its holder's release.
    a.begin_record();
    void* w = a.allocate(1 << 20, &cap);
    const auto held = a.end_record();
    a.unown(held);
    a.release(w, cap);
    EXPECT_EQ(a.allocate(1 << 20, &cap), w);
    for (void* p : got) a.release(p, 4096);
    a.release(w, cap);
}

}  // namespace
}  // namespace megactx
