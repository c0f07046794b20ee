// The Earley matcher: hand-made grammars with known languages (left and right recursion, ε, ambiguity, bounded
// repetition, UTF-8), the advance/rollback/allowed contract checked byte by byte, and random grammars against a
// brute-force recogniser.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace megactx::grammar {
namespace {

ByteSet bytes_of(std::string_view s) {
    ByteSet out;
    for (unsigned char c : s) out.add(c);
    return out;
}

// The bytes b for which a copy of `m` takes b: what allowed() must equal.
ByteSet accepted_bytes(const Matcher& m) {
    ByteSet out;
    for (int b = 0; b < 256; ++b) {
        Matcher copy = m;
        if (copy.advance(static_cast<uint8_t>(b))) {
            out.add(static_cast<uint8_t>(b));
            EXPECT_EQ(copy.position(), m.position() + 1);
        } else {
            EXPECT_EQ(copy.position(), m.position());
        }
    }
    return out;
}

// Feeds `text` byte by byte and checks allowed() against every byte at every position on the way.
void check_allowed_along(const Grammar& g, std::string_view text) {
    Matcher m(g);
    for (size_t i = 0; i <= text.size(); ++i) {
        ASSERT_EQ(m.allowed(), accepted_bytes(m)) << "after " << i << " bytes of '" << text << "'";
        if (i == text.size() || !m.advance(static_cast<uint8_t>(text[i]))) break;
    }
}

// expr ::= expr "+" term | term ; term ::= [0-9]+ (left recursion in expr, right recursion in the digits)
Grammar sum_grammar() {
    Builder b;
    const int32_t expr = b.rule("expr");
    const Symbol term = b.repeat(b.bytes(ByteSet::range('0', '9')), 1, -1, "term");
    b.add_alternative(expr, {Symbol::ref(expr), b.literal("+"), term});
    b.add_alternative(expr, {term});
    return b.finish(expr);
}

TEST(GrammarMatcher, Literal) {
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.literal("hello")});
    const Grammar g = b.finish(root);
    EXPECT_TRUE(matches(g, "hello"));
    EXPECT_FALSE(matches(g, "hell"));
    EXPECT_FALSE(matches(g, "hello!"));
    EXPECT_FALSE(matches(g, ""));
    Matcher m(g);
    EXPECT_EQ(m.allowed(), ByteSet::of('h'));
    EXPECT_FALSE(m.advance(static_cast<uint8_t>('x')));
    EXPECT_EQ(m.position(), 0u);
    EXPECT_TRUE(m.advance("hell"));
    EXPECT_FALSE(m.accepting());
    EXPECT_FALSE(m.finished());
    EXPECT_TRUE(m.advance(static_cast<uint8_t>('o')));
    EXPECT_TRUE(m.accepting());
    EXPECT_TRUE(m.finished());
    EXPECT_TRUE(m.allowed().empty());
}

TEST(GrammarMatcher, ClassesAndAlternation) {
    Builder b;
    const int32_t root = b.rule("root");
    const Symbol ident = b.seq({b.bytes(ByteSet::range('a', 'z')), b.repeat(b.bytes(bytes_of("abc019_")), 0, -1)});
    b.add_alternative(root, {b.alt({{b.literal("true")}, {b.literal("false")}, {ident}})});
    const Grammar g = b.finish(root);
    for (const char* yes : {"true", "false", "t", "tab1", "x_0", "z9c"}) EXPECT_TRUE(matches(g, yes)) << yes;
    for (const char* no : {"", "True", "9", "x-", "a z", "tru"}) EXPECT_FALSE(matches(g, no)) << no;
    Matcher m(g);
    ASSERT_TRUE(m.advance("t"));
    EXPECT_EQ(m.allowed(), bytes_of("abc019_r"));  // "t" goes on as an identifier or as "true"
    ASSERT_TRUE(m.advance("r"));
    EXPECT_EQ(m.allowed(), ByteSet::of('u'));
    check_allowed_along(g, "false");
    check_allowed_along(g, "tzz");
}

TEST(GrammarMatcher, LeftRecursion) {
    const Grammar g = sum_grammar();
    for (const char* yes : {"1", "12", "1+2", "10+20+30", "1+2+3+4+5+6+7+8+9"}) EXPECT_TRUE(matches(g, yes)) << yes;
    for (const char* no : {"", "+", "1+", "1++2", "+1", "1+2+"}) EXPECT_FALSE(matches(g, no)) << no;
    Matcher m(g);
    ASSERT_TRUE(m.advance("1+"));
    EXPECT_EQ(m.allowed(), ByteSet::range('0', '9'));
    EXPECT_FALSE(m.advance(static_cast<uint8_t>('+')));
    ASSERT_TRUE(m.advance("23"));
    EXPECT_TRUE(m.accepting());
    EXPECT_FALSE(m.finished());
    ByteSet digits_plus = ByteSet::range('0', '9');
    digits_plus.add('+');
    EXPECT_EQ(m.allowed(), digits_plus);
    check_allowed_along(g, "12+3+45");
}

TEST(GrammarMatcher, RightRecursion) {
    // list ::= "a" "," list | "a": every byte completes a chain as deep as the input.
    Builder b;
    const int32_t list = b.rule("list");
    b.add_alternative(list, {b.literal("a"), b.literal(","), Symbol::ref(list)});
    b.add_alternative(list, {b.literal("a")});
    const Grammar g = b.finish(list);
    std::string s = "a";
    for (int i = 0; i < 300; ++i) s += ",a";
    EXPECT_TRUE(matches(g, s));
    EXPECT_FALSE(matches(g, s + ","));
    EXPECT_FALSE(matches(g, s + "a"));
    Matcher m(g);
    ASSERT_TRUE(m.advance(s));
    EXPECT_TRUE(m.accepting());
    EXPECT_EQ(m.allowed(), ByteSet::of(','));
    check_allowed_along(g, "a,a,a");
}

TEST(GrammarMatcher, EpsilonAndNullableChains) {
    // a ::= b b b ; b ::= "" | "x": zero to three x.
    Builder bl;
    const int32_t a = bl.rule("a"), b = bl.rule("b");
    bl.add_alternative(a, {Symbol::ref(b), Symbol::ref(b), Symbol::ref(b)});
    bl.add_alternative(b, {});
    bl.add_alternative(b, {bl.literal("x")});
    const Grammar g = bl.finish(a);
    EXPECT_TRUE(matches(g, ""));
    EXPECT_TRUE(matches(g, "x"));
    EXPECT_TRUE(matches(g, "xxx"));
    EXPECT_FALSE(matches(g, "xxxx"));
    Matcher m(g);
    EXPECT_TRUE(m.accepting());
    EXPECT_EQ(m.allowed(), ByteSet::of('x'));
    ASSERT_TRUE(m.advance("xxx"));
    EXPECT_TRUE(m.finished());
    check_allowed_along(g, "xxx");

    // Nullable rules in the middle of sequences and through several levels: s ::= n "y" n ; n ::= m m ; m ::= "" |
    // "z" m.
    Builder b2;
    const int32_t s = b2.rule("s"), n = b2.rule("n"), mm = b2.rule("m");
    b2.add_alternative(s, {Symbol::ref(n), b2.literal("y"), Symbol::ref(n)});
    b2.add_alternative(n, {Symbol::ref(mm), Symbol::ref(mm)});
    b2.add_alternative(mm, {});
    b2.add_alternative(mm, {b2.literal("z"), Symbol::ref(mm)});
    const Grammar g2 = b2.finish(s);
    for (const char* yes : {"y", "zy", "yz", "zzzyzz"}) EXPECT_TRUE(matches(g2, yes)) << yes;
    for (const char* no : {"", "z", "yy", "zyzy"}) EXPECT_FALSE(matches(g2, no)) << no;
    check_allowed_along(g2, "zzyz");
}

TEST(GrammarMatcher, RootOnlyEpsilon) {
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {});
    const Grammar g = b.finish(root);
    Matcher m(g);
    EXPECT_TRUE(m.accepting());
    EXPECT_TRUE(m.finished());
    EXPECT_FALSE(m.advance(static_cast<uint8_t>('a')));
    EXPECT_TRUE(matches(g, ""));
}

TEST(GrammarMatcher, AmbiguousGrammars) {
    // s ::= s s | "a" | "" : highly ambiguous, with ε and left recursion and a cycle s => s.
    Builder b;
    const int32_t s = b.rule("s");
    b.add_alternative(s, {Symbol::ref(s), Symbol::ref(s)});
    b.add_alternative(s, {b.literal("a")});
    b.add_alternative(s, {});
    const Grammar g = b.finish(s);
    EXPECT_TRUE(matches(g, ""));
    EXPECT_TRUE(matches(g, std::string(60, 'a')));
    EXPECT_FALSE(matches(g, "aab"));
    check_allowed_along(g, "aaa");

    // e ::= e "-" e | "1" | "(" e ")": ambiguous associativity.
    Builder b2;
    const int32_t e = b2.rule("e");
    b2.add_alternative(e, {Symbol::ref(e), b2.literal("-"), Symbol::ref(e)});
    b2.add_alternative(e, {b2.literal("1")});
    b2.add_alternative(e, {b2.literal("("), Symbol::ref(e), b2.literal(")")});
    const Grammar g2 = b2.finish(e);
    for (const char* yes : {"1", "1-1-1", "(1-1)-1", "1-(1-(1))"}) EXPECT_TRUE(matches(g2, yes)) << yes;
    for (const char* no : {"1-", "(1", "1)", "()", "1--1"}) EXPECT_FALSE(matches(g2, no)) << no;
    check_allowed_along(g2, "(1-1)-1");
}

TEST(GrammarMatcher, RollbackThenAnotherContinuation) {
    const Grammar g = sum_grammar();
    Matcher m(g);
    ASSERT_TRUE(m.advance("12+34"));
    m.rollback(3);
    EXPECT_EQ(m.position(), 2u);
    ASSERT_TRUE(m.advance("5+6+7"));
    Matcher fresh(g);
    ASSERT_TRUE(fresh.advance("125+6+7"));
    EXPECT_EQ(m.position(), fresh.position());
    EXPECT_EQ(m.accepting(), fresh.accepting());
    EXPECT_EQ(m.allowed(), fresh.allowed());
    m.rollback(1);
    EXPECT_FALSE(m.accepting());  // "125+6+" ends in '+'
    EXPECT_EQ(m.allowed(), ByteSet::range('0', '9'));
    m.reset();
    EXPECT_EQ(m.position(), 0u);
    EXPECT_EQ(m.allowed(), ByteSet::range('0', '9'));
    EXPECT_FALSE(m.accepting());
    EXPECT_THROW(m.rollback(1), std::out_of_range);
    // Roll back into a right-recursive chain and grow it again (the chain's shortcuts belong to the sets popped).
    Builder b;
    const int32_t list = b.rule("list");
    b.add_alternative(list, {b.literal("ab"), Symbol::ref(list)});
    b.add_alternative(list, {b.literal("c")});
    const Grammar g2 = b.finish(list);
    Matcher r(g2);
    ASSERT_TRUE(r.advance("ababab"));
    r.rollback(3);
    ASSERT_TRUE(r.advance("bababc"));
    EXPECT_TRUE(r.accepting());
    EXPECT_EQ(r.position(), 9u);
}

TEST(GrammarMatcher, AdvanceStringIsAllOrNothing) {
    const Grammar g = sum_grammar();
    Matcher m(g);
    ASSERT_TRUE(m.advance("1+"));
    const ByteSet before = m.allowed();
    EXPECT_FALSE(m.advance(std::string_view("23+x4")));
    EXPECT_EQ(m.position(), 2u);
    EXPECT_EQ(m.allowed(), before);
    EXPECT_FALSE(m.accepting());
    EXPECT_TRUE(m.advance(std::string_view("")));
    EXPECT_EQ(m.position(), 2u);
    EXPECT_TRUE(m.advance(std::string_view("23+4")));
    EXPECT_TRUE(m.accepting());
}

TEST(GrammarMatcher, CopiesAreIndependent) {
    const Grammar g = sum_grammar();
    Matcher a(g);
    ASSERT_TRUE(a.advance("1+2"));
    Matcher b = a;
    ASSERT_TRUE(b.advance("+3"));
    EXPECT_EQ(a.position(), 3u);
    EXPECT_EQ(b.position(), 5u);
    a.rollback(3);
    EXPECT_EQ(b.position(), 5u);
    EXPECT_TRUE(b.accepting());
    Matcher c(g);
    c = b;
    b.reset();
    EXPECT_EQ(c.position(), 5u);
    ASSERT_TRUE(c.advance(static_cast<uint8_t>('4')));
    EXPECT_TRUE(c.accepting());
    c = c;  // self-assignment keeps the state
    EXPECT_EQ(c.position(), 6u);
}

TEST(GrammarMatcher, AcceptingVersusPrefix) {
    // "ab" and "abcd" are sentences, "abc" only a prefix.
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.literal("ab")});
    b.add_alternative(root, {b.literal("abcd")});
    const Grammar g = b.finish(root);
    Matcher m(g);
    const bool want[] = {false, false, true, false, true};
    for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(m.accepting(), want[i]) << i;
        if (i < 4) {
            ASSERT_TRUE(m.advance(static_cast<uint8_t>("abcd"[i])));
        }
    }
    EXPECT_TRUE(m.finished());
    EXPECT_FALSE(matches(g, "abc"));
}

TEST(GrammarMatcher, BoundedRepetitionOfAThousand) {
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.literal("["), b.repeat(b.literal("ab"), 0, 1000), b.literal("]")});
    const Grammar g = b.finish(root);
    std::string s = "[";
    for (int i = 0; i < 1000; ++i) s += "ab";
    Matcher m(g);
    ASSERT_TRUE(m.advance(s));
    EXPECT_EQ(m.allowed(), ByteSet::of(']'));  // a 1001st "ab" is refused
    EXPECT_FALSE(m.advance(static_cast<uint8_t>('a')));
    ASSERT_TRUE(m.advance(static_cast<uint8_t>(']')));
    EXPECT_TRUE(m.finished());
    EXPECT_TRUE(matches(g, "[]"));
    EXPECT_TRUE(matches(g, "[abab]"));
    EXPECT_FALSE(matches(g, "[aba]"));
    m.rollback(1 + 2 * 500);
    ByteSet a_or_close = ByteSet::of('a');
    a_or_close.add(']');
    EXPECT_EQ(m.allowed(), a_or_close);
    check_allowed_along(g, "[ababa]");
}

// Counted repetitions (Builder::repeat) read exactly min..max items, at small counts and at 65535, for an item of
// one byte, of a literal and of alternatives of different lengths; after max items only what follows is allowed.
TEST(GrammarMatcher, CountedRepetitionBoundsAreExact) {
    struct Case {
        int64_t lo, hi;
        std::vector<int64_t> accept, reject;
    };
    const std::vector<Case> cases = {
        {0, 65535, {0, 1, 2, 65535}, {65536}},
        {3, 5, {3, 4, 5}, {0, 2, 6}},
        {1, 65535, {1, 65535}, {0, 65536}},
        {4, 4, {4}, {3, 5}},
        {65535, 65535, {65535}, {0, 65534, 65536}},
        {0, 1, {0, 1}, {2}},
        {2, -1, {2, 3, 1000}, {0, 1}},
    };
    for (const std::string_view kind : {"byte", "literal", "alternatives"}) {
        for (const Case& c : cases) {
            Builder b;
            const int32_t root = b.rule("root");
            const Symbol item = kind == "byte"      ? b.bytes(ByteSet::range('x', 'y'))
                                : kind == "literal" ? b.literal("ab")
                                                    : b.alt({{b.literal("a")}, {b.literal("bc")}});
            b.add_alternative(root, {b.literal("["), b.repeat(item, c.lo, c.hi), b.literal("]")});
            const Grammar g = b.finish(root);
            EXPECT_LE(g.rules.size(), 6u);
            const auto text = [&](int64_t n) {  // n items, alternating between the item's spellings
                std::string s = "[";
                for (int64_t i = 0; i < n; ++i)
                    s += kind == "byte" ? (i % 2 ? "y" : "x") : kind == "literal" ? "ab" : (i % 2 ? "bc" : "a");
                return s + "]";
            };
            const std::string where = fmt::format("{} {{{},{}}}", kind, c.lo, c.hi);
            for (const int64_t n : c.accept) EXPECT_TRUE(matches(g, text(n))) << where << ": " << n << " items";
            for (const int64_t n : c.reject) EXPECT_FALSE(matches(g, text(n))) << where << ": " << n << " items";
            if (c.hi < 0) continue;
            // At max items only the closing bracket may come; one item fewer, another item may too.
            const auto open = [&](int64_t n) {  // the text of n items without its closing bracket
                std::string s = text(n);
                s.pop_back();
                return s;
            };
            Matcher m(g);
            ASSERT_TRUE(m.advance(open(c.hi))) << where;
            EXPECT_EQ(m.allowed(), ByteSet::of(']')) << where;
            if (c.hi > c.lo) {
                m.reset();
                ASSERT_TRUE(m.advance(open(c.hi - 1))) << where;
                EXPECT_TRUE(m.allowed().has(']')) << where;
                EXPECT_GT(m.allowed().count(), 1) << where;
            }
        }
    }
}

TEST(GrammarMatcher, LongChainOfRules) {
    // r_i ::= r_{i+1} "a" | "b" (i < n), r_n ::= "c": predicting r_0 reaches every rule, more than the matcher
    // precomputes for one rule, so prediction runs both ways. r_0 derives b a^j (j < n) and c a^n.
    constexpr int kN = 600;
    Builder b;
    std::vector<int32_t> r;
    for (int i = 0; i <= kN; ++i) r.push_back(b.rule("r"));
    for (int i = 0; i < kN; ++i) {
        b.add_alternative(r[static_cast<size_t>(i)], {Symbol::ref(r[static_cast<size_t>(i) + 1]), b.literal("a")});
        b.add_alternative(r[static_cast<size_t>(i)], {b.literal("b")});
    }
    b.add_alternative(r[kN], {b.literal("c")});
    const Grammar g = b.finish(r[0]);
    EXPECT_TRUE(matches(g, "b"));
    EXPECT_TRUE(matches(g, "b" + std::string(kN - 1, 'a')));
    EXPECT_FALSE(matches(g, "b" + std::string(kN, 'a')));
    EXPECT_TRUE(matches(g, "c" + std::string(kN, 'a')));
    EXPECT_FALSE(matches(g, "c" + std::string(kN - 1, 'a')));
    EXPECT_FALSE(matches(g, "c" + std::string(kN + 1, 'a')));
    Matcher m(g);
    EXPECT_EQ(m.allowed(), bytes_of("bc"));
    ASSERT_TRUE(m.advance("caa"));
    EXPECT_EQ(m.allowed(), ByteSet::of('a'));
    EXPECT_FALSE(m.accepting());
    check_allowed_along(g, "baa");
}

TEST(GrammarMatcher, Utf8Characters) {
    // A JSON-like string: '"' (any code point but '"', '\\' and control characters)* '"'.
    Builder b;
    ByteSet exclude = ByteSet::range(0, 0x1F);
    exclude.add('"');
    exclude.add('\\');
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.literal("\""), b.repeat(b.utf8_char_except(exclude), 0, -1), b.literal("\"")});
    const Grammar g = b.finish(root);
    EXPECT_TRUE(matches(g, "\"\""));
    EXPECT_TRUE(matches(g, "\"h\xC3\xA9llo \xE2\x82\xAC \xF0\x9D\x84\x9E\""));  // é € 𝄞
    EXPECT_TRUE(matches(g, "\"\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF\""));    // U+D7FF U+E000 U+10FFFF
    EXPECT_FALSE(matches(g, "\"a\"b\""));
    EXPECT_FALSE(matches(g, "\"\\\""));
    EXPECT_FALSE(matches(g, "\"\n\""));
    EXPECT_FALSE(matches(g, "\"\x80\""));              // a lone continuation byte
    EXPECT_FALSE(matches(g, "\"\xC0\x80\""));          // overlong
    EXPECT_FALSE(matches(g, "\"\xED\xA0\x80\""));      // a surrogate
    EXPECT_FALSE(matches(g, "\"\xF4\x90\x80\x80\""));  // above U+10FFFF
    EXPECT_FALSE(matches(g, "\"\xE2\x82\""));          // cut short
    Matcher m(g);
    ASSERT_TRUE(m.advance("\"\xE0"));
    EXPECT_EQ(m.allowed(), ByteSet::range(0xA0, 0xBF));
    ASSERT_TRUE(m.advance(static_cast<uint8_t>(0xA0)));
    EXPECT_EQ(m.allowed(), ByteSet::range(0x80, 0xBF));
    check_allowed_along(g, "\"a\xC3\xA9\xE2\x82\xAC\xF0\x9D\x84\x9E\"");
    check_allowed_along(g, "\"\xED\x9F\xBF\"");
}

// JSON values (objects, arrays, strings with escapes and UTF-8, numbers, literals), with whitespace.
Grammar json_grammar() {
    Builder b;
    const int32_t value = b.rule("value"), object = b.rule("object"), array = b.rule("array");
    const Symbol ws = b.repeat(b.bytes(bytes_of(" \n\t")), 0, -1, "ws");
    ByteSet exclude = ByteSet::range(0, 0x1F);
    exclude.add('"');
    exclude.add('\\');
    const Symbol escape = b.seq({b.literal("\\"), b.bytes(bytes_of("\"\\/bfnrt"))});
    const Symbol str =
        b.seq({b.literal("\""), b.repeat(b.alt({{b.utf8_char_except(exclude)}, {escape}}), 0, -1), b.literal("\"")},
              "string");
    const Symbol digits = b.repeat(b.bytes(ByteSet::range('0', '9')), 1, -1);
    const Symbol number =
        b.seq({b.optional(b.literal("-")), digits, b.optional(b.seq({b.literal("."), digits}))}, "number");
    const Symbol member = b.seq({ws, str, ws, b.literal(":"), ws, Symbol::ref(value), ws});
    const Symbol members = b.seq({member, b.repeat(b.seq({b.literal(","), member}), 0, -1)});
    b.add_alternative(object, {b.literal("{"), b.alt({{members}, {ws}}), b.literal("}")});
    const Symbol element = b.seq({ws, Symbol::ref(value), ws});
    const Symbol elements = b.seq({element, b.repeat(b.seq({b.literal(","), element}), 0, -1)});
    b.add_alternative(array, {b.literal("["), b.alt({{elements}, {ws}}), b.literal("]")});
    for (const Symbol& s : {Symbol::ref(object), Symbol::ref(array), str, number, b.literal("true"), b.literal("false"),
                            b.literal("null")})
        b.add_alternative(value, {s});
    return b.finish(value);
}

TEST(GrammarMatcher, Json) {
    const Grammar g = json_grammar();
    const std::string doc =
        "{\"a\": [1, -2.5, true, null], \"b\": {\"c\": \"x\\\"y \xC3\xA9\"}, \"d\": [[], {}, [{\"e\": false}]]}";
    EXPECT_TRUE(matches(g, doc));
    for (const char* no : {"{\"a\" 1}", "[1,]", "{\"a\": tru}", "\"\\x\"", "[1 2]", "{a: 1}", "-", "01a"})
        EXPECT_FALSE(matches(g, no)) << no;
    Matcher m(g);
    ASSERT_TRUE(m.advance("{\"a\": [1, "));
    EXPECT_EQ(m.allowed(), bytes_of(" \n\t{[\"-0123456789tfn"));
    ASSERT_TRUE(m.advance("2]"));
    EXPECT_EQ(m.allowed(), bytes_of(" \n\t,}"));
    check_allowed_along(g, doc);
}

// A brute-force recogniser: the spans [i, j) of `text` that each rule derives, found for ever longer spans by
// iterating to a fixed point (a span of length L needs only shorter spans, or spans of length L next to ε).
class BruteForce {
  public:
    BruteForce(const Grammar& g, std::string_view text) : g_(g), text_(text), n_(text.size()) {
        derives_.assign(g.rules.size() * (n_ + 1) * (n_ + 1), false);
        for (size_t len = 0; len <= n_; ++len)
            for (bool changed = true; changed;) {
                changed = false;
                for (size_t i = 0; i + len <= n_; ++i)
                    for (size_t r = 0; r < g.rules.size(); ++r) {
                        if (at(r, i, i + len)) continue;
                        for (const Sequence& alt : expansions(g.rules[r]))
                            if (seq_derives(alt, i, i + len)) {
                                at(r, i, i + len) = true;
                                changed = true;
                                break;
                            }
                    }
            }
    }

    bool rule_derives(size_t rule, size_t i, size_t j) { return at(rule, i, j); }

  private:
    // A rule's alternatives; a counted rule's are its item min..max times (small bounds here).
    static std::vector<Sequence> expansions(const Rule& rule) {
        if (!rule.counted()) return rule.alternatives;
        std::vector<Sequence> out;
        for (uint32_t k = rule.min; k <= rule.max; ++k) out.push_back(Sequence(k, rule.alternatives[0][0]));
        return out;
    }

    std::vector<bool>::reference at(size_t r, size_t i, size_t j) {
        return derives_[(r * (n_ + 1) + i) * (n_ + 1) + j];
    }

    bool seq_derives(const Sequence& seq, size_t i, size_t j) {
        std::vector<bool> reach(n_ + 1, false);
        reach[i] = true;
        for (const Symbol& s : seq) {
            std::vector<bool> next(n_ + 1, false);
            for (size_t p = i; p <= j; ++p) {
                if (!reach[p]) continue;
                if (!s.is_rule()) {
                    if (p < j && s.bytes.has(static_cast<uint8_t>(text_[p]))) next[p + 1] = true;
                } else {
                    for (size_t q = p; q <= j; ++q)
                        if (at(static_cast<size_t>(s.rule), p, q)) next[q] = true;
                }
            }
            reach.swap(next);
        }
        return reach[j];
    }

    const Grammar& g_;
    std::string_view text_;
    size_t n_;
    std::vector<bool> derives_;
};

// A random grammar over "abc" of a few rules, some alternatives empty, references anywhere (left, right and
// middle recursion, cycles), some symbols repeated with small bounds (counted rules), kept when every rule can end.
Grammar random_grammar(std::mt19937& rng) {
    for (;;) {
        Builder b;
        const int n_rules = 1 + static_cast<int>(rng() % 4);
        for (int r = 0; r < n_rules; ++r) b.rule("r");
        for (int r = 0; r < n_rules; ++r) {
            const int n_alts = 1 + static_cast<int>(rng() % 3);
            for (int a = 0; a < n_alts; ++a) {
                Sequence seq;
                const int len = static_cast<int>(rng() % 4);
                for (int k = 0; k < len; ++k) {
                    if (rng() % 2 == 0) {
                        seq.push_back(Symbol::ref(static_cast<int32_t>(rng() % static_cast<unsigned>(n_rules))));
                    } else {
                        ByteSet s = ByteSet::of(static_cast<uint8_t>('a' + rng() % 3));
                        if (rng() % 4 == 0) s.add(static_cast<uint8_t>('a' + rng() % 3));
                        seq.push_back(Symbol::terminal(s));
                    }
                    if (rng() % 5 == 0) {
                        const int64_t lo = rng() % 3, hi = lo + rng() % 3;
                        seq.back() = b.repeat(seq.back(), lo, hi);
                    }
                }
                b.add_alternative(r, std::move(seq));
            }
        }
        try {
            return b.finish(0);
        } catch (const GrammarError&) {
            // Some rule never ends: draw again.
        }
    }
}

// A string the grammar derives (a random derivation, depth-limited; empty when it ran too deep).
bool sample(const Grammar& g, int32_t rule, std::mt19937& rng, int depth, std::string& out) {
    if (depth > 12 || out.size() > 10) return false;
    const Rule& r = g.rules[static_cast<size_t>(rule)];
    Sequence chosen = r.alternatives[rng() % r.alternatives.size()];
    if (r.counted()) chosen = Sequence(r.min + rng() % (r.max - r.min + 1), chosen[0]);
    for (const Symbol& s : chosen) {
        if (s.is_rule()) {
            if (!sample(g, s.rule, rng, depth + 1, out)) return false;
        } else {
            std::vector<uint8_t> choices;
            for (int c = 0; c < 256; ++c)
                if (s.bytes.has(static_cast<uint8_t>(c))) choices.push_back(static_cast<uint8_t>(c));
            out.push_back(static_cast<char>(choices[rng() % choices.size()]));
        }
    }
    return true;
}

TEST(GrammarMatcher, RandomGrammarsAgainstBruteForce) {
    std::mt19937 rng(20261206);
    int n_accepted = 0, n_cases = 0;
    for (int round = 0; round < 800; ++round) {
        const Grammar g = random_grammar(rng);
        for (int t = 0; t < 6; ++t) {
            std::string text;
            if (t % 2 == 0) {
                if (!sample(g, g.root, rng, 0, text)) text.clear();
                if (rng() % 2 == 0) text.push_back(static_cast<char>('a' + rng() % 3));  // often a near miss
            } else {
                const size_t len = rng() % 10;
                for (size_t i = 0; i < len; ++i) text.push_back(static_cast<char>('a' + rng() % 3));
            }
            BruteForce brute(g, text);
            // Every prefix: accepting() iff the brute force derives it; once a byte is refused no longer prefix
            // may be derivable.
            Matcher m(g);
            bool alive = true;
            for (size_t i = 0; i <= text.size(); ++i) {
                const bool want = brute.rule_derives(static_cast<size_t>(g.root), 0, i);
                ASSERT_EQ(alive && m.accepting(), want) << "prefix " << i << " of '" << text << "' in\n" << g.to_gbnf();
                n_accepted += want;
                ++n_cases;
                if (alive && i < text.size()) {
                    Matcher copy = m;
                    alive = m.advance(static_cast<uint8_t>(text[i]));
                    EXPECT_EQ(alive, copy.allowed().has(static_cast<uint8_t>(text[i])));
                }
            }
            // Rolled back to the start and fed again, all at once: the same answer.
            m.reset();
            EXPECT_EQ(m.advance(std::string_view(text)) && m.accepting(),
                      brute.rule_derives(static_cast<size_t>(g.root), 0, text.size()));
        }
    }
    // The cases are worth something only if both answers are common.
    EXPECT_GT(n_accepted, n_cases / 10);
    EXPECT_LT(n_accepted, n_cases * 9 / 10);
}

}  // namespace
}  // namespace megactx::grammar
