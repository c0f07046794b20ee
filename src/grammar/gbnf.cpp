// GBNF (llama.cpp's grammar format) and choice lists compiled to a Grammar. The GBNF text is parsed whole into the
// front ends' syntax tree first, so that rules may be used before they are defined and every rule keeps its own
// name; then each rule is lowered through one Builder.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "grammar/frontend_common.h"
#include "grammar/frontends.h"

namespace megactx::grammar {

namespace {

using frontend::CharClass;
using frontend::Node;

constexpr int64_t kMaxBound = 1'000'000;  // {m,n} numbers beyond this are refused before they could overflow

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; }

struct RuleDef {
    std::string name;
    size_t pos = 0;  // of the name
    Node body;
};

class GbnfParser {
  public:
    explicit GbnfParser(std::string_view text) : s_(text) {}

    std::string where(size_t at) const { return fmt::format("gbnf: {}", line_column(at)); }

    std::string line_column(size_t at) const {
        size_t line = 1, col = 1;
        for (size_t k = 0; k < at && k < s_.size(); ++k) {
            if (s_[k] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        return fmt::format("line {}, column {}", line, col);
    }

    std::vector<RuleDef> parse() {
        std::vector<RuleDef> rules;
        skip_space();
        while (!at_end()) {
            const size_t at = i_;
            std::string name = parse_name();
            if (name.empty()) fail(fmt::format("expected a rule name, found {}", describe()), at);
            skip_space();
            if (!s_.substr(i_).starts_with("::=")) fail(fmt::format("expected '::=' after '{}'", name), i_);
            i_ += 3;
            Node body = alternatives(0);
            if (!at_end() && !looking_at_definition())
                fail(fmt::format("unexpected {} in rule '{}'", describe(), name), i_);
            if (!at_end() && !newline_seen_) fail("expected a newline before the next rule", i_);
            rules.push_back({std::move(name), at, std::move(body)});
        }
        return rules;
    }

  private:
    [[noreturn]] void fail(std::string_view what, size_t at) const {
        throw GrammarError(fmt::format("{}: {}", where(at), what));
    }

    bool at_end() const { return i_ >= s_.size(); }
    char peek(size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }

    std::string describe() const {
        if (at_end()) return "the end of the grammar";
        const unsigned char c = static_cast<unsigned char>(peek());
        if (c < 0x20 || c >= 0x7F) return fmt::format("byte 0x{:02X}", c);
        return fmt::format("'{}'", static_cast<char>(c));
    }

    // Spaces, newlines and comments; newline_seen_ says whether a line ended among them.
    void skip_space() {
        newline_seen_ = false;
        while (!at_end()) {
            const char c = peek();
            if (c == '#') {
                while (!at_end() && peek() != '\n') ++i_;
            } else if (c == '\n') {
                newline_seen_ = true;
                ++i_;
            } else if (c == ' ' || c == '\t' || c == '\r') {
                ++i_;
            } else {
                break;
            }
        }
    }

    std::string parse_name() {
        const size_t from = i_;
        while (!at_end() && is_name_char(peek())) ++i_;
        return std::string(s_.substr(from, i_ - from));
    }

    // At `name ::=`: the start of the next rule, which ends the current one. Nothing is consumed.
    bool looking_at_definition() const {
        size_t k = i_;
        while (k < s_.size() && is_name_char(s_[k])) ++k;
        if (k == i_) return false;
        while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t')) ++k;
        return s_.substr(k).starts_with("::=");
    }

    Node alternatives(int depth) {
        if (depth > frontend::kMaxNesting) fail("groups nested too deeply", i_);
        Node alt = Node::make(Node::Kind::kAlt, i_);
        alt.items.push_back(sequence(depth));
        while (peek() == '|' && !at_end()) {
            ++i_;
            alt.items.push_back(sequence(depth));
        }
        if (alt.items.size() == 1) return std::move(alt.items[0]);
        return alt;
    }

    // Stops before '|', ')', the end, or (at the top level) the next rule's `name ::=`. Newlines are spaces: a rule
    // may go on over several lines, as every grammar llama.cpp accepts has a definition after each line break.
    Node sequence(int depth) {
        Node seq = Node::make(Node::Kind::kSeq, i_);
        while (true) {
            skip_space();
            if (at_end() || peek() == '|' || peek() == ')') break;
            if (depth == 0 && looking_at_definition()) break;
            Node item = element(depth);
            postfix(item);
            seq.items.push_back(std::move(item));
        }
        if (seq.items.size() == 1) return std::move(seq.items[0]);
        return seq;
    }

    Node element(int depth) {
        const size_t at = i_;
        const char c = peek();
        if (c == '"') return Node::bytes(string_literal(), at);
        if (c == '[') return Node::of_class(char_class(), at);
        if (c == '.') {
            ++i_;
            CharClass any;
            any.negated = true;
            return Node::of_class(std::move(any), at);
        }
        if (c == '(') {
            ++i_;
            Node inner = alternatives(depth + 1);
            skip_space();
            if (peek() != ')' || at_end()) fail("missing ')' for the group opened here", at);
            ++i_;
            return inner;
        }
        if (is_name_char(c)) {
            Node ref = Node::make(Node::Kind::kRef, at);
            ref.text = parse_name();
            return ref;
        }
        if (c == '*' || c == '+' || c == '?' || c == '{') fail(fmt::format("'{}' with nothing to repeat", c), at);
        fail(fmt::format("unexpected {}", describe()), at);
    }

    int64_t number() {
        const size_t at = i_;
        int64_t v = 0;
        if (!std::isdigit(static_cast<unsigned char>(peek())) || at_end()) fail("expected a number", at);
        while (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) {
            v = v * 10 + (peek() - '0');
            if (v > kMaxBound) fail(fmt::format("repetition bound above {}", kMaxBound), at);
            ++i_;
        }
        return v;
    }

    void inline_space() {
        while (peek() == ' ' || peek() == '\t') ++i_;
    }

    // * + ? {m} {m,} {m,n} {,n} after an element; several apply in turn ("a*?" is (a*)?).
    void postfix(Node& n) {
        while (true) {
            const size_t save = i_;
            inline_space();
            if (at_end()) return;
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
                ++i_;
                inline_space();
                if (peek() != ',') lo = number();
                inline_space();
                if (peek() == '}') {
                    hi = lo;
                } else if (peek() == ',') {
                    ++i_;
                    inline_space();
                    if (peek() != '}') hi = number();
                    inline_space();
                    if (peek() != '}') fail("expected '}' to close the repetition", i_);
                } else {
                    fail("expected ',' or '}' in the repetition", i_);
                }
                ++i_;
                if (hi >= 0 && hi < lo) fail(fmt::format("repetition {{{},{}}} with max below min", lo, hi), at);
            } else {
                i_ = save;
                return;
            }
            Node rep = Node::make(Node::Kind::kRepeat, at);
            rep.min = lo;
            rep.max = hi;
            rep.items.push_back(std::move(n));
            n = std::move(rep);
        }
    }

    // An escape at i_ (the backslash), consumed. Code points come back as `cp`; GBNF's \xHH above 0x7F is a raw
    // byte, returned as `raw` (how Grammar::to_gbnf prints bytes of UTF-8 sequences).
    void escape(uint32_t& cp, bool& raw) {
        const size_t at = i_;
        ++i_;
        raw = false;
        if (at_end()) fail("a backslash at the end of the grammar", at);
        const char e = peek();
        ++i_;
        const auto hex = [&](size_t digits) {
            uint32_t v = 0;
            for (size_t k = 0; k < digits; ++k, ++i_) {
                const char h = peek();
                if (at_end() || !std::isxdigit(static_cast<unsigned char>(h)))
                    fail(fmt::format("'\\{}' needs {} hex digits", e, digits), at);
                v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            return v;
        };
        switch (e) {
            case 'n':
                cp = '\n';
                return;
            case 'r':
                cp = '\r';
                return;
            case 't':
                cp = '\t';
                return;
            case 'x':
                cp = hex(2);
                raw = cp >= 0x80;
                return;
            case 'u':
                cp = hex(4);
                break;
            case 'U':
                cp = hex(8);
                break;
            default:
                if (std::ispunct(static_cast<unsigned char>(e)) || e == ' ') {
                    cp = static_cast<unsigned char>(e);  // \\ \" \[ \] \- \^ and other punctuation: itself
                    return;
                }
                fail(fmt::format("unknown escape '\\{}'", e), at);
        }
        if (cp > frontend::kMaxCodePoint || (cp >= frontend::kSurrogateLo && cp <= frontend::kSurrogateHi))
            fail(fmt::format("escape for U+{:X}, which is not a character", cp), at);
    }

    std::string string_literal() {
        const size_t open = i_;
        ++i_;
        std::string out;
        while (true) {
            if (at_end()) fail("missing '\"' to close the string", open);
            const char c = peek();
            if (c == '"') break;
            if (c == '\\') {
                uint32_t cp = 0;
                bool raw = false;
                escape(cp, raw);
                if (raw)
                    out += static_cast<char>(cp);
                else
                    frontend::append_utf8(out, cp);
            } else {
                out += c;
                ++i_;
            }
        }
        ++i_;
        return out;
    }

    // One class member's character at i_: a code point or a raw byte.
    void class_char(uint32_t& cp, bool& raw) {
        if (peek() == '\\') return escape(cp, raw);
        const size_t at = i_;
        raw = false;
        if (!frontend::decode_utf8(s_, i_, cp)) fail("invalid UTF-8 in a character class", at);
    }

    CharClass char_class() {
        const size_t open = i_;
        ++i_;
        CharClass cls;
        if (peek() == '^' && !at_end()) {
            cls.negated = true;
            ++i_;
        }
        while (true) {
            if (at_end()) fail("missing ']' to close the character class", open);
            if (peek() == ']') break;
            const size_t at = i_;
            uint32_t lo = 0, hi = 0;
            bool lo_raw = false, hi_raw = false;
            class_char(lo, lo_raw);
            hi = lo, hi_raw = lo_raw;
            if (peek() == '-' && i_ + 1 < s_.size() && peek(1) != ']') {
                ++i_;
                class_char(hi, hi_raw);
                if (hi < lo) fail("a character range with its end below its start", at);
            }
            if (lo_raw || hi_raw) {
                // A raw byte ranges over bytes: \x80-\xBF, or from ASCII (one byte either way) as in \x20-\xFF,
                // which to_gbnf prints for byte sets; never from a code point above 0x7F as in \u00C0-\xFF.
                if (!lo_raw && lo > 0x7F) fail("a range between a code point and a raw byte (\\x80 and up)", at);
                if (cls.negated) fail("a raw byte (\\x80 and up) in a negated class", at);
                if (!lo_raw) cls.add(lo, 0x7F);
                cls.raw_bytes.add_range(static_cast<uint8_t>(std::max(lo, 0x80u)), static_cast<uint8_t>(hi));
            } else {
                cls.add(lo, hi);
            }
        }
        ++i_;
        if (!cls.negated && cls.ranges.empty() && cls.raw_bytes.empty()) fail("an empty character class", open);
        return cls;
    }

    std::string_view s_;
    size_t i_ = 0;
    bool newline_seen_ = false;
};

}  // namespace

Grammar parse_gbnf(std::string_view text, std::string_view root) {
    GbnfParser parser(text);
    std::vector<RuleDef> defs = parser.parse();

    Builder b;
    std::map<std::string, int32_t, std::less<>> index;  // defined name -> rule
    std::map<std::string, size_t, std::less<>> defined_at;
    for (const RuleDef& d : defs) {
        if (auto it = defined_at.find(d.name); it != defined_at.end())
            throw GrammarError(fmt::format("{}: rule '{}' is defined twice (first at {})", parser.where(d.pos), d.name,
                                           parser.line_column(it->second)));
        defined_at.emplace(d.name, d.pos);
    }
    const auto root_it = defined_at.find(root);
    if (root_it == defined_at.end())
        throw GrammarError(
            fmt::format("{}: no rule '{}' (the start rule) is defined", parser.where(text.size()), root));
    // Every rule made before any helper rule, so each keeps its own name (the builder renames clashes).
    for (const RuleDef& d : defs) index.emplace(d.name, b.rule(d.name));

    frontend::Lowering lower(
        b,
        [&](const Node& ref) {
            const auto it = index.find(ref.text);
            if (it == index.end())
                throw GrammarError(fmt::format("{}: undefined rule '{}'", parser.where(ref.pos), ref.text));
            return Symbol::ref(it->second);
        },
        [&](size_t at) { return parser.where(at); });
    for (const RuleDef& d : defs) {
        const int32_t r = index.at(d.name);
        if (d.body.kind == Node::Kind::kAlt) {
            for (const Node& alt : d.body.items) b.add_alternative(r, lower.sequence(alt, d.name));
        } else {
            b.add_alternative(r, lower.sequence(d.body, d.name));
        }
    }
    return b.finish(index.find(root)->second);
}

Grammar compile_choices(const std::vector<std::string>& choices) {
    if (choices.empty()) throw GrammarError("choice: the list of choices is empty");
    Builder b;
    const int32_t root = b.rule("root");
    for (const std::string& c : choices) {
        Sequence seq;
        for (const unsigned char ch : c) seq.push_back(b.bytes(ByteSet::of(ch)));
        b.add_alternative(root, std::move(seq));
    }
    return b.finish(root);
}

}  // namespace megactx::grammar
