#include "grammar_masks.h"
#include "text_file.h"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

namespace {

using json = nlohmann::json;

std::string hex(std::string_view bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (const unsigned char c : bytes) {
        out += kDigits[c >> 4];
        out += kDigits[c & 15];
    }
    return out;
}

// The allowed ids as inclusive [lo, hi] ranges, ascending.
json ranges(const grammar::TokenMask& mask, size_t n_tokens) {
    json out = json::array();
    int64_t lo = -1;
    for (size_t i = 0; i <= n_tokens; ++i) {
        const bool on = i < n_tokens && mask.allowed(static_cast<int32_t>(i));
        if (on && lo < 0) lo = static_cast<int64_t>(i);
        if (!on && lo >= 0) {
            out.push_back({lo, static_cast<int64_t>(i) - 1});
            lo = -1;
        }
    }
    return out;
}

// One text's masks, computed as the engine computes them (through `cache`, the grammar's MaskCache; null: the
// plain trie walk); `masks` stops at the first token refused.
json masks_along(const Tokenizer& tok, const grammar::TokenVocab& vocab, const grammar::Grammar& g,
                 const std::string& text, grammar::MaskCache* cache) {
    const std::vector<int32_t> ids = tok.encode(text, false);
    grammar::Matcher m(g);
    grammar::TokenMask mask;
    json masks = json::array();
    int64_t refused = -1;
    for (size_t i = 0; i <= ids.size(); ++i) {
        vocab.fill_mask(m, mask, cache);
        masks.push_back(ranges(mask, vocab.n_tokens()));
        if (i == ids.size()) break;
        if (!mask.allowed(ids[i])) {
            refused = static_cast<int64_t>(i);
            break;
        }
        m.advance(tok.token_bytes(ids[i]));
    }
    return {{"n_tokens", vocab.n_tokens()}, {"ids", ids}, {"masks", masks}, {"refused", refused},
            {"accepting", refused < 0 && m.accepting()}};
}

// The texts of a JSONL file, one JSON string a line (as `megactx tokenize --jsonl`).
std::vector<std::string> read_jsonl_texts(const std::string& path) {
    std::istringstream in(read_text_file(path));
    std::vector<std::string> texts;
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
        if (line.empty()) continue;
        const json j = json::parse(line, nullptr, false);
        MEGACTX_CHECK(j.is_string(), "{}: line {} is not a JSON string", path, n);
        texts.push_back(j.get<std::string>());
    }
    return texts;
}

}  // namespace

int run_vocab(const GrammarOptions& o) {
    const Tokenizer tok = Tokenizer::load(o.model);
    const auto vocab = load_vocab(tok);
    json tokens = json::array();
    for (size_t i = 0; i < vocab->n_tokens(); ++i) tokens.push_back(hex(vocab->bytes(static_cast<int32_t>(i))));
    const json out = {{"n_tokens", vocab->n_tokens()}, {"stop_ids", vocab->stop_ids()}, {"tokens", tokens}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
}

int run_masks(const GrammarOptions& o, const grammar::Grammar& g) {
    const Tokenizer tok = Tokenizer::load(o.model);
    const auto vocab = load_vocab(tok);
    const std::vector<std::string> texts = !o.jsonl.empty()          ? read_jsonl_texts(o.jsonl)
                                           : !o.text_file.empty()    ? std::vector{read_text_file(o.text_file)}
                                                                     : std::vector{o.text};
    bool all_taken = true;
    std::unique_ptr<grammar::MaskCache> cache;
    if (!o.no_cache) cache = std::make_unique<grammar::MaskCache>();
    for (const std::string& text : texts) {
        const json out = masks_along(tok, *vocab, g, text, cache.get());
        all_taken = all_taken && out["refused"] == -1;
        std::printf("%s\n", out.dump().c_str());
    }
    return all_taken ? 0 : 1;
}

}  // namespace megactx
