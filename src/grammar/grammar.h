// The grammar engine's one internal form (issue 51): a context-free grammar over bytes. Every front end — JSON
// Schema, regular expressions, GBNF, choice lists — compiles to it through Builder, and the matcher
// (grammar/matcher.h) runs it byte by byte. It knows bytes, never tokens or HTTP: the token masks are built on top
// (grammar/token_mask.h).
//
// A rule has alternatives; an alternative is a sequence of symbols; a symbol is a terminal (a set of bytes, one
// byte of input) or a reference to a rule. The empty sequence is ε. UTF-8 is spelled out as byte sequences by the
// front ends (Builder::utf8_range), so the matcher never decodes. A rule may instead be a counted repetition
// (Rule::max > 0): its one symbol between min and max times, which the matcher reads with a count, so that a
// bound such as maxLength 65535 costs one rule rather than one per count.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace megactx::grammar {

// A grammar that cannot be compiled: a syntax error, an unsupported keyword, a size limit. The message says which
// and where; the server turns it into a 400.
class GrammarError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// 256 bits: the bytes one terminal accepts.
struct ByteSet {
    std::array<uint64_t, 4> words{};

    static ByteSet of(uint8_t b);
    static ByteSet range(uint8_t lo, uint8_t hi);  // lo..hi inclusive
    static ByteSet any();
    void add(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
    void add_range(uint8_t lo, uint8_t hi);
    void add(const ByteSet& o);
    bool has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
    bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
    int count() const;
    ByteSet complement() const;
    ByteSet intersect(const ByteSet& o) const;
    bool operator==(const ByteSet& o) const = default;
};

struct Symbol {
    int32_t rule = -1;  // >= 0: a reference to rules[rule]; -1: the terminal `bytes`
    ByteSet bytes;

    static Symbol ref(int32_t r) { return Symbol{r, {}}; }
    static Symbol terminal(const ByteSet& b) { return Symbol{-1, b}; }
    bool is_rule() const { return rule >= 0; }
    bool operator==(const Symbol& o) const = default;
};

using Sequence = std::vector<Symbol>;  // empty: ε

struct Rule {
    std::string name;  // for messages and to_gbnf(); unique within a grammar
    std::vector<Sequence> alternatives;
    // A counted repetition (Builder::repeat): max > 0, and the rule derives item{min,max}, where the item is the
    // one symbol of its one alternative (min <= max). max == 0: an ordinary rule, its alternatives as they are.
    uint32_t min = 0, max = 0;
    bool counted() const { return max > 0; }
};

struct Grammar {
    std::vector<Rule> rules;
    int32_t root = -1;

    // GrammarError unless: root and every reference name a rule, every rule has an alternative (a counted one has
    // exactly one, of one symbol, and min <= max), and every rule can derive some finite byte string (a rule that
    // only recurses into itself matches nothing and is a mistake).
    void validate() const;
    int64_t n_symbols() const;  // symbols over all alternatives: the size limit counts these
    // GBNF text (llama.cpp's syntax) that parse_gbnf() reads back into an equivalent grammar: for `grammar compile`
    // and for messages.
    std::string to_gbnf() const;
};

// Composes grammars. Each helper returns a Symbol to use inside a sequence; rule() and define() make named rules
// for recursion ($ref, GBNF rules referenced before they are defined).
class Builder {
  public:
    explicit Builder(int64_t max_symbols = 2'000'000) : max_symbols_(max_symbols) {}

    int32_t rule(std::string_view name);  // a new rule without alternatives; the name is made unique
    void add_alternative(int32_t rule, Sequence seq);
    int32_t n_rules() const { return static_cast<int32_t>(g_.rules.size()); }
    const std::string& name(int32_t rule) const { return g_.rules.at(static_cast<size_t>(rule)).name; }

    Symbol bytes(const ByteSet& b) { return Symbol::terminal(b); }
    Symbol literal(std::string_view s, std::string_view hint = "lit");  // exactly these bytes
    Symbol seq(Sequence items, std::string_view hint = "seq");          // one rule of one alternative
    Symbol alt(std::vector<Sequence> alternatives, std::string_view hint = "alt");
    Symbol optional(const Symbol& s, std::string_view hint = "opt");
    // item{min,max}; max < 0: unbounded. A bounded repetition (other than {0,0} and {1,1}) is one counted rule
    // (Rule::max), whatever its bounds; item{min,} is item{min,min} then item*.
    Symbol repeat(const Symbol& item, int64_t min, int64_t max, std::string_view hint = "rep");
    // Makes `rule` (new, without alternatives) the counted repetition item{min,max}, 1 <= max, min <= max: for a
    // copy of a grammar's counted rule under its own number.
    void set_repeat(int32_t rule, const Symbol& item, int64_t min, int64_t max);
    // Every UTF-8 encoding of a code point in [lo, hi] (surrogates excluded), as alternatives of byte sequences.
    Symbol utf8_range(uint32_t lo, uint32_t hi, std::string_view hint = "utf8");
    // Any one UTF-8 code point whose bytes are not in `exclude_ascii` (an ASCII-only exclusion: JSON strings
    // exclude '"', '\\' and control characters).
    Symbol utf8_char_except(const ByteSet& exclude_ascii, std::string_view hint = "char");
    // Any byte string (ε included) in which `forbidden` never occurs: a right-linear grammar of the string-matching
    // automaton's states (Knuth–Morris–Pratt), one rule per matched prefix of `forbidden`.
    Symbol text_without(std::string_view forbidden, std::string_view hint = "text");
    // A copy of all of `g`'s rules (names made unique), referenced by its root: one grammar inside another (a
    // response_format's content beside tool calls).
    Symbol embed(const Grammar& g);

    // The grammar rooted at `root`, validated. The builder is left empty.
    Grammar finish(int32_t root);

    // The largest bound repeat() takes (the front ends refuse theirs sooner); the matcher numbers every count of
    // every counted rule, so their sum must stay well inside 32 bits.
    static constexpr int64_t kMaxRepeat = int64_t{1} << 28;

  private:
    void count(int64_t n);
    Grammar g_;
    std::unordered_set<std::string> names_;  // in use: rule() makes each name unique with a numeric suffix
    std::unordered_map<std::string, int> next_suffix_;  // per base name: where rule() looks for a free suffix
    int64_t n_symbols_ = 0, max_symbols_;
};

}  // namespace megactx::grammar
