// Tokenizer unit tests on small tokenizer.json files built here, one component at a time.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "model/gen_model.h"
#include "model/gen_tokenizer.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace megactx {
namespace {

using json = nlohmann::json;

// The byte-level alphabet at ids 0..255 plus `extra` tokens, merges as given.
json byte_level_vocab(const std::vector<std::string>& extra = {}) {
    json v = json::object();
    const auto& b = utf8::byte_to_unicode();
    for (int i = 0; i < 256; ++i) v[b[i]] = i;
    int next = 256;
    for (const auto& e : extra) v[e] = next++;
    return v;
}

json byte_level_tokenizer(const json& merges, const std::vector<std::string>& extra = {}) {
    return {{"version", "1.0"},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"added_tokens", json::array()},
            {"model", {{"type", "BPE"}, {"vocab", byte_level_vocab(extra)}, {"merges", merges}}}};
}

Tokenizer make(const json& j) { return Tokenizer::from_json(j.dump(), {}, "test.json"); }

int32_t byte_id(unsigned char c) { return c; }  // the alphabet sits at ids 0..255 in byte order

std::vector<std::string> pieces(const json& pre, std::string_view text) {
    tok::PreTokenizer p;
    p.build(pre, "test.json");
    std::deque<std::string> scratch;
    std::vector<std::string_view> out;
    p.run(text, out, scratch);
    return {out.begin(), out.end()};
}

json split(const std::string& pattern, const std::string& behavior, bool invert = false, bool literal = false) {
    return {{"type", "Split"},
            {"pattern", {{literal ? "String" : "Regex", pattern}}},
            {"behavior", behavior},
            {"invert", invert}};
}

using Strs = std::vector<std::string>;

TEST(TokenizerPre, SplitBehaviours) {
    EXPECT_EQ(pieces(split("-", "Isolated", false, true), "a-b--c"), (Strs{"a", "-", "b", "-", "-", "c"}));
    EXPECT_EQ(pieces(split("-", "Removed", false, true), "a-b--c"), (Strs{"a", "b", "c"}));
    EXPECT_EQ(pieces(split("-", "MergedWithPrevious", false, true), "a-b--c"), (Strs{"a-", "b-", "-", "c"}));
    EXPECT_EQ(pieces(split("-", "MergedWithNext", false, true), "a-b--c"), (Strs{"a", "-b", "-", "-c"}));
    EXPECT_EQ(pieces(split("-", "Contiguous", false, true), "a-b--c"), (Strs{"a", "-", "b", "--", "c"}));
    // A String pattern is literal: "." is not "any character".
    EXPECT_EQ(pieces(split(".", "Isolated", false, true), "a.b"), (Strs{"a", ".", "b"}));
    EXPECT_EQ(pieces(split(".", "Isolated"), "ab"), (Strs{"a", "b"}));
}

TEST(TokenizerPre, SplitInvert) {
    // Inverted, the matches are the content and the rest the delimiters.
    EXPECT_EQ(pieces(split("[a-z]+", "Removed", true), "ab, cd!"), (Strs{"ab", "cd"}));
    EXPECT_EQ(pieces(split("[a-z]+", "Removed", false), "ab, cd!"), (Strs{", ", "!"}));
    EXPECT_EQ(pieces(split("[a-z]+", "MergedWithPrevious", true), "ab, cd!"), (Strs{"ab, ", "cd!"}));
    EXPECT_EQ(pieces(split("[a-z]+", "Isolated", true), "ab, cd!"), (Strs{"ab", ", ", "cd", "!"}));
}

TEST(TokenizerPre, OnigurumaConstructsCompileWithPcre2) {
    // The GPT-2 / GLM-4 / DeepSeek constructs: \p{..}, (?i:..), \s+(?!\S), \uHHHH.
    const json glm = split(
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        "Isolated");
    EXPECT_EQ(pieces(glm, "He'S 12345 ok!!\n\n  x"),
              (Strs{"He", "'S", " ", "123", "45", " ok", "!!\n\n", " ", " x"}));
    EXPECT_EQ(pieces(split("\\u00e9+", "Isolated"), "a\xC3\xA9\xC3\xA9" "b"), (Strs{"a", "\xC3\xA9\xC3\xA9", "b"}));
    // \s is Unicode White_Space, including U+0085 (as in Oniguruma), which PCRE2's own \s leaves out.
    EXPECT_EQ(pieces(split("\\s+", "Removed"), "a\xC2\x85" "b\xE3\x80\x80" "c"), (Strs{"a", "b", "c"}));
}

TEST(TokenizerPre, ByteLevelRegexAndPrefixSpace) {
    const json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    EXPECT_EQ(pieces(bl, "Hello  world's 42"), (Strs{"Hello", " ", " world", "'s", " 42"}));
    json pre = bl;
    pre["add_prefix_space"] = true;
    EXPECT_EQ(pieces(pre, "Hello"), (Strs{" Hello"}));
    EXPECT_EQ(pieces(pre, " Hello"), (Strs{" Hello"}));
    pre["use_regex"] = false;
    EXPECT_EQ(pieces(pre, "a b"), (Strs{" a b"}));
}

TEST(TokenizerPre, DigitsAndSequence) {
    EXPECT_EQ(pieces({{"type", "Digits"}, {"individual_digits", true}}, "ab123c"), (Strs{"ab", "1", "2", "3", "c"}));
    EXPECT_EQ(pieces({{"type", "Digits"}, {"individual_digits", false}}, "ab123c"), (Strs{"ab", "123", "c"}));
    const json seq = {{"type", "Sequence"},
                      {"pretokenizers",
                       {split(" ", "Removed", false, true), {{"type", "Digits"}, {"individual_digits", true}}}}};
    EXPECT_EQ(pieces(seq, "x12 y3"), (Strs{"x", "1", "2", "y", "3"}));
}

TEST(TokenizerBpe, MergesInBothFormsGiveTheSameIds) {
    const Strs extra = {"he", "ll", "hell", "hello"};
    const Tokenizer a = make(byte_level_tokenizer({"h e", "l l", "he ll", "hell o"}, extra));
    const Tokenizer b = make(byte_level_tokenizer(json::parse(R"([["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"]])"), extra));
    EXPECT_EQ(a.encode("hello"), (std::vector<int32_t>{259}));
    EXPECT_EQ(b.encode("hello"), a.encode("hello"));
    EXPECT_EQ(a.encode("helo"), (std::vector<int32_t>{256, byte_id('l'), byte_id('o')}));
    EXPECT_EQ(a.token_id("hello"), 259);
    EXPECT_EQ(a.token_str(259), "hello");
    EXPECT_EQ(a.decode(a.encode("hello hell")), "hello hell");
}

TEST(TokenizerBpe, LowestRankFirstThenLeftmost) {
    // "l l" ranks before "e l": "ell" merges its right pair first.
    const Tokenizer t = make(byte_level_tokenizer({"l l", "e l"}, {"ll", "el"}));
    EXPECT_EQ(t.encode("ell"), (std::vector<int32_t>{byte_id('e'), 256}));
    // Equal ranks: leftmost first.
    const Tokenizer u = make(byte_level_tokenizer({"a a"}, {"aa"}));
    EXPECT_EQ(u.encode("aaa"), (std::vector<int32_t>{256, byte_id('a')}));
}

TEST(TokenizerBpe, LongWordsTakeTheHeapPathWithTheSameResult) {
    const Tokenizer t = make(byte_level_tokenizer({"a a", "aa aa"}, {"aa", "aaaa"}));
    std::vector<int32_t> expect(25, 257);
    expect.push_back(byte_id('a'));
    EXPECT_EQ(t.encode(std::string(101, 'a')), expect);  // heap version (> 48 symbols)
    EXPECT_EQ(t.encode(std::string(41, 'a')), std::vector<int32_t>(expect.end() - 11, expect.end()));
}

TEST(TokenizerBpe, IgnoreMerges) {
    json j = byte_level_tokenizer(json::array(), {"abc"});
    EXPECT_EQ(make(j).encode("abc"), (std::vector<int32_t>{byte_id('a'), byte_id('b'), byte_id('c')}));
    j["model"]["ignore_merges"] = true;
    EXPECT_EQ(make(j).encode("abc"), (std::vector<int32_t>{256}));
}

json char_level_tokenizer(bool byte_fallback) {
    return {{"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
            {"model",
             {{"type", "BPE"},
              {"byte_fallback", byte_fallback},
              {"fuse_unk", true},
              {"unk_token", "<unk>"},
              {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"<0xC3>", 4}, {"<0xA9>", 5}}},
              {"merges", {"a b"}}}}};
}

TEST(TokenizerBpe, ByteFallbackAndUnk) {
    const Tokenizer fb = make(char_level_tokenizer(true));
    EXPECT_EQ(fb.encode("ab\xC3\xA9"), (std::vector<int32_t>{3, 4, 5}));
    EXPECT_EQ(fb.decode(fb.encode("ab\xC3\xA9")), "ab\xC3\xA9");
    // Without byte fallback, unknown characters become <unk>, consecutive ones fused.
    const Tokenizer unk = make(char_level_tokenizer(false));
    EXPECT_EQ(unk.encode("a\xC3\xA9\xC3\xA9" "b"), (std::vector<int32_t>{1, 0, 2}));
}

json with_added(json j, const json& added) {
    j["added_tokens"] = added;
    return j;
}

json added_token(int id, const std::string& content, bool special, json flags = json::object()) {
    json a = {{"id", id},         {"content", content}, {"special", special},   {"lstrip", false},
              {"rstrip", false}, {"single_word", false}, {"normalized", !special}};
    a.update(flags);
    return a;
}

TEST(TokenizerAdded, LeftmostThenLongest) {
    const Tokenizer t = make(with_added(byte_level_tokenizer(json::array()),
                                        {added_token(300, "<a>", true), added_token(301, "<a><b>", true),
                                         added_token(302, "xy", false), added_token(303, "yz", false)}));
    EXPECT_EQ(t.encode("<a><b>"), (std::vector<int32_t>{301}));
    EXPECT_EQ(t.encode("<a><c>"), (std::vector<int32_t>{300, byte_id('<'), byte_id('c'), byte_id('>')}));
    EXPECT_EQ(t.encode("xyz"), (std::vector<int32_t>{302, byte_id('z')}));
    EXPECT_EQ(t.vocab_size(), 304u);
    EXPECT_TRUE(t.is_special(300));
    EXPECT_FALSE(t.is_special(302));
    EXPECT_TRUE(t.is_added(302));
}

TEST(TokenizerAdded, StripAndSingleWordFlags) {
    const json base = byte_level_tokenizer(json::array());
    const Tokenizer l = make(with_added(base, json::array({added_token(300, "<t>", true, {{"lstrip", true}})})));
    EXPECT_EQ(l.encode("a  <t> b"), (std::vector<int32_t>{byte_id('a'), 300, byte_id(' '), byte_id('b')}));
    const Tokenizer r = make(with_added(base, json::array({added_token(300, "<t>", true, {{"rstrip", true}})})));
    EXPECT_EQ(r.encode("a <t>  b"), (std::vector<int32_t>{byte_id('a'), byte_id(' '), 300, byte_id('b')}));
    const Tokenizer w = make(with_added(base, json::array({added_token(300, "tok", false, {{"single_word", true}})})));
    EXPECT_EQ(w.encode("a tok b"), (std::vector<int32_t>{byte_id('a'), byte_id(' '), 300, byte_id(' '), byte_id('b')}));
    EXPECT_EQ(w.encode("atok"), (std::vector<int32_t>{byte_id('a'), byte_id('t'), byte_id('o'), byte_id('k')}));
}

TEST(TokenizerAdded, NormalizedTokensMatchAfterNormalization) {
    json j = with_added(byte_level_tokenizer(json::array()),
                        {added_token(300, "\xC3\xA9t\xC3\xA9", false, {{"normalized", true}}),
                         added_token(301, "e\xCC\x81!", true, {{"normalized", false}})});
    j["normalizer"] = {{"type", "NFC"}};
    const Tokenizer t = make(j);
    // Decomposed "été" becomes the normalized token's content under NFC...
    EXPECT_EQ(t.encode("e\xCC\x81te\xCC\x81", false), (std::vector<int32_t>{300}));
    // ...while an unnormalized token is matched on the raw text, before normalization could change it.
    EXPECT_EQ(t.encode("e\xCC\x81!", false), (std::vector<int32_t>{301}));
    EXPECT_EQ(t.encode("\xC3\xA9!", false), (std::vector<int32_t>{0xC3, 0xA9, '!'}));
}

TEST(TokenizerNormalizer, NfcNfdAndSequence) {
    json j = byte_level_tokenizer(json::array());
    j["normalizer"] = {{"type", "NFC"}};
    const Tokenizer nfc = make(j);
    EXPECT_EQ(nfc.encode("e\xCC\x81"), (std::vector<int32_t>{0xC3, 0xA9}));
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}}}};
    EXPECT_EQ(make(j).encode("\xC3\xA9"), (std::vector<int32_t>{'e', 0xCC, 0x81}));
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
    EXPECT_EQ(make(j).encode("e\xCC\x81"), (std::vector<int32_t>{'e', 0xCC, 0x81}));
}

TEST(TokenizerPost, TemplateProcessingAndSequence) {
    json j = with_added(byte_level_tokenizer(json::array()),
                        {added_token(300, "<s>", true), added_token(301, "</s>", true)});
    // The "</s>" entry has no special_tokens row: its id comes from the added tokens.
    j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
        {"type": "ByteLevel", "trim_offsets": false},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "</s>", "type_id": 0}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}}]})");
    const Tokenizer t = make(j);
    EXPECT_EQ(t.encode("a"), (std::vector<int32_t>{300, 'a', 301}));
    EXPECT_EQ(t.encode("a", false), (std::vector<int32_t>{'a'}));
    EXPECT_EQ(t.decode(t.encode("a"), true), "a");
    EXPECT_EQ(t.decode(t.encode("a"), false), "<s>a</s>");
}

TEST(TokenizerDecode, ByteLevelSkipSpecialAndAddedTokens) {
    const Tokenizer t = make(with_added(byte_level_tokenizer({"\xC4\xA0 h"}, {"\xC4\xA0h"}),
                                        {added_token(300, "<|user|>", true), added_token(301, "<think>", false)}));
    const auto ids = t.encode("<|user|> hi<think>");
    EXPECT_EQ(ids, (std::vector<int32_t>{300, 256, 'i', 301}));
    EXPECT_EQ(t.token_str(256), "\xC4\xA0h");  // "Ġh"
    EXPECT_EQ(t.decode(ids), "<|user|> hi<think>");
    EXPECT_EQ(t.decode(ids, true), " hi<think>");  // only special tokens are skipped
}

TEST(TokenizerDecode, InvalidUtf8OutBecomesReplacement) {
    const Tokenizer t = make(byte_level_tokenizer(json::array()));
    EXPECT_EQ(t.decode(std::vector<int32_t>{0xE4, 0xBD}), "\xEF\xBF\xBD");          // truncated: one U+FFFD
    EXPECT_EQ(t.decode(std::vector<int32_t>{0xE4, 0xBD, 'a'}), "\xEF\xBF\xBD" "a");
    EXPECT_EQ(t.decode(std::vector<int32_t>{0xFF, 0xC0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(t.decode(std::vector<int32_t>{0xED, 0xA0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
    EXPECT_THROW(t.decode(std::vector<int32_t>{256}), Error);
    EXPECT_THROW(t.decode(std::vector<int32_t>{-1}), Error);
    EXPECT_THROW(t.token_str(1000), Error);
}

TEST(TokenizerEncode, InvalidUtf8InIsReplacedFirst) {
    const Tokenizer t = make(byte_level_tokenizer(json::array()));
    EXPECT_EQ(t.encode("a\xFF" "b"), t.encode("a\xEF\xBF\xBD" "b"));
    EXPECT_EQ(t.encode("a\xE4\xBD"), t.encode("a\xEF\xBF\xBD"));
    EXPECT_EQ(t.encode(std::string("a\0b", 3)), (std::vector<int32_t>{'a', 0, 'b'}));
    EXPECT_TRUE(t.encode("").empty());
}

TEST(TokenizerStream, MultiByteCharactersSplitAcrossTokens) {
    const Tokenizer t = make(with_added(byte_level_tokenizer(json::array()), json::array({added_token(300, "<x>", false)})));
    const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80<x>\xE4\xBD\xA0";
    const auto ids = t.encode(text);
    StreamDecoder sd(t);
    std::string all;
    std::vector<std::string> parts;
    for (int32_t id : ids) {
        parts.push_back(sd.push(id));
        EXPECT_TRUE(utf8::is_valid(parts.back())) << "partial character emitted";
        all += parts.back();
    }
    all += sd.flush();
    EXPECT_EQ(all, text);
    EXPECT_EQ(parts[1], "");                  // first byte of é held back
    EXPECT_EQ(parts[2], "\xC3\xA9");
    // An incomplete character before an added token, or at the end, becomes U+FFFD just as decode() says.
    const std::vector<int32_t> broken = {0xE4, 0xBD, 300, 0xF0, 0x9F};
    StreamDecoder sd2(t);
    std::string out;
    for (int32_t id : broken) out += sd2.push(id);
    out += sd2.flush();
    EXPECT_EQ(out, t.decode(broken));
    EXPECT_EQ(out, "\xEF\xBF\xBD<x>\xEF\xBF\xBD");
}

void expect_error(json j, const std::string& what) {
    try {
        make(j);
        FAIL() << "expected an error naming " << what;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("test.json"), std::string::npos) << e.what();
    }
}

TEST(TokenizerLoad, UnsupportedComponentsAreClearErrors) {
    const json base = byte_level_tokenizer(json::array());
    json j = base;
    j["normalizer"] = {{"type", "Lowercase"}};
    expect_error(j, "Lowercase");
    j = base;
    j["pre_tokenizer"] = {{"type", "Metaspace"}};
    expect_error(j, "Metaspace");
    j = base;
    j["model"]["type"] = "WordPiece";
    expect_error(j, "WordPiece");
    j = base;
    j["decoder"] = {{"type", "WordPiece"}};
    expect_error(j, "WordPiece");
    j = base;
    j["post_processor"] = {{"type", "RobertaProcessing"}};
    expect_error(j, "RobertaProcessing");
    j = base;
    j["model"]["merges"] = {"a zz"};
    expect_error(j, "merges[0]");
    j = base;
    j["pre_tokenizer"] = split("(", "Isolated");
    expect_error(j, "cannot compile regex");
    EXPECT_THROW(Tokenizer::from_json("{not json", {}, "test.json"), Error);
    EXPECT_THROW(Tokenizer::load("/nonexistent/dir"), Error);
}

TEST(TokenizerLoad, DirectoryFileAndConfig) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / "megactx_tok_test";
    fs::create_directories(dir);
    json j = with_added(byte_level_tokenizer(json::array()), json::array({added_token(300, "<eos>", true)}));
    std::ofstream(dir / "tokenizer.json") << j.dump();
    std::ofstream(dir / "tokenizer_config.json")
        << json({{"eos_token", {{"content", "<eos>"}}}, {"pad_token", "<eos>"}, {"chat_template", "{{ x }}"}}).dump();
    for (const fs::path& p : {dir, dir / "tokenizer.json"}) {
        const Tokenizer t = Tokenizer::load(p.string());
        EXPECT_EQ(t.eos_id(), 300);
        EXPECT_EQ(t.pad_id(), 300);
        EXPECT_EQ(t.bos_id(), -1);
        EXPECT_EQ(t.eos_token(), "<eos>");
        EXPECT_TRUE(t.has_chat_template());
        EXPECT_EQ(t.chat_template(), "{{ x }}");
    }
    fs::remove_all(dir);
}

// BPE training by its definition: every pair recounted over every word for each merge; the most frequent pair
// wins, ties go to the smallest (a, b); stop when no pair occurs twice. Returns {vocab, merges}.
std::pair<json, json> naive_bpe(const std::vector<std::string>& pieces, size_t max_merges) {
    const auto& bytes = utf8::byte_to_unicode();
    std::map<std::string, int64_t> counts;
    for (const auto& p : pieces) ++counts[p];
    std::vector<std::pair<std::vector<std::string>, int64_t>> words;
    for (const auto& [w, c] : counts) {
        std::vector<std::string> syms;
        for (char ch : w) syms.push_back(bytes[static_cast<unsigned char>(ch)]);
        words.push_back({syms, c});
    }
    json vocab = json::object(), merges = json::array();
    int32_t next_id = 0;
    for (int b = 0; b < 256; ++b) vocab[bytes[b]] = next_id++;
    while (merges.size() < max_merges) {
        std::map<std::pair<std::string, std::string>, int64_t> pairs;
        for (const auto& [syms, c] : words) {
            for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += c;
        }
        std::pair<std::string, std::string> best;
        int64_t best_count = 1;
        for (const auto& [p, c] : pairs) {
            if (c > best_count) {  // strict: the first, smallest, pair keeps a tie
                best = p;
                best_count = c;
            }
        }
        if (best_count <= 1) break;
        const auto& [a, b] = best;
        merges.push_back({a, b});
        if (!vocab.contains(a + b)) vocab[a + b] = next_id++;
        for (auto& [syms, c] : words) {
            std::vector<std::string> out;
            for (size_t i = 0; i < syms.size(); ++i) {
                const bool merge = i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b;
                out.push_back(merge ? a + b : syms[i]);
                i += merge;
            }
            syms = out;
        }
    }
    return {vocab, merges};
}

// Random text from pieces that stress the trainer (separated by '|'): repeated words, accents, Cyrillic, CJK,
// emoji, runs of one letter ("aaaa", whose pairs overlap), alternations ("ababab"), digit runs, whitespace runs
// with tabs and CRLF, punctuation.
std::string random_corpus(uint32_t seed, size_t n_pieces) {
    constexpr std::string_view kParts =
        "the| the|model| token|tokens|and| of|'s|'ll|"
        "caf\u00e9| na\u00efve|\u00fcber|\u043f\u0440\u0438\u0432\u0435\u0442| "
        "\u043c\u0438\u0440|\u6f22\u5b57|\u65e5\u672c\u8a9e|"
        "\U0001F600|\U0001F44D\U0001F3FD|\u00a0|"
        "a|aa|aaa|aaaa|ab|abab|ababab|ba|x|y|z|xyz|"
        "0|7|42|123|2048|65536|"
        " |  |    |\t|\n|\r\n|\n\n| \n |"
        ".|,|!?|...|(|)|{}|=|->";
    std::vector<std::string_view> parts;
    for (size_t b = 0, e = 0; b <= kParts.size(); b = e + 1) {
        e = std::min(kParts.find('|', b), kParts.size());
        parts.push_back(kParts.substr(b, e - b));
    }
    std::mt19937 rng(seed);
    std::uniform_int_distribution<size_t> pick(0, parts.size() - 1);
    std::string text;
    for (size_t i = 0; i < n_pieces; ++i) text += parts[pick(rng)];
    return text;
}

std::vector<std::string> pieces_of(const json& pre, const std::vector<std::string>& texts) {
    std::vector<std::string> all;
    for (const auto& t : texts) {
        const auto p = pieces(pre, t);
        all.insert(all.end(), p.begin(), p.end());
    }
    return all;
}

void expect_same_as_naive(const json& pre, const std::vector<std::string>& texts, size_t max_merges,
                          const std::string& what) {
    BpeTrainer trainer(pre);
    for (const auto& t : texts) trainer.add_text(t);
    const json model = trainer.train(max_merges);
    const auto [vocab, merges] = naive_bpe(pieces_of(pre, texts), max_merges);
    EXPECT_EQ(model["type"], "BPE") << what;
    EXPECT_EQ(model["merges"], merges) << what;
    EXPECT_EQ(model["vocab"], vocab) << what;
}

TEST(TokenizerBpeTrain, HandCheckedMerges) {
    // "aaa", " aaa", " aaa": (a a) counts 6 with the overlaps, then (aa a) 3, then (Ġ aaa) 2.
    const json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    const json m = train_byte_level_bpe("aaa aaa aaa", gpt2, 100);
    EXPECT_EQ(m["merges"], json::parse(R"([["a", "a"], ["aa", "a"], ["Ġ", "aaa"]])"));
    EXPECT_EQ(m["vocab"]["aa"], 256);
    EXPECT_EQ(m["vocab"]["aaa"], 257);
    EXPECT_EQ(m["vocab"]["Ġaaa"], 258);
    EXPECT_EQ(m["vocab"].size(), 259u);
    // (a b) and (b a) both occur twice: the smaller pair goes first.
    const json words = {{"type", "Sequence"},
                        {"pretokenizers",
                         {split(" ", "Removed", false, true),
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    EXPECT_EQ(train_byte_level_bpe("ba ab ba ab", words, 100)["merges"], json::parse(R"([["a", "b"], ["b", "a"]])"));
    EXPECT_EQ(train_byte_level_bpe("ba ab ba ab", words, 1)["merges"], json::parse(R"([["a", "b"]])"));
    EXPECT_EQ(train_byte_level_bpe("ab cd", words, 100)["merges"], json::array());  // no pair occurs twice
}

// The incremental trainer gives exactly the merges and vocab of the definition, on seeded random corpora, with
// the GLM pre-tokenizer and GPT-2's ByteLevel (whose prefix space makes new strings), to the end and cut short.
TEST(TokenizerBpeTrain, SameAsTheDefinitionOnRandomCorpora) {
    const json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
    for (uint32_t seed = 1; seed <= 6; ++seed) {
        const std::string text = random_corpus(seed, 400 + 150 * seed);
        for (const json& pre : {glm_pre_tokenizer(), gpt2}) {
            for (size_t max_merges : {size_t{100000}, size_t{37}}) {
                expect_same_as_naive(pre, {text}, max_merges, "seed " + std::to_string(seed) + " " + pre.dump());
            }
        }
    }
    // Several texts count as one corpus whose pieces never span two texts.
    expect_same_as_naive(glm_pre_tokenizer(), {random_corpus(10, 300), random_corpus(11, 500), "", "  \n"}, 100000,
                         "several texts");
    // One word repeated: long runs of a single symbol and of a pair.
    expect_same_as_naive(glm_pre_tokenizer(), {std::string(300, 'a') + " " + std::string(301, 'a')}, 100000,
                         "runs of a");
    expect_same_as_naive(glm_pre_tokenizer(), {"abababababababab ababab abab ab"}, 100000, "alternation");
    expect_same_as_naive(glm_pre_tokenizer(), {std::string(200, ' ') + "x" + std::string(57, ' ')}, 100000, "spaces");
}

TEST(TokenizerGenModel, WritesAByteLevelTokenizerWithGlmSpecials) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / "megactx_tok_genmodel";
    fs::remove_all(dir);
    GenModelOptions o;
    generate_model(dir.string(), o);
    const Tokenizer t = Tokenizer::load(dir.string());
    const json config = json::parse(std::ifstream(dir / "config.json"));
    const int64_t vocab = config["vocab_size"].get<int64_t>();
    EXPECT_LE(t.vocab_size(), static_cast<size_t>(vocab));
    for (const char* s : {"<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>",
                          "<think>", "</think>", "<tool_call>", "</arg_value>", "<tool_response>"}) {
        EXPECT_GE(t.token_id(s), vocab - 64) << s;
    }
    EXPECT_EQ(config["eos_token_id"],
              json({t.token_id("<|endoftext|>"), t.token_id("<|user|>"), t.token_id("<|observation|>")}));
    const std::string text = "[gMASK]<sop><|user|>\nHello, world! The model writes code: x = 42;<|assistant|>";
    const auto ids = t.encode(text);
    EXPECT_LT(ids.size(), text.size() / 2);  // merges were learned
    EXPECT_EQ(t.decode(ids), text);
    EXPECT_EQ(t.eos_id(), t.token_id("<|endoftext|>"));
    fs::remove_all(dir);
}

// Runs a shell command, returning its stdout and setting `status` to the exit code.
std::string run(const std::string& cmd, int& status) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n = 0;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    status = WEXITSTATUS(pclose(p));
    return out;
}

TEST(TokenizerCli, TokenizeAndDetokenize) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / "megactx_tok_cli";
    fs::create_directories(dir);
    json j = with_added(byte_level_tokenizer({"h i"}, {"hi"}),
                        json::array({added_token(300, "<s>", true), added_token(301, "<x>", false)}));
    j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}})");
    std::ofstream(dir / "tokenizer.json") << j.dump();
    std::ofstream(dir / "lines.jsonl") << "\"hi\"\n\"<x>h\"\n";
    const std::string bin = MEGACTX_BIN, model = (dir / "tokenizer.json").string();
    int status = 0;
    EXPECT_EQ(run(bin + " tokenize --model " + dir.string() + " --text hi", status), "[300,256]\n");
    EXPECT_EQ(status, 0);
    EXPECT_EQ(run(bin + " tokenize --model " + model + " --text hi --no-special", status), "[256]\n");
    EXPECT_EQ(run(bin + " tokenize --model " + model + " --jsonl " + (dir / "lines.jsonl").string() + " --no-special",
                  status),
              "[256]\n[301,104]\n");
    EXPECT_EQ(run(bin + " detokenize --model " + model + " --ids 300,256,301", status), "<s>hi<x>");
    EXPECT_EQ(run(bin + " detokenize --model " + model + " --ids 300,256,301 --skip-special", status), "hi<x>");
    EXPECT_EQ(run(bin + " detokenize --model " + model + " --ids 300,999 2>&1", status),
              "megactx: error: " + model + ": token id 999 is not in the vocabulary (size 302)\n");
    EXPECT_EQ(status, 1);
    EXPECT_EQ(run(bin + " tokenize --model " + model + " 2>/dev/null", status), "");
    EXPECT_EQ(status, 1);
    fs::remove_all(dir);
}

}  // namespace
}  // namespace megactx
