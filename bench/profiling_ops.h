// ProfilingOps: an Ops decorator that forwards every op to an inner backend and accumulates the wall time
// (std::chrono::steady_clock) and call count per op name. The benchmarks use it to split decode time into
// the indexer scan (`indexer_topk`), sparse attention (`sparse_mla`) and the rest.
//
// Only calls made through this table are seen: a backend op that calls another op of its own backend
// (CpuOps::moe_experts → swiglu_mlp → linear) is counted once, under the outer name. For an asynchronous
// backend the times are launch times unless the inner ops synchronise.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace megactx {

class ProfilingOps final : public Ops {
  public:
    struct Stat {
        int64_t calls = 0;
        double seconds = 0;
    };

    explicit ProfilingOps(Ops& inner) : inner_(inner) {}

    void reset() { stats_ = {}; }
    // (name, stat) for every op called since the last reset, in op-table order.
    std::vector<std::pair<std::string, Stat>> stats() const {
        std::vector<std::pair<std::string, Stat>> out;
        for (size_t i = 0; i < kNames.size(); ++i) {
            if (stats_[i].calls > 0) out.emplace_back(kNames[i], stats_[i]);
        }
        return out;
    }
    double total_seconds() const {
        double s = 0;
        for (const Stat& st : stats_) s += st.seconds;
        return s;
    }

    Tensor alloc(DType dtype, std::vector<int64_t> shape) override {
        const Timer timer(stats_[kAlloc]);
        return inner_.alloc(dtype, std::move(shape));
    }
    Tensor upload_i32(const std::vector<int32_t>& v) override {
        const Timer timer(stats_[kUploadI32]);
        return inner_.upload_i32(v);
    }
    void download(const Tensor& t, void* host) override {
        const Timer timer(stats_[kDownload]);
        inner_.download(t, host);
    }
    void upload(const void* host, Tensor& t) override {
        const Timer timer(stats_[kDownload]);  // host transfers share one row
        inner_.upload(host, t);
    }
    void zero(Tensor& t) override {
        const Timer timer(stats_[kDownload]);
        inner_.zero(t);
    }
    void embedding(const Tensor& tokens, const Weight& table, Tensor& out) override {
        const Timer timer(stats_[kEmbedding]);
        inner_.embedding(tokens, table, out);
    }
    void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor& y) override {
        const Timer timer(stats_[kRmsNorm]);
        inner_.rms_norm(x, w, eps, y);
    }
    void add_rms_norm(Tensor& x, const Tensor& delta, const std::vector<float>& w, float eps, Tensor& y) override {
        const Timer timer(stats_[kAddRmsNorm]);
        inner_.add_rms_norm(x, delta, w, eps, y);
    }
    void layer_norm(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, float eps,
                    Tensor& y) override {
        const Timer timer(stats_[kLayerNorm]);
        inner_.layer_norm(x, w, b, eps, y);
    }
    void linear(const Tensor& x, const Weight& w, Tensor& y) override {
        const Timer timer(stats_[kLinear]);
        inner_.linear(x, w, y);
    }
    void rope(Tensor& x, int64_t offset, const Tensor& pos, const Rope& rope) override {
        const Timer timer(stats_[kRope]);
        inner_.rope(x, offset, pos, rope);
    }
    void cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) override {
        const Timer timer(stats_[kCacheWrite]);
        inner_.cache_write(rows, slots, cache);
    }
    void latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                            const Rope& rope, const Tensor& slots, Tensor& cache) override {
        const Timer timer(stats_[kLatentCacheWrite]);
        inner_.latent_cache_write(kv_a, norm_w, eps, pos, rope, slots, cache);
    }
    void indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w, const std::vector<float>& ln_b,
                             float eps, const Tensor& pos, const Rope& rope, const Tensor& slots, Tensor& cache,
                             bool hadamard) override {
        const Timer timer(stats_[kIndexerCacheWrite]);
        inner_.indexer_cache_write(k_raw, ln_w, ln_b, eps, pos, rope, slots, cache, hadamard);
    }
    void indexer_topk(const IndexerTopkParams& p) override {
        const Timer timer(stats_[kIndexerTopk]);
        inner_.indexer_topk(p);
    }
    void mla_absorb_q(const Tensor& q, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& q_out) override {
        const Timer timer(stats_[kMlaAbsorbQ]);
        inner_.mla_absorb_q(q, kv_b, d_nope, d_v, q_out);
    }
    void sparse_mla(const SparseMlaParams& p) override {
        const Timer timer(stats_[kSparseMla]);
        inner_.sparse_mla(p);
    }
    void mla_expand_v(const Tensor& lat, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& out) override {
        const Timer timer(stats_[kMlaExpandV]);
        inner_.mla_expand_v(lat, kv_b, d_nope, d_v, out);
    }
    void swiglu_mlp(const Tensor& x, const MlpWeights& w, Tensor& y) override {
        const Timer timer(stats_[kSwigluMlp]);
        inner_.swiglu_mlp(x, w, y);
    }
    void moe_route(const Tensor& x, const Weight& gate, const std::vector<float>& bias, const MoeRouteParams& p,
                   Tensor& ids, Tensor& weights) override {
        const Timer timer(stats_[kMoeRoute]);
        inner_.moe_route(x, gate, bias, p, ids, weights);
    }
    void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                     Tensor& y) override {
        const Timer timer(stats_[kMoeExperts]);
        inner_.moe_experts(x, ids, weights, experts, y);
    }
    void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {
        const Timer timer(stats_[kGatherRows]);
        inner_.gather_rows(x, rows, out);
    }
    // The host KV tier's ops, counted with the gathers (row moves).
    void kv_resolve(const KvResolveParams& p) override {
        const Timer timer(stats_[kGatherRows]);
        inner_.kv_resolve(p);
    }
    void kv_split_slots(const Tensor& slots, const Tensor& loc, Tensor& device, Tensor& host) override {
        const Timer timer(stats_[kGatherRows]);
        inner_.kv_split_slots(slots, loc, device, host);
    }
    void kv_fetch_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override {
        const Timer timer(stats_[kGatherRows]);
        inner_.kv_fetch_rows(src, rows, dst);
    }
    int64_t kv_fetch_rows_async(const Tensor& src, const Tensor& rows, Tensor& dst) override {
        const Timer timer(stats_[kGatherRows]);
        return inner_.kv_fetch_rows_async(src, rows, dst);
    }
    void kv_fetch_wait(int64_t ticket) override { inner_.kv_fetch_wait(ticket); }
    int64_t kv_fetch_stall_ns() override { return inner_.kv_fetch_stall_ns(); }
    void copy_blocks(const std::vector<BlockCopy>& copies) override {
        const Timer timer(stats_[kGatherRows]);
        inner_.copy_blocks(copies);
    }
    Tensor alloc_host(DType dtype, std::vector<int64_t> shape) override {
        return inner_.alloc_host(dtype, std::move(shape));
    }
    void argmax_rows(const Tensor& x, Tensor& out) override {
        const Timer timer(stats_[kGatherRows]);  // counted with the gathers: both are row moves at the end of a step
        inner_.argmax_rows(x, out);
    }
    void mask_rows(Tensor& x, const Tensor& rows, const Tensor& bits) override {
        const Timer timer(stats_[kGatherRows]);  // with argmax_rows: both end a step
        inner_.mask_rows(x, rows, bits);
    }
    void add(Tensor& y, const Tensor& x) override {
        const Timer timer(stats_[kAdd]);
        inner_.add(y, x);
    }
    void slice_cols(const Tensor& x, int64_t c0, Tensor& out) override {
        const Timer timer(stats_[kSliceCols]);
        inner_.slice_cols(x, c0, out);
    }
    void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override {
        const Timer timer(stats_[kConcatCols]);
        inner_.concat_cols(a, b, out);
    }

  private:
    using Clock = std::chrono::steady_clock;
    enum OpId : size_t {
        kAlloc,
        kUploadI32,
        kDownload,
        kEmbedding,
        kRmsNorm,
        kLayerNorm,
        kLinear,
        kRope,
        kCacheWrite,
        kLatentCacheWrite,
        kIndexerCacheWrite,
        kIndexerTopk,
        kMlaAbsorbQ,
        kSparseMla,
        kMlaExpandV,
        kSwigluMlp,
        kMoeRoute,
        kMoeExperts,
        kGatherRows,
        kAdd,
        kSliceCols,
        kConcatCols,
        kAddRmsNorm,
        kOpCount
    };
    static constexpr std::array<const char*, kOpCount> kNames = {"alloc",
                                                                 "upload_i32",
                                                                 "download",
                                                                 "embedding",
                                                                 "rms_norm",
                                                                 "layer_norm",
                                                                 "linear",
                                                                 "rope",
                                                                 "cache_write",
                                                                 "latent_cache_write",
                                                                 "indexer_cache_write",
                                                                 "indexer_topk",
                                                                 "mla_absorb_q",
                                                                 "sparse_mla",
                                                                 "mla_expand_v",
                                                                 "swiglu_mlp",
                                                                 "moe_route",
                                                                 "moe_experts",
                                                                 "gather_rows",
                                                                 "add",
                                                                 "slice_cols",
                                                                 "concat_cols",
                                                                 "add_rms_norm"};

    // Adds the wall time of its scope to one op's stat.
    class Timer {
      public:
        explicit Timer(Stat& s) : s_(s), t0_(Clock::now()) {}
        ~Timer() {
            s_.seconds += std::chrono::duration<double>(Clock::now() - t0_).count();
            ++s_.calls;
        }

      private:
        Stat& s_;
        Clock::time_point t0_;
    };

    Ops& inner_;
    std::array<Stat, kOpCount> stats_{};
};

}  // namespace megactx
