// Regular expressions (vLLM's and SGLang's `regex` outputs, JSON Schema's `pattern`) compiled to a Grammar: a
// recursive-descent parser in Python's `re` syntax with ASCII class escapes, building the front ends' syntax tree.
// Features a context-free recogniser cannot honour (backreferences, lookaround, anchors inside the pattern, flags)
// are errors naming the feature and its offset.
#include <fmt/format.h>

#include <cctype>
#include <optional>

#include "grammar/frontend_common.h"
#include "grammar/frontends.h"

namespace megactx::grammar {

namespace {

using frontend::CharClass;
using frontend::CodePointRange;
using frontend::Node;

const std::vector<CodePointRange> kDigit = {{'0', '9'}};
const std::vector<CodePointRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodePointRange> kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space

// Numbers in {m,n} beyond this are refused before they could overflow; the builder's size limit refuses far
// smaller bounds anyway.
constexpr int64_t kMaxBound = 1'000'000;

class RegexParser {
  public:
    explicit RegexParser(std::string_view p) : p_(p) {}

    Node parse() {
        Node n = alternation(0, true);
        if (i_ < p_.size()) fail("unbalanced ')'", i_);  // alternation() stops only at the end or at ')'
        return n;
    }

  private:
    [[noreturn]] void fail(std::string_view what, size_t at) const {
        throw GrammarError(fmt::format("regex: {} at offset {} of /{}/", what, at, p_));
    }
    [[noreturn]] void unsupported(std::string_view feature, size_t at) const {
        throw GrammarError(fmt::format("regex: {} at offset {} is not supported (/{}/)", feature, at, p_));
    }

    bool at_end() const { return i_ >= p_.size(); }
    char peek(size_t ahead = 0) const { return i_ + ahead < p_.size() ? p_[i_ + ahead] : '\0'; }
    bool starts_with(std::string_view s) const { return p_.substr(i_).starts_with(s); }

    // `top`: a branch of the whole pattern, where ^ may open and $ may close it.
    Node alternation(int depth, bool top) {
        if (depth > frontend::kMaxNesting) fail("groups nested too deeply", i_);
        Node alt = Node::make(Node::Kind::kAlt, i_);
        alt.items.push_back(sequence(depth, top));
        while (peek() == '|' && !at_end()) {
            ++i_;
            alt.items.push_back(sequence(depth, top));
        }
        if (alt.items.size() == 1) return std::move(alt.items[0]);
        return alt;
    }

    Node sequence(int depth, bool top) {
        Node seq = Node::make(Node::Kind::kSeq, i_);
        const size_t start = i_;
        while (!at_end() && peek() != '|' && peek() != ')') {
            const size_t at = i_;
            const char c = peek();
            if (c == '^' || starts_with("\\A")) {
                if (!top || at != start) unsupported("'^' (an anchor) inside the pattern", at);
                i_ += c == '^' ? 1 : 2;
                if (quantifier_next()) fail("nothing to repeat", i_);
                continue;
            }
            if (c == '$' || starts_with("\\Z") || starts_with("\\z")) {
                i_ += c == '$' ? 1 : 2;
                if (!top || (!at_end() && peek() != '|')) unsupported("'$' (an anchor) inside the pattern", at);
                continue;
            }
            Node atom_node = atom(depth);
            quantifiers(atom_node);
            seq.items.push_back(std::move(atom_node));
        }
        if (seq.items.size() == 1) return std::move(seq.items[0]);
        return seq;
    }

    bool quantifier_next() {
        if (at_end()) return false;
        const char c = peek();
        if (c == '*' || c == '+' || c == '?') return true;
        return c == '{' && bounds().has_value();
    }

    // {m}, {m,}, {m,n} or {,n} at i_ (not consumed), as Python reads them; nullopt: the '{' is a literal.
    std::optional<std::pair<int64_t, int64_t>> bounds() const {
        size_t k = i_ + 1;
        const auto number = [&](int64_t& v) {
            const size_t from = k;
            v = 0;
            while (k < p_.size() && p_[k] >= '0' && p_[k] <= '9') {
                v = v * 10 + (p_[k] - '0');
                if (v > kMaxBound) fail(fmt::format("repetition bound above {}", kMaxBound), from);
                ++k;
            }
            return k > from;
        };
        int64_t lo = 0, hi = 0;
        const bool has_lo = number(lo);
        if (k < p_.size() && p_[k] == '}') {
            if (!has_lo) return std::nullopt;
            return std::pair{lo, lo};
        }
        if (k >= p_.size() || p_[k] != ',') return std::nullopt;
        ++k;
        const bool has_hi = number(hi);
        if (k >= p_.size() || p_[k] != '}') return std::nullopt;
        if (!has_lo) lo = 0;
        if (!has_hi) hi = -1;
        if (!has_lo && !has_hi) return std::nullopt;  // "{,}" is literal text in Python
        return std::pair{lo, hi};
    }

    void quantifiers(Node& n) {
        bool quantified = false;
        while (!at_end()) {
            const size_t at = i_;
            int64_t lo = 0, hi = -1;
            const char c = peek();
            if (c == '*') {
                ++i_;
            } else if (c == '+') {
                lo = 1, ++i_;
            } else if (c == '?') {
                hi = 1, ++i_;
            } else if (c == '{') {
                const auto b = bounds();
                if (!b) return;
                lo = b->first, hi = b->second;
                if (hi >= 0 && hi < lo) fail(fmt::format("repetition {{{},{}}} with max below min", lo, hi), at);
                i_ = p_.find('}', i_) + 1;
            } else {
                return;
            }
            if (quantified) fail("multiple repeat (a quantifier after a quantifier)", at);
            quantified = true;
            if (peek() == '?' && !at_end()) {
                ++i_;  // lazy: the same language
            } else if (peek() == '+' && !at_end()) {
                unsupported("a possessive quantifier", i_);
            }
            Node rep = Node::make(Node::Kind::kRepeat, at);
            rep.min = lo;
            rep.max = hi;
            rep.items.push_back(std::move(n));
            n = std::move(rep);
        }
    }

    Node atom(int depth) {
        const size_t at = i_;
        const char c = peek();
        switch (c) {
            case '*':
            case '+':
            case '?':
                fail("nothing to repeat", at);
            case '{':
                if (bounds()) fail("nothing to repeat", at);
                ++i_;
                return Node::bytes("{", at);
            case '(':
                return group(depth);
            case '[':
                return Node::of_class(char_class(), at);
            case '.': {
                ++i_;
                CharClass cls;
                cls.negated = true;
                cls.add('\n', '\n');
                return Node::of_class(std::move(cls), at);
            }
            case '\\':
                return escape_atom();
            default:
                return Node::bytes(literal_char(), at);
        }
    }

    // One literal code point's bytes (a quantifier after it repeats the whole character).
    std::string literal_char() {
        const size_t at = i_;
        uint32_t cp = 0;
        if (!frontend::decode_utf8(p_, i_, cp)) fail("invalid UTF-8", at);
        return std::string(p_.substr(at, i_ - at));
    }

    Node group(int depth) {
        const size_t at = i_;
        ++i_;
        if (peek() == '?') {
            if (starts_with("?:")) {
                i_ += 2;
            } else if (starts_with("?P<") || (starts_with("?<") && peek(2) != '=' && peek(2) != '!')) {
                const size_t close = p_.find('>', i_);
                if (close == std::string_view::npos) fail("unterminated group name", at);
                i_ = close + 1;
            } else if (starts_with("?=") || starts_with("?!")) {
                unsupported("lookahead '(?=' / '(?!'", at);
            } else if (starts_with("?<=") || starts_with("?<!")) {
                unsupported("lookbehind '(?<=' / '(?<!'", at);
            } else if (starts_with("?P=")) {
                unsupported("a backreference '(?P=name)'", at);
            } else if (starts_with("?>")) {
                unsupported("an atomic group '(?>'", at);
            } else if (starts_with("?(")) {
                unsupported("a conditional group '(?('", at);
            } else if (starts_with("?#")) {
                unsupported("an inline comment '(?#'", at);
            } else {
                unsupported("an inline flag group such as '(?i)'", at);
            }
        }
        Node inner = alternation(depth + 1, false);
        if (peek() != ')' || at_end()) fail("missing ')' for the group opened", at);
        ++i_;
        return inner;
    }

    uint32_t hex(size_t digits, size_t at) {
        uint32_t v = 0;
        for (size_t k = 0; k < digits; ++k, ++i_) {
            const char h = peek();
            if (at_end() || !std::isxdigit(static_cast<unsigned char>(h)))
                fail(fmt::format("escape needs {} hex digits", digits), at);
            v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (v > frontend::kMaxCodePoint || (v >= frontend::kSurrogateLo && v <= frontend::kSurrogateHi))
            fail(fmt::format("escape for U+{:X}, not a character", v), at);
        return v;
    }

    // ECMAScript's \u{H...} (JSON Schema patterns are ECMA-262), the brace at i_.
    uint32_t braced_hex(size_t at) {
        const size_t close = p_.find('}', i_);
        const size_t digits = close == std::string_view::npos ? 0 : close - i_ - 1;
        if (digits == 0 || digits > 6) fail("\\u{...} needs 1 to 6 hex digits", at);
        ++i_;
        const uint32_t v = hex(digits, at);
        ++i_;
        return v;
    }

    // A class escape (\d \w \s and negations) as ranges, if `e` is one.
    static std::optional<std::vector<CodePointRange>> class_escape(char e) {
        switch (e) {
            case 'd':
                return kDigit;
            case 'w':
                return kWord;
            case 's':
                return kSpace;
            case 'D':
                return frontend::complement(kDigit);
            case 'W':
                return frontend::complement(kWord);
            case 'S':
                return frontend::complement(kSpace);
            default:
                return std::nullopt;
        }
    }

    // The code point of a single-character escape whose backslash is at i_ (consumed), `in_class` for \b.
    uint32_t escaped_char(bool in_class) {
        const size_t at = i_;
        ++i_;
        if (at_end()) fail("a trailing backslash", at);
        const char e = peek();
        ++i_;
        switch (e) {
            case 'n':
                return '\n';
            case 't':
                return '\t';
            case 'r':
                return '\r';
            case 'f':
                return '\f';
            case 'v':
                return '\v';
            case 'a':
                return '\a';
            case '0':
                if (peek() >= '0' && peek() <= '7' && !at_end()) unsupported("an octal escape", at);
                return 0;
            case 'x':
                return hex(2, at);
            case 'u':
                if (peek() == '{' && !at_end()) return braced_hex(at);
                return hex(4, at);
            case 'U':
                return hex(8, at);
            case 'b':
                if (in_class) return '\b';
                unsupported("a word boundary '\\b'", at);
            case 'B':
                unsupported("a word boundary '\\B'", at);
            default:
                break;
        }
        if (e >= '1' && e <= '9') unsupported("a backreference", at);
        if (e == 'k' && peek() == '<') unsupported("a backreference '\\k<name>'", at);
        if (e == 'p' || e == 'P') unsupported("a Unicode property escape", at);
        if (static_cast<unsigned char>(e) >= 0x80 || std::isalnum(static_cast<unsigned char>(e)))
            fail(fmt::format("unknown escape '\\{}'", e), at);
        return static_cast<unsigned char>(e);  // escaped punctuation or space stands for itself
    }

    Node escape_atom() {
        const size_t at = i_;
        if (auto r = class_escape(peek(1))) {
            i_ += 2;
            CharClass cls;
            cls.add(*r);
            return Node::of_class(std::move(cls), at);
        }
        std::string bytes;
        frontend::append_utf8(bytes, escaped_char(false));
        return Node::bytes(std::move(bytes), at);
    }

    // One class member at i_: a code point, or (via `ranges`) a class escape such as \d.
    uint32_t class_member(std::optional<std::vector<CodePointRange>>& ranges) {
        const size_t at = i_;
        if (peek() == '\\') {
            if ((ranges = class_escape(peek(1)))) {
                i_ += 2;
                return 0;
            }
            return escaped_char(true);
        }
        uint32_t cp = 0;
        if (!frontend::decode_utf8(p_, i_, cp)) fail("invalid UTF-8", at);
        return cp;
    }

    CharClass char_class() {
        const size_t open = i_;
        ++i_;
        CharClass cls;
        if (peek() == '^' && !at_end()) {
            cls.negated = true;
            ++i_;
        }
        bool first = true;
        while (true) {
            if (at_end()) fail("missing ']' for the class opened", open);
            if (peek() == ']' && !first) break;
            first = false;
            const size_t at = i_;
            std::optional<std::vector<CodePointRange>> ranges;
            const uint32_t lo = class_member(ranges);
            if (ranges) {
                cls.add(*ranges);
                continue;
            }
            if (peek() == '-' && i_ + 1 < p_.size() && peek(1) != ']') {
                ++i_;
                std::optional<std::vector<CodePointRange>> hi_ranges;
                const uint32_t hi = class_member(hi_ranges);
                if (hi_ranges) {  // [a-\d]: ECMAScript's reading, as in [\w-.] (JSON Schema patterns are ECMA-262)
                    cls.add(lo, lo);
                    cls.add('-', '-');
                    cls.add(*hi_ranges);
                    continue;
                }
                if (hi < lo) fail("a character range with its end below its start", at);
                cls.add(lo, hi);
            } else {
                cls.add(lo, lo);
            }
        }
        ++i_;
        return cls;
    }

    std::string_view p_;
    size_t i_ = 0;
};

}  // namespace

Symbol add_regex(Builder& b, std::string_view pattern) {
    const Node tree = RegexParser(pattern).parse();
    frontend::Lowering lower(
        b, [](const Node&) -> Symbol { throw GrammarError("regex: rule reference in a regular expression"); },
        [pattern](size_t at) { return fmt::format("regex: offset {} of /{}/", at, pattern); });
    return lower.symbol(tree, "re");
}

Grammar compile_regex(std::string_view pattern) {
    Builder b;
    const int32_t root = b.rule("root");
    const Symbol s = add_regex(b, pattern);
    b.add_alternative(root, {s});
    return b.finish(root);
}

}  // namespace megactx::grammar
