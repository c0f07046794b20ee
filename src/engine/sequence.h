// One request's state inside the engine: its tokens (prompt then generated), how many have KV written, its
// block table, its sampler and where its tokens go.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"

namespace megactx {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);

struct GenerationParams {
    SamplingParams sampling;
    int64_t max_tokens = 16;  // generated tokens at most
    std::vector<int32_t> stop_token_ids;
    bool ignore_eos = false;
    int64_t top_logprobs = -1;  // -1: no logprobs; n >= 0: logprob of each token plus the n best
    std::shared_ptr<const OutputConstraint> constraint;  // structured outputs: the grammar the output follows
};

// Speculative decoding's counts for one request (or, summed, for the engine).
struct SpecStats {
    int64_t verifications = 0;           // target forwards that verified drafts
    int64_t drafted = 0, accepted = 0;   // draft tokens proposed / accepted
    std::vector<int64_t> drafted_at;     // [i]: drafts proposed at draft position i (0 = the first draft)
    std::vector<int64_t> accepted_at;    // [i]: drafts accepted at draft position i
    std::vector<int64_t> accept_length;  // [a]: verifications that accepted a drafts (a + 1 tokens)
    // Tokens per verification: accepted drafts plus the target's own token.
    double mean_acceptance_length() const {
        return verifications ? 1.0 + static_cast<double>(accepted) / static_cast<double>(verifications) : 0.0;
    }
    void add(const SpecStats& o);
    void record(int64_t n_drafts, int64_t n_accepted);
    // "MTP drafts accepted A of D, mean acceptance length L tokens per step, by draft position p0% p1% …" (the
    // line run, generate and eval niah print).
    std::string summary() const;
};

// What the engine reports per generated token (on the engine thread).
struct TokenEvent {
    int64_t request_id = 0;
    int32_t token = -1;  // -1 when the event only reports a finish (cancel, error)
    TokenLogprobs logprobs;
    bool has_logprobs = false;
    FinishReason finish = FinishReason::kNone;
    std::string error;
    int64_t n_prompt = 0;         // prompt tokens
    int64_t n_cached_prompt = 0;  // prompt tokens served from the prefix cache
    int64_t n_generated = 0;
    SpecStats spec;  // the request's speculative-decoding counts so far (empty without speculation)
};

// Returns false to end the request now (a stop string matched: finish kStop; or the client went away).
using TokenSink = std::function<bool(const TokenEvent&)>;

struct Sequence {
    int64_t id = 0;
    std::vector<int32_t> tokens;  // prompt then generated
    int64_t n_prompt = 0;
    int64_t n_computed = 0;              // tokens whose KV is written
    int64_t n_cached_prompt = 0;         // from the prefix cache at the last admission
    SeqKv kv;                            // block table; kv.n_tokens mirrors n_computed
    std::vector<uint64_t> block_hashes;  // chained hashes of the full blocks published so far
    GenerationParams params;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<ConstraintState> constraint;  // params.constraint's progress (none: free text)
    TokenSink sink;
    int64_t arrival = 0;  // admission order, for preemption (newest first)
    bool cancelled = false;
    // Speculative decoding: the MTP drafts that the next step verifies after the last token, and (sampling) the
    // draft distribution each was drawn from.
    std::vector<int32_t> drafts;
    std::vector<std::vector<float>> draft_q;
    SpecStats spec;
    std::chrono::steady_clock::time_point t_arrival;

    int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
    int64_t n_remaining() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
};

}  // namespace megactx
