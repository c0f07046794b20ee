// libFuzzer target: the grammar engine. The input is a front end (its first byte: GBNF, regex or JSON Schema), the
// grammar's text up to a NUL byte, and a text to follow. A GrammarError is the expected answer to a bad grammar;
// any other exception, a crash or a sanitizer report is a bug. For a grammar that compiles, the text is followed
// token by token over a small vocabulary made of its own pieces, and at every state the masks the engine uses
// (by state key, from kernel positions, shared by shape) must equal the plain trie walk.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/frontends.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace {

using namespace megactx::grammar;

Grammar compile(uint8_t kind, std::string_view text) {
    switch (kind % 3) {
        case 0: return parse_gbnf(text);
        case 1: return compile_regex(text);
        default: return compile_json_schema(text);
    }
}

// Every byte, then the text's pieces of 2 to 5 bytes (at most 600 in all).
TokenVocab vocab_for(std::string_view text) {
    std::vector<std::string> tokens = {"<eos>"};
    for (int b = 1; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (size_t len = 2; len <= 5; ++len)
        for (size_t i = 0; i + len <= text.size() && tokens.size() < 600; i += len - 1)
            tokens.emplace_back(text.substr(i, len));
    return TokenVocab(tokens, {0});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2 || size > 4096) return 0;
    const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    const size_t nul = in.find('\0');
    const std::string_view grammar_text = in.substr(0, nul);
    const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    Grammar g;
    try {
        g = compile(data[0], grammar_text);
        if (g.n_symbols() > 20000) return 0;  // the walks below are quadratic-ish: keep a run short
    } catch (const GrammarError&) {
        return 0;
    }
    const TokenVocab vocab = vocab_for(text);
    MaskCache by_state, positions_only(0);
    Matcher m(g);
    size_t at = 0;
    for (int step = 0; step < 64; ++step) {
        TokenMask plain, cached, composed;
        vocab.fill_mask(m, plain);
        vocab.fill_mask(m, cached, &by_state);
        vocab.fill_mask(m, composed, &positions_only);
        if (cached.words != plain.words || composed.words != plain.words) __builtin_trap();
        // The longest allowed token that the rest of the text starts with.
        int32_t next = -1;
        for (int32_t id = 1; id < static_cast<int32_t>(vocab.n_tokens()); ++id) {
            const std::string& b = vocab.bytes(id);
            if (plain.allowed(id) && text.substr(at).starts_with(b) &&
                (next < 0 || b.size() > vocab.bytes(next).size()))
                next = id;
        }
        if (next < 0) break;
        if (!m.advance(vocab.bytes(next))) __builtin_trap();  // the mask allowed it
        at += vocab.bytes(next).size();
    }
    return 0;
}
