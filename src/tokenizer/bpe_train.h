// Byte-level BPE training: the merges of `megactx train-tokenizer` and of the tokenizers `megactx gen-model`
// writes next to its random models. Pair counts are kept up to date from the words each merge touches instead
// of being recounted over the whole corpus, so tens of megabytes of text train to a vocabulary of thousands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

namespace megactx {

// Collects the pre-tokens of one or more texts, then learns merges from their counts.
//
// Training starts from the 256 byte-level characters and repeatedly merges the most frequent adjacent pair of
// symbols, counted over every occurrence of every word (overlapping pairs count: "aaa" holds two "a a"), and
// applies each merge left to right without overlap ("aaa" becomes "aa" "a"). Among pairs of the highest
// count the smallest in std::pair<std::string, std::string> order wins. It stops after `max_merges` merges or
// when no pair occurs twice.
class BpeTrainer {
  public:
    // `pre_tokenizer` is a tokenizer.json "pre_tokenizer" value ending in ByteLevel.
    explicit BpeTrainer(const nlohmann::json& pre_tokenizer);
    ~BpeTrainer();
    BpeTrainer(const BpeTrainer&) = delete;
    BpeTrainer& operator=(const BpeTrainer&) = delete;

    // Pre-tokenizes `text` and counts its pieces (each text is split on its own: no piece spans two texts).
    void add_text(std::string_view text);
    int64_t n_words() const;  // pieces counted so far
    size_t n_distinct_words() const;

    // A tokenizer.json "model" object: type BPE, vocab with the 256 byte-level characters at ids 0..255 (in byte
    // order) followed by one token per merge whose string is new, and merges as [a, b] pairs. `on_merge(n)` is
    // called after the n-th merge.
    nlohmann::json train(size_t max_merges, const std::function<void(size_t)>& on_merge = {}) const;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// BpeTrainer on one text.
nlohmann::json train_byte_level_bpe(std::string_view text, const nlohmann::json& pre_tokenizer, size_t max_merges);

}  // namespace megactx
