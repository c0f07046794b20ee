// A small deterministic byte-level BPE trainer, for the tokenizers `megactx gen-model` writes next to its
// random models (not a production trainer: it recounts pairs each merge).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

namespace megactx {

// Learns up to `max_merges` merges from `text`, pre-tokenized by `pre_tokenizer` (a tokenizer.json
// "pre_tokenizer" value ending in ByteLevel). Returns a tokenizer.json "model" object: type BPE, vocab with
// the 256 byte-level characters at ids 0..255 (in byte order) followed by one token per merge, and merges as
// [a, b] pairs. The most frequent pair wins; ties go to the lexicographically smallest pair. Stops early when
// no pair occurs twice.
nlohmann::json train_byte_level_bpe(std::string_view text, const nlohmann::json& pre_tokenizer, size_t max_merges);

}  // namespace megactx
