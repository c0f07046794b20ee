// Sharding plans for one node of G GPUs (issue 6; design.md §6): which attention heads, indexer heads, MLP columns
// and experts each rank holds under tensor / expert parallelism, which layers' KV each rank keeps under LayerSplit,
// the weight bytes per rank, and how many tokens (and 1M-token sequences) of FP8 KV the node then holds.
//
// Conventions (vLLM / SGLang for MLA models):
//   - tensor parallel (TP = G): q_b, kv_b and o_proj split by attention heads; q_a and kv_a (the latents) are
//     replicated; the dense MLP and each expert's FFN split by intermediate columns; the LM head split by
//     vocabulary rows when the vocabulary divides (logits all-gathered), the embedding replicated (a lookup
//     needs no collective);
//   - expert parallel: routed experts split across the ranks (each whole), the shared expert still split by TP;
//   - the indexer replicated, or split by heads (each rank scores its heads; the weighted head sums are added
//     across ranks before top-k);
//   - without LayerSplit every rank keeps the whole latent KV (MLA's one latent row serves all heads, so TP does
//     not divide it: the node holds only what one GPU holds); with LayerSplit rank r keeps the KV of a contiguous
//     group of layers (groups balanced by KV bytes), and the owner serves a layer's selected rows when it runs;
//   - pipeline parallel (PP stages, each of TP GPUs; plan only, the engine runs one stage): the decoder layers split
//     into contiguous stages by count, the extra layers going to the stages before the last (vLLM's split); the
//     embedding on the first stage, the LM head and the MTP layers (with their own embedding) on the last; a rank
//     keeps the weights and KV of its stage's layers only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/range.h"
#include "io/config.h"

namespace megactx {

struct ParallelOptions {
    int64_t n_gpus = 1;            // --tensor-parallel-size
    bool expert_parallel = false;  // --expert-parallel
    bool indexer_split = false;    // split the indexer by heads (else replicated)
    bool layer_split = false;      // LayerSplit KV (within each pipeline stage)
    int64_t pp = 1;                // --pipeline-parallel-size: stages of n_gpus GPUs each
};

struct RankPlan {
    int64_t rank = 0;         // stage · n_gpus + the rank within the stage
    int64_t stage = 0;        // pipeline stage
    Range layers;             // layers (decoder then MTP) whose weights this rank holds
    Range heads;              // attention heads
    Range indexer_heads;      // indexer heads (all when replicated)
    Range dense_ff;           // dense MLP intermediate columns
    Range experts;            // routed experts held (all under TP-within-expert)
    Range expert_ff;          // intermediate columns of each held expert
    Range shared_ff;          // shared-expert intermediate columns (n_shared · moe_intermediate)
    Range vocab;              // LM head rows (the embedding is replicated)
    Range kv_layers;          // layers (decoder then MTP) whose KV this rank keeps
    double weight_bytes = 0;  // this rank's share of the checkpoint (FP8 linears: 1 B, else 2 B)
    double kv_bytes_per_token =
        0;  // FP8 KV this rank keeps per token (656 B latent / layer + 132 B indexer / full layer)
};

struct ShardPlan {
    ParallelOptions options;
    std::vector<RankPlan> ranks;
    double kv_bytes_per_token_total = 0;  // the whole model's FP8 KV per token (every layer, MTP included)
};

// Throws megactx::Error naming the dimension that does not divide by the GPU count.
ShardPlan make_shard_plan(const ModelConfig& c, const ParallelOptions& o);

struct NodeCapacity {
    double gpu_bytes = 0;              // memory per GPU given to weights + KV
    double min_free_bytes = 0;         // the smallest per-rank remainder after weights
    double kv_tokens = 0;              // tokens of KV the node holds (the tightest rank decides)
    int64_t sequences_at_context = 0;  // whole sequences of `context` tokens that fit
    int64_t context = 0;
};

NodeCapacity node_capacity(const ShardPlan& plan, double gpu_bytes, int64_t context);

// Throws megactx::Error when a rank's weights do not fit into `gpu_bytes`, saying by how much and what would fit:
// the smallest power-of-two GPU count up to 1024 whose plan fits (with --expert-parallel where the experts' columns
// do not divide), and the memory per GPU the weights need at this count.
void check_weights_fit(const ModelConfig& c, const ShardPlan& plan, double gpu_bytes);

// The plan as a table (per rank) plus the capacity with and without LayerSplit.
std::string format_shard_plan(const ModelConfig& c, const ShardPlan& plan, double gpu_bytes, int64_t context);

}  // namespace megactx
