// Regular expressions compiled to grammars and run by the matcher: every feature against strings it must and must
// not match, UTF-8 in classes and literals, realistic patterns, random expressions against std::regex and their
// GBNF spelling, add_regex inside a larger grammar, the GBNF round trip, and the errors for what a recogniser
// cannot do.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "frontend_test_util.h"
#include "grammar/frontends.h"
#include "grammar/matcher.h"

namespace megactx::grammar {
namespace {

void expect_regex(std::string_view pattern, std::initializer_list<std::string_view> accept,
                  std::initializer_list<std::string_view> reject) {
    SCOPED_TRACE(std::string("/").append(pattern).append("/"));
    expect_matches(compile_regex(pattern), accept, reject);
}

void expect_regex_error(std::string_view pattern, std::initializer_list<std::string_view> fragments) {
    SCOPED_TRACE(std::string("/").append(pattern).append("/"));
    expect_error([&] { compile_regex(pattern); }, fragments);
}

TEST(GrammarRegex, LiteralsMatchTheWholeString) {
    expect_regex("abc", {"abc"}, {"", "ab", "abcd", "xabc", "abC"});
    expect_regex("", {""}, {"a"});
}

TEST(GrammarRegex, AlternationBindsLooserThanConcatenation) {
    expect_regex("ab|cd", {"ab", "cd"}, {"abd", "acd", "abcd", "a"});
    expect_regex("a(b|c)d", {"abd", "acd"}, {"ab", "ad", "abcd"});
    expect_regex("a|b|", {"a", "b", ""}, {"ab"});
    expect_regex("(a|)b", {"ab", "b"}, {"a", "aab"});
    expect_regex("ab*|c", {"a", "abbb", "c"}, {"abc", "cc", "abab"});
}

TEST(GrammarRegex, Quantifiers) {
    expect_regex("a*", {"", "a", "aaaa"}, {"b", "aab"});
    expect_regex("a+", {"a", "aaa"}, {"", "ab"});
    expect_regex("ab?c", {"ac", "abc"}, {"abbc", "a"});
    expect_regex("a{3}", {"aaa"}, {"aa", "aaaa"});
    expect_regex("a{2,}", {"aa", "aaaaaaa"}, {"", "a"});
    expect_regex("a{,2}", {"", "a", "aa"}, {"aaa"});
    expect_regex("a{0}b", {"b"}, {"ab"});
    // Lazy forms: the same language.
    expect_regex("a*?b+?c??d{1,2}?", {"bd", "aabbcd", "bdd"}, {"b", "bddd", "acd"});
}

TEST(GrammarRegex, BoundsAreExact) {
    expect_regex("x{2,4}", {"xx", "xxx", "xxxx"}, {"", "x", "xxxxx"});
    expect_regex("(ab){2}", {"abab"}, {"ab", "ababab", "aabb"});
    expect_regex("[0-9]{1,3}(,[0-9]{3})*", {"1", "999", "1,000", "12,345,678"}, {"1000", "1,00", ",000", "1,0000"});
}

TEST(GrammarRegex, NestedQuantifiers) {
    expect_regex("(a{1,2}b)+", {"ab", "aab", "abaab", "aabaabab"}, {"b", "aaab", "aba"});
    expect_regex("((ab)*c)?", {"", "c", "abc", "ababc"}, {"ab", "abcc"});
    expect_regex("(a*)*b", {"b", "aaab"}, {"", "aa"});  // a repeated item that matches ε
    expect_regex("(a|bc){2,3}", {"aa", "abc", "bcbcbc", "aaa"}, {"a", "bc", "aaaa", "bcbcbca"});
}

TEST(GrammarRegex, DotIsAnyCodePointButNewline) {
    expect_regex(".", {"a", " ", "\t", "é", "€", "😀"},
                 {"", "\n", "ab", "\xC3", "\xFF", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"});
    // Only the lead bytes of well-formed UTF-8 may start it.
    ByteSet want = ByteSet::range(0, 0x7F);
    want.add_range(0xC2, 0xF4);
    want = want.intersect(ByteSet::of('\n').complement());
    EXPECT_EQ(Matcher(compile_regex(".")).allowed(), want);
}

TEST(GrammarRegex, ClassesRangesAndNegation) {
    expect_regex("[a-c]", {"a", "b", "c"}, {"d", "A", "", "ab"});
    expect_regex("[a-cx-z_]+", {"abz_", "x"}, {"abd", "-"});
    expect_regex("[^a-c]", {"d", "\n", "é", "😀"}, {"a", "c", "", "dd"});
    expect_regex("[]a]", {"]", "a"}, {"[", "b"});
    expect_regex("[a-]", {"a", "-"}, {"b"});
    expect_regex("[-a]", {"a", "-"}, {"b"});
    expect_regex("[\\]\\\\\\-^]", {"]", "\\", "-", "^"}, {"a"});
    expect_regex("[\\n\\t.]", {"\n", "\t", "."}, {"a", " "});
    expect_regex("[\\x41-\\x43]", {"A", "C"}, {"D"});
}

TEST(GrammarRegex, ClassEscapesHaveAsciiMeanings) {
    expect_regex("\\d+", {"0123456789"}, {"", "a", "\u0663", "１"});
    expect_regex("\\w+", {"aZ_09"}, {"é", "-", " "});
    expect_regex("\\s", {" ", "\t", "\n", "\r", "\f", "\v"}, {"a", "\u00A0", "\u2003"});
    expect_regex("\\D", {"a", "é", "\n"}, {"5"});
    expect_regex("\\W", {"-", "é", " "}, {"a", "_", "7"});
    expect_regex("\\S", {"a", "é"}, {" ", "\n"});
    expect_regex("[\\d\\s]+", {"1 2\t3"}, {"1a"});
    expect_regex("[^\\d]", {"a", "é"}, {"3"});
    expect_regex("[\\W\\d]", {"-", "5", "é"}, {"a", "_"});
    // A '-' next to a class escape is literal, as ECMAScript (JSON Schema's pattern dialect) reads it.
    expect_regex("[\\w-.]+", {"a-b.c", "-", "."}, {"a b", "/"});
    expect_regex("[%-\\d]", {"%", "-", "7"}, {"&", "a"});
}

TEST(GrammarRegex, NonAsciiInClassesAndLiterals) {
    expect_regex("[à-ÿ]", {"à", "é", "ÿ"}, {"a", "Ā", "\xC3", "\xC3\xA9\xA9"});
    expect_regex("[^é]", {"è", "a", "😀", "\n"}, {"é", ""});
    expect_regex("[\\u4e00-\\u9fff]+", {"日本語"}, {"日本語a", "ー"});
    expect_regex("[a€😀-😂]", {"a", "€", "😀", "😁", "😂"}, {"😃", "b"});
    expect_regex("é+", {"é", "ééé"}, {"\xC3\xA9\xA9", ""});  // the quantifier repeats the whole character
    expect_regex("日本", {"日本"}, {"日", "本日"});
    expect_regex("[\\u0000-\\U0010FFFF]", {std::string_view("\0", 1), "\U0010FFFF", "a"},
                 {"\xED\xA0\x80", "\xF4\x90\x80\x80"});
}

TEST(GrammarRegex, Escapes) {
    expect_regex("a\\.b", {"a.b"}, {"axb"});
    expect_regex("\\\\\\n\\t\\r\\f\\v", {"\\\n\t\r\f\v"}, {"\\n\\t"});
    expect_regex("\\x41\\u00e9\\U0001F600", {"Aé😀"}, {"A\xE9\xF0"});
    expect_regex("\\xE9", {"é"}, {"\xE9"});  // a code point, unlike GBNF's raw byte
    expect_regex("\\u{41}\\u{1F600}[\\u{e0}-\\u{ff}]", {"A😀é"}, {"A😀a"});
    expect_regex("\\(\\)\\[\\]\\{\\}\\*\\+\\?\\|\\^\\$\\/\\-", {"()[]{}*+?|^$/-"}, {""});
    expect_regex("a{x}", {"a{x}"}, {"a"});  // a brace that opens no repetition is literal, as in Python
    expect_regex("a{,}", {"a{,}"}, {"a"});
}

TEST(GrammarRegex, GroupsOfEveryKind) {
    expect_regex("(?:ab)+", {"ab", "abab"}, {"a", "aba"});
    expect_regex("(?P<year>\\d{4})-(?<month>\\d\\d)", {"2024-05"}, {"2024-5", "24-05"});
    expect_regex("()a(())", {"a"}, {""});
}

TEST(GrammarRegex, AnchorsAtTheEndsAreIgnored) {
    expect_regex("^abc$", {"abc"}, {"", "abcabc"});
    expect_regex("^a|b$", {"a", "b"}, {"ab"});
    expect_regex("^(a|b)+$", {"abba"}, {"abc"});
    expect_regex("\\Aab\\Z", {"ab"}, {"a"});
}

TEST(GrammarRegex, RealisticPatterns) {
    expect_regex("\\(\\d{3}\\) \\d{3}-\\d{4}", {"(555) 123-4567"}, {"555-123-4567", "(555) 123-456", "(55a) 123-4567"});
    expect_regex("\\+?1?[ -]?\\d{3}[ -]?\\d{3}[ -]?\\d{4}", {"+1 555 123 4567", "5551234567", "555-123-4567"},
                 {"+1 555 123 456", "555_123_4567"});
    const std::string date = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
    expect_regex(date, {"2024-01-31", "1999-12-01", "2000-02-29"},
                 {"2024-13-01", "2024-00-10", "2024-01-32", "2024-1-01", "24-01-01"});
    expect_regex("[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}", {"john.doe+x@example.co.uk", "a@b.io"},
                 {"john@example", "@example.com", "a@b.c", "a b@c.com"});
    expect_regex("[A-Za-z_][A-Za-z0-9_]*", {"_x", "snake_case9", "X"}, {"9lives", "", "a-b"});
    const std::string octet = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    expect_regex("(" + octet + "\\.){3}" + octet, {"192.168.0.1", "255.255.255.255", "0.0.0.0"},
                 {"256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4"});
    expect_regex("(true|false|-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?)", {"true", "-0.5e10", "42"},
                 {"tru", "01", "1.", "-"});
}

// One random expression written twice: as a regular expression (which std::regex reads the same way for this
// subset) and as GBNF.
struct Twin {
    std::string re, gbnf;
};

Twin random_expression(std::mt19937& rng, int depth) {
    const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    static const Twin kAtoms[] = {{"a", "\"a\""},   {"b", "\"b\""},     {"[ab]", "[ab]"},
                                  {"[^a]", "[^a]"}, {"[a-c]", "[a-c]"}, {".", "[^\\n]"}};
    static const char* const kQuantifiers[] = {"*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}"};
    switch (depth <= 0 ? 0 : pick(4)) {
        case 0:
            return kAtoms[pick(6)];
        case 1: {
            const Twin x = random_expression(rng, depth - 1), y = random_expression(rng, depth - 1);
            return {x.re + y.re, x.gbnf + " " + y.gbnf};
        }
        case 2: {
            const Twin x = random_expression(rng, depth - 1), y = random_expression(rng, depth - 1);
            return {"(" + x.re + "|" + y.re + ")", "(" + x.gbnf + " | " + y.gbnf + ")"};
        }
        default: {
            const Twin x = random_expression(rng, depth - 1);
            const std::string q = kQuantifiers[pick(7)];
            return {"(" + x.re + ")" + q, "(" + x.gbnf + ")" + q};
        }
    }
}

TEST(GrammarRegex, AgreesWithStdRegexAndGbnfOnRandomExpressions) {
    std::vector<std::string> inputs = {""};  // every string over a, b, c, \n up to 4 bytes
    for (size_t begin = 0, len = 1; len <= 4; ++len) {
        const size_t end = inputs.size();
        for (size_t i = begin; i < end; ++i)
            for (const char c : std::string_view("abc\n")) inputs.push_back(inputs[i] + c);
        begin = end;
    }
    std::mt19937 rng(51);
    for (int n = 0; n < 120; ++n) {
        const Twin t = random_expression(rng, 3);
        SCOPED_TRACE(t.re);
        const std::regex want(t.re, std::regex::ECMAScript);
        const Grammar re = compile_regex(t.re);
        const Grammar gbnf = parse_gbnf("root ::= " + t.gbnf);
        for (const std::string& s : inputs) {
            const bool expected = std::regex_match(s, want);
            ASSERT_EQ(matches(re, s), expected) << "regex on '" << s << "'";
            ASSERT_EQ(matches(gbnf, s), expected) << "gbnf " << t.gbnf << " on '" << s << "'";
        }
    }
}

TEST(GrammarRegex, RandomTextCompilesOrIsAGrammarError) {
    // Metacharacters in every order: anything but a GrammarError (or a crash) is a parser bug.
    constexpr std::string_view kAlphabet = "ab()[]{}|*+?^$\\.-,0129dwsDuxU:P<>=!\xC3\xA9";
    std::mt19937 rng(7);
    int compiled = 0;
    for (int n = 0; n < 3000; ++n) {
        std::string pattern;
        for (size_t len = rng() % 12; len > 0; --len) pattern += kAlphabet[rng() % kAlphabet.size()];
        try {
            const Grammar g = compile_regex(pattern);
            EXPECT_GE(g.root, 0);
            ++compiled;
        } catch (const GrammarError&) {
        }
    }
    EXPECT_GT(compiled, 100);  // the alphabet makes valid patterns too, not only errors
}

TEST(GrammarRegex, AddRegexComposesIntoALargerGrammar) {
    Builder b;
    const int32_t root = b.rule("root");
    const Symbol word = add_regex(b, "[a-z]+");
    const Symbol num = add_regex(b, "\\d{1,3}");
    b.add_alternative(root, {b.literal("\""), word, b.literal("\"")});
    b.add_alternative(root, {num});
    const Grammar g = b.finish(root);
    EXPECT_EQ(g.rules[static_cast<size_t>(g.root)].name, "root");
    expect_matches(g, {"\"abc\"", "7", "123"}, {"\"\"", "\"ab1\"", "1234", "abc"});
    // A pattern that matches only ε is a usable symbol too.
    Builder b2;
    const int32_t r2 = b2.rule("root");
    b2.add_alternative(r2, {b2.literal("x"), add_regex(b2, "(a?)")});
    expect_matches(b2.finish(r2), {"x", "xa"}, {"xaa"});
}

TEST(GrammarRegex, RoundTripThroughGbnf) {
    const std::string date = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
    const std::initializer_list<std::string_view> samples = {"2024-01-31", "2024-13-01", "é",    "\n",   "x",
                                                             "",           "ab",         "abab", "日本", "aé😀"};
    for (const std::string& pattern :
         {date, std::string("[^a-z\\d]+"), std::string(".(ab|é)*"), std::string("[à-ÿ😀]{0,3}"), std::string("\\w*")}) {
        SCOPED_TRACE(pattern);
        const Grammar g = compile_regex(pattern);
        const Grammar back = parse_gbnf(g.to_gbnf());
        for (std::string_view s : samples) EXPECT_EQ(matches(back, s), matches(g, s)) << "'" << s << "'";
    }
}

TEST(GrammarRegex, UnsupportedFeaturesAreNamedWithTheirOffset) {
    expect_regex_error("ab(?=c)", {"lookahead", "offset 2"});
    expect_regex_error("a(?!c)", {"lookahead", "offset 1"});
    expect_regex_error("(?<=a)b", {"lookbehind", "offset 0"});
    expect_regex_error("(?<!a)b", {"lookbehind", "offset 0"});
    expect_regex_error("(a)\\1", {"backreference", "offset 3"});
    expect_regex_error("(?P<x>a)(?P=x)", {"backreference", "offset 8"});
    expect_regex_error("(?<x>a)\\k<x>", {"backreference", "offset 7"});
    expect_regex_error("a^b", {"'^'", "offset 1"});
    expect_regex_error("(^a)", {"'^'", "offset 1"});
    expect_regex_error("a$b", {"'$'", "offset 1"});
    expect_regex_error("(a$)", {"'$'", "offset 2"});
    expect_regex_error("(?i)abc", {"flag", "offset 0"});
    expect_regex_error("a(?s:.)", {"flag", "offset 1"});
    expect_regex_error("a++", {"possessive", "offset 2"});
    expect_regex_error("a{2}+", {"possessive", "offset 4"});
    expect_regex_error("(?>a)", {"atomic", "offset 0"});
    expect_regex_error("a\\b", {"word boundary", "offset 1"});
    expect_regex_error("\\p{L}", {"Unicode property", "offset 0"});
}

TEST(GrammarRegex, SyntaxErrorsSayWhere) {
    expect_regex_error("a**", {"multiple repeat", "offset 2"});
    expect_regex_error("*a", {"nothing to repeat", "offset 0"});
    expect_regex_error("a|?", {"nothing to repeat", "offset 2"});
    expect_regex_error("^*", {"nothing to repeat", "offset 1"});
    expect_regex_error("(ab", {"missing ')'", "offset 0"});
    expect_regex_error("ab)", {"unbalanced ')'", "offset 2"});
    expect_regex_error("x[abc", {"missing ']'", "offset 1"});
    expect_regex_error("[z-a]", {"range", "offset 1"});
    expect_regex_error("x{3,2}", {"max below min", "offset 1"});
    expect_regex_error("a\\q", {"unknown escape", "offset 1"});
    expect_regex_error("ab\\", {"trailing backslash", "offset 2"});
    expect_regex_error("\\xZZ", {"hex digits", "offset 0"});
    expect_regex_error("\\uD800", {"not a character", "offset 0"});
    expect_regex_error("a\\u{}", {"1 to 6 hex digits", "offset 1"});
    expect_regex_error("\\u{110000}", {"not a character", "offset 0"});
    expect_regex_error("a\xFF", {"invalid UTF-8", "offset 1"});
    expect_regex_error("[^\\x00-\\U0010FFFF]", {"matches no character", "offset 0"});
    expect_regex_error("x{99999999}", {"bound above", "offset 2"});
    // A bound is one counted rule, so a large one fits a small size limit; a long pattern still does not.
    Builder b(1000);
    EXPECT_NO_THROW(add_regex(b, "x{0,500000}"));
    expect_error(
        [] {
            Builder small(1000);
            add_regex(small, std::string(2000, 'x'));
        },
        {"too large"});
}

}  // namespace
}  // namespace megactx::grammar
