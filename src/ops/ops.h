// The backend-neutral op table (design.md §6). Model code calls these and never a kernel; each backend
// (cpu/ is the reference, cuda/ later) implements every op. Shapes in comments are outermost first;
// n = tokens in the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "model/weight.h"
#include "ops/rope.h"
#include "ops/tensor.h"

namespace megactx {

constexpr int64_t kBlockSize = 64;  // tokens per KV block (a slot is block · 64 + offset)

// Where each token of a ragged batch reads its sequence's cached tokens: candidates of the token at
// position p are its sequence's positions 0..p, whose slots are block_table[t / block_size] · block_size
// + t % block_size. Built on the host by the model runner ("plan"), consumed by the indexer.
struct CacheMap {
    int64_t block_size = 64;
    const int32_t* pos = nullptr;           // [n] position of each token
    const int32_t* seq = nullptr;           // [n] sequence index of each token
    const int32_t* table_offset = nullptr;  // [n_seq] offset of each sequence's block table in `tables`
    const int32_t* tables = nullptr;        // concatenated block tables
    // Host-side facts of the batch, so a backend can plan (scratch sizes, row groups) without reading back
    // (the CUDA indexer requires them; BatchPlan fills them):
    int64_t n_seq = 0;         // sequences in the batch
    int64_t max_seq_rows = 0;  // the most tokens of any one sequence (0: unknown)
    int64_t max_context = 0;   // the most candidates of any token: max(pos) + 1
};

struct IndexerTopkParams {
    const Tensor* q = nullptr;        // [n, n_head_indexer, d_indexer]  f32, RoPE applied
    const Tensor* weights = nullptr;  // [n, n_head_indexer]            per-head gates (weights_proj output)
    const Tensor* keys = nullptr;     // [n_slots, d_indexer]           the layer's indexer key cache
    CacheMap map;
    float softmax_scale = 0;  // d_indexer^-0.5
    float head_scale = 0;     // n_head_indexer^-0.5, applied to the gates
    int64_t topk = 0;
    // With an FP8 key cache: its keys were stored rotated (indexer_cache_write's `hadamard`), so the queries are
    // rotated the same way (then quantised where the backend scores in FP8). F32 / BF16 caches ignore it.
    bool hadamard = false;
    Tensor* out_slots = nullptr;  // [n, topk] int32, selected slots, -1 padded
    // Tensor parallel with the indexer split by heads: q / weights hold this rank's heads, and the backend calls
    // reduce_scores(scores, count) on every group of fp32 score rows (its own memory) before selecting, to sum
    // the ranks' partial scores (a score is a sum over heads). Same batch → same calls on every rank.
    std::function<void(float* scores, int64_t count)> reduce_scores;
};

struct SparseMlaParams {
    const Tensor* q = nullptr;      // [n, n_head, d_latent]  [q_abs (kv_lora_rank) | q_pe (rope)]
    const Tensor* cache = nullptr;  // [n_slots, d_latent]    [c (kv_lora_rank) | k_pe (rope)]
    const Tensor* slots = nullptr;  // [n, topk] int32, -1 = unused
    int64_t d_v = 0;                // kv_lora_rank: V is the first d_v values of each cache row
    float scale = 0;
    Tensor* out = nullptr;  // [n, n_head, d_v]
    // The rows of the whole batch when it is attended in passes (tiered KV): a backend that splits the work by
    // the row count plans as for one call, so passes sum in the order one call would (0: n).
    int64_t plan_rows = 0;
};

// Tiered KV (kv/kv_cache.h): a logical block b lives in the device pool (loc[b] = d ≥ 0: device rows d·64 ..) or
// in the host pool (loc[b] = −(h + 1): host rows h·64 ..). Top-k slots and write slots are logical
// (b · 64 + offset); these params turn a selection into rows of the device pool, staging host-resident rows.
struct KvResolveParams {
    const Tensor* slots = nullptr;   // [n, k] int32 logical slots, -1 = unused
    const Tensor* loc = nullptr;     // [n_logical_blocks] int32
    int64_t staging_base = 0;        // the device pool's first staging row (device blocks · 64)
    int64_t rows_per_pass = 1;       // R: selection (i, j) stages at row staging_base + (i % R) · k + j
    int32_t weight = 1;              // added to block_hits per selected row (the layers that read this selection)
    Tensor* device_slots = nullptr;  // [n, k] out: the device-pool row each selection is read from, -1 kept
    Tensor* fetch = nullptr;         // [n · k] out: the host-pool row selection (i, j) stages, or -1 (resident/unused)
    Tensor* block_hits = nullptr;    // [n_logical_blocks] int32, accumulated: += weight per selected row
};

struct BlockCopy {  // Ops::copy_blocks
    const void* src = nullptr;
    void* dst = nullptr;
    int64_t bytes = 0;
};

struct MoeRouteParams {
    int64_t n_group = 1, topk_group = 1, top_k = 1;
    bool norm_topk_prob = true;
    float routed_scaling_factor = 1.0f;
};

struct MlpWeights {
    Weight gate, up, down;  // gate/up [d_ff, d_model], down [d_model, d_ff]
};

// A recorded sequence of ops (Ops::record), replayed with new host inputs: `inputs` holds, in order, the vectors
// the recorded upload_i32 calls sent; a replay sends what they hold then (each must keep its recorded size).
// Everything else (tensor addresses, shapes, launch grids) is fixed at recording.
class OpsGraph {
  public:
    virtual ~OpsGraph() = default;
    std::vector<std::vector<int32_t>> inputs;
    int64_t bytes = 0;  // backend memory the graph keeps reserved while it lives
};

class Ops {
  public:
    virtual ~Ops() = default;

    // Whether record() can work here (CUDA: yes; CPU: no).
    virtual bool can_record() const { return false; }
    // Records the ops `body` issues without running them (CUDA graphs); nullptr where the backend cannot. The
    // memory of tensors allocated while recording stays reserved for the graph. Throws if an op cannot be
    // recorded (a host sync, a first-use upload): run the same body once without recording first.
    virtual std::unique_ptr<OpsGraph> record(const std::function<void()>& body) {
        (void)body;
        return nullptr;
    }
    // Runs a recorded graph with its current inputs.
    virtual void replay(OpsGraph& g) {
        (void)g;
        throw std::logic_error("Ops::replay: this backend records no graphs");
    }

    virtual Tensor alloc(DType dtype, std::vector<int64_t> shape) = 0;
    // Host → backend memory (and back) for small metadata and results.
    virtual Tensor upload_i32(const std::vector<int32_t>& v) = 0;
    virtual void download(const Tensor& t, void* host) = 0;
    // Host bytes (t.numel() elements of t.dtype) → t's memory.
    virtual void upload(const void* host, Tensor& t) = 0;
    // t's bytes set to 0 in backend memory, ordered like an op (no host buffer, no synchronisation).
    virtual void zero(Tensor& t) = 0;

    // out[i] = table[tokens[i]]                                 out [n, d]
    virtual void embedding(const Tensor& tokens, const Weight& table, Tensor& out) = 0;
    // y = x · rsqrt(mean(x²) + eps) · w                          x, y [n, d]
    virtual void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor& y) = 0;
    // The pre-norm residual step: x += delta, then y = rms_norm(x, w) (the same values as add then rms_norm; one
    // pass over the rows on CUDA).                              x, delta, y [n, d]
    virtual void add_rms_norm(Tensor& x, const Tensor& delta, const std::vector<float>& w, float eps, Tensor& y) = 0;
    // y = (x − mean) · rsqrt(var + eps) · w + b, over the last dim
    virtual void layer_norm(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, float eps,
                            Tensor& y) = 0;
    // y = x · Wᵀ                                                 x [n, in], W [out, in], y [n, out]
    virtual void linear(const Tensor& x, const Weight& w, Tensor& y) = 0;
    // RoPE in place on x[:, h, offset : offset + rope.dim()] for every head h: pair i (dims 2i, 2i+1, or i and
    // i + dim/2 when not interleaved) rotates by pos · rope.inv_freq[i], cos and sin times rope.scale.
    //                                                            x [n, n_head, d_head], pos [n] int32
    virtual void rope(Tensor& x, int64_t offset, const Tensor& pos, const Rope& rope) = 0;
    // cache[slots[i]] = rows[i]; slot -1: not stored             rows [n, d], cache [n_slots, d]
    virtual void cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) = 0;
    // The token's MLA cache row, fused: [RMSNorm(kv_a[:, :r]) · norm_w | RoPE(kv_a[:, r:])] stored at slots[i]
    // in the cache's format (F32 / BF16 rows, FP8 656-B-style rows: kv_format.h); slot -1: not stored (tiered KV
    // writes each row into one of two pools).
    //   kv_a [n, r + d_rope] raw kv_a_proj output, norm_w [r], pos/slots [n] int32, cache: KvCache::latent
    virtual void latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                                    const Rope& rope, const Tensor& slots, Tensor& cache) = 0;
    // The token's indexer key, fused: LayerNorm(k_raw) · ln_w + ln_b, RoPE on dims [0, rope.dim()), stored at
    // slots[i] in the cache's format (FP8: the paged layout). `hadamard` (ModelConfig::indexer_hadamard): an FP8
    // cache stores H·key (kv_format.h hadamard_transform) quantised; F32 / BF16 caches ignore it.
    //   k_raw [n, d_indexer], pos/slots [n] int32, cache: KvCache::indexer_keys
    virtual void indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w,
                                     const std::vector<float>& ln_b, float eps, const Tensor& pos, const Rope& rope,
                                     const Tensor& slots, Tensor& cache, bool hadamard) = 0;
    // DSA lightning indexer: per token, scores over its candidates, top-k slots (model-spec §3.2).
    virtual void indexer_topk(const IndexerTopkParams& p) = 0;
    // q_out[i, h] = [q_nope[i, h] · W_UK_h | q_pe[i, h]]
    //   q [n, n_head, d_nope + d_rope], kv_b [n_head · (d_nope + d_v), kv_lora_rank],
    //   q_out [n, n_head, kv_lora_rank + d_rope]
    virtual void mla_absorb_q(const Tensor& q, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& q_out) = 0;
    // Absorbed sparse MLA over exactly the selected slots (model-spec §2.5).
    virtual void sparse_mla(const SparseMlaParams& p) = 0;
    // out[i, h] = lat[i, h] · W_UV_hᵀ                            lat [n, n_head, kv_lora_rank], out [n, n_head · d_v]
    virtual void mla_expand_v(const Tensor& lat, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& out) = 0;
    // y = down(silu(gate(x)) ⊙ up(x))                            x [n, d_model], y [n, d_model]
    virtual void swiglu_mlp(const Tensor& x, const MlpWeights& w, Tensor& y) = 0;
    // Router: sigmoid scores, bias for choice only, group limit, top-k, renormalise, scale.
    //   x [n, d_model] → ids [n, top_k] int32, weights [n, top_k]
    virtual void moe_route(const Tensor& x, const Weight& gate, const std::vector<float>& bias, const MoeRouteParams& p,
                           Tensor& ids, Tensor& weights) = 0;
    // y = Σ_k weights[:, k] · expert_{ids[:, k]}(x)                y [n, d_model] (overwritten)
    // An expert with empty weights is held by another rank (expert parallel) and contributes 0.
    virtual void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                             const std::vector<MlpWeights>& experts, Tensor& y) = 0;
    // Tiered KV (KvResolveParams): a selection's device-pool rows and the host rows to stage. The tier ops and
    // alloc_host are implemented by the backends that hold a host tier (CPU, CUDA); the others refuse it.
    virtual void kv_resolve(const KvResolveParams& p) {
        (void)p;
        no_host_tier();
    }
    // Write slots into the two pools: device[i] / host[i] = the token's row in that pool, -1 in the other one (and
    // in both for slot -1).                                     slots, device, host [n] int32, loc [n_blocks]
    virtual void kv_split_slots(const Tensor& slots, const Tensor& loc, Tensor& device, Tensor& host) {
        (void)slots, (void)loc, (void)device, (void)host;
        no_host_tier();
    }
    // dst[t] = src[rows[t]] for rows[t] >= 0, whole rows of any dtype; src may be host memory (alloc_host).
    //                                                           src [n_src, ...], rows [m] int32, dst [>= m, ...]
    virtual void kv_fetch_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
        (void)src, (void)rows, (void)dst;
        no_host_tier();
    }
    // kv_fetch_rows on the backend's copy stream, ordered after every op issued so far; ops issued after
    // kv_fetch_wait(ticket) see its rows. Lets the gathers of the layers sharing a selection run under the first
    // layer's compute. Backends without a second stream fetch at once (ticket 0, wait does nothing).
    virtual int64_t kv_fetch_rows_async(const Tensor& src, const Tensor& rows, Tensor& dst) {
        kv_fetch_rows(src, rows, dst);
        return 0;
    }
    virtual void kv_fetch_wait(int64_t ticket) { (void)ticket; }
    // Nanoseconds the compute has waited for host-tier rows since the backend was made: the time between the
    // compute reaching a kv_fetch_rows or a kv_fetch_wait and the rows being there (the fetch stall). CPU: the
    // gathers themselves (nothing runs beside them). CUDA: measured on the device (%globaltimer stamps around
    // each gather or wait on the compute stream, graphs included), read without a host sync, so it may lag the
    // last step; each gather or wait adds two one-thread kernels to the stream (MEGACTX_TIER_STALL=0 leaves them
    // out: 0 then).
    virtual int64_t kv_fetch_stall_ns() { return 0; }
    // Byte ranges copied between host memory (alloc_host) and backend memory: KV blocks moving between tiers,
    // every layer's at once. The ranges of one call do not overlap, so the copies may run in any order.
    virtual void copy_blocks(const std::vector<BlockCopy>& copies) {
        (void)copies;
        no_host_tier();
    }
    // Memory that lives on the host and that the backend's kernels read and write directly (CUDA: pinned and
    // mapped); alloc on the CPU.
    virtual Tensor alloc_host(DType dtype, std::vector<int64_t> shape) {
        (void)dtype, (void)shape;
        no_host_tier();
    }
    // out[j] = x[rows[j]]                                       x [n, d], out [m, d]  (F32, or I32 for both)
    virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;
    // out[i] = the index of row i's largest value; the lowest index wins ties (Sampler's argmax).
    //                                                           x [n, d] F32, out [n] I32
    virtual void argmax_rows(const Tensor& x, Tensor& out) = 0;
    // x[rows[j], c] = -inf for every column c whose bit is clear in mask j: bit c % 32 of bits[j, c / 32]; the
    // columns from 32·w on have no bit and are cleared (a grammar's token masks, whose vocabulary may be shorter
    // than the model's).                                        x [n, d] F32, rows [m] I32, bits [m, w] I32
    virtual void mask_rows(Tensor& x, const Tensor& rows, const Tensor& bits) = 0;
    // y += x (elementwise)
    virtual void add(Tensor& y, const Tensor& x) = 0;
    // Copies columns [c0, c0 + out.cols) of x into out.          x [n, d], out [n, d']
    virtual void slice_cols(const Tensor& x, int64_t c0, Tensor& out) = 0;
    // out = [a | b] along the last dim.
    virtual void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) = 0;

  private:
    [[noreturn]] static void no_host_tier() {
        throw std::runtime_error("--kv-offload-memory: this backend has no host KV tier yet (the CPU backend has)");
    }
};

}  // namespace megactx
