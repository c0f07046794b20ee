// The DSA models: GLM-5.x (`glm_moe_dsa`: MLA + DSA lightning indexer + IndexShare + MoE + MTP, as model-spec.md
// describes) and DeepSeek-V3.2 (`deepseek_v32`: the same blocks with an indexer on every layer and YaRN RoPE,
// docs/deepseek-v32.md); what differs is resolved in the config (io/config.h).
// load: config.json + safetensors → plain weight structs per layer. forward: one ragged Batch through all
// decoder layers, writing KV at each token's slot. mtp_forward: the MTP layer (model-spec §5.1).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/weight.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/pipe.h"
#include "parallel/shard_plan.h"

namespace megactx {

struct IndexerWeights {
    Weight wq_b;                            // [n_head_indexer · d_indexer, q_lora_rank]
    Weight wk;                              // [d_indexer, hidden]
    std::vector<float> k_norm_w, k_norm_b;  // LayerNorm [d_indexer]
    Weight weights_proj;                    // [n_head_indexer, hidden]
};

struct LayerWeights {
    bool full = true;  // runs its own indexer (else reuses the last full layer's top-k)
    bool moe = false;
    std::vector<float> input_norm, post_norm;  // [hidden]
    // MLA
    Weight q_a;                    // [q_lora_rank, hidden]
    std::vector<float> q_a_norm;   // [q_lora_rank]
    Weight q_b;                    // [n_head · qk_head_dim, q_lora_rank]
    Weight kv_a;                   // [kv_lora_rank + rope, hidden]
    std::vector<float> kv_a_norm;  // [kv_lora_rank]
    Weight kv_b;                   // [n_head · (nope + v), kv_lora_rank]
    Weight o;                      // [hidden, n_head · v]
    IndexerWeights indexer;        // full layers only
    // FFN
    MlpWeights mlp;                  // dense layers
    Weight router;                   // [n_experts, hidden]
    std::vector<float> router_bias;  // e_score_correction_bias [n_experts]
    std::vector<MlpWeights> experts;
    MlpWeights shared_expert;
    bool has_shared_expert = false;
    // MTP layers only
    std::vector<float> enorm, hnorm, head_norm;
    Weight eh_proj;  // [hidden, 2 · hidden]
};

struct ForwardResult {
    Tensor hidden;  // [n, hidden] after the final norm (what MTP step 0 consumes)
    Tensor logits;  // [n_logit_rows, vocab] for the rows the batch asked for
    Tensor topk;    // [n, index_topk] int32 slots chosen by the last full layer (MTP: by the MTP indexer)
};

// The other ranks of a tensor-parallel group as rank 0's model sees them (parallel/tp_group.h): every forward on
// rank 0 starts the same forward on each follower (its own shard, ops and KV cache) and waits for it, so that
// the ranks' collectives meet.
class RankFollowers {
  public:
    virtual ~RankFollowers() = default;
    // Makes every follower's KV cache like kv0 now (so a pool that does not fit fails at startup, not at the
    // first request).
    // With a host tier, kv0 logs its tier events from now on for the followers to replay (KvCache::TierEvent).
    virtual void prepare(KvCache& kv0) = 0;
    virtual void begin_forward(const Batch& batch, const KvCache& kv0) = 0;
    // The MTP layer's inputs from rank 0's backend, in host memory: each follower uploads them to its own.
    struct MtpInputs {
        std::vector<float> hidden;        // [n, hidden]
        std::vector<int32_t> reuse_topk;  // [n, index_topk], or empty: the MTP indexer runs
        std::vector<int32_t> tokens;      // [n] token ids to embed instead of the batch's, or empty
    };
    // Starts GlmDsaModel::mtp_forward on every follower (`in` stays alive until end_forward).
    virtual void begin_mtp_forward(const Batch& batch, const KvCache& kv0, const MtpInputs& in) = 0;
    virtual void end_forward() = 0;  // rethrows a follower's error
    // Rank 0 failed mid-forward with `cause`: releases the followers from their collectives; true when a follower
    // had failed first (its error, rethrown by end_forward, is then the cause).
    virtual bool abort(const std::exception_ptr& cause) = 0;
};

// Pipeline parallel: a batch of n tokens in min(n, stages) micro-batches of consecutive tokens, sizes differing by
// one at most. Every stage splits alike, so each knows what it receives. A sequence may be cut between two: the
// second's tokens see the first's KV, written on each stage before (prefill = chunked prefill).
std::vector<Range> micro_batches(int64_t n_tokens, int64_t n_stages);
// The rows of tokens [r.begin, r.end) of `b` that want logits.
int64_t count_logit_rows(const Batch& b, Range r);

class GlmDsaModel {
  public:
    // Loads config.json and the weights of `dir`; every error names the file, tensor or field.
    explicit GlmDsaModel(const std::string& dir);
    // Tensor / expert parallel: loads rank `rank`'s shard of `plan` (attention heads, MLP and expert columns or
    // whole experts, LM-head vocabulary rows; the rest replicated) and meets the other ranks through `comm`:
    // an all-reduce after o_proj and after the FFN, an all-gather of the logits.
    GlmDsaModel(const std::string& dir, const ShardPlan& plan, int rank, Comm& comm);
    // The same from a config and tensors already in hand (synthetic weights: model/synthetic_weights.h); `plan`
    // nullptr: the whole model.
    GlmDsaModel(const ModelConfig& config, std::unique_ptr<TensorStore> store, const ShardPlan* plan = nullptr,
                int rank = 0, Comm* comm = nullptr);

    const ModelConfig& config() const { return config_; }
    // --indexer-hadamard: ModelConfig::indexer_hadamard set to `on` unless nullopt (override_indexer_hadamard).
    void override_indexer_hadamard(std::optional<bool> on) { megactx::override_indexer_hadamard(config_, on); }
    bool has_mtp() const { return n_mtp_loaded_ > 0; }
    // Pipeline parallel: this rank's ends of the links to the neighbouring stages (parallel/pipe.h). With a pipe,
    // forward runs this rank's stage: the batch in micro-batches (micro_batches), each received from the stage
    // before (or embedded on the first), through the stage's layers, sent on (or, on the last, turned into logits
    // that rank 0 receives); rank 0's result holds the logits, and the hidden rows and top-k when the batch
    // asks for them (Batch::want_hidden). mtp_forward runs on the last stage (the MTP layer's), rank 0 receiving
    // its logits, hidden rows and top-k.
    void set_pipe(Pipe* p) { pipe_ = p; }
    bool pipelined() const { return pipe_ != nullptr; }
    // Rank 0 of a group drives the other ranks through `f` (nullptr: none).
    void set_followers(RankFollowers* f) { followers_ = f; }
    // Allocates the followers' KV caches like `kv` (no-op without a group); engines call it once they made theirs.
    void prepare_kv(KvCache& kv) const {
        if (followers_) followers_->prepare(kv);
    }
    // One device, no collectives: the whole forward can be recorded as one graph (graphed_forward.h).
    bool single_device() const { return followers_ == nullptr && (comm_ == nullptr || comm_->on_device_only()); }
    // The layers whose KV this model's KV cache holds: all, or this rank's group under LayerSplit.
    Range kv_layers() const;
    // KV bytes per token of the rank that holds the most (LayerSplit groups differ; every rank gets the same
    // block count, so the engine sizes the pool by this one); the whole model's without a group.
    int64_t kv_bytes_per_token_max(KvFormat format) const;

    // Runs the decoder over the batch: writes every token's KV at its slot, computes logits for the
    // requested rows. The tokens' positions must be covered by their block tables.
    ForwardResult forward(Ops& ops, const Batch& batch, KvCache& kv) const;
    // The token ids and positions of a batch against the vocabulary and context (forward's first step).
    void check_batch(const Batch& batch) const;

    // The MTP layer for a batch whose tokens are the *next* tokens (t+1) at the positions p of the hidden
    // states `hidden_in` [n, hidden] (the main model's normed hidden at p, or the previous MTP step's).
    // With `reuse_topk` ([n, index_topk] slots) the MTP indexer is not run and those indices are used
    // (draft steps ≥ 1, model-spec §5.3). With `tokens` ([n] int32 in backend memory: the previous draft step's
    // choices) those ids are embedded instead of the batch's. Writes the MTP layer's KV at each token's slot.
    ForwardResult mtp_forward(Ops& ops, const Batch& batch, const Tensor& hidden_in, KvCache& kv,
                              const Tensor* reuse_topk = nullptr, const Tensor* tokens = nullptr) const;

  private:
    // A forward's view of a tiered KV cache (KvCache::tiered): where the batch's latent rows are written, and the
    // current selection resolved to device-pool rows with the host rows to stage (Ops::kv_resolve).
    struct TierStep {
        Tensor write_device, write_host;  // [n] rows of the two pools, -1 in the other one
        Tensor slots, fetch;              // [n, index_topk] device-pool rows, [n · index_topk] host rows or -1
        bool resolved = false;            // `slots` holds the current top-k's rows
        int64_t ticket = -1;              // the current layer's staged rows (Ops::kv_fetch_rows_async), -1: none
    };
    // The TierStep of a batch, or nullptr (the cache has one tier).
    std::unique_ptr<TierStep> begin_tiers(Ops& ops, const BatchPlan& plan, KvCache& kv, int64_t n) const;
    // Layers that read the selection a full layer makes (itself and the shared layers after it).
    int64_t selection_readers(int64_t i_layer) const;
    // Tiered KV: resolves the selection if this layer is the first to read it, then (a batch that fits one staging
    // pass) gathers this layer's selected host rows on the copy stream (Ops::kv_fetch_rows_async). Called after
    // the layer's new rows are stored, since one of them may be selected.
    void stage_rows(Ops& ops, int64_t i_layer, KvCache& kv, const Tensor& topk, TierStep& tier) const;
    // run_indexer: the layer computes top-k into `topk`; otherwise it attends over the incoming `topk`.
    void layer_forward(Ops& ops, int64_t i_layer, Tensor& x, const BatchPlan& plan, KvCache& kv, Tensor& topk,
                       bool run_indexer, TierStep* tier) const;
    void attention(Ops& ops, int64_t i_layer, const Tensor& xn, const BatchPlan& plan, KvCache& kv, Tensor& topk,
                   bool run_indexer, TierStep* tier, Tensor& out) const;
    // Sparse MLA over `topk`; through the staging rows, pass by pass, when the cache is tiered.
    void sparse_attention(Ops& ops, int64_t i_layer, KvCache& kv, const Tensor& topk, TierStep* tier,
                          SparseMlaParams sp) const;
    ForwardResult finish(Ops& ops, const Tensor& x, const std::vector<float>& norm, const BatchPlan& plan,
                         Tensor topk) const;
    ForwardResult forward_local(Ops& ops, const Batch& batch, KvCache& kv) const;
    ForwardResult forward_stage(Ops& ops, const Batch& batch, KvCache& kv) const;
    // Pipeline stages: the last stage's first rank sends a (micro-)batch's logits — and with `hidden` its hidden
    // rows and top-k — to rank 0, which receives the micro-batches' results (their logit rows and token counts)
    // as one result.
    void send_result(Ops& ops, const ForwardResult& r, bool hidden) const;
    ForwardResult receive_result(Ops& ops, const std::vector<int64_t>& logit_rows, const std::vector<int64_t>& tokens,
                                 bool hidden) const;
    ForwardResult mtp_forward_local(Ops& ops, const Batch& batch, const Tensor& hidden_in, KvCache& kv,
                                    const Tensor* reuse_topk, const Tensor* tokens) const;
    // Rank 0 of a group: starts the followers (`start`), runs its own part (`local`) and waits for them; when
    // either side fails, releases the other from its collectives and rethrows the first cause.
    ForwardResult lead(const std::function<void()>& start, const std::function<ForwardResult()>& local) const;
    void load(std::unique_ptr<TensorStore> store);
    void set_shard(const ShardPlan& plan, int rank, Comm& comm);
    void all_reduce(Tensor& t) const;  // sums the ranks' partial results (no-op without a group)
    // LayerSplit: the rank holding layer l's KV, or -1 when every rank holds every layer.
    int kv_owner(int64_t i_layer) const;

    ModelConfig config_;
    Rope rope_attention_, rope_indexer_;  // config_'s, resolved once at load
    std::unique_ptr<TensorStore> store_;  // owns the mappings the weights point into
    Weight embed_, lm_head_;
    std::vector<float> final_norm_;
    std::vector<LayerWeights> layers_;  // decoder layers, then loaded MTP layers
    int64_t n_mtp_loaded_ = 0;
    // tensor parallel (absent: the whole model on one device)
    const RankPlan* shard_ = nullptr;  // points into shard_plan_
    std::unique_ptr<ShardPlan> shard_plan_;
    Comm* comm_ = nullptr;
    RankFollowers* followers_ = nullptr;
    Pipe* pipe_ = nullptr;  // pipeline stages (absent: one stage)
    int64_t n_head_local_ = 0;  // attention heads this rank computes
};

}  // namespace megactx
