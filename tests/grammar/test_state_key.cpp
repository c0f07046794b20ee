// Matcher::state_key and the mask cache built on it. Soundness: whenever two states (at different positions, in
// different matchers) get equal keys, they must behave the same on every future — compared here on allowed(),
// accepting() and continuations several bytes deep, over random grammars and realistic ones. Completeness: the key
// repeats where the grammar loops (JSON strings, numbers, arrays), else the cache never hits. And masks taken from
// the cache equal masks walked afresh.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/frontends.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace megactx::grammar {
namespace {

// A random grammar over the bytes a..d: rules of random alternatives mixing terminals, references (left and right
// recursion, ε), some symbols repeated with bounds (counted rules, small or large) — or nothing when the draw is not
// a valid grammar.
std::unique_ptr<Grammar> random_grammar(std::mt19937& rng) {
    Builder b;
    const int n_rules = 2 + static_cast<int>(rng() % 4);
    std::vector<int32_t> rules;
    for (int i = 0; i < n_rules; ++i) rules.push_back(b.rule("r"));
    for (int i = 0; i < n_rules; ++i) {
        const int n_alts = 1 + static_cast<int>(rng() % 3);
        for (int a = 0; a < n_alts; ++a) {
            Sequence seq;
            const int len = static_cast<int>(rng() % 4);
            for (int s = 0; s < len; ++s) {
                if (rng() % 3 == 0) {
                    seq.push_back(Symbol::ref(rules[rng() % rules.size()]));
                } else {
                    const auto lo = static_cast<uint8_t>('a' + rng() % 4);
                    seq.push_back(b.bytes(ByteSet::range(lo, static_cast<uint8_t>(lo + rng() % 2))));
                }
                if (rng() % 5 == 0) {
                    const int64_t min = rng() % 3, max = rng() % 4 == 0 ? 1000 : min + rng() % 4;
                    seq.back() = b.repeat(seq.back(), min, max);
                }
            }
            b.add_alternative(rules[static_cast<size_t>(i)], std::move(seq));
        }
    }
    try {
        return std::make_unique<Grammar>(b.finish(rules[0]));
    } catch (const GrammarError&) {
        return nullptr;
    }
}

// Every byte of `set`, in order.
std::vector<uint8_t> bytes_of(const ByteSet& set) {
    std::vector<uint8_t> out;
    for (int c = 0; c < 256; ++c)
        if (set.has(static_cast<uint8_t>(c))) out.push_back(static_cast<uint8_t>(c));
    return out;
}

// a and b agree on allowed() and accepting() here and after strings of up to `depth` bytes: every next byte
// where at most two are allowed, three random ones otherwise. Both are left as they were.
void expect_equivalent(Matcher& a, Matcher& b, int depth, std::mt19937& rng, const std::string& where) {
    ASSERT_EQ(a.accepting(), b.accepting()) << where;
    ASSERT_TRUE(a.allowed() == b.allowed()) << where;
    if (depth == 0) return;
    const std::vector<uint8_t> next = bytes_of(a.allowed());
    if (next.size() <= 2) {
        for (const uint8_t c : next) {
            ASSERT_TRUE(a.advance(c) && b.advance(c));
            expect_equivalent(a, b, depth - 1, rng, where + static_cast<char>(c));
            a.rollback(1);
            b.rollback(1);
        }
        return;
    }
    for (int s = 0; s < 3; ++s) {
        const uint8_t c = next[rng() % next.size()];
        ASSERT_TRUE(a.advance(c) && b.advance(c));
        expect_equivalent(a, b, depth - 1, rng, where + static_cast<char>(c));
        a.rollback(1);
        b.rollback(1);
    }
}

// Random walks of several matchers over `g` (each starting with `prefix` when it is readable); every state's key is
// checked against the first state seen with that key. Returns how many states repeated a key.
int check_keys(const Grammar& g, std::mt19937& rng, int walks, int steps, int depth,
               const std::vector<std::string>& prefixes = {""}) {
    std::map<uint64_t, std::unique_ptr<Matcher>> seen;
    int repeats = 0;
    for (int w = 0; w < walks; ++w) {
        Matcher m(g);
        const std::string& prefix = prefixes[static_cast<size_t>(w) % prefixes.size()];
        const std::string start = prefix.substr(0, rng() % (prefix.size() + 1));
        if (!m.advance(start)) ADD_FAILURE() << start;
        for (int s = 0; s <= steps; ++s) {
            const uint64_t key = m.state_key();
            EXPECT_EQ(m.state_key(), key);  // stable
            const auto it = seen.find(key);
            if (it == seen.end()) {
                seen.emplace(key, std::make_unique<Matcher>(m));
            } else {
                ++repeats;
                expect_equivalent(*it->second, m, depth, rng, "after " + std::to_string(m.position()) + " bytes: ");
                if (testing::Test::HasFatalFailure()) return repeats;
            }
            const std::vector<uint8_t> next = bytes_of(m.allowed());
            if (next.empty()) break;
            // Now and then step back, so keys are asked of positions reached again after a rollback.
            if (m.position() > 0 && rng() % 8 == 0) {
                m.rollback(1 + rng() % std::min<size_t>(m.position(), 3));
                continue;
            }
            EXPECT_TRUE(m.advance(next[rng() % next.size()]));
        }
    }
    return repeats;
}

TEST(StateKey, RandomGrammarsEqualKeysMeanEqualFutures) {
    std::mt19937 rng(11);
    int grammars = 0, repeats = 0;
    while (grammars < 400) {
        const auto g = random_grammar(rng);
        if (!g) continue;
        ++grammars;
        repeats += check_keys(*g, rng, 6, 30, 6);
        if (HasFatalFailure()) return;
    }
    EXPECT_GT(repeats, 1000);  // the check must have had equal keys to compare
}

const char* const kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "tags": {"type": "array", "items": {"type": "string"}},
    "count": {"type": "integer"},
    "price": {"type": "number"},
    "kind": {"enum": ["a", "bb", 3]},
    "child": {"$ref": "#"}
  },
  "required": ["name"]
})";

const std::vector<std::string> kInstances = {
    R"({"name":"xéy","tags":["a\u00e9","b\"c"],"count":-120,"price":3.25e-3,"kind":"bb"})",
    R"({"name":"n","count":0,"child":{"name":"deeper","child":{"name":"","tags":[]}}})",
};

TEST(StateKey, RealisticGrammarsEqualKeysMeanEqualFutures) {
    std::mt19937 rng(5);
    JsonSchemaOptions jo;
    jo.max_whitespace = 1;
    // Each grammar with texts its walks start from a prefix of (so they reach deep states), or none.
    const std::vector<std::pair<Grammar, std::vector<std::string>>> grammars = {
        {compile_json_schema(kSchema, jo), kInstances},
        {compile_json_schema(R"({"type":"array","items":{"type":"number"}})"), {"[1.5,-2,3e4,0.25,-0.5]", "[12345678"}},
        {parse_gbnf(R"(
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
array  ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\/bfnrtu] )* "\""
number ::= "-"? [0-9]+ ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
)"),
         kInstances},
        {parse_gbnf("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= term \"*\" [0-9] | [0-9]\n"),
         {"1+2*3*4+5+6*7"}},
        {compile_regex("(ab|a[b-d]*c)+x?[0-9]{2,5}"), {"abacabadcx12"}},
    };
    int repeats = 0;
    for (const auto& [g, prefixes] : grammars) {
        repeats += check_keys(g, rng, 30, 60, 6, prefixes);
        if (HasFatalFailure()) return;
    }
    EXPECT_GT(repeats, 500);
}

// Keys after each prefix of `text` from `from` bytes on (the states at those positions).
std::vector<uint64_t> keys_along(const Grammar& g, const std::string& text, const std::vector<size_t>& at) {
    Matcher m(g);
    std::vector<uint64_t> keys;
    size_t done = 0;
    for (const size_t n : at) {
        EXPECT_TRUE(m.advance(text.substr(done, n - done))) << text.substr(0, n);
        done = n;
        keys.push_back(m.state_key());
    }
    return keys;
}

TEST(StateKey, RepeatsInsideJsonStrings) {
    const Grammar g = compile_json_schema(R"({"type":"object","properties":{"s":{"type":"string"}}})");
    const std::string text = R"({"s":"abc def, xyz \"q\" é 中 01)";
    const size_t body = text.find("abc") + 1;  // after the first character of the body
    std::vector<size_t> at;
    for (size_t i = body; i <= text.size(); ++i)
        if ((static_cast<uint8_t>(text[i - 1]) & 0xC0) != 0x80 && (i == text.size() || (text[i] & 0xC0) != 0x80) &&
            text[i - 1] != '\\')
            at.push_back(i);  // after a whole character, not inside an escape
    // The position after a backslash reads an escape; after each whole character, the same state.
    const std::vector<uint64_t> keys = keys_along(g, text, at);
    for (size_t i = 1; i < keys.size(); ++i) EXPECT_EQ(keys[i], keys[0]) << "after " << text.substr(0, at[i]);
}

TEST(StateKey, RepeatsInsideNumbersAndArrays) {
    {
        const Grammar g = compile_json_schema(R"({"type":"integer"})");
        const std::vector<uint64_t> keys = keys_along(g, "-1234567890123", {3, 4, 5, 6, 7, 10, 14});
        for (size_t i = 1; i < keys.size(); ++i) EXPECT_EQ(keys[i], keys[0]) << i;
    }
    {
        const Grammar g = compile_json_schema(R"({"type":"number"})");
        const std::vector<uint64_t> keys = keys_along(g, "12.3456789", {5, 6, 8, 10});
        for (size_t i = 1; i < keys.size(); ++i) EXPECT_EQ(keys[i], keys[0]) << i;
    }
    {
        const Grammar g = compile_json_schema(R"({"type":"array","items":{"type":"integer"}})");
        const std::string text = "[1,22,3,4,55,6";
        // After each comma (an item expected), and after each later one-digit item (a first item, or one of two
        // digits, is in other rules: equivalent, not the same items).
        const std::vector<uint64_t> commas = keys_along(g, text, {3, 6, 8, 10, 13});
        for (size_t i = 1; i < commas.size(); ++i) EXPECT_EQ(commas[i], commas[0]) << i;
        const std::vector<uint64_t> items = keys_along(g, text, {7, 9, 14});
        for (size_t i = 1; i < items.size(); ++i) EXPECT_EQ(items[i], items[0]) << i;
    }
    {  // the same key from two different matchers at different positions
        const Grammar g = compile_json_schema(R"({"type":"string"})");
        Matcher a(g), b(g);
        ASSERT_TRUE(a.advance("\"ab") && b.advance("\"xyz12"));
        EXPECT_EQ(a.state_key(), b.state_key());
        ASSERT_TRUE(b.advance("\""));
        EXPECT_NE(a.state_key(), b.state_key());
    }
}

// Masks with a cache equal masks without, along random token walks; the walks revisit states, so the cache hits.
void expect_cached_masks_match(const Grammar& g, const TokenVocab& vocab, std::mt19937& rng, int walks, int steps,
                               MaskCache& cache) {
    for (int w = 0; w < walks; ++w) {
        Matcher m(g);
        for (int s = 0; s < steps; ++s) {
            TokenMask fresh, cached;
            vocab.fill_mask(m, fresh);
            const size_t pos = m.position();
            vocab.fill_mask(m, cached, &cache);
            ASSERT_EQ(m.position(), pos);
            ASSERT_EQ(cached.words, fresh.words) << "walk " << w << " step " << s << " at byte " << pos;
            std::vector<int32_t> ok;
            for (size_t id = 0; id < vocab.n_tokens(); ++id)
                if (fresh.allowed(static_cast<int32_t>(id)) && !vocab.bytes(static_cast<int32_t>(id)).empty() &&
                    std::find(vocab.stop_ids().begin(), vocab.stop_ids().end(), static_cast<int32_t>(id)) ==
                        vocab.stop_ids().end())
                    ok.push_back(static_cast<int32_t>(id));
            if (ok.empty()) break;
            ASSERT_TRUE(m.advance(vocab.bytes(ok[rng() % ok.size()])));
        }
    }
}

// An end-of-sequence token and 40 random words of 1 to 4 letters from a-e (the random grammars' alphabet).
TokenVocab random_words_vocab(std::mt19937& rng) {
    std::vector<std::string> tokens = {"<eos>"};
    for (int t = 0; t < 40; ++t) {
        std::string s;
        for (size_t len = 1 + rng() % 4; s.size() < len;) s += static_cast<char>('a' + rng() % 5);
        tokens.push_back(s);
    }
    return TokenVocab(tokens, {0});
}

TEST(MaskCache, RandomGrammarsAndVocabulariesMatchTheWalk) {
    std::mt19937 rng(3);
    int64_t hits = 0;
    for (int n = 0; n < 150;) {
        const auto g = random_grammar(rng);
        if (!g) continue;
        ++n;
        const TokenVocab vocab = random_words_vocab(rng);
        MaskCache cache(rng() % 2 == 0 ? 4 : 64);  // a small cache evicts too
        expect_cached_masks_match(*g, vocab, rng, 4, 20, cache);
        if (HasFatalFailure()) return;
        EXPECT_LE(cache.size(), 64u);
        hits += cache.hits();
    }
    EXPECT_GT(hits, 100);
}

TEST(MaskCache, JsonSchemaMatchesTheWalk) {
    std::mt19937 rng(9);
    const Grammar g = compile_json_schema(kSchema);
    // A vocabulary of pieces of JSON: single bytes and common runs.
    std::vector<std::string> tokens = {"<eos>"};
    for (int c = 0x20; c < 0x7F; ++c) tokens.emplace_back(1, static_cast<char>(c));
    for (const char* t : {"\"",    "\":", "\",\"", "name",     "tags", "count",    "price", "kind",  "child",
                          "\":\"", "{\"", "\"}",   "[\"",      "\"]",  "12",       "3.",    "e-",    "\\u00",
                          "\\\"",  "ab",  " the",  "\xC3\xA9", "\xE4", "\xB8\xAD", "\"bb",  "\"a\"", "-1"})
        tokens.emplace_back(t);
    const TokenVocab vocab(tokens, {0});
    MaskCache cache;
    expect_cached_masks_match(g, vocab, rng, 20, 60, cache);
    EXPECT_GT(cache.hits(), 50);
}

TEST(MaskCache, GrammarsWithoutRepeatingStatesMatchTheWalk) {
    // Palindromes: the state remembers every byte read, so the walk by state meets a new state at nearly every trie
    // node and gives way to the plain walk once there are too many.
    const Grammar g = parse_gbnf("root ::= \"a\" root \"a\" | \"b\" root \"b\" | \"c\" root \"c\" | \"\"\n");
    std::mt19937 rng(2);
    std::vector<std::string> tokens = {"<eos>"};
    for (int t = 0; t < 6000; ++t) {
        std::string s;
        for (size_t len = 1 + rng() % 14; s.size() < len;) s += static_cast<char>('a' + rng() % 3);
        tokens.push_back(s);
    }
    const TokenVocab vocab(tokens, {0});
    ASSERT_GT(vocab.n_nodes(), 5000u);
    MaskCache cache;
    expect_cached_masks_match(g, vocab, rng, 2, 4, cache);
}

// A vocabulary of pieces of JSON: single bytes, common runs, and tokens that run past a string's closing quote.
TokenVocab json_pieces_vocab() {
    std::vector<std::string> tokens = {"<eos>"};
    for (int c = 0x20; c < 0x7F; ++c) tokens.emplace_back(1, static_cast<char>(c));
    for (const char* t : {"\"",    "\":", "\",\"", "name",     "tags", "count",    "price", "kind",  "child",
                          "\":\"", "{\"", "\"}",   "[\"",      "\"]",  "12",       "3.",    "e-",    "\\u00",
                          "\\\"",  "ab",  " the",  "\xC3\xA9", "\xE4", "\xB8\xAD", "\"bb",  "\"a\"", "-1",
                          "ab\",", "x\"}", "q\"]", "ab\":", "\"a\",\"", "1,", "2]", "a\\n", "\"\"", "ss\"\""})
        tokens.emplace_back(t);
    return TokenVocab(tokens, {0});
}

// The masks put together from kernel positions (a cache that keeps no masks, so every state goes through them; or
// keeps no positions either, so each is analysed afresh) equal the plain walk.
TEST(MaskCache, KernelPositionsMatchTheWalk) {
    std::mt19937 rng(5);
    size_t positions = 0;
    for (int n = 0; n < 150;) {
        const auto g = random_grammar(rng);
        if (!g) continue;
        ++n;
        const TokenVocab vocab = random_words_vocab(rng);
        MaskCache cache(0, n % 3 == 0 ? 0 : 64);
        expect_cached_masks_match(*g, vocab, rng, 4, 20, cache);
        if (HasFatalFailure()) return;
        EXPECT_EQ(cache.size(), 0u);
        positions += cache.n_positions();
    }
    EXPECT_GT(positions, 200u);
    const Grammar g = compile_json_schema(kSchema);
    const TokenVocab vocab = json_pieces_vocab();
    for (size_t max_positions : {0, 256}) {
        MaskCache cache(0, max_positions);
        expect_cached_masks_match(g, vocab, rng, 20, 60, cache);
        if (HasFatalFailure()) return;
        EXPECT_EQ(cache.n_positions() > 0, max_positions > 0);
    }
}

// A vocabulary large enough for the walks' shortcuts (a string's body loops on letters: whole subtrees of words are
// taken without visiting them), words with quotes, escapes and multi-byte characters among them; masks with and
// without the cache agree with the plain walk.
TEST(MaskCache, LargeVocabularyOfWordsMatchesTheWalk) {
    std::mt19937 rng(11);
    std::vector<std::string> tokens = {"<eos>"};
    for (int c = 0x20; c < 0x7F; ++c) tokens.emplace_back(1, static_cast<char>(c));
    const char* const pieces[] = {"\"", "\\", "\xC3\xA9", "\xE4\xB8\xAD", "\xE4", ",", ":", "\n", "}", "]", "1", "2."};
    for (int t = 0; t < 3000; ++t) {
        std::string s;
        for (size_t len = 2 + rng() % 9; s.size() < len;) {
            if (rng() % 12 == 0) s += pieces[rng() % std::size(pieces)];
            else s += static_cast<char>('a' + rng() % 26);
        }
        tokens.push_back(s);
    }
    const TokenVocab vocab(tokens, {0});
    const Grammar g = compile_json_schema(
        R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"string"}},)"
        R"("c":{"type":"string","maxLength":12}},"required":["a","b","c"]})");
    for (size_t max_masks : {0, 64}) {
        MaskCache cache(max_masks);
        expect_cached_masks_match(g, vocab, rng, 6, 40, cache);
        if (HasFatalFailure()) return;
    }
    // Another grammar with the same pieces reuses the vocabulary's analyses of them.
    const size_t shared = vocab.n_shared_positions();
    EXPECT_GT(shared, 0u);
    const Grammar g2 = compile_json_schema(R"({"type":"array","items":{"type":"string"}})");
    MaskCache cache2(0);
    expect_cached_masks_match(g2, vocab, rng, 6, 40, cache2);
    EXPECT_GT(cache2.n_positions(), 0u);
}

// A cold state whose kernel positions are all unanalysed analyses one of them per mask and walks the state for the
// rest (one trie walk for a position, one for the state, not one per position); the masks stay the walk's. (A
// position whose walk stays in a small part of the trie is analysed at once: here every position's first bytes lead
// to a good share of the vocabulary, and those that read a byte or two are counted apart.)
TEST(MaskCache, AColdStateAnalysesOnePositionPerMask) {
    const Grammar g = compile_json_schema(
        R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"]})");
    std::mt19937 rng(2);
    std::vector<std::string> tokens = {"<eos>"};  // a vocabulary of its own: nothing shared is analysed yet
    for (const char lead : std::string("1,} \n")) {
        for (int t = 0; t < 60; ++t) {
            std::string s(1, lead);
            s += std::to_string(rng() % 100000);
            tokens.push_back(s);
        }
    }
    const TokenVocab vocab(tokens, {0});
    Matcher m(g);
    ASSERT_TRUE(m.advance("{\"a\": 12"));
    std::vector<uint32_t> kernel;
    m.kernel_positions(kernel);
    ASSERT_GE(kernel.size(), 2u);
    size_t literals = 0;  // positions that read a byte or two (a closing brace): analysed at once
    for (const uint32_t pos : kernel) literals += m.literal_length(pos) > 0 && m.literal_length(pos) <= 2;
    TokenMask plain, cached;
    vocab.fill_mask(m, plain);
    MaskCache cache(0);  // keeps no masks: every call goes through the positions
    for (size_t call = 1; call <= kernel.size() + 1; ++call) {
        vocab.fill_mask(m, cached, &cache);
        EXPECT_EQ(cached.words, plain.words) << "call " << call;
        EXPECT_LE(cache.n_positions(), std::min(call + literals, kernel.size())) << "call " << call;
    }
    EXPECT_EQ(cache.n_positions(), kernel.size());
}

// A vocabulary for bounded strings: single bytes, words of 2 to 50 letters (longer than some bounds, so an item's
// analysis meets paths that use up all of its items), and tokens with escapes, multi-byte characters and closing
// quotes in the middle or at the end.
TokenVocab bounded_strings_vocab(std::mt19937& rng) {
    std::vector<std::string> tokens = {"<eos>"};
    for (int c = 0x20; c < 0x7F; ++c) tokens.emplace_back(1, static_cast<char>(c));
    for (const char* t : {"\\n",
                          "\\u00e9",
                          "\\\"",
                          "a\\",
                          "\\u",
                          "\\u00",
                          "ab\\t",
                          "x\\\"y\"",
                          "\xC3\xA9",
                          "\xE4\xB8\xAD",
                          "\xE4",
                          "\xB8\xAD",
                          "ab\xC3",
                          "\xA9"
                          "cd",
                          "\"",
                          "\",",
                          "\"}",
                          "\"]",
                          "ab\"",
                          "abc\",",
                          "a\"}",
                          "\",\"",
                          "\":",
                          "\": \"",
                          "\"a",
                          "\"\"",
                          "\n",
                          "a\nb",
                          "\t"})
        tokens.emplace_back(t);
    for (const char* t : {"cc", "ccx", "bccx"}) tokens.emplace_back(t);  // an item, then what follows the repeat
    for (int t = 0; t < 400; ++t) {
        std::string s;
        const size_t len = t < 40 ? 20 + rng() % 31 : 2 + rng() % 8;
        while (s.size() < len) {
            const auto r = rng() % 40;
            if (r == 0)
                s += "\"";
            else if (r == 1)
                s += "\\n";
            else if (r == 2)
                s += "\xC3\xA9";
            else
                s += static_cast<char>('a' + rng() % 6);
        }
        tokens.push_back(s);
    }
    return TokenVocab(tokens, {0});
}

// Matcher::repetition finds the bounded repetitions Builder::repeat writes (counted rules): before one, or at one
// of its counts; never where bytes could split into items two ways.
TEST(MaskCache, RepetitionsOfOneItem) {
    const auto repetitions = [](const Grammar& g, std::string_view text) {
        Matcher m(g);
        EXPECT_TRUE(m.advance(text)) << text;
        std::vector<uint32_t> kernel;
        m.kernel_positions(kernel);
        std::vector<std::pair<uint32_t, uint32_t>> out;
        for (const uint32_t pos : kernel) {
            Matcher::Repetition r{};
            if (m.repetition(pos, r)) out.emplace_back(r.min, r.max);
        }
        return out;
    };
    using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
    const Grammar five = compile_json_schema(R"({"type":"string","maxLength":5})");
    EXPECT_EQ(repetitions(five, "\""), (Ranges{{0, 5}}));
    EXPECT_EQ(repetitions(five, "\"ab"), (Ranges{{0, 3}}));
    EXPECT_EQ(repetitions(five, "\"a\\u00"), Ranges{});  // inside an escape: the item's own positions
    const Grammar two_six = compile_json_schema(R"({"type":"string","minLength":2,"maxLength":6})");
    EXPECT_EQ(repetitions(two_six, "\""), (Ranges{{2, 6}}));
    EXPECT_EQ(repetitions(two_six, "\"a"), (Ranges{{1, 5}}));
    EXPECT_EQ(repetitions(two_six, "\"ab"), (Ranges{{0, 4}}));
    const Grammar large = compile_json_schema(R"({"type":"string","minLength":3,"maxLength":65535})");
    EXPECT_EQ(repetitions(large, "\"abcd"), (Ranges{{0, 65531}}));
    EXPECT_EQ(repetitions(compile_regex("[a-c]{0,5}x"), "ab"), (Ranges{{0, 3}}));
    EXPECT_EQ(repetitions(compile_regex("[a-c]{4}x"), "a"), (Ranges{{3, 3}}));  // an exact count
    EXPECT_EQ(repetitions(compile_regex("(a|ab){0,5}"), "ab"), Ranges{});  // "ab" is one item or two
    EXPECT_EQ(repetitions(compile_regex("(a|b)*"), "ab"), Ranges{});       // unbounded
    // The counted rule alone, read up to its max and no further, accepting after every item (below min too): a
    // matcher that stops there. The closing quote follows the rule in the string's production.
    Matcher m(five);
    std::vector<uint32_t> kernel;
    ASSERT_TRUE(m.advance("\""));
    m.kernel_positions(kernel);
    Matcher::Repetition r{};
    ASSERT_TRUE(m.repetition(kernel[0], r));
    Matcher items = m.at_position(r.rule_start, r.rule_end), rest = m.at_position(kernel[0]);
    EXPECT_TRUE(items.accepting());
    EXPECT_TRUE(items.advance("abcde"));
    EXPECT_TRUE(items.accepting());
    EXPECT_FALSE(items.advance("f"));   // five items at most
    EXPECT_FALSE(items.advance("\""));  // what follows the rule is not read
    EXPECT_TRUE(rest.advance("abcde\""));
    EXPECT_TRUE(rest.accepting());
    EXPECT_NE(items.state_key(), m.at_position(r.rule_start).state_key());
    EXPECT_THROW(m.at_position(r.rule_start, r.rule_start), std::out_of_range);
    EXPECT_THROW(m.at_position(r.rule_start, r.rule_end + 1), std::out_of_range);
    Matcher m2(two_six);
    ASSERT_TRUE(m2.advance("\""));
    m2.kernel_positions(kernel);
    ASSERT_TRUE(m2.repetition(kernel[0], r));
    Matcher all = m2.at_position(r.rule_start, r.rule_end), from_min = m2.at_position(r.rule_start);
    EXPECT_TRUE(all.accepting());
    EXPECT_FALSE(from_min.accepting());
    ASSERT_TRUE(all.advance("a") && from_min.advance("a"));
    EXPECT_TRUE(all.accepting());
    EXPECT_FALSE(from_min.accepting());
    EXPECT_NE(all.state_key(), from_min.state_key());
    ASSERT_TRUE(all.advance("bcdef") && from_min.advance("bcdef"));
    EXPECT_TRUE(all.accepting() && from_min.accepting());
    EXPECT_FALSE(all.advance("g") || from_min.advance("g"));
}

// Masks of bounded strings put together from their item's one analysis equal the plain walk: several bounds,
// minLength, strings in arrays and objects, tokens that cross the closing quote, escapes, multi-byte characters,
// and an analysis made for a small bound serving larger ones.
TEST(MaskCache, BoundedStringsMatchTheWalk) {
    std::mt19937 rng(17);
    const TokenVocab vocab = bounded_strings_vocab(rng);
    const std::vector<std::string> schemas = {
        R"({"type":"string","maxLength":3})",
        R"({"type":"string","maxLength":1})",
        R"({"type":"string","minLength":2,"maxLength":5})",
        R"({"type":"string","minLength":4,"maxLength":60})",
        R"({"type":"array","items":{"type":"string","maxLength":12}})",
        R"({"type":"object","properties":{"a":{"type":"string","maxLength":2},"b":{"type":"string","minLength":1,)"
        R"("maxLength":30},"c":{"type":"string","format":"email"}},"required":["a","b","c"]})",
    };
    for (const std::string& schema : schemas) {
        const Grammar g = compile_json_schema(schema);
        MaskCache cache(0);  // keeps no masks: every state is put together from its positions
        expect_cached_masks_match(g, vocab, rng, 12, 30, cache);
        if (HasFatalFailure()) return;
    }
    EXPECT_GE(vocab.n_item_analyses(), 1u);
}

// Repetitions of a byte class (analysed from the trie alone) or of a longer item, small bounds among them, and
// followed by what may read the same bytes (a token then leaves the repetition where it could have gone on); [a-c]'s
// analysis is made for 8 items and serves 1 and 2. Random walks, and every prefix of a text, twice (the first time a
// state may meet several new positions and walk itself instead).
TEST(MaskCache, ByteClassRepetitionsMatchTheWalk) {
    std::mt19937 rng(17);
    const TokenVocab vocab = bounded_strings_vocab(rng);
    const std::pair<const char*, const char*> patterns[] = {
        {"[a-c]{0,9}z", "abcabcz"},
        {"[a-c]{0,2}[b-e]{0,3}x", "abbcdx"},
        {"[a-f]{1,3}[a-z]*", "fedcbaz"},
        {"[a-d]{2,40}\"?[a-f]{0,3}", "abcdabcdabcdaa\"ef"},
        {"[a-e]{0,1}[a-f]{1,2}\"", "af\""},
        {"(x|[a-c]{1,3})[c-f]{0,4}\"?", "abcdef\""},
        // An item of several bytes (walked through the matcher), followed by what reads its bytes too.
        {"(ab|c){0,7}z", "abcabz"},
        {"(ab|c){0,2}[a-c]{0,4}x", "abcabx"},
        {"(ab|c){0,2}cx", "abccx"}};
    for (const auto& [pattern, text] : patterns) {
        const Grammar g = compile_regex(pattern);
        MaskCache cache(0);
        const std::string_view t(text);
        for (size_t i = 0; i <= 2 * t.size() + 1; ++i) {
            Matcher m(g);
            ASSERT_TRUE(m.advance(t.substr(0, i % (t.size() + 1)))) << pattern;
            TokenMask plain, composed;
            vocab.fill_mask(m, plain);
            vocab.fill_mask(m, composed, &cache);
            EXPECT_EQ(composed.words, plain.words) << pattern << " after " << i % (t.size() + 1) << " bytes";
        }
        expect_cached_masks_match(g, vocab, rng, 12, 20, cache);
        if (HasFatalFailure()) return;
    }
}

std::vector<uint64_t> kernel_shapes(const Grammar& g, std::string_view text) {
    Matcher m(g);
    EXPECT_TRUE(m.advance(text)) << text;
    std::vector<uint32_t> kernel;
    m.kernel_positions(kernel);
    std::vector<uint64_t> shapes;
    for (const uint32_t pos : kernel) shapes.push_back(m.position_shape(pos));
    std::sort(shapes.begin(), shapes.end());
    return shapes;
}

bool share_a_shape(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    for (const uint64_t x : a)
        if (x != 0 && std::binary_search(b.begin(), b.end(), x)) return true;
    return false;
}

// Position shapes are the grammar's structure: equal for the same piece in different grammars (a string's body in
// any schema, in the JSON-object grammar), different where the structure differs (a bound one character apart).
TEST(MaskCache, PositionShapesFollowTheStructure) {
    const Grammar a = compile_json_schema(R"({"type":"object","properties":{"x":{"type":"string"}}})");
    const Grammar b = compile_json_schema(R"({"type":"array","items":{"type":"string"}})");
    const Grammar any = json_object_grammar();
    const auto in_a = kernel_shapes(a, "{\"x\": \"ab");
    const auto in_b = kernel_shapes(b, "[\"ab");
    const auto in_any = kernel_shapes(any, "{\"k\": \"ab");
    EXPECT_EQ(kernel_shapes(a, "{\"x\": \"abc"), in_a);
    EXPECT_TRUE(share_a_shape(in_a, in_b));
    EXPECT_TRUE(share_a_shape(in_a, in_any));
    const Grammar five = compile_json_schema(R"({"type":"string","maxLength":5})");
    const Grammar six = compile_json_schema(R"({"type":"string","maxLength":6})");
    // After the opening quote: the body (bounds differ) and, over the nullable body, the closing quote (the same).
    const auto in_five = kernel_shapes(five, "\""), in_six = kernel_shapes(six, "\"");
    ASSERT_EQ(in_five.size(), 2u);
    ASSERT_EQ(in_six.size(), 2u);
    EXPECT_TRUE(share_a_shape(in_five, in_six));
    EXPECT_NE(in_five, in_six);
}

// kernel_positions() and at_position(): the start's kernel is one position; inside a production, a matcher started
// at a kernel position reads the rest of that production alone and accepts where it completes.
TEST(MaskCache, MatcherStartedInsideAProduction) {
    const Grammar g = parse_gbnf("root ::= \"x\" inner \"y\" \"z\"\ninner ::= \"a\" inner | \"\"\n");
    Matcher m(g);
    std::vector<uint32_t> kernel;
    m.kernel_positions(kernel);
    ASSERT_EQ(kernel.size(), 1u);
    ASSERT_TRUE(m.advance("xaa"));
    m.kernel_positions(kernel);
    ASSERT_FALSE(kernel.empty());
    // Two kernel positions: the rest of root after inner ("yz", complete after z) and the rest of inner's
    // production after an "a" (more a's, complete anywhere, "y" belongs to the context).
    bool rest_of_root = false, rest_of_inner = false;
    for (const uint32_t pos : kernel) {
        Matcher inner = m.at_position(pos);
        EXPECT_EQ(inner.position(), 0u);
        if (inner.advance("yz")) {
            rest_of_root = true;
            EXPECT_TRUE(inner.accepting());
            EXPECT_TRUE(inner.allowed().empty());
            inner.reset();
            EXPECT_EQ(inner.position(), 0u);
            EXPECT_FALSE(inner.advance("yzz"));
            EXPECT_THROW(inner.rollback(1), std::out_of_range);
        } else if (inner.advance("aaa")) {
            rest_of_inner = true;
            EXPECT_TRUE(inner.accepting());
            EXPECT_FALSE(inner.advance("y"));
        }
    }
    EXPECT_TRUE(rest_of_root);
    EXPECT_TRUE(rest_of_inner);
}

TEST(MaskCache, EvictsTheLeastRecentlyUsed) {
    MaskCache cache(2);
    TokenMask a, b, c, out;
    a.words = {1};
    b.words = {2};
    c.words = {3};
    cache.insert(10, a);
    cache.insert(20, b);
    ASSERT_TRUE(cache.find(10, out));  // 10 is now the most recent
    cache.insert(30, c);               // evicts 20
    EXPECT_FALSE(cache.find(20, out));
    ASSERT_TRUE(cache.find(10, out));
    EXPECT_EQ(out.words, a.words);
    ASSERT_TRUE(cache.find(30, out));
    EXPECT_EQ(out.words, c.words);
    EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace megactx::grammar
