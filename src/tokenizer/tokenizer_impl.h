// Internals of the tokenizer shared by its .cpp files (not part of the public API): the pre-tokenizer
// pipeline, the BPE model over token ids, added-token matching and the loaded state.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace megactx::tok {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// Pre-tokenization: a sequence of steps that cut the text into pieces (views into the text or into
// `scratch`, which owns strings the steps create, such as a piece with a prefix space).
class PreTokenizer {
public:
    // `j` is the tokenizer.json "pre_tokenizer" value (may be null).
    void build(const nlohmann::json& j, const std::string& where);
    void run(std::string_view text, std::vector<std::string_view>& out, std::deque<std::string>& scratch) const;
    // True when the last step is ByteLevel: pieces are raw bytes that the model maps through the byte alphabet.
    bool byte_level() const { return byte_level_; }

private:
    struct Step {
        std::shared_ptr<Regex> re;  // null for a ByteLevel step without regex
        Behavior behavior = Behavior::Isolated;
        bool invert = false;
        bool byte_level = false;
        bool add_prefix_space = false;
    };
    void add(const nlohmann::json& j, const std::string& where);
    void split(const Step& s, std::string_view piece, std::vector<std::string_view>& out) const;
    std::vector<Step> steps_;
    bool byte_level_ = false;
};

// Open-addressing map (left id, right id) → (rank, merged id).
class MergeTable {
public:
    struct Entry {
        uint64_t key = kEmpty;
        int32_t rank = 0;
        int32_t id = 0;
    };
    static constexpr uint64_t kEmpty = ~0ull;
    void reserve(size_t n);
    void insert(int32_t a, int32_t b, int32_t rank, int32_t id);
    const Entry* find(int32_t a, int32_t b) const {
        const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
        size_t i = slot(key);
        while (true) {
            const Entry& e = table_[i];
            if (e.key == key) return &e;
            if (e.key == kEmpty) return nullptr;
            i = (i + 1) & mask_;
        }
    }

private:
    size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
    std::vector<Entry> table_;
    size_t mask_ = 0;
    int shift_ = 64;
};

class Bpe {
public:
    void build(const nlohmann::json& model, const std::string& where);
    // Appends the ids of one pre-token. byte_level: `piece` is raw bytes mapped through the byte alphabet;
    // otherwise it is text whose characters are vocabulary entries.
    void encode(std::string_view piece, bool byte_level, std::vector<int32_t>& out) const;

    StringMap<int32_t> vocab;
    int32_t unk_id = -1;

private:
    void merge(std::vector<int32_t>& syms) const;
    void merge_long(std::vector<int32_t>& syms) const;
    void initial_symbols(std::string_view piece, bool byte_level, std::vector<int32_t>& syms) const;

    MergeTable merges_;
    int32_t byte_ids_[256];           // id of each byte's byte-level character, -1 if not in the vocabulary
    int32_t fallback_ids_[256];       // id of "<0xXX>", -1 if absent
    bool ignore_merges_ = false;
    bool byte_fallback_ = false;
    bool fuse_unk_ = false;

    // Bounded cache of whole pre-tokens → ids; cleared when full.
    struct Cache {
        std::mutex mu;
        StringMap<std::vector<int32_t>> map;
    };
    std::unique_ptr<Cache> cache_ = std::make_unique<Cache>();
};

struct AddedToken {
    int32_t id = -1;
    std::string content;
    bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Byte trie over added-token contents: leftmost, then longest match, as Hugging Face does.
class AddedTrie {
public:
    void add(std::string_view s, int32_t token_index);
    bool empty() const { return nodes_.size() <= 1; }
    // Longest token starting at text[pos]: its index (or -1) and end.
    int32_t longest(std::string_view text, size_t pos, size_t& end) const;
    bool may_start(unsigned char c) const { return first_[c]; }

private:
    struct Node {
        int32_t token = -1;
        std::vector<std::pair<unsigned char, int32_t>> next;
    };
    std::vector<Node> nodes_ = std::vector<Node>(1);
    bool first_[256] = {};
};

}  // namespace megactx::tok

namespace megactx {

struct Tokenizer::Impl {
    std::string origin;
    std::vector<utf8::NormalForm> normalizers;
    tok::PreTokenizer pre;
    tok::Bpe bpe;
    std::vector<tok::AddedToken> added;
    tok::StringMap<int32_t> added_by_content;  // content (and normalized content) → index in `added`
    tok::AddedTrie raw_trie, norm_trie;        // unnormalized tokens, normalized tokens
    std::vector<int32_t> prefix_ids, suffix_ids;

    // Decoding: per id, what it contributes.
    enum Kind : uint8_t { kAbsent = 0, kVocab = 1, kAdded = 2, kSpecial = 3 };
    std::vector<uint8_t> kind;
    std::vector<std::string> id_str;    // vocabulary string
    std::vector<std::string> id_bytes;  // bytes the decoder turns it into (added: the content)
    bool join_with_space = false;        // no decoder: tokens are joined with " "

    int32_t bos_id = -1, eos_id = -1, pad_id = -1;
    std::string bos_token, eos_token, pad_token, chat_template;
    bool has_chat_template = false;

    void check_id(int32_t id) const;
    void encode_text(std::string_view text, std::vector<int32_t>& out) const;
    void encode_plain(std::string_view text, std::vector<int32_t>& out, std::deque<std::string>& scratch,
                      std::vector<std::string_view>& pieces) const;
};

}  // namespace megactx
