#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/speculative.h"

namespace megactx {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::kNone:
            return "none";
        case FinishReason::kStop:
            return "stop";
        case FinishReason::kLength:
            return "length";
        case FinishReason::kCancelled:
            return "cancelled";
        case FinishReason::kError:
            return "error";
    }
    return "?";
}

namespace {

// A request whose next token is the argmax of its logits after its grammar's mask, if any: greedy, no penalties,
// no logit bias.
bool plain_greedy(const Sequence& s) {
    const SamplingParams& sp = s.params.sampling;
    return s.sampler->greedy() && sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f &&
           sp.repetition_penalty == 1.0f && sp.logit_bias.empty();
}

// A request whose next token is the argmax of the raw logits: greedy, no penalties, no logit bias, no grammar.
bool raw_greedy(const Sequence& s) { return plain_greedy(s) && !s.constraint; }

int64_t resolve_max_model_len(const ModelConfig& c, const EngineConfig& e) {
    const int64_t len = e.max_model_len > 0 ? e.max_model_len : c.max_position_embeddings;
    MEGACTX_CHECK(len <= c.max_position_embeddings,
                  "--max-model-len {} exceeds the model's max_position_embeddings ({})", len,
                  c.max_position_embeddings);
    return len;
}

// Blocks of the device tier (all blocks without a host tier) and of the host tier.
KvTierBlocks resolve_blocks(const ModelConfig& c, const EngineConfig& e, int64_t kv_bytes_per_token) {
    KvTierBlocks t;
    MEGACTX_CHECK(e.kv_offload_bytes >= 0 && e.n_kv_host_blocks >= 0, "--kv-offload-memory must not be negative");
    const int64_t bytes = e.kv_cache_bytes > 0 ? e.kv_cache_bytes : (int64_t{2} << 30);  // CPU default: 2 GiB
    if (e.n_kv_host_blocks > 0 || e.kv_offload_bytes > 0) {
        t = kv_tier_blocks(c, e.kv_format, {}, bytes, e.kv_offload_bytes, e.kv_staging_rows,
                           e.scheduler.max_num_batched_tokens);
        if (e.n_kv_host_blocks > 0) t.host = e.n_kv_host_blocks;
    }
    if (e.n_kv_blocks > 0) {
        t.device = e.n_kv_blocks;
        return t;
    }
    const int64_t max_len = resolve_max_model_len(c, e);
    const int64_t want = e.scheduler.max_num_seqs * ((max_len + kBlockSize - 1) / kBlockSize);
    if (t.host > 0) {
        t.device = std::min(want, t.device);
        return t;
    }
    const int64_t per_block = kv_bytes_per_token * kBlockSize;  // the fullest rank's layers (LayerSplit)
    const int64_t fit = bytes / per_block;
    MEGACTX_CHECK(fit >= 1, "KV cache budget of {} bytes holds no 64-token block ({} bytes per block)", bytes,
                  per_block);
    t.device = std::min(want, fit);
    return t;
}

}  // namespace

Engine::Engine(const GlmDsaModel& model, Ops& ops, const EngineConfig& config)
    : model_(model),
      ops_(ops),
      config_(config),
      max_model_len_(resolve_max_model_len(model.config(), config)),
      tier_blocks_(resolve_blocks(model.config(), config, model.kv_bytes_per_token_max(config.kv_format))),
      kv_(ops, model.config(), tier_blocks_.device, config.kv_format, model.kv_layers(),
          KvTierOptions{tier_blocks_.host, tier_blocks_.rows_per_pass}),
      graphs_(model, ops, kv_),
      stall_ns0_(ops.kv_fetch_stall_ns()) {
    MEGACTX_CHECK(config.scheduler.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
    MEGACTX_CHECK(config.scheduler.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be at least 1");
    MEGACTX_CHECK(config.speculative_tokens >= 0 && config.speculative_tokens <= 7,
                  "--speculative-tokens must be in [0, 7], got {}", config.speculative_tokens);
    MEGACTX_CHECK(config.speculative_disable_by_batch_size >= 0,
                  "--speculative-disable-by-batch-size must be >= 0 (0 = never), got {}",
                  config.speculative_disable_by_batch_size);
    if (config.speculative_tokens > 0) {
        MEGACTX_CHECK(model.has_mtp(), "--speculative-tokens {}: the checkpoint has no MTP layer (model.layers.{}.*)",
                      config.speculative_tokens, model.config().n_layers);
    }
    if (config.forced_acceptance_length > 0.0)
        forced_ = std::make_unique<ForcedAcceptance>(config.forced_acceptance_length, config.speculative_tokens,
                                                     config.forced_acceptance_seed);
    snapshot_.kv_blocks_total = kv_.n_blocks();
    model_.prepare_kv(kv_);  // tensor parallel: the other ranks' pools, now
}

Engine::~Engine() { stop(); }

int64_t Engine::submit(std::vector<int32_t> prompt, const GenerationParams& params, TokenSink sink) {
    const ModelConfig& c = model_.config();
    MEGACTX_CHECK(!prompt.empty(), "the prompt is empty");
    for (size_t i = 0; i < prompt.size(); ++i) {
        MEGACTX_CHECK(prompt[i] >= 0 && prompt[i] < c.vocab_size,
                      "prompt token id {} at index {} is out of range (vocabulary size {})", prompt[i], i,
                      c.vocab_size);
    }
    params.sampling.validate();
    for (const auto& [token, bias] : params.sampling.logit_bias) {
        MEGACTX_CHECK(token < c.vocab_size, "logit_bias: token id {} is out of range (vocabulary size {})", token,
                      c.vocab_size);
    }
    for (int32_t t : params.stop_token_ids) {
        MEGACTX_CHECK(t >= 0 && t < c.vocab_size, "stop_token_ids: {} is out of range (vocabulary size {})", t,
                      c.vocab_size);
    }
    MEGACTX_CHECK(params.max_tokens >= 1, "max_tokens must be at least 1, got {}", params.max_tokens);
    if (params.constraint) {
        MEGACTX_CHECK(params.constraint->grammar && params.constraint->vocab, "the output constraint has no grammar");
        MEGACTX_CHECK(!params.ignore_eos, "ignore_eos cannot be combined with a structured output: the grammar decides "
                                          "where the output ends");
        MEGACTX_CHECK(static_cast<int64_t>(params.constraint->vocab->n_tokens()) <= c.vocab_size,
                      "the output constraint's vocabulary ({} tokens) is larger than the model's ({})",
                      params.constraint->vocab->n_tokens(), c.vocab_size);
    }
    const int64_t total = static_cast<int64_t>(prompt.size()) + params.max_tokens;
    MEGACTX_CHECK(total <= max_model_len_,
                  "the prompt ({} tokens) plus max_tokens ({}) is {} tokens, beyond the maximum context length of {}",
                  prompt.size(), params.max_tokens, total, max_model_len_);
    MEGACTX_CHECK(total <= kv_capacity_tokens(),
                  "the prompt ({} tokens) plus max_tokens ({}) does not fit in the KV cache ({} tokens{})", prompt.size(),
                  params.max_tokens, kv_capacity_tokens(),
                  kv_.tiered() ? fmt::format(": {} on the device and {} in the host tier; raise --kv-cache-memory or "
                                             "--kv-offload-memory",
                                             kv_.tiers().n_device() * kBlockSize, kv_.tiers().n_host() * kBlockSize)
                               : std::string());
    MEGACTX_CHECK(alive_.load(), "the engine is not running");

    auto s = std::make_unique<Sequence>();
    s->n_prompt = static_cast<int64_t>(prompt.size());
    s->tokens = std::move(prompt);
    s->params = params;
    s->sampler = std::make_unique<Sampler>(params.sampling);
    if (params.constraint) s->constraint = std::make_unique<ConstraintState>(params.constraint);
    s->sink = std::move(sink);
    s->t_arrival = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    s->id = next_id_++;
    const int64_t id = s->id;
    inbox_.push_back(std::move(s));
    cv_.notify_one();
    return id;
}

void Engine::cancel(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    cv_.notify_one();
}

void Engine::drain_inbox() {
    std::vector<std::unique_ptr<Sequence>> inbox;
    std::vector<int64_t> cancels;
    {
        std::lock_guard<std::mutex> lock(mu_);
        inbox.swap(inbox_);
        cancels.swap(cancels_);
    }
    for (auto& s : inbox) {
        waiting_.push_back(s.get());
        seqs_[s->id] = std::move(s);
    }
    for (int64_t id : cancels) {
        const auto it = seqs_.find(id);
        if (it != seqs_.end()) finish(it->second.get(), FinishReason::kCancelled);
    }
}

void Engine::free_kv(Sequence* s) {
    s->drafts.clear();
    s->draft_q.clear();
    s->kv.free(kv_.blocks());
    s->block_hashes.clear();
    s->n_computed = 0;
}

void Engine::finish(Sequence* s, FinishReason r, const std::string& error) {
    TokenEvent ev;
    ev.request_id = s->id;
    ev.finish = r;
    ev.error = error;
    ev.n_prompt = s->n_prompt;
    ev.n_cached_prompt = s->n_cached_prompt;
    ev.n_generated = s->n_generated();
    ev.spec = s->spec;
    if (s->sink) s->sink(ev);
    free_kv(s);
    running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
    seqs_.erase(s->id);
}

PrefixMatch Engine::match_prefix(const Sequence& s, std::vector<int32_t>* blocks, std::vector<uint64_t>* hashes) const {
    PrefixMatch m;
    if (!config_.prefix_caching) return m;
    // At least one token must be computed to produce logits.
    const int64_t max_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / kBlockSize;
    uint64_t parent = 0;
    auto& alloc = const_cast<KvCache&>(kv_).blocks();
    for (int64_t i = 0; i < max_blocks; ++i) {
        const uint64_t h = block_hash(parent, s.tokens.data() + i * kBlockSize, block_key_tokens());
        const auto b = alloc.lookup(h);
        if (!b) break;
        ++m.n_blocks;
        m.n_shared += alloc.refcount(*b) > 0;
        if (blocks) blocks->push_back(*b);
        if (hashes) hashes->push_back(h);
        parent = h;
    }
    return m;
}

void Engine::admit(Sequence* s) {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;
    const PrefixMatch m = match_prefix(*s, &blocks, &hashes);
    for (int32_t b : blocks) kv_.blocks().retain(b);
    s->kv.blocks = std::move(blocks);
    s->block_hashes = std::move(hashes);
    s->n_computed = m.n_blocks * kBlockSize;
    s->kv.n_tokens = s->n_computed;
    const bool first_admission = s->n_generated() == 0;
    if (first_admission) {
        s->n_cached_prompt = std::min(s->n_computed, s->n_prompt);
        counters_.prefix_query_tokens += s->n_prompt;
        counters_.prefix_hit_tokens += s->n_cached_prompt;
        counters_.prompt_tokens += s->n_prompt;
    }
    s->arrival = next_arrival_++;
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
    running_.push_back(s);
}

void Engine::publish_full_blocks(Sequence* s) {
    if (!config_.prefix_caching) return;
    const int64_t n_full = s->n_computed / kBlockSize;
    while (static_cast<int64_t>(s->block_hashes.size()) < n_full) {
        const size_t i = s->block_hashes.size();
        const uint64_t parent = i == 0 ? 0 : s->block_hashes[i - 1];
        MEGACTX_CHECK(static_cast<int64_t>(s->tokens.size()) >= static_cast<int64_t>(i) * kBlockSize + block_key_tokens(),
                      "publish_full_blocks: block {} of request {} has no next token yet", i, s->id);
        const uint64_t h = block_hash(parent, s->tokens.data() + i * kBlockSize, block_key_tokens());
        kv_.blocks().publish(s->kv.blocks[i], h);
        s->block_hashes.push_back(h);
    }
}

void Engine::update_snapshot() {
    EngineStats snap = counters_;
    snap.running = static_cast<int64_t>(running_.size());
    snap.waiting = static_cast<int64_t>(waiting_.size());
    snap.kv_blocks_total = kv_.n_blocks();
    snap.kv_blocks_used = kv_.blocks().n_used();
    snap.kv_blocks_cached = kv_.blocks().n_cached();
    if (kv_.tiered()) {
        const KvTiers& t = kv_.tiers();
        snap.kv_device_blocks = t.n_device();
        snap.kv_host_blocks = t.n_host();
        snap.kv_device_blocks_used = t.device_used();
        snap.kv_host_blocks_used = t.host_used();
        snap.kv_selected_device_rows = t.stats().device_rows;
        snap.kv_fetched_rows = t.stats().host_rows;
        snap.kv_fetched_bytes = t.stats().host_rows * kv_.latent_row_bytes();
        snap.kv_promotions = t.stats().promotions;
        snap.kv_demotions = t.stats().demotions;
        snap.kv_promotions_unread = t.stats().promotions_unread;
        snap.kv_promotion_limit = t.promotion_limit();
        snap.kv_fetch_stall_s = static_cast<double>(ops_.kv_fetch_stall_ns() - stall_ns0_) * 1e-9;
    }
    snap.graph_replays = graphs_.stats().replayed;
    snap.graphs = graphs_.stats().graphs;
    snap.graph_shapes = graphs_.stats().shapes;
    snap.graph_bytes = graphs_.stats().bytes;
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_ = snap;
}

std::string Engine::kv_capacity_line() const {
    const int64_t max_seqs = kv_capacity_tokens() / std::max<int64_t>(1, max_model_len_);
    const std::string fit = fmt::format("{} sequence{} of max_model_len {} fit", max_seqs, max_seqs == 1 ? "" : "s",
                                        max_model_len_);
    if (!kv_.tiered())
        return fmt::format("KV cache: {} blocks of 64 tokens = {} tokens; {}", kv_.n_blocks(), kv_capacity_tokens(),
                           fit);
    const KvTiers& t = kv_.tiers();
    return fmt::format("KV cache: {} device blocks = {} tokens + {} host blocks = {} tokens (latent rows offloaded) "
                       "= {} tokens; {}; staging rows for {} query rows a pass",
                       t.n_device(), t.n_device() * kBlockSize, t.n_host(), t.n_host() * kBlockSize,
                       kv_capacity_tokens(), fit, kv_.rows_per_pass());
}

bool Engine::step() {
    const auto start = std::chrono::steady_clock::now();
    const bool worked = step_once();
    counters_.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    update_snapshot();
    return worked;
}

bool Engine::step_once() {
    drain_inbox();
    if (running_.empty() && waiting_.empty()) return false;
    kv_.end_step();  // (host tier) the last step's selections promote hot host blocks, before this step allocates
    // Test hook (docs/testing.md): MEGACTX_FAULT_STEP=N makes step N fail as a backend fault would, so the
    // tests can check that the server reports a dead engine instead of hanging.
    static const int64_t fault_step = [] {
        const char* v = std::getenv("MEGACTX_FAULT_STEP");
        return v ? std::atoll(v) : int64_t{-1};
    }();
    if (counters_.steps == fault_step)
        MEGACTX_FAIL("fault injected at engine step {} (MEGACTX_FAULT_STEP)", fault_step);
    const SchedulePlan plan = schedule(config_.scheduler, running_, waiting_, kv_.blocks(),
                                       [&](const Sequence& s) { return match_prefix(s, nullptr, nullptr); });

    // Preempted sequences drop their KV and go back to the front of the queue, oldest first; they are
    // recomputed (through the prefix cache where their blocks survive) when admitted again.
    for (auto it = plan.preempted.rbegin(); it != plan.preempted.rend(); ++it) {
        Sequence* s = *it;
        free_kv(s);
        running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
        waiting_.push_front(s);
        ++counters_.preemptions;
    }
    std::sort(waiting_.begin(), waiting_.begin() + static_cast<long>(plan.preempted.size()),
              [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
    for (Sequence* s : plan.admitted) admit(s);  // matched blocks are retained before anything is allocated
    if (plan.chunks.empty()) return !plan.preempted.empty();

    Batch batch;
    batch.want_hidden = config_.speculative_tokens > 0;  // the drafter reads the target's hidden rows
    // Each chunk's rows: a prefill chunk computes logits for its last token only when it ends the prompt; a
    // decode computes them for the last token and for each draft it verifies.
    std::vector<std::vector<int32_t>> feeds(plan.chunks.size());
    std::vector<int64_t> first_row(plan.chunks.size());
    std::vector<ScoredChunk> scored;  // the chunks whose rows have logits, in row order
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
        const ScheduledChunk& ch = plan.chunks[c];
        Sequence* s = ch.seq;
        first_row[c] = batch.n_tokens();
        s->kv.reserve(kv_.blocks(), s->n_computed + ch.n_tokens);
        const bool decode = s->n_remaining() == 1;
        if (decode && ch.n_tokens > 1) {
            feeds[c].push_back(s->tokens.back());
            feeds[c].insert(feeds[c].end(), s->drafts.begin(), s->drafts.begin() + (ch.n_tokens - 1));
            batch.add_sequence(&s->kv.blocks, feeds[c].data(), ch.n_tokens, s->n_computed, true);
            scored.push_back({s, ch.n_tokens, true});
            continue;
        }
        const bool last = s->n_computed + ch.n_tokens == static_cast<int64_t>(s->tokens.size());
        if (last) scored.push_back({s, 1, false});
        batch.add_sequence(&s->kv.blocks, s->tokens.data() + s->n_computed, ch.n_tokens, s->n_computed, false);
        batch.want_logits.back() = last;
    }
    const auto t_forward = std::chrono::steady_clock::now();
    const ForwardResult out = graphs_.forward(batch);
    // Grammar masks for the next tokens while the device computes the logits (they depend only on the tokens
    // accepted so far).
    for (const ScheduledChunk& ch : plan.chunks)
        if (ch.seq->constraint) ch.seq->constraint->prepare();
    const int64_t vocab = model_.config().vocab_size;
    // The logits come back only for the rows whose token needs them (sampling, penalties or bias, a grammar,
    // log-probabilities); the device takes the other rows' argmaxes and only their ids come back. A greedy row
    // then moves 4 bytes instead of a vocabulary of floats and the host scans nothing (GLM-5.2: 154,880 logits
    // a row, (K + 1) rows a verifying request), also beside constrained or sampled rows in the same batch. With
    // its logits on the host, a greedy row's argmax is taken there.
    std::vector<int32_t> ids;
    std::vector<float> logits;
    std::vector<int64_t> at;
    fetch_scored(out.logits, route_rows(scored, out.logits), &logits, &at, &ids);
    const auto t_forwarded = std::chrono::steady_clock::now();
    counters_.target_s += std::chrono::duration<double>(t_forwarded - t_forward).count();

    std::vector<std::pair<Sequence*, FinishReason>> done;
    // For the drafter: the batch rows whose KV is now valid, per sequence (a prefix of its chunk).
    std::vector<DraftRows> valid_rows;
    int64_t row = 0;
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
        const ScheduledChunk& ch = plan.chunks[c];
        Sequence* s = ch.seq;
        const bool verify = !feeds[c].empty();
        if (!verify && s->n_computed + ch.n_tokens != static_cast<int64_t>(s->tokens.size())) {
            // A prefill chunk that does not end the prompt.
            s->n_computed += ch.n_tokens;
            s->kv.n_tokens = s->n_computed;
            publish_full_blocks(s);
            valid_rows.push_back({s, first_row[c], ch.n_tokens});
            continue;
        }
        const int64_t n_rows = verify ? ch.n_tokens : 1;
        // A sequence's rows are all on the host or none, and consecutive there.
        const int64_t h = at[static_cast<size_t>(row)];
        const float* rows = h >= 0 ? logits.data() + h * vocab : nullptr;
        // The token is the row's argmax: of the raw logits, or of the logits its grammar's mask left on the device.
        const bool by_argmax = rows == nullptr || raw_greedy(*s);
        std::vector<int32_t> host_best;
        if (by_argmax && rows)
            for (int64_t i = 0; i < n_rows; ++i) host_best.push_back(argmax(rows + i * vocab, vocab));
        const int32_t* best = rows ? host_best.data() : ids.data() + row;  // the rows' argmaxes
        row += n_rows;
        std::vector<int32_t> toks;
        if (verify) {
            const std::vector<int32_t> drafts(feeds[c].begin() + 1, feeds[c].end());
            Verified v;
            if (forced_) {
                // Benchmarks: a set share of the drafts accepted, then the target's token at the row after them.
                v.n_accepted = forced_->draw(static_cast<int64_t>(drafts.size()));
                v.tokens.assign(drafts.begin(), drafts.begin() + v.n_accepted);
                const int64_t r = v.n_accepted;
                if (by_argmax) {
                    v.tokens.push_back(best[r]);
                } else {
                    const std::vector<int32_t> extra(drafts.begin(), drafts.begin() + r);
                    std::vector<float> l = penalized(*s, rows + r * vocab, extra);
                    v.tokens.push_back(s->sampler->sample(l.data(), vocab));
                }
            } else if (by_argmax) {
                v = verify_greedy(drafts, best);
            } else {
                std::vector<std::vector<float>> p, q;
                std::vector<int32_t> extra;
                for (int64_t i = 0; i < n_rows; ++i) {
                    p.push_back(target_probs(*s, rows + i * vocab, extra));
                    if (i + 1 < n_rows) {
                        extra.push_back(drafts[static_cast<size_t>(i)]);
                        q.push_back(s->sampler->greedy() ? std::vector<float>{} : s->draft_q[static_cast<size_t>(i)]);
                    }
                }
                v = verify_drafts(*s->sampler, drafts, q, p);
            }
            s->spec.record(static_cast<int64_t>(drafts.size()), v.n_accepted);
            counters_.spec.record(static_cast<int64_t>(drafts.size()), v.n_accepted);
            toks = v.tokens;
        } else if (by_argmax) {
            toks.push_back(best[0]);
        } else {
            std::vector<float> l = penalized(*s, rows, {});
            toks.push_back(s->sampler->sample(l.data(), vocab));
        }
        s->drafts.clear();
        s->draft_q.clear();
        // The target KV is valid for the fed token and the accepted drafts.
        const int64_t valid = verify ? static_cast<int64_t>(toks.size()) : ch.n_tokens;
        s->n_computed += valid;
        s->kv.n_tokens = s->n_computed;
        const FinishReason r = accept_tokens(s, toks, rows, n_rows);
        if (r != FinishReason::kNone) {
            done.push_back({s, r});
            continue;
        }
        publish_full_blocks(s);
        valid_rows.push_back({s, first_row[c], valid, verify ? ch.n_tokens : 0});
    }
    if (config_.speculative_tokens > 0) {
        const auto t_draft = std::chrono::steady_clock::now();
        draft(batch, out, valid_rows);
        counters_.draft_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_draft).count();
    }
    for (auto& [s, r] : done)
        finish(s, r, r == FinishReason::kError && s->constraint ? s->constraint->error() : std::string());
    ++counters_.steps;
    return true;
}

std::vector<uint8_t> Engine::route_rows(const std::vector<ScoredChunk>& scored, Tensor logits) {
    std::vector<uint8_t> need;
    std::vector<int32_t> masked;  // rows whose grammar mask is applied on the device, and the masks' words
    std::vector<const grammar::TokenMask*> masks;
    size_t words = 0;
    int64_t row = 0;
    for (const ScoredChunk& sc : scored) {
        const Sequence& s = *sc.seq;
        bool device = plain_greedy(s) && s.params.top_logprobs < 0;
        if (device && s.constraint) {
            // A verification's rows follow drafts, whose masks the host computes; before its start token
            // (thinking) a one-row decode is free.
            const grammar::TokenMask* m = sc.verify ? nullptr : s.constraint->ready_mask();
            device = !sc.verify && (m != nullptr || !s.constraint->active());
            if (device && m != nullptr) {
                masked.push_back(static_cast<int32_t>(row));
                masks.push_back(m);
                words = std::max(words, m->words.size());
            }
        }
        need.insert(need.end(), static_cast<size_t>(sc.n_rows), !device);
        row += sc.n_rows;
    }
    if (!masked.empty()) {
        static_assert(std::endian::native == std::endian::little, "a mask's 64-bit words read as pairs of 32");
        std::vector<uint64_t> bits(masked.size() * words, 0);
        for (size_t j = 0; j < masks.size(); ++j)
            std::copy(masks[j]->words.begin(), masks[j]->words.end(), bits.begin() + static_cast<long>(j * words));
        Tensor t = ops_.alloc(DType::I32, {static_cast<int64_t>(masked.size()), static_cast<int64_t>(2 * words)});
        ops_.upload(bits.data(), t);
        ops_.mask_rows(logits, ops_.upload_i32(masked), t);
    }
    return need;
}

void Engine::fetch_scored(const Tensor& logits, const std::vector<uint8_t>& need, std::vector<float>* lg,
                          std::vector<int64_t>* at, std::vector<int32_t>* ids) {
    const int64_t vocab = model_.config().vocab_size;
    const int64_t n = logits.numel() / std::max<int64_t>(vocab, 1);
    MEGACTX_CHECK(static_cast<int64_t>(need.size()) == n, "{} scored rows, {} logit rows", need.size(), n);
    lg->clear();
    ids->clear();
    at->assign(static_cast<size_t>(n), -1);
    if (n == 0) return;
    std::vector<int32_t> host_rows;
    for (int64_t i = 0; i < n; ++i)
        if (need[static_cast<size_t>(i)]) {
            (*at)[static_cast<size_t>(i)] = static_cast<int64_t>(host_rows.size());
            host_rows.push_back(static_cast<int32_t>(i));
        }
    const auto m = static_cast<int64_t>(host_rows.size());
    if (m < n) {
        Tensor t = ops_.alloc(DType::I32, {n});
        ops_.argmax_rows(logits, t);
        ids->resize(static_cast<size_t>(n));
        ops_.download(t, ids->data());
    }
    if (m == 0) return;
    lg->resize(static_cast<size_t>(m * vocab));
    if (m == n) {
        ops_.download(logits, lg->data());
        return;
    }
    Tensor picked = ops_.alloc(DType::F32, {m, vocab});  // the rows that need their logits, gathered on the device
    ops_.gather_rows(logits, ops_.upload_i32(host_rows), picked);
    ops_.download(picked, lg->data());
}

std::vector<float> Engine::penalized(const Sequence& s, const float* row, const std::vector<int32_t>& extra) const {
    const int64_t vocab = model_.config().vocab_size;
    std::vector<float> l(row, row + vocab);
    const SamplingParams& sp = s.params.sampling;
    // The history is copied only for the penalties that read it (a 1M-token prompt per row otherwise).
    const bool history = sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f;
    std::vector<int32_t> prompt, output;
    if (history) {
        prompt.assign(s.tokens.begin(), s.tokens.begin() + s.n_prompt);
        output.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
        output.insert(output.end(), extra.begin(), extra.end());
    }
    apply_penalties(sp, prompt, output, l.data(), vocab);
    if (s.constraint) s.constraint->mask(l.data(), vocab, extra);  // the grammar's refusals at -inf, after the bias
    return l;
}

std::vector<float> Engine::target_probs(const Sequence& s, const float* row, const std::vector<int32_t>& extra) const {
    const std::vector<float> l = penalized(s, row, extra);
    return s.sampler->probs(l.data(), model_.config().vocab_size);
}

FinishReason Engine::accept_tokens(Sequence* s, const std::vector<int32_t>& toks, const float* rows, int64_t n_rows) {
    const int64_t vocab = model_.config().vocab_size;
    const auto& eos = model_.config().eos_token_ids;
    for (size_t i = 0; i < toks.size(); ++i) {
        const int32_t tok = toks[i];
        if (s->constraint && !s->constraint->accept(tok)) return FinishReason::kError;  // (its message: finish)
        s->tokens.push_back(tok);
        ++counters_.generation_tokens;
        TokenEvent ev;
        ev.request_id = s->id;
        ev.token = tok;
        ev.n_prompt = s->n_prompt;
        ev.n_cached_prompt = s->n_cached_prompt;
        ev.n_generated = s->n_generated();
        ev.spec = s->spec;
        if (s->params.top_logprobs >= 0) {
            // Row i scored this token (a verify's row i follows the accepted drafts before it).
            const float* raw = rows + std::min<int64_t>(static_cast<int64_t>(i), n_rows - 1) * vocab;
            ev.logprobs = token_logprobs(raw, vocab, tok, s->params.top_logprobs);
            ev.has_logprobs = true;
        }
        const bool keep = s->sink ? s->sink(ev) : true;
        const bool is_stop = (!s->params.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) ||
                             std::find(s->params.stop_token_ids.begin(), s->params.stop_token_ids.end(), tok) !=
                                 s->params.stop_token_ids.end();
        if (!keep || is_stop) return FinishReason::kStop;
        if (s->n_generated() >= s->params.max_tokens || static_cast<int64_t>(s->tokens.size()) >= max_model_len_)
            return FinishReason::kLength;
    }
    return FinishReason::kNone;
}

// Drafts per sequence of the step's valid rows: K for a sequence that decodes next, fewer near max_tokens or the
// model's length, 0 when drafting is off for the step or its KV does not fit (then the sequence's blocks are
// reserved up to the last draft's position).
std::vector<int64_t> Engine::draft_counts(const std::vector<DraftRows>& valid) {
    int64_t n_decoding = 0;
    for (const DraftRows& v : valid) n_decoding += v.seq->n_remaining() == 1;
    const bool too_many = config_.speculative_disable_by_batch_size > 0 &&
                          n_decoding > config_.speculative_disable_by_batch_size;
    std::vector<int64_t> kds(valid.size(), 0);
    for (size_t k = 0; k < valid.size(); ++k) {
        Sequence* s = valid[k].seq;
        if (s->n_remaining() != 1 || too_many) continue;
        int64_t kd = std::min({config_.speculative_tokens, s->params.max_tokens - s->n_generated() - 1,
                               max_model_len_ - static_cast<int64_t>(s->tokens.size())});
        // The draft steps and the verification write KV up to position tokens.size() - 1 + kd.
        const int64_t total = static_cast<int64_t>(s->tokens.size()) + kd;
        if (kd > 0 && blocks_needed(*s, total) > kv_.blocks().n_available()) kd = 0;
        if (kd > 0) s->kv.reserve(kv_.blocks(), total);
        kds[k] = kd;
    }
    return kds;
}

void Engine::draft(const Batch& batch, const ForwardResult& out, const std::vector<DraftRows>& valid) {
    const std::vector<int64_t> kds = draft_counts(valid);
    // Every drafting sequence greedy on raw logits (no penalties or bias) with the same number of drafts: the
    // whole chain runs on the device as one step (one graph on the GPU) and only the drafts come back.
    int64_t kd_chain = 0;  // the drafts of the first drafting sequence: all must have as many
    bool chain = true;
    for (size_t k = 0; k < valid.size(); ++k) {
        if (kds[k] == 0) continue;
        if (kd_chain == 0) kd_chain = kds[k];
        chain = chain && raw_greedy(*valid[k].seq) && kds[k] == kd_chain;
    }
    chain = chain && kd_chain > 0;
    // On a backend with graphs and one device, when every sequence of the step drafts after a verification, step 0
    // covers each one's whole verification (its K + 1 rows, the rejected ones too) with every row scored, so the
    // chain's shape does not follow the step's acceptance pattern (with a dozen sequences one pattern seldom
    // repeats: no replay). The rows past the accepted ones keep nothing: their MTP KV lies at positions the next
    // verification and step 0 write again before any kept row reads them, and their logits are not taken. Also
    // with MEGACTX_GRAPHS=0, so that eager runs do the same arithmetic; not under tensor parallelism, whose draft
    // steps run eagerly.
    const bool all_verified = std::all_of(valid.begin(), valid.end(), [](const DraftRows& v) {
        return v.n_verified > 0;
    }) && std::all_of(kds.begin(), kds.end(), [](int64_t kd) { return kd > 0; });
    const bool pad = chain && all_verified && (ops_.can_record() || graphs_.enabled()) && model_.single_device();

    // Step 0: the MTP layer over every row whose target KV is now valid, with the token after each, from the
    // target's hidden states; it writes the MTP layer's KV there (KVShare: only target-derived entries).
    Batch b0;
    std::vector<int32_t> rows;                             // target batch rows feeding step 0
    std::vector<std::vector<int32_t>> next(valid.size());  // their next tokens (b0 points into them)
    Drafting d;
    for (size_t k = 0; k < valid.size(); ++k) {
        Sequence* s = valid[k].seq;
        const int64_t first = valid[k].first_row, n = valid[k].n_rows, kd = kds[k];
        const int64_t n0 = pad ? valid[k].n_verified : n;  // rows in step 0
        const int64_t pos0 = batch.pos[static_cast<size_t>(first)];
        for (int64_t j = 0; j < n0; ++j) {
            rows.push_back(static_cast<int32_t>(first + j));
            next[k].push_back(j < n ? s->tokens[static_cast<size_t>(pos0 + j + 1)] : 0);  // 0: a padding row's
        }
        b0.add_sequence(&s->kv.blocks, next[k].data(), n0, pos0, pad);
        if (!pad) b0.want_logits.back() = kd > 0;
        if (kd > 0) {
            d.seqs.push_back(s);
            d.n_draft.push_back(kd);
            d.last_rows.push_back(static_cast<int32_t>(b0.n_tokens() - n0 + n - 1));
        }
    }
    if (b0.n_tokens() == 0) return;
    Tensor h0 = ops_.alloc(DType::F32, {b0.n_tokens(), model_.config().hidden_size});
    ops_.gather_rows(out.hidden, ops_.upload_i32(rows), h0);
    d.share = model_.config().mtp_index_share && !config_.no_mtp_index_share;
    if (chain) {
        draft_chain(b0, h0, d);
        return;
    }
    const ForwardResult m = graphs_.mtp_forward(b0, h0, nullptr);
    if (!d.seqs.empty()) draft_steps(m, d);
}

// Greedy drafts of equal count: step 0 and the K - 1 steps after it as one chain on the device (argmax fed to the
// next step there), and only the drafts come back.
void Engine::draft_chain(const Batch& b0, const Tensor& h0, const Drafting& d) {
    static const int32_t kPlaceholder = 0;  // step j's tokens come from step j - 1's argmax on the device
    std::vector<Batch> steps(static_cast<size_t>(d.n_draft[0] - 1));
    for (size_t j = 0; j < steps.size(); ++j) {
        for (Sequence* s : d.seqs) {
            // Step 0 ran at the last verified token's predecessor (position tokens.size() - 2, reading the last
            // token); step j reads draft j one position further on, as the chain of MTP depths does.
            const int64_t pos = static_cast<int64_t>(s->tokens.size()) - 2 + static_cast<int64_t>(j) + 1;
            steps[j].add_sequence(&s->kv.blocks, &kPlaceholder, 1, pos, true);
        }
    }
    const std::vector<int32_t> drafts = graphs_.mtp_greedy_chain(b0, h0, d.last_rows, steps, d.share);
    for (size_t j = 0; j <= steps.size(); ++j)
        for (size_t i = 0; i < d.seqs.size(); ++i) d.seqs[i]->drafts.push_back(drafts[j * d.seqs.size() + i]);
}

// Any other drafting, one MTP step at a time from step 0's output m: draft j from the MTP logits (sampled from the
// request's processed distribution, kept as q for the rejection sampling, or its argmax); steps j >= 1 feed it back
// at the next position, from the previous step's hidden state, over step 0's top-k row
// (index_share_for_mtp_iteration), for the sequences that still want drafts.
void Engine::draft_steps(const ForwardResult& m, const Drafting& d) {
    const int64_t vocab = model_.config().vocab_size, topk = model_.config().index_topk;
    std::vector<int32_t> topk_host;
    if (d.share) {
        std::vector<int32_t> all(static_cast<size_t>(m.topk.numel()));
        ops_.download(m.topk, all.data());
        for (int32_t r : d.last_rows)
            topk_host.insert(topk_host.end(), all.begin() + r * topk, all.begin() + (r + 1) * topk);
    }
    Tensor hidden = ops_.alloc(DType::F32, {static_cast<int64_t>(d.seqs.size()), model_.config().hidden_size});
    ops_.gather_rows(m.hidden, ops_.upload_i32(d.last_rows), hidden);  // step 0's rows in graph memory: copied out
    std::vector<size_t> active(d.seqs.size());
    for (size_t i = 0; i < d.seqs.size(); ++i) active[i] = i;
    // One row per active sequence: the logits of its next draft on the host (lg) when a sequence samples or
    // processes them, else only their argmaxes (best), as for the target's rows.
    std::vector<float> lg;
    std::vector<int64_t> at;
    std::vector<int32_t> best;
    const auto take = [&](const Tensor& logits) {
        std::vector<uint8_t> need(active.size());
        for (size_t a = 0; a < active.size(); ++a) need[a] = !raw_greedy(*d.seqs[active[a]]);
        fetch_scored(logits, need, &lg, &at, &best);
    };
    take(m.logits);
    while (true) {
        std::vector<size_t> still;
        for (size_t a = 0; a < active.size(); ++a) {
            Sequence* s = d.seqs[active[a]];
            if (at[a] < 0) {
                s->drafts.push_back(best[a]);
            } else {
                const std::vector<float> q = target_probs(*s, lg.data() + at[a] * vocab, s->drafts);
                const int32_t tok = s->sampler->greedy()
                                        ? static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin())
                                        : s->sampler->draw(q);
                s->drafts.push_back(tok);
                if (!s->sampler->greedy()) s->draft_q.push_back(q);
            }
            if (static_cast<int64_t>(s->drafts.size()) < d.n_draft[active[a]]) still.push_back(a);
        }
        if (still.empty()) break;
        Batch bj;
        std::vector<int32_t> keep_rows, reuse;
        for (size_t a : still) {
            Sequence* s = d.seqs[active[a]];
            // Step 0 ran at the last verified token's predecessor (position tokens.size() - 2, reading the last
            // token); step j reads draft j one position further on, as the chain of MTP depths does.
            const int64_t pos = static_cast<int64_t>(s->tokens.size()) - 2 + static_cast<int64_t>(s->drafts.size());
            bj.add_sequence(&s->kv.blocks, &s->drafts.back(), 1, pos, true);
            keep_rows.push_back(static_cast<int32_t>(a));
            if (d.share) {
                const auto* row = topk_host.data() + active[a] * static_cast<size_t>(topk);
                reuse.insert(reuse.end(), row, row + topk);
            }
        }
        Tensor h = hidden;  // all rows still drafting: no gather
        if (still.size() != active.size()) {
            h = ops_.alloc(DType::F32, {bj.n_tokens(), model_.config().hidden_size});
            ops_.gather_rows(hidden, ops_.upload_i32(keep_rows), h);
        }
        ForwardResult mj = graphs_.mtp_forward(bj, h, d.share ? &reuse : nullptr);
        hidden = mj.hidden;
        std::vector<size_t> next_active;
        for (size_t a : still) next_active.push_back(active[a]);
        active = next_active;
        take(mj.logits);
    }
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = snapshot_;
    s.waiting += static_cast<int64_t>(inbox_.size());
    s.alive = alive_.load();
    return s;
}

void Engine::fail_all(const std::string& error) {
    std::vector<Sequence*> all;
    for (auto& [id, s] : seqs_) all.push_back(s.get());
    for (Sequence* s : all) finish(s, FinishReason::kError, error);
}

void Engine::loop() {
    while (!stopping_.load()) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] {
                return stopping_.load() || !inbox_.empty() || !cancels_.empty() || !running_.empty() ||
                       !waiting_.empty();
            });
        }
        if (stopping_.load()) break;
        try {
            step();
        } catch (const std::exception& e) {
            // A failed step leaves sequences in an unknown state: fail them all and stop serving, so
            // clients get an error now and /health turns 503 instead of hanging.
            alive_.store(false);
            fail_all(std::string("engine step failed: ") + e.what());
            update_snapshot();
            return;
        }
    }
    drain_inbox();
    std::vector<Sequence*> all;
    for (auto& [id, s] : seqs_) all.push_back(s.get());
    for (Sequence* s : all) finish(s, FinishReason::kCancelled);
    update_snapshot();
}

void Engine::start() {
    if (thread_.joinable()) return;
    stopping_.store(false);
    thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
    stopping_.store(true);
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

}  // namespace megactx
