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
class MaskCache {
  public:
    // 2048 masks of a 128K-token vocabulary: 32 MiB.
    static constexpr size_t kDefaultMaxMasks = 2048;
    explicit MaskCache(size_t max_masks = kDefaultMaxMasks) : max_masks_(max_masks) {}

    bool find(uint64_t key, TokenMask& out);  // copies the mask of `key` into `out` when there is one
    void insert(uint64_t key, const TokenMask& mask);
    size_t size() const;
    int64_t hits() const;
    int64_t misses() const;

  private:
    using Entry = std::pair<uint64_t, std::vector<uint64_t>>;
    mutable std::mutex mu_;
    size_t max_masks_;
    std::list<Entry> lru_;  // most recently used first
    std::unordered_map<uint64_t, std::list<Entry>::iterator> by_key_;
    int64_t hits_ = 0, misses_ = 0;
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

    // The tokens `m` may read next, and the stop tokens when `m` accepts. `m` is unchanged on return.
    void fill_mask(Matcher& m, TokenMask& out) const;
    // The same, taking the mask from `cache` when the state was seen before and adding it otherwise (`cache` must
    // belong to m's grammar and this vocabulary; null: no cache).
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
    };
    void walk(uint32_t node, Matcher& m, TokenMask& out) const;
    bool walk_by_state(Matcher& m, TokenMask& out) const;
    size_t max_depth_ = 0;

    size_t n_tokens_;
    std::vector<std::string> bytes_;
    std::vector<int32_t> stop_ids_;
    std::vector<Node> nodes_;  // nodes_[0]: the root (no byte)
    std::vector<int32_t> token_ids_;
};

}  // namespace megactx::grammar
