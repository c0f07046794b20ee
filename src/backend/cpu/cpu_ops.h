// The CPU backend: the numerical oracle (F32 KV caches only). Plain loops, fp32 accumulation, OpenMP across tokens,
// heads or output rows. Every output element is computed by one thread in a fixed order, so results do not depend on
// the thread count or on which other tokens share the batch.
#pragma once

#include "ops/ops.h"

namespace megactx {

// Not final: tests derive reference variants (e.g. emulating a GPU KV format) from it.
class CpuOps : public Ops {
  public:
    Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
    Tensor upload_i32(const std::vector<int32_t>& v) override;
    void download(const Tensor& t, void* host) override;
    void upload(const void* host, Tensor& t) override;
    void zero(Tensor& t) override;

    void embedding(const Tensor& tokens, const Weight& table, Tensor& out) override;
    void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor& y) override;
    void add_rms_norm(Tensor& x, const Tensor& delta, const std::vector<float>& w, float eps, Tensor& y) override;
    void layer_norm(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, float eps,
                    Tensor& y) override;
    void linear(const Tensor& x, const Weight& w, Tensor& y) override;
    void rope(Tensor& x, int64_t offset, const Tensor& pos, const Rope& rope) override;
    void cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) override;
    void latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                            const Rope& rope, const Tensor& slots, Tensor& cache) override;
    void indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w, const std::vector<float>& ln_b,
                             float eps, const Tensor& pos, const Rope& rope, const Tensor& slots, Tensor& cache,
                             bool hadamard) override;
    void indexer_topk(const IndexerTopkParams& p) override;
    void mla_absorb_q(const Tensor& q, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& q_out) override;
    void sparse_mla(const SparseMlaParams& p) override;
    void mla_expand_v(const Tensor& lat, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& out) override;
    void swiglu_mlp(const Tensor& x, const MlpWeights& w, Tensor& y) override;
    void moe_route(const Tensor& x, const Weight& gate, const std::vector<float>& bias, const MoeRouteParams& p,
                   Tensor& ids, Tensor& weights) override;
    void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                     Tensor& y) override;
    void kv_resolve(const KvResolveParams& p) override;
    void kv_split_slots(const Tensor& slots, const Tensor& loc, Tensor& device, Tensor& host) override;
    void kv_fetch_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override;
    int64_t kv_fetch_stall_ns() override { return fetch_ns_; }
    void copy_blocks(const std::vector<BlockCopy>& copies) override;
    Tensor alloc_host(DType dtype, std::vector<int64_t> shape) override { return alloc(dtype, std::move(shape)); }
    void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
    void argmax_rows(const Tensor& x, Tensor& out) override;
    void mask_rows(Tensor& x, const Tensor& rows, const Tensor& bits) override;
    void add(Tensor& y, const Tensor& x) override;
    void slice_cols(const Tensor& x, int64_t c0, Tensor& out) override;
    void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override;

  private:
    int64_t fetch_ns_ = 0;  // time in kv_fetch_rows (kv_fetch_stall_ns)
};

// Top-k of scores[0..n) by (score descending, index ascending); writes the chosen indices in ascending order.
// Exposed for tests.
void topk_indices(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out);

}  // namespace megactx
