// The tokenizer `megactx gen-model` writes beside its random models: GLM-style byte-level BPE (GLM-4 split
// regex + ByteLevel without regex), merges learned deterministically from a small built-in text, and the
// GLM-5 special tokens as added tokens at the top of the model's vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megactx {

// The GLM special tokens, in the order they take the top ids.
const std::vector<std::string>& glm_special_tokens();
// The id of special token `name` in a vocabulary of `vocab_size` (Error when not a GLM special token).
int32_t glm_special_id(int64_t vocab_size, const std::string& name);
// Writes tokenizer.json and tokenizer_config.json into out_dir.
void write_glm_tokenizer(const std::string& out_dir, int64_t vocab_size);

}  // namespace megactx
