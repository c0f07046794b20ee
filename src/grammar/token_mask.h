// Token masks (issue 51): which tokens of the model's vocabulary a grammar allows next. The vocabulary becomes a byte
// trie once, at load; a mask walks the trie from the matcher's state, entering only the children whose byte the
// matcher allows (Matcher::allowed), so a state that allows few bytes costs little however large the vocabulary.
// The walk advances the matcher and rolls it back: it is left as it was.
//
// Knows tokens as byte strings, not the tokenizer: the caller lists each id's bytes (Tokenizer::token_bytes) and
// the ids that end the output (end of sequence, end of turn), allowed exactly when the matcher accepts.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"

namespace megactx::grammar {

// A bit per token id: allowed or not.
struct TokenMask {
    std::vector<uint64_t> words;

    void reset(size_t n_tokens) { words.assign((n_tokens + 63) / 64, 0); }
    void set(int32_t id) { words[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
    bool allowed(int32_t id) const { return (words[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
    int64_t count() const;
};

// Masks already computed for one grammar over one vocabulary, by Matcher::state_key(): a mask depends only on the
// matcher's future, so a state that repeats (every character of a JSON string, every digit of a number) reuses the
// mask instead of walking the trie again. Shareable between requests using the same grammar and vocabulary (never
// across grammars: keys of different grammars mean different things), thread-safe. Holds at most `max_masks`
// masks, dropping the least recently used.
//
// It also keeps what each kernel position of the grammar allows on its own (TokenVocab::fill_mask's per-position
// precomputation, PositionMasks), at most `max_positions` of them, dropping the least recently used.
struct PositionMasks;
struct StateTable;

class MaskCache {
  public:
    // 2048 masks of a 128K-token vocabulary: 32 MiB; 256 positions: at most 4 MiB more.
    static constexpr size_t kDefaultMaxMasks = 2048;
    static constexpr size_t kDefaultMaxPositions = 256;
    // The analyses' shared transitions are dropped past this many states (256 entries each: 8 MiB).
    static constexpr size_t kMaxTableStates = 8192;
    explicit MaskCache(size_t max_masks = kDefaultMaxMasks, size_t max_positions = kDefaultMaxPositions);
    ~MaskCache();
    MaskCache(const MaskCache&) = delete;
    MaskCache& operator=(const MaskCache&) = delete;

    bool find(uint64_t key, TokenMask& out);  // copies the mask of `key` into `out` when there is one
    void insert(uint64_t key, const TokenMask& mask);
    size_t size() const;
    int64_t hits() const;
    int64_t misses() const;

    // Kept by position (a grammar's cache) or by Matcher::position_shape (the vocabulary's, across grammars).
    std::shared_ptr<const PositionMasks> find_position(uint64_t key);
    void insert_position(uint64_t key, std::shared_ptr<const PositionMasks> masks);
    size_t n_positions() const;
    // The transitions between states that the analyses of kernel positions have taken (TokenVocab::fill_mask),
    // lent with its lock held.
    std::pair<std::unique_lock<std::mutex>, StateTable*> analysis_table();

  private:
    using Entry = std::pair<uint64_t, std::vector<uint64_t>>;
    using PositionEntry = std::pair<uint64_t, std::shared_ptr<const PositionMasks>>;
    mutable std::mutex mu_;
    size_t max_masks_, max_positions_;
    std::list<Entry> lru_;  // most recently used first
    std::unordered_map<uint64_t, std::list<Entry>::iterator> by_key_;
    std::list<PositionEntry> position_lru_;
    std::unordered_map<uint64_t, std::list<PositionEntry>::iterator> by_position_;
    int64_t hits_ = 0, misses_ = 0;
    std::mutex table_mu_;
    std::unique_ptr<StateTable> table_;
};

// What one kernel position allows on its own (see TokenVocab::fill_mask): `accepted`, the tokens read entirely
// inside the rest of its production (a bit per token; empty: none), and `cuts`, the trie nodes (subtree roots,
// ascending) where a token leaves the production after it could have completed: those tokens depend on the
// context. `complete` is false when the position had too many states to analyse: the mask is then walked whole.
struct PositionMasks {
    std::vector<uint64_t> accepted;
    std::vector<uint32_t> cuts;
    // Per cut, or none: the bytes read right after the production completed on the way to it. A context takes the
    // cut's tokens only if it may begin with one of them (Matcher::follow_bytes), so the others are left out when
    // the mask is put together.
    std::vector<ByteSet> leads;
    bool complete = true;
};

class TokenVocab {
  public:
    // token_bytes[id]: the bytes of token id (empty: never allowed, e.g. an id the vocabulary lacks). stop_ids:
    // the tokens that end the output; they are not matched as bytes.
    TokenVocab(const std::vector<std::string>& token_bytes, std::vector<int32_t> stop_ids);

    size_t n_tokens() const { return n_tokens_; }
    const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
    const std::string& bytes(int32_t id) const { return bytes_.at(static_cast<size_t>(id)); }
    size_t n_nodes() const { return nodes_.size(); }
    // Positions analysed for any grammar, kept by their shape: a piece of grammar many grammars share (a JSON
    // string's body) is analysed once per vocabulary.
    size_t n_shared_positions() const { return shared_->n_positions(); }
    // Bounded repetitions' items analysed (ItemAnalysis in token_mask.cpp), kept by the item's shape.
    size_t n_item_analyses() const;

    // The tokens `m` may read next, and the stop tokens when `m` accepts. `m` is unchanged on return.
    void fill_mask(Matcher& m, TokenMask& out) const;
    // The same, taking the mask from `cache` when the state was seen before and adding it otherwise (`cache` must
    // belong to m's grammar and this vocabulary; null: no cache). A new state's mask is put together from its
    // kernel positions (Matcher::kernel_positions): each position's tokens read entirely inside the rest of its
    // production, computed once per position and kept in the cache, and a check through `m` of only the tokens
    // that may run past the production's end (a JSON string's body allows most of the vocabulary whatever follows
    // the string; only the tokens holding its closing quote depend on the context).
    void fill_mask(Matcher& m, TokenMask& out, MaskCache* cache) const;

  private:
    // Trie nodes in depth-first order: node i's subtree is nodes i .. end-1; its children follow it, each child's
    // subtree before the next child.
    struct Node {
        uint8_t byte;           // the byte on the edge into this node
        uint32_t depth;         // bytes from the root
        uint32_t end;           // one past the last node of this subtree
        uint32_t first_token;   // tokens ending here: token_ids_[first_token .. first_token + n_tokens)
        uint32_t n_tokens;
        uint32_t parent;  // the node one byte up (the root's: itself)
    };
    class StateWalk;
    struct ItemAnalysis;
    class ItemAnalyses;
    void walk(uint32_t node, Matcher& m, TokenMask& out) const;
    void set_subtree(uint32_t node, TokenMask& out) const;
    bool walk_by_state(Matcher& m, TokenMask& out, const std::vector<uint32_t>* cuts,
                       StateTable* table = nullptr) const;
    bool walk_subtrees(StateWalk& w, uint32_t from, uint32_t to, TokenMask& out) const;
    std::shared_ptr<const PositionMasks> analyse_position(const Matcher& m, uint32_t pos, StateTable* table) const;
    std::shared_ptr<const ItemAnalysis> analyse_item(const Matcher& m, const Matcher::Repetition& rep,
                                                     StateTable* table) const;
    std::shared_ptr<const ItemAnalysis> analyse_byte_item(const ByteSet& bytes, uint32_t max) const;
    std::vector<uint64_t> derive_accepted(const ItemAnalysis& a, uint32_t max) const;
    std::vector<uint32_t> derive_cuts(const ItemAnalysis& a, const Matcher::Repetition& rep) const;
    std::shared_ptr<const PositionMasks> repetition_masks(const Matcher& m, uint32_t pos, MaskCache& cache,
                                                          bool may_walk) const;
    std::shared_ptr<const PositionMasks> position_masks(const Matcher& m, uint32_t pos, MaskCache& cache,
                                                        bool may_walk) const;
    bool narrow_position(const Matcher& m, uint32_t pos) const;
    bool fill_by_positions(Matcher& m, TokenMask& out, MaskCache& cache) const;
    size_t max_depth_ = 0;

    size_t n_tokens_;
    std::vector<std::string> bytes_;
    std::vector<int32_t> stop_ids_;
    std::vector<Node> nodes_;  // nodes_[0]: the root (no byte)
    std::vector<ByteSet> below_;  // per node: the bytes on the edges of its subtree (not the edge into it)
    // 1,024 positions of a 128K-token vocabulary: at most 16 MiB.
    std::shared_ptr<MaskCache> shared_ = std::make_shared<MaskCache>(0, 1024);
    // The analyses of bounded repetitions' items (a JSON string's character), by the item's shape: every count of
    // an item (a string of at most N characters with N - k left) is derived from one walk (derive_accepted,
    // derive_cuts).
    std::shared_ptr<ItemAnalyses> items_;
    std::vector<int32_t> token_ids_;
};

}  // namespace megactx::grammar
