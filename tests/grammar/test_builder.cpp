// The grammar IR and its builder: byte sets, repetition, UTF-8 ranges, validation, the GBNF printer.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "grammar/grammar.h"

namespace megactx::grammar {
namespace {

// Every string of at most `max_len` bytes that `sym` derives (a brute-force expansion for small grammars).
std::set<std::string> language(const Grammar& g, const Symbol& sym, size_t max_len) {
    std::function<std::set<std::string>(const Sequence&, size_t, size_t)> seq_lang;
    std::function<std::set<std::string>(const Symbol&, size_t)> sym_lang = [&](const Symbol& s, size_t depth) {
        std::set<std::string> out;
        if (depth > 12) return out;
        if (!s.is_rule()) {
            for (int b = 0; b < 256; ++b)
                if (s.bytes.has(static_cast<uint8_t>(b))) out.insert(std::string(1, static_cast<char>(b)));
            return out;
        }
        const Rule& rule = g.rules[static_cast<size_t>(s.rule)];
        if (rule.counted()) {  // item^k for k = min..max
            const Sequence item = rule.alternatives[0];
            Sequence power;
            for (uint32_t k = 0; k <= rule.max && power.size() <= max_len; ++k, power.push_back(item[0]))
                if (k >= rule.min)
                    for (const std::string& x : seq_lang(power, 0, depth + 1)) out.insert(x);
            return out;
        }
        for (const Sequence& alt : rule.alternatives)
            for (const std::string& x : seq_lang(alt, 0, depth + 1)) out.insert(x);
        return out;
    };
    seq_lang = [&](const Sequence& seq, size_t i, size_t depth) {
        std::set<std::string> out;
        if (i == seq.size()) return std::set<std::string>{""};
        for (const std::string& head : sym_lang(seq[i], depth))
            if (head.size() <= max_len)
                for (const std::string& tail : seq_lang(seq, i + 1, depth))
                    if (head.size() + tail.size() <= max_len) out.insert(head + tail);
        return out;
    };
    return sym_lang(sym, 0);
}

TEST(GrammarByteSet, RangesCountsAndComplement) {
    ByteSet s = ByteSet::range('a', 'z');
    EXPECT_EQ(s.count(), 26);
    EXPECT_TRUE(s.has('m'));
    EXPECT_FALSE(s.has('A'));
    s.add(0xFF);
    EXPECT_TRUE(s.has(0xFF));
    EXPECT_EQ(s.complement().count(), 256 - 27);
    EXPECT_TRUE(ByteSet{}.empty());
    EXPECT_EQ(ByteSet::any().count(), 256);
    EXPECT_EQ(s.intersect(ByteSet::range('x', 0xFF)).count(), 3 + 1);
}

TEST(GrammarBuilder, RepeatBoundsAreExact) {
    Builder b;
    const Symbol x = b.literal("ab");
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.repeat(x, 1, 3)});
    const Grammar g = b.finish(root);
    EXPECT_EQ(language(g, Symbol::ref(g.root), 8), (std::set<std::string>{"ab", "abab", "ababab"}));
}

TEST(GrammarBuilder, UnboundedAndOptional) {
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.literal("x"), b.repeat(b.literal("y"), 2, -1), b.optional(b.literal("z"))});
    const Grammar g = b.finish(root);
    EXPECT_EQ(language(g, Symbol::ref(g.root), 5),
              (std::set<std::string>{"xyy", "xyyy", "xyyyy", "xyyz", "xyyyz"}));
}

TEST(GrammarBuilder, Utf8RangeEncodesEveryCodePointOnce) {
    // U+00E0..U+0800 crosses the 2-/3-byte boundary: every code point's encoding and nothing else.
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.utf8_range(0x7F0, 0x801)});
    const Grammar g = b.finish(root);
    std::set<std::string> want;
    for (uint32_t cp = 0x7F0; cp <= 0x801; ++cp) {
        std::string e;
        if (cp < 0x800) {
            e += static_cast<char>(0xC0 | (cp >> 6));
        } else {
            e += static_cast<char>(0xE0 | (cp >> 12));
            e += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        }
        e += static_cast<char>(0x80 | (cp & 0x3F));
        want.insert(e);
    }
    EXPECT_EQ(language(g, Symbol::ref(g.root), 3), want);
}

TEST(GrammarBuilder, Utf8RangeSkipsSurrogates) {
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.utf8_range(0xD7FF, 0xE000)});
    const Grammar g = b.finish(root);
    EXPECT_EQ(language(g, Symbol::ref(g.root), 3), (std::set<std::string>{"\xED\x9F\xBF", "\xEE\x80\x80"}));
    Builder b2;
    EXPECT_THROW(b2.utf8_range(0xD800, 0xDFFF), GrammarError);
}

TEST(GrammarBuilder, ValidationNamesTheRule) {
    Builder b;
    const int32_t root = b.rule("root");
    const int32_t loop = b.rule("loop");
    b.add_alternative(loop, {b.literal("a"), Symbol::ref(loop)});  // never ends
    b.add_alternative(root, {Symbol::ref(loop)});
    try {
        b.finish(root);
        FAIL() << "no error";
    } catch (const GrammarError& e) {
        EXPECT_NE(std::string(e.what()).find("'loop'"), std::string::npos) << e.what();
    }
}

TEST(GrammarBuilder, SizeLimitIsAnError) {
    Builder b(1000);
    const int32_t root = b.rule("root");
    EXPECT_THROW(b.add_alternative(root, {b.literal(std::string(2000, 'a'))}), GrammarError);
}

// A bounded repetition is one counted rule whatever its bounds: {0,65535} costs what {0,5} does, and the size
// limit no longer refuses a large bound.
TEST(GrammarBuilder, BoundedRepeatIsOneCountedRule) {
    Builder b(1000);
    const int32_t root = b.rule("root");
    b.add_alternative(
        root, {b.literal("["), b.repeat(b.literal("ab"), 0, 65535), b.repeat(b.literal("c"), 7, 7), b.literal("]")});
    const Grammar g = b.finish(root);
    EXPECT_LE(g.rules.size(), 5u);
    EXPECT_LE(g.n_symbols(), 12);
    size_t n_counted = 0;
    for (const Rule& r : g.rules) n_counted += r.counted();
    EXPECT_EQ(n_counted, 2u);
    // {0,0} is ε, {1,1} the item itself; item{m,} is item{m,m} then a star.
    Builder b2;
    const int32_t root2 = b2.rule("root");
    const Symbol a = b2.literal("a");
    EXPECT_EQ(b2.repeat(a, 1, 1), a);
    b2.add_alternative(root2, {b2.repeat(a, 0, 0), b2.repeat(b2.literal("b"), 3, -1)});
    const Grammar g2 = b2.finish(root2);
    EXPECT_EQ(language(g2, Symbol::ref(g2.root), 5), (std::set<std::string>{"bbb", "bbbb", "bbbbb"}));
    EXPECT_THROW(b2.repeat(a, 0, Builder::kMaxRepeat + 1), GrammarError);
}

// Exact bounds at small counts, by expansion of the language.
TEST(GrammarBuilder, CountedBoundsAreExact) {
    for (const auto& [lo, hi] : std::vector<std::pair<int, int>>{{0, 1}, {0, 3}, {2, 2}, {3, 5}, {1, 4}, {2, 6}}) {
        Builder b;
        const int32_t root = b.rule("root");
        b.add_alternative(root, {b.repeat(b.bytes(ByteSet::range('x', 'y')), lo, hi)});
        const Grammar g = b.finish(root);
        std::set<std::string> want;
        for (int n = lo; n <= hi; ++n)
            for (int bits = 0; bits < (1 << n); ++bits) {
                std::string s;
                for (int i = 0; i < n; ++i) s += (bits >> i & 1) ? 'y' : 'x';
                want.insert(s);
            }
        EXPECT_EQ(language(g, Symbol::ref(g.root), 8), want) << lo << "," << hi;
    }
}

TEST(GrammarBuilder, UniqueNamesAndGbnfText) {
    Builder b;
    const int32_t root = b.rule("root");
    const int32_t a = b.rule("item"), a2 = b.rule("item");
    EXPECT_NE(b.name(a), b.name(a2));
    b.add_alternative(a, {b.bytes(ByteSet::range('0', '9'))});
    b.add_alternative(a2, {b.literal("\"\n")});
    b.add_alternative(root, {Symbol::ref(a), Symbol::ref(a2)});
    b.add_alternative(root, {});
    const Grammar g = b.finish(root);
    const std::string text = g.to_gbnf();
    EXPECT_EQ(text.rfind("root ::= item item-1 | \"\"\n", 0), 0u) << text;
    EXPECT_NE(text.find("item ::= [0-9]"), std::string::npos) << text;
    EXPECT_NE(text.find("\"\\\"\" \"\\n\""), std::string::npos) << text;
}

}  // namespace
}  // namespace megactx::grammar
