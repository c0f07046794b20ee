// Single-sequence model runner for the CLI (`logits`, `generate`) and the model tests: owns a KV cache
// sized for the sequence and feeds tokens through the model in chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/glm_dsa.h"
#include "model/graphed_forward.h"

namespace megactx {

class SequenceRunner {
  public:
    // Capacity: the KV cache holds max_tokens tokens, stored in `kv_format`. With host_bytes > 0 the cache has a
    // host tier of that size (--kv-offload-memory) and a device tier of device_bytes (--kv-cache-memory; default
    // 2 GiB) or of the blocks the sequence needs, if fewer; device_bytes alone caps the one tier. Error when the
    // sequence does not fit.
    SequenceRunner(const GlmDsaModel& model, Ops& ops, int64_t max_tokens, KvFormat kv_format = KvFormat::F32,
                   int64_t device_bytes = 0, int64_t host_bytes = 0);

    // Feeds `tokens` after what is already cached, `chunk` tokens per forward (0 = one pass). Returns
    // the logits of every fed token [n, vocab] when all_logits, else only of the last one [1, vocab].
    std::vector<float> feed(const std::vector<int32_t>& tokens, int64_t chunk, bool all_logits);
    int64_t n_cached() const { return seq_.n_tokens; }
    KvCache& kv() { return kv_; }
    const ForwardResult& last_result() const { return last_; }
    const GraphedForward& graphs() const { return graphs_; }

    // Prompt → prompt + up to max_new tokens (stops after an EOS id of the config when stop_at_eos).
    std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new, const SamplingParams& sp,
                                  bool stop_at_eos);

  private:
    SequenceRunner(const GlmDsaModel& model, Ops& ops, KvFormat kv_format, KvTierBlocks blocks);

    const GlmDsaModel& model_;
    Ops& ops_;
    KvCache kv_;
    GraphedForward graphs_;  // one-token steps (generate) replay recorded graphs on the GPU
    SeqKv seq_;
    ForwardResult last_;
};

// Checks ids against the vocabulary and the length against max_position_embeddings, naming the problem.
void validate_tokens(const ModelConfig& c, const std::vector<int32_t>& tokens, int64_t extra = 0);

}  // namespace megactx
