// GLM-style tokenizers: byte-level BPE (GLM-4 split regex + ByteLevel without regex) with the GLM-5 special
// tokens as added tokens at the top of the vocabulary. `megactx gen-model` writes one beside its random models
// (merges learned from a small built-in text); `megactx train-tokenizer` writes one with merges learned from
// the user's text.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace megactx {

// The GLM special tokens, in the order they take the top ids.
const std::vector<std::string>& glm_special_tokens();
// The id of special token `name` in a vocabulary of `vocab_size` (Error when not a GLM special token).
int32_t glm_special_id(int64_t vocab_size, const std::string& name);
// The tokenizer.json "pre_tokenizer" value: GLM-4's Split regex, then ByteLevel without its own regex.
nlohmann::json glm_pre_tokenizer();
// Merges that fit in `vocab_size` beside the 256 byte tokens and the special tokens (Error when negative).
int64_t glm_max_merges(int64_t vocab_size);
// Writes tokenizer.json (glm_pre_tokenizer(), the BPE `bpe_model` — a tokenizer.json "model" object whose ids
// stay below the special tokens — and the specials at the top ids of `vocab_size`) and tokenizer_config.json
// (eos and pad <|endoftext|>) into out_dir.
void write_glm_tokenizer(const std::string& out_dir, int64_t vocab_size, const nlohmann::json& bpe_model);
// The same with at most 4096 merges learned from a small built-in text (gen-model's tokenizer).
void write_glm_tokenizer(const std::string& out_dir, int64_t vocab_size);

}  // namespace megactx
