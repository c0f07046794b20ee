// The serving engine: continuous batching over one model (design.md §4). Requests join and leave the running
// batch every step; each step the scheduler (policy) picks decode tokens first and then prefill chunks under a
// token budget, the model runs one ragged Batch, and each sequence that finished its chunk samples a token.
// KV lives in 64-token blocks with prefix caching (kv/block_allocator.h). Runs on its own thread (start/stop)
// or step by step (tests).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"
#include "model/glm_dsa.h"
#include "model/graphed_forward.h"

namespace megactx {

struct EngineConfig {
    int64_t n_kv_blocks = 0;     // 0: enough for max_num_seqs sequences of max_model_len (capped by kv_cache_bytes)
    int64_t kv_cache_bytes = 0;  // 0: no byte cap
    // The host tier (kv/kv_tiers.h): its size in bytes (--kv-offload-memory), or its blocks (tests); 0 = none. With a
    // host tier, kv_cache_bytes is the device tier's budget (latent rows of its blocks, every block's indexer keys,
    // the staging rows) and n_kv_blocks, when given, its block count.
    int64_t kv_offload_bytes = 0;
    int64_t n_kv_host_blocks = 0;
    // Query rows whose selections the staging rows hold (kv_tier_blocks); 0: sized by the device budget for
    // max_num_batched_tokens rows.
    int64_t kv_staging_rows = 0;
    int64_t max_model_len = 0;   // 0: the model's max_position_embeddings
    bool prefix_caching = true;
    KvFormat kv_format = KvFormat::F32;  // the backend must support it (CpuOps: F32 only)
    SchedulerConfig scheduler;
    // MTP speculative decoding (model-spec §5): draft tokens per step, 0 = off, at most 7. Draft steps >= 1
    // reuse step 0's top-k when the config says index_share_for_mtp_iteration, unless no_mtp_index_share.
    int64_t speculative_tokens = 0;
    bool no_mtp_index_share = false;
    // > 0: no drafts in a step where more than this many sequences decode next (vLLM's disable_by_batch_size):
    // large batches are compute-bound and verification rows cost what decode rows cost. The MTP layer still runs
    // over the verified rows, so its KV stays complete for when the batch shrinks.
    int64_t speculative_disable_by_batch_size = 0;
    // > 0, benchmarks only (ForcedAcceptance in speculative.h): verification accepts drafts at random so that the
    // mean acceptance length is this many tokens per step, whatever the drafts are; the output is not the model's.
    double forced_acceptance_length = 0.0;
    uint64_t forced_acceptance_seed = 0;
};

struct EngineStats {
    int64_t running = 0, waiting = 0;
    int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
    // The host tier (zero without one): blocks of each tier and those holding KV, and what sparse attention
    // selected — rows (× the layers reading them) found on the device / fetched from the host — and block moves.
    int64_t kv_device_blocks = 0, kv_host_blocks = 0, kv_device_blocks_used = 0, kv_host_blocks_used = 0;
    int64_t kv_selected_device_rows = 0, kv_fetched_rows = 0, kv_fetched_bytes = 0;
    int64_t kv_promotions = 0, kv_demotions = 0;
    int64_t kv_promotions_unread = 0, kv_promotion_limit = 0;  // promoted blocks not read the step after; the limit
    double kv_fetch_stall_s = 0;  // time the compute waited for host-tier rows (Ops::kv_fetch_stall_ns)
    int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;  // prompt tokens looked up / found in the cache
    int64_t steps = 0, preemptions = 0;
    double step_s = 0;  // wall time of the steps (with kv_fetch_stall_s: the share of a step spent waiting)
    // Of step_s: the target forward until its logits or ids are on the host, and the MTP draft steps until their
    // drafts are (speculation's split: a verification's and the drafts' cost against a plain step's).
    double target_s = 0, draft_s = 0;
    int64_t prompt_tokens = 0, generation_tokens = 0;
    // Decode steps replayed from recorded CUDA graphs, and the graphs kept with their reserved memory
    // (GraphedForward; 0 on backends without graphs).
    int64_t graph_replays = 0, graphs = 0, graph_bytes = 0;
    int64_t graph_shapes = 0;  // distinct step shapes met (each recorded on its second step; MEGACTX_GRAPHS=pad too)
    SpecStats spec;  // speculative decoding, over all requests
    bool alive = true;
};

class Engine {
  public:
    Engine(const GlmDsaModel& model, Ops& ops, const EngineConfig& config);
    ~Engine();

    // Queues a request; returns its id. Throws Error (naming the problem) for a request that can never run:
    // empty prompt, token ids out of range, prompt + max_tokens beyond max_model_len or the KV cache.
    int64_t submit(std::vector<int32_t> prompt, const GenerationParams& params, TokenSink sink);
    // Ends a request at the next step (its sink gets a kCancelled event; its blocks are freed).
    void cancel(int64_t id);

    // Runs one step on the calling thread; returns false when there was nothing to do.
    bool step();
    // A background loop calling step(); stop() finishes it (pending requests get kCancelled).
    void start();
    void stop();

    bool alive() const { return alive_.load(); }
    EngineStats stats() const;
    int64_t max_model_len() const { return max_model_len_; }
    int64_t kv_capacity_tokens() const { return kv_.n_blocks() * kBlockSize; }  // both tiers
    // "KV cache: …" — blocks, tokens of each tier and how many max_model_len sequences fit (the startup line).
    std::string kv_capacity_line() const;
    const GlmDsaModel& model() const { return model_; }

  private:
    void finish(Sequence* s, FinishReason r, const std::string& error = "");
    void free_kv(Sequence* s);
    PrefixMatch match_prefix(const Sequence& s, std::vector<int32_t>* blocks, std::vector<uint64_t>* hashes) const;
    // Tokens a cached block's key covers: its own 64, and with speculation the one after it too, since the MTP KV
    // at its last position was computed from that token (model-spec §5.1): a prompt that goes on differently right
    // after the block must not reuse it.
    int64_t block_key_tokens() const { return kBlockSize + (config_.speculative_tokens > 0 ? 1 : 0); }
    void admit(Sequence* s);
    void publish_full_blocks(Sequence* s);
    void drain_inbox();
    void fail_all(const std::string& error);
    void loop();
    bool step_once();
    // Sequence s's tokens decided by one target row (or, verifying drafts, by its rows): appends them, reports
    // each to the sink, and returns the finish reason, if any.
    FinishReason accept_tokens(Sequence* s, const std::vector<int32_t>& toks, const float* rows, int64_t n_rows);
    // A chunk of a step whose rows have logits: a verification's K + 1 rows, or a prompt's or decode's last row.
    struct ScoredChunk {
        Sequence* seq;
        int64_t n_rows;
        bool verify;
    };
    // Where each scored row's token is decided: on the host (1: its logits come back: sampling, penalties, bias,
    // log-probabilities, a verification under a grammar) or by the backend's argmax (0), after the grammar's mask
    // for the next token, which this applies to the row on the backend (Ops::mask_rows).
    std::vector<uint8_t> route_rows(const std::vector<ScoredChunk>& scored, Tensor logits);
    // A forward's scored rows as the host needs them. Rows with need[i] (the row samples, processes its logits,
    // follows a grammar or reports log-probabilities) bring their logits to the host, only those rows: row i at
    // lg->data() + (*at)[i] * vocab, (*at)[i] = -1 for the others. When some row needs no logits, every row's
    // argmax is taken on the backend into *ids, so a batch with a few constrained or sampled requests moves
    // their rows and ids, not a vocabulary of floats for every row (GLM-5.2: 154,880 logits a row); when every
    // row needs its logits, *ids stays empty.
    void fetch_scored(const Tensor& logits, const std::vector<uint8_t>& need, std::vector<float>* lg,
                      std::vector<int64_t>* at, std::vector<int32_t>* ids);
    // A row's logits after the request's penalties and logit bias, with `output_extra` (drafts) appended to its
    // output; and the distribution Sampler::probs makes of them.
    std::vector<float> penalized(const Sequence& s, const float* row, const std::vector<int32_t>& output_extra) const;
    std::vector<float> target_probs(const Sequence& s, const float* row,
                                    const std::vector<int32_t>& output_extra) const;
    // MTP: step 0 over the rows just computed (target hidden states), then steps 1..k-1; leaves each decoding
    // sequence's next drafts in s->drafts.
    struct DraftRows {
        Sequence* seq;
        int64_t first_row, n_rows;  // its rows of the target batch whose KV is valid
        int64_t n_verified = 0;     // a verification: its rows in the target batch (the rejected ones too); else 0
    };
    // The sequences that get drafts this step, in step 0's order: how many each, its last valid row in step 0,
    // and whether draft steps reuse step 0's top-k (index_share_for_mtp_iteration).
    struct Drafting {
        std::vector<Sequence*> seqs;
        std::vector<int64_t> n_draft;
        std::vector<int32_t> last_rows;
        bool share = true;
    };
    void draft(const Batch& batch, const ForwardResult& out, const std::vector<DraftRows>& valid);
    std::vector<int64_t> draft_counts(const std::vector<DraftRows>& valid);
    void draft_chain(const Batch& b0, const Tensor& h0, const Drafting& d);
    void draft_steps(const ForwardResult& m, const Drafting& d);
    void update_snapshot();

    const GlmDsaModel& model_;
    Ops& ops_;
    EngineConfig config_;
    int64_t max_model_len_ = 0;
    KvTierBlocks tier_blocks_;
    KvCache kv_;
    std::unique_ptr<ForcedAcceptance> forced_;  // config.forced_acceptance_length > 0
    GraphedForward graphs_;  // all-decode steps of <= 32 sequences replay recorded graphs on the GPU
    int64_t stall_ns0_ = 0;  // Ops::kv_fetch_stall_ns when the engine was made

    // Engine-thread state
    std::map<int64_t, std::unique_ptr<Sequence>> seqs_;
    std::vector<Sequence*> running_;
    std::deque<Sequence*> waiting_;
    int64_t next_arrival_ = 0;
    EngineStats counters_;

    // Shared with submitters
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::unique_ptr<Sequence>> inbox_;
    std::vector<int64_t> cancels_;
    int64_t next_id_ = 1;
    EngineStats snapshot_;
    std::atomic<bool> alive_{true};
    std::atomic<bool> stopping_{false};
    std::thread thread_;
};

}  // namespace megactx
