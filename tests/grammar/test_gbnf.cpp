// GBNF grammars and choice lists compiled to grammars and run by the matcher: every construct against strings it
// must and must not match, UTF-8 in classes, errors with their line and column, realistic grammars (JSON,
// arithmetic with left recursion, chess moves, lists), and parse_gbnf(to_gbnf()) keeping the language.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "frontend_test_util.h"
#include "grammar/frontends.h"
#include "grammar/matcher.h"

namespace megactx::grammar {
namespace {

void expect_gbnf(std::string_view text, std::initializer_list<std::string_view> accept,
                 std::initializer_list<std::string_view> reject) {
    SCOPED_TRACE(text);
    expect_matches(parse_gbnf(text), accept, reject);
}

void expect_gbnf_error(std::string_view text, std::initializer_list<std::string_view> fragments) {
    SCOPED_TRACE(text);
    expect_error([&] { parse_gbnf(text); }, fragments);
}

// Every sample matched alike by `g` and by the grammar read back from its GBNF text.
void expect_round_trip(const Grammar& g, const std::vector<std::string>& samples) {
    const std::string text = g.to_gbnf();
    SCOPED_TRACE(text);
    const Grammar back = parse_gbnf(text);
    for (const std::string& s : samples) EXPECT_EQ(matches(back, s), matches(g, s)) << "'" << s << "'";
}

constexpr std::string_view kJson = R"gbnf(# JSON values, with up to 8 bytes of whitespace between tokens.
root    ::= ws value
value   ::= ( object | array | string | number | "true" | "false" | "null" ) ws

object  ::= "{" ws ( member ( "," ws member )* )? "}"
member  ::= string ws ":" ws value
array   ::= "[" ws ( value ( "," ws value )* )? "]"

string  ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" escape )* "\""
escape  ::= ["\\/bfnrt] | "u" hex{4}
hex     ::= [0-9a-fA-F]
number  ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= [ \t\n]{0,8}
)gbnf";

// Left-recursive on purpose: the matcher takes any CFG.
constexpr std::string_view kArithmetic = R"gbnf(
root   ::= expr
expr   ::= expr ( "+" | "-" ) term | term
term   ::= term ( "*" | "/" ) factor | factor
factor ::= number | "(" expr ")" | "-" factor
number ::= [0-9]+ ( "." [0-9]+ )?
)gbnf";

constexpr std::string_view kChess = R"gbnf(
root   ::= ( move " " ){0,9} move   # one to ten moves in algebraic notation
move   ::= ( castle | pawn | piece ) [+#]?
castle ::= "O-O" "-O"?
pawn   ::= ( file "x" )? square ( "=" [QRBN] )?
piece  ::= [KQRBN] ( file | rank )? "x"? square
square ::= file rank
file   ::= [a-h]
rank   ::= [1-8]
)gbnf";

constexpr std::string_view kList = R"gbnf(
root ::= "Items:\n" item{1,5}
item ::= "- " [^\n]+ "\n"
)gbnf";

TEST(GrammarGbnf, StringLiteralsAndEscapes) {
    expect_gbnf(R"gbnf(root ::= "hello")gbnf", {"hello"}, {"hell", "hello!", ""});
    expect_gbnf(R"gbnf(root ::= "a\n\t\r\\\"b")gbnf", {"a\n\t\r\\\"b"}, {"a\\n"});
    expect_gbnf(R"gbnf(root ::= "\x41\u00e9\U0001F600")gbnf", {"Aé😀"}, {"A\xE9"});
    expect_gbnf(R"gbnf(root ::= "é日本")gbnf", {"é日本"}, {"é"});
    expect_gbnf(R"gbnf(root ::= "" | "a")gbnf", {"", "a"}, {"aa"});
    expect_gbnf("root ::=", {""}, {"a"});
    // \x80 and up are bytes (as Grammar::to_gbnf prints them), so two of them spell é.
    expect_gbnf(R"gbnf(root ::= "\xC3\xA9")gbnf", {"é"}, {"\xC3"});
}

TEST(GrammarGbnf, CharacterClasses) {
    expect_gbnf("root ::= [a-z0-9_]+", {"abc_09", "z"}, {"", "A", "a-b"});
    expect_gbnf(R"gbnf(root ::= [^"\\]*)gbnf", {"abc", "é😀", "\n", "'"}, {"\"", "\\", "a\"b"});
    expect_gbnf(R"gbnf(root ::= [\]\[\-\^\\] )gbnf", {"]", "[", "-", "^", "\\"}, {"a"});
    expect_gbnf(R"gbnf(root ::= [\n\t\x41-\x43\u00e9])gbnf", {"\n", "\t", "A", "C", "é"}, {"D", " ", "è"});
    expect_gbnf("root ::= [a-] [-b]", {"a-", "ab", "--"}, {"aa"});
    expect_gbnf("root ::= [^]", {"a", "\n", "€"}, {"", "ab"});
}

TEST(GrammarGbnf, NonAsciiClassesAreWellFormedUtf8) {
    expect_gbnf("root ::= [à-ÿ]", {"à", "é", "ÿ"}, {"a", "Ā", "\xC3", "\xC3\xA9\xA9"});
    expect_gbnf("root ::= [^é]", {"è", "a", "😀", "\n"}, {"é", "\xC3", "\xFF", "\xED\xA0\x80"});
    expect_gbnf("root ::= [a€😀-😂]+", {"a€😁", "😂"}, {"😃", "b"});
    expect_gbnf(R"gbnf(root ::= [\u4e00-\u9fff]{2})gbnf", {"日本"}, {"日", "日本語"});
    expect_gbnf(R"gbnf(root ::= [^\x00-\x7F])gbnf", {"é", "€", "😀"}, {"a", "\x7F", "\xC3\xA9\xC3"});
    // Raw bytes: the continuation bytes of two-byte sequences, as to_gbnf prints UTF-8 ranges.
    expect_gbnf(R"gbnf(root ::= "\xC3" [\x80-\xBF])gbnf", {"é", "À"}, {"\xC3", "\xC3\x7F"});
    expect_gbnf(R"gbnf(root ::= [a\x7E-\x81])gbnf", {"a", "~", "\x7F", "\x80", "\x81"}, {"b", "\x82", "\xC2\x80"});
    // Only well-formed lead bytes may start `.` or a negated class.
    ByteSet lead = ByteSet::range(0, 0x7F);
    lead.add_range(0xC2, 0xF4);
    EXPECT_EQ(Matcher(parse_gbnf("root ::= .")).allowed(), lead);
    EXPECT_EQ(Matcher(parse_gbnf("root ::= [^a]")).allowed(), lead.intersect(ByteSet::of('a').complement()));
}

TEST(GrammarGbnf, DotIsAnyCodePoint) {
    expect_gbnf("root ::= . .", {"ab", "\né", "😀€"},
                {"a", "abc", "\xC3\xA9\xA9",
                 "\xF4\x90\x80\x80"
                 "a"});
}

TEST(GrammarGbnf, AlternativesSequencesAndGroups) {
    expect_gbnf(R"gbnf(root ::= "a" "b" | "c")gbnf", {"ab", "c"}, {"ac", "abc", "a"});
    expect_gbnf(R"gbnf(root ::= "a" ("b" | "c") "d")gbnf", {"abd", "acd"}, {"ad", "abcd"});
    expect_gbnf(R"gbnf(root ::= ( ( "x" ) ))gbnf", {"x"}, {""});
    expect_gbnf(R"gbnf(root ::= () "a")gbnf", {"a"}, {""});
    // An empty first alternative and a line break after '|' (as llama.cpp's JSON Schema converter writes).
    expect_gbnf("root ::= | \"a\" |\n  \"b\"", {"", "a", "b"}, {"ab"});
}

TEST(GrammarGbnf, RepetitionOperators) {
    expect_gbnf(R"gbnf(root ::= "a"* "b")gbnf", {"b", "aaab"}, {"", "aa"});
    expect_gbnf(R"gbnf(root ::= "a"+)gbnf", {"a", "aaa"}, {""});
    expect_gbnf(R"gbnf(root ::= "a"? "b")gbnf", {"b", "ab"}, {"aab"});
    expect_gbnf(R"gbnf(root ::= "ab"{2})gbnf", {"abab"}, {"ab", "ababab"});
    expect_gbnf(R"gbnf(root ::= "a"{2,})gbnf", {"aa", "aaaaa"}, {"a"});
    expect_gbnf(R"gbnf(root ::= "a"{2,4})gbnf", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"});
    expect_gbnf(R"gbnf(root ::= "a"{,2})gbnf", {"", "a", "aa"}, {"aaa"});
    expect_gbnf(R"gbnf(root ::= "a"{ 1 , 2 } "b" *)gbnf", {"a", "aabb"}, {"aaa", "b"});
    expect_gbnf(R"gbnf(root ::= ("a" | "bc"){1,2})gbnf", {"a", "bc", "abc", "bcbc"}, {"", "abca"});
    expect_gbnf(R"gbnf(root ::= "a"+?)gbnf", {"", "a", "aa"}, {"b"});  // operators apply in turn: ("a"+)?
    expect_gbnf(R"gbnf(root ::= ("a"{0,2}){2})gbnf", {"", "a", "aaaa"}, {"aaaaa"});
    expect_gbnf(R"gbnf(root ::= ("a"? "b"?){2,3} "c")gbnf", {"c", "ac", "abababc", "bbbc"}, {"aaaac", "ababab"});
}

// A bounded repetition prints as GBNF's own {m,n} (Grammar::to_gbnf) and reads back to the same language, large
// bounds included.
TEST(GrammarGbnf, CountedRepetitionRoundTrip) {
    const Grammar g = parse_gbnf(R"gbnf(root ::= "[" item{0,65535} "]" [0-9]{3,5}
item ::= "ab" | "c")gbnf");
    const std::string text = g.to_gbnf();
    EXPECT_NE(text.find("{0,65535}"), std::string::npos) << text;
    EXPECT_NE(text.find("{3,5}"), std::string::npos) << text;
    const Grammar back = parse_gbnf(text);
    for (const Grammar* x : {&g, &back}) {
        EXPECT_TRUE(matches(*x, "[]123"));
        EXPECT_TRUE(matches(*x, "[abcab]12345"));
        EXPECT_FALSE(matches(*x, "[]12"));
        EXPECT_FALSE(matches(*x, "[]123456"));
        EXPECT_FALSE(matches(*x, "[a]123"));
    }
}

TEST(GrammarGbnf, LayoutCommentsAndForwardReferences) {
    const std::string_view text =
        "# a comment line\n"
        "root ::= greeting  # a trailing comment\n"
        "         name\n"
        "  | \"bye\"\r\n"
        "greeting ::= (\n"
        "    \"hi\" |   # inside a group\n"
        "    \"hello\"\n"
        "  ) \" \"\n"
        "\n"
        "name ::= [A-Z] [a-z]*\n";
    expect_gbnf(text, {"hi Ann", "hello Bob", "bye"}, {"hi ann", "hiAnn", "bye Ann"});
    const Grammar g = parse_gbnf(text);
    EXPECT_EQ(g.rules[static_cast<size_t>(g.root)].name, "root");
}

TEST(GrammarGbnf, RulesKeepTheirNamesAndTheRootCanBeChosen) {
    const std::string_view text = R"gbnf(
value ::= "v" root-1
start ::= value "!"
root-1 ::= [0-9]
root ::= "r"
)gbnf";
    const Grammar g = parse_gbnf(text, "start");
    EXPECT_EQ(g.rules[static_cast<size_t>(g.root)].name, "start");
    std::vector<std::string> names;
    for (const Rule& r : g.rules) names.push_back(r.name);
    for (const char* want : {"value", "start", "root-1", "root"})
        EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    expect_matches(g, {"v1!"}, {"r", "v1", "vx!"});
    expect_matches(parse_gbnf(text), {"r"}, {"v1!"});
}

TEST(GrammarGbnf, JsonGrammar) {
    const Grammar g = parse_gbnf(kJson);
    expect_matches(g,
                   {"{}", "[]", "null", "-0.5e+10", "\"a\\u00e9\\n\"", "\"é😀\"",
                    R"gbnf({"a": [1, 2.5, {"b": null}], "c" : "d\"e"})gbnf", "  [ true ,false ]\n", "[[[]]]"},
                   {"{", "{\"a\" 1}", "[1,]", "01", "\"a\nb\"", "\"\\x\"", "\"\\u12g4\"", "tru", "{\"a\":1,}",
                    "[1]          ", "\"\x7F\""});
}

TEST(GrammarGbnf, ArithmeticGrammarWithLeftRecursion) {
    expect_matches(parse_gbnf(kArithmetic), {"1", "1+2*3", "(1+2)*3.5", "-(4/2)-1", "2*-3", "((7))"},
                   {"", "1+", "(1+2", "1 + 2", "+1", "1..2", "()"});
}

TEST(GrammarGbnf, ChessMoves) {
    expect_matches(parse_gbnf(kChess), {"e4", "e4 e5 Nf3 Nc6 Bb5", "O-O-O", "exd5", "e8=Q#", "Rae1+", "N1xf3"},
                   {"e9", "i4", "O-O-O-O", "e4  e5", "Ke", "e4 e5 e4 e5 e4 e5 e4 e5 e4 e5 e4"});
}

TEST(GrammarGbnf, ListGrammar) {
    expect_matches(
        parse_gbnf(kList), {"Items:\n- one\n", "Items:\n- a\n- b c\n- é\n"},
        {"Items:\n", "Items:\n- \n", "Items:\n- a", "Items:\n-a\n", "Items:\n- 1\n- 2\n- 3\n- 4\n- 5\n- 6\n"});
}

TEST(GrammarGbnf, RoundTripThroughToGbnf) {
    const std::vector<std::string> json = {"{}", "[1, {\"a\": \"é\\n\"}]", "\"\\u00zz\"", "[1,]", "-0.5e10", " null"};
    expect_round_trip(parse_gbnf(kJson), json);
    expect_round_trip(parse_gbnf(kArithmetic), {"1+2*3", "(1", "-(2)", ""});
    expect_round_trip(parse_gbnf(kChess), {"e4 e5", "O-O-O+", "Nbxd7", "e4  e5"});
    expect_round_trip(parse_gbnf(kList), {"Items:\n- a\n", "Items:\n"});
    expect_round_trip(parse_gbnf(R"gbnf(root ::= [^é"]{1,3} . [à-ÿ😀]?)gbnf"),
                      {"ab\n", "é", "aé😀", "x😀😀", "\"ab", "abc\xC3", "abcd"});
    // Byte sets that cross from ASCII into bytes above 0x7F print as one range, such as [ -\xFF].
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.bytes(ByteSet::range(0x20, 0xFF)), b.bytes(ByteSet::any())});
    const Grammar bytes = b.finish(root);
    EXPECT_NE(bytes.to_gbnf().find("[ -\\xFF] [\\x00-\\xFF]"), std::string::npos) << bytes.to_gbnf();
    expect_round_trip(bytes, {" \xFF", "\xC3\x00", "\x1F ", "a", "abc"});
    expect_round_trip(compile_choices({"yes", "no", "", "日本"}), {"yes", "no", "", "日本", "ye", "日"});
}

TEST(GrammarGbnf, ChoicesMatchExactlyOneString) {
    expect_matches(compile_choices({"red", "green", "blue"}), {"red", "green", "blue"},
                   {"", "re", "redd", "Red", "redgreen"});
    expect_matches(compile_choices({"a", "ab", "é"}), {"a", "ab", "é"}, {"b", "\xC3"});
    expect_matches(compile_choices({""}), {""}, {"a"});
    expect_error([] { compile_choices({}); }, {"empty"});
}

TEST(GrammarGbnf, RandomTextParsesOrIsAGrammarError) {
    // GBNF's punctuation in every order after `root ::=`: anything but a GrammarError (or a crash) is a parser bug.
    constexpr std::string_view kAlphabet = "ab \n()[]{}|*+?^.\"\\-,0129xu#:=\xC3\xA9";
    std::mt19937 rng(7);
    int parsed = 0;
    for (int n = 0; n < 3000; ++n) {
        std::string text = "root ::= ";
        for (size_t len = rng() % 14; len > 0; --len) text += kAlphabet[rng() % kAlphabet.size()];
        try {
            const Grammar g = parse_gbnf(text + "\na ::= \"x\"\nb ::= \"y\"");
            EXPECT_GE(g.root, 0);
            ++parsed;
        } catch (const GrammarError&) {
        }
    }
    EXPECT_GT(parsed, 100);
}

TEST(GrammarGbnf, ReferenceAndDefinitionErrorsSayWhere) {
    expect_gbnf_error("root ::= a b\na ::= \"x\"\n", {"undefined rule 'b'", "line 1, column 12"});
    expect_gbnf_error("root ::= \"x\"\na ::= \"y\"\n  root ::= \"z\"",
                      {"'root' is defined twice", "line 3, column 3", "first at line 1, column 1"});
    expect_gbnf_error("start ::= \"x\"\n", {"no rule 'root'", "line 2"});
    expect_gbnf_error("", {"no rule 'root'"});
    expect_gbnf_error("root ::= root \"a\"\n", {"never end"});
}

TEST(GrammarGbnf, SyntaxErrorsSayWhere) {
    expect_gbnf_error("root ::= \"abc", {"missing '\"'", "line 1, column 10"});
    expect_gbnf_error("root ::= [a-z", {"missing ']'", "line 1, column 10"});
    expect_gbnf_error("root ::=\n  (\"a\" | \"b\"\n", {"missing ')'", "line 2, column 3"});
    expect_gbnf_error("root ::= \"a\")", {"unexpected ')'", "line 1, column 13"});
    expect_gbnf_error("root = \"a\"", {"expected '::='", "line 1, column 6"});
    expect_gbnf_error("::= \"a\"", {"expected a rule name", "line 1, column 1"});
    expect_gbnf_error("root ::= \"a\" x ::= \"b\"", {"newline", "line 1, column 14"});
    expect_gbnf_error("root ::= * \"a\"", {"nothing to repeat", "line 1, column 10"});
    expect_gbnf_error("root ::= \"\\q\"", {"unknown escape '\\q'", "line 1, column 11"});
    expect_gbnf_error("root ::= \"\\u12\"", {"4 hex digits", "line 1, column 11"});
    expect_gbnf_error("root ::= \"\\uD800\"", {"not a character", "line 1, column 11"});
    expect_gbnf_error("root ::= []", {"empty character class", "line 1, column 10"});
    expect_gbnf_error("root ::= [z-a]", {"end below its start", "line 1, column 11"});
    expect_gbnf_error("root ::= \"a\"{3,2}", {"max below min", "line 1, column 13"});
    expect_gbnf_error("root ::= \"a\"{2", {"expected ',' or '}'", "line 1, column 15"});
    expect_gbnf_error("root ::= \"a\"{99999999}", {"bound above", "line 1, column 14"});
    expect_gbnf_error("root ::= [^\\x80]", {"raw byte", "negated", "line 1, column 12"});
    expect_gbnf_error("root ::= [\\u00C0-\\xFF]", {"raw byte", "code point", "line 1, column 11"});
    expect_gbnf_error("root ::= [^\\x00-\\U0010FFFF]", {"matches no character", "line 1, column 10"});
    expect_gbnf_error("root ::= <[1000]>", {"unexpected '<'", "line 1, column 10"});
    expect_gbnf_error("root ::= \"a\" \n\n  [\xFF]", {"invalid UTF-8", "line 3, column 4"});
    expect_gbnf_error("root ::= " + std::string(600, '(') + "\"a\"" + std::string(600, ')'), {"nested too deeply"});
}

}  // namespace
}  // namespace megactx::grammar
