// Hugging Face `tokenizer.json` for the byte-level BPE family (GLM-4/5, DeepSeek-V3, Qwen, GPT-2), in C++.
//
// Supported components (anything else is an Error naming the component and the file):
//   normalizer      null, NFC, NFD, NFKC, NFKD, Sequence
//   pre_tokenizer   null, Split (Regex or String pattern; Isolated, Removed, MergedWithPrevious,
//                   MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space, use_regex), Digits,
//                   Sequence — ByteLevel must come last
//   model           BPE (merges as "a b" or ["a", "b"], ignore_merges, byte_fallback, unk_token, fuse_unk)
//   added_tokens    special, lstrip, rstrip, single_word, normalized; leftmost, then longest, match
//   post_processor  null, TemplateProcessing (single), ByteLevel (no-op on ids), Sequence
//   decoder         null, ByteLevel, ByteFallback, Fuse, Sequence
//
// Invalid UTF-8 given to encode(): every ill-formed subsequence is replaced by U+FFFD first (the WHATWG
// maximal-subpart rule), exactly what a JavaScript string read from those bytes holds, so the ids equal those
// of @huggingface/tokenizers on that string. decode() of ids whose bytes are not valid UTF-8 replaces each
// ill-formed subsequence by U+FFFD (Hugging Face's errors="replace"). Ids outside the vocabulary are an Error.
// Encode and decode never crash on any input. A Tokenizer is immutable after load and safe to share between
// threads (the BPE word cache is internally locked).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megactx {

class Tokenizer {
public:
    // `path`: a directory holding tokenizer.json (and optionally tokenizer_config.json), or tokenizer.json
    // itself (a tokenizer_config.json beside it is read too).
    static Tokenizer load(const std::string& path);
    // From JSON text; `config_json` may be empty. `origin` names the source in error messages.
    static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                               const std::string& origin = "tokenizer.json");

    // add_special_tokens = false is Hugging Face's add_special_tokens=False: the post-processor adds nothing.
    // Added-token strings inside `text` are always recognised.
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

    int32_t token_id(std::string_view token) const;  // -1 when absent
    std::string token_str(int32_t id) const;         // the vocabulary string; Error when out of range
    // The bytes the decoder turns this one token into, before any UTF-8 repair (a byte-level token may hold part
    // of a character); an added token's content. For grammar masks, which match bytes.
    const std::string& token_bytes(int32_t id) const;
    bool is_special(int32_t id) const;               // an added token marked special
    bool is_added(int32_t id) const;
    size_t vocab_size() const;                       // largest id + 1

    // From tokenizer_config.json (-1 / empty when not given there).
    int32_t bos_id() const;
    int32_t eos_id() const;
    int32_t pad_id() const;
    const std::string& bos_token() const;
    const std::string& eos_token() const;
    const std::string& pad_token() const;
    bool has_chat_template() const;
    const std::string& chat_template() const;  // the default template when the config holds a named list

    struct Impl;
    const Impl& impl() const { return *impl_; }

private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

// Incremental detokenizer for streaming. Contract: the concatenation of every push() result and the final
// flush() equals tokenizer.decode(all ids pushed, skip_special) byte for byte; push() never returns part of
// a UTF-8 character (an incomplete character is held until its remaining bytes arrive, or until flush() or a
// following added token shows it can never complete, when it becomes U+FFFD as in decode()).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
    std::string push(int32_t id);
    std::string flush();

private:
    Tokenizer tok_;  // shares the loaded state
    bool skip_special_;
    bool first_ = true;
    std::string pending_;  // bytes of a character not yet complete
};

}  // namespace megactx
