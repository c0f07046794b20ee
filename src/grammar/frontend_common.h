// What the text front ends (GBNF, regular expressions) share: a small syntax tree of literals, character classes,
// rule references, sequences, alternations and repetitions, its lowering into a Builder, character classes over
// code points turned into UTF-8 byte sequences, and UTF-8 encoding and decoding. Internal to the grammar library.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace megactx::grammar::frontend {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;
// Nesting of groups (and so recursion in the parsers and the lowering) beyond this is refused rather than allowed to
// exhaust the stack.
inline constexpr int kMaxNesting = 500;

// Appends the UTF-8 encoding of `cp`; false for a surrogate or a value past U+10FFFF.
inline bool append_utf8(std::string& out, uint32_t cp) {
    if (cp > kMaxCodePoint || (cp >= kSurrogateLo && cp <= kSurrogateHi)) return false;
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return true;
}

// Decodes the code point at s[i] and moves i past it; false (i unchanged) for bytes that are not well-formed UTF-8
// (overlong forms and surrogates included).
inline bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp) {
    const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t lead = byte(i);
    int len = 0;
    uint32_t v = 0, min = 0;
    if (lead < 0x80) {
        cp = lead;
        ++i;
        return true;
    } else if ((lead & 0xE0) == 0xC0) {
        len = 2, v = lead & 0x1F, min = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
        len = 3, v = lead & 0x0F, min = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
        len = 4, v = lead & 0x07, min = 0x10000;
    } else {
        return false;
    }
    if (i + static_cast<size_t>(len) > s.size()) return false;
    for (size_t k = 1; k < static_cast<size_t>(len); ++k) {
        if ((byte(i + k) & 0xC0) != 0x80) return false;
        v = (v << 6) | (byte(i + k) & 0x3F);
    }
    if (v < min || v > kMaxCodePoint || (v >= kSurrogateLo && v <= kSurrogateHi)) return false;
    cp = v;
    i += static_cast<size_t>(len);
    return true;
}

struct CodePointRange {
    uint32_t lo = 0, hi = 0;  // inclusive
    bool operator<(const CodePointRange& o) const { return lo != o.lo ? lo < o.lo : hi < o.hi; }
};

// Sorted, overlapping and adjacent ranges merged.
inline std::vector<CodePointRange> normalize(std::vector<CodePointRange> r) {
    std::sort(r.begin(), r.end());
    std::vector<CodePointRange> out;
    for (const CodePointRange& x : r) {
        if (!out.empty() && x.lo <= out.back().hi + 1)
            out.back().hi = std::max(out.back().hi, x.hi);
        else
            out.push_back(x);
    }
    return out;
}

// The code points 0..U+10FFFF not in `r` (normalized).
inline std::vector<CodePointRange> complement(const std::vector<CodePointRange>& r) {
    std::vector<CodePointRange> out;
    uint32_t next = 0;
    for (const CodePointRange& x : normalize(r)) {
        if (x.lo > next) out.push_back({next, x.lo - 1});
        next = x.hi + 1;
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return out;
}

// A set of characters: code point ranges, and for GBNF also raw bytes above 0x7F (`\xHH` there is one byte, which
// is how Grammar::to_gbnf prints the bytes of UTF-8 sequences). A negated class is every code point not listed.
struct CharClass {
    std::vector<CodePointRange> ranges;
    ByteSet raw_bytes;  // only bytes >= 0x80, never in a negated class
    bool negated = false;

    void add(uint32_t lo, uint32_t hi) { ranges.push_back({lo, hi}); }
    void add(const std::vector<CodePointRange>& r) { ranges.insert(ranges.end(), r.begin(), r.end()); }
};

struct Node {
    enum class Kind { kBytes, kClass, kRef, kSeq, kAlt, kRepeat };
    Kind kind = Kind::kSeq;
    std::string text;          // kBytes: the bytes (empty: ε); kRef: the rule's name
    CharClass cls;             // kClass
    std::vector<Node> items;   // kSeq, kAlt: the parts; kRepeat: the one repeated item
    int64_t min = 0, max = 0;  // kRepeat; max < 0: unbounded
    size_t pos = 0;            // offset in the source text, for messages

    static Node make(Kind kind, size_t pos) {
        Node n;
        n.kind = kind;
        n.pos = pos;
        return n;
    }
    static Node bytes(std::string b, size_t pos) {
        Node n = make(Kind::kBytes, pos);
        n.text = std::move(b);
        return n;
    }
    static Node of_class(CharClass c, size_t pos) {
        Node n = make(Kind::kClass, pos);
        n.cls = std::move(c);
        return n;
    }
};

// Turns syntax trees into rules of one Builder. Classes seen before are reused, so `.` or `[0-9]` written many
// times costs their UTF-8 rules once.
class Lowering {
  public:
    using RefResolver = std::function<Symbol(const Node&)>;
    // `where` formats a source offset for messages ("line 3, column 7").
    Lowering(Builder& b, RefResolver ref, std::function<std::string(size_t)> where)
        : b_(b), ref_(std::move(ref)), where_(std::move(where)) {}

    Symbol symbol(const Node& n, std::string_view hint) {
        switch (n.kind) {
            case Node::Kind::kBytes:
                if (n.text.empty()) return epsilon();
                return b_.literal(n.text, hint);
            case Node::Kind::kClass:
                return class_symbol(n.cls, n.pos, hint);
            case Node::Kind::kRef:
                return ref_(n);
            case Node::Kind::kSeq: {
                Sequence s = sequence(n, hint);
                if (s.empty()) return epsilon();
                return b_.seq(std::move(s), hint);
            }
            case Node::Kind::kAlt: {
                std::vector<Sequence> alts;
                for (const Node& item : n.items) alts.push_back(sequence(item, hint));
                return b_.alt(std::move(alts), hint);
            }
            case Node::Kind::kRepeat:
                return b_.repeat(symbol(n.items.at(0), hint), n.min, n.max, hint);
        }
        throw GrammarError("grammar: unknown syntax node");
    }

    // `n` as the symbols of one alternative: sequences and literals are spliced in rather than made rules.
    Sequence sequence(const Node& n, std::string_view hint) {
        Sequence out;
        append(n, out, hint);
        return out;
    }

    Symbol class_symbol(const CharClass& c, size_t pos, std::string_view hint) {
        std::vector<CodePointRange> r = c.negated ? complement(c.ranges) : normalize(c.ranges);
        ByteSet single = c.raw_bytes;  // one-byte characters: ASCII code points and raw bytes
        std::vector<CodePointRange> multi;
        for (const CodePointRange& x : r) {
            if (x.lo < 0x80) single.add_range(static_cast<uint8_t>(x.lo), static_cast<uint8_t>(std::min(x.hi, 0x7Fu)));
            // Surrogates have no UTF-8 form: the parts on either side.
            const uint32_t lo = std::max(x.lo, 0x80u);
            if (lo > x.hi) continue;
            if (x.hi < kSurrogateLo || lo > kSurrogateHi) {
                multi.push_back({lo, x.hi});
            } else {
                if (lo < kSurrogateLo) multi.push_back({lo, kSurrogateLo - 1});
                if (x.hi > kSurrogateHi) multi.push_back({kSurrogateHi + 1, x.hi});
            }
        }
        if (single.empty() && multi.empty())
            throw GrammarError(fmt::format("{}: the character class matches no character", where_(pos)));
        std::string key;
        for (const uint64_t w : single.words) key += fmt::format("{:x}.", w);
        for (const CodePointRange& x : multi) key += fmt::format("{:x}-{:x},", x.lo, x.hi);
        if (auto it = classes_.find(key); it != classes_.end()) return it->second;

        Symbol s;
        const bool all_multi = multi.size() == 2 && multi[0].lo == 0x80 && multi[0].hi == kSurrogateLo - 1 &&
                               multi[1].lo == kSurrogateHi + 1 && multi[1].hi == kMaxCodePoint;
        const ByteSet non_ascii = ByteSet::range(0x80, 0xFF);
        if (all_multi && single.intersect(non_ascii).empty()) {
            // Every non-ASCII code point: the builder's flat form, without a rule per range.
            s = b_.utf8_char_except(single.complement().intersect(ByteSet::range(0, 0x7F)), hint);
        } else {
            std::vector<Sequence> alts;
            if (!single.empty()) alts.push_back({b_.bytes(single)});
            for (const CodePointRange& x : multi) alts.push_back({b_.utf8_range(x.lo, x.hi, hint)});
            s = b_.alt(std::move(alts), hint);
        }
        classes_.emplace(std::move(key), s);
        return s;
    }

  private:
    void append(const Node& n, Sequence& out, std::string_view hint) {
        if (n.kind == Node::Kind::kBytes) {
            for (const unsigned char ch : n.text) out.push_back(b_.bytes(ByteSet::of(ch)));
        } else if (n.kind == Node::Kind::kSeq) {
            for (const Node& item : n.items) append(item, out, hint);
        } else {
            out.push_back(symbol(n, hint));
        }
    }

    Symbol epsilon() {
        if (epsilon_rule_ < 0) {
            epsilon_rule_ = b_.rule("empty");
            b_.add_alternative(epsilon_rule_, {});
        }
        return Symbol::ref(epsilon_rule_);
    }

    Builder& b_;
    RefResolver ref_;
    std::function<std::string(size_t)> where_;
    std::map<std::string, Symbol> classes_;
    int32_t epsilon_rule_ = -1;
};

}  // namespace megactx::grammar::frontend
