#include "grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <fmt/format.h>
#include <unordered_set>

namespace megactx::grammar {

ByteSet ByteSet::of(uint8_t b) {
    ByteSet s;
    s.add(b);
    return s;
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.add_range(lo, hi);
    return s;
}

ByteSet ByteSet::any() {
    ByteSet s;
    s.words.fill(~uint64_t{0});
    return s;
}

void ByteSet::add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
}

void ByteSet::add(const ByteSet& o) {
    for (size_t i = 0; i < 4; ++i) words[i] |= o.words[i];
}

int ByteSet::count() const {
    int n = 0;
    for (uint64_t w : words) n += std::popcount(w);
    return n;
}

ByteSet ByteSet::complement() const {
    ByteSet s;
    for (size_t i = 0; i < 4; ++i) s.words[i] = ~words[i];
    return s;
}

ByteSet ByteSet::intersect(const ByteSet& o) const {
    ByteSet s;
    for (size_t i = 0; i < 4; ++i) s.words[i] = words[i] & o.words[i];
    return s;
}

void Grammar::validate() const {
    const auto n = static_cast<int32_t>(rules.size());
    if (root < 0 || root >= n) throw GrammarError(fmt::format("grammar: no root rule (root {} of {} rules)", root, n));
    for (const Rule& r : rules) {
        if (r.alternatives.empty()) throw GrammarError(fmt::format("grammar: rule '{}' has no alternative", r.name));
        if (r.counted() && (r.alternatives.size() != 1 || r.alternatives[0].size() != 1 || r.min > r.max))
            throw GrammarError(
                fmt::format("grammar: counted rule '{}' is not one symbol {{{},{}}}", r.name, r.min, r.max));
        for (const Sequence& s : r.alternatives)
            for (const Symbol& sym : s) {
                if (sym.is_rule() && sym.rule >= n)
                    throw GrammarError(fmt::format("grammar: rule '{}' refers to rule {} of {}", r.name, sym.rule, n));
                if (!sym.is_rule() && sym.bytes.empty())
                    throw GrammarError(fmt::format("grammar: rule '{}' has an empty byte class", r.name));
            }
    }
    // Productive rules: those deriving some finite string, found by iterating to a fixed point.
    std::vector<bool> productive(rules.size(), false);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < rules.size(); ++i) {
            if (productive[i]) continue;
            if (rules[i].counted() && rules[i].min == 0) {  // item{0,n} derives ε whatever the item
                productive[i] = changed = true;
                continue;
            }
            for (const Sequence& s : rules[i].alternatives) {
                bool all = true;
                for (const Symbol& sym : s) all = all && (!sym.is_rule() || productive[static_cast<size_t>(sym.rule)]);
                if (all) {
                    productive[i] = changed = true;
                    break;
                }
            }
        }
    }
    std::string stuck;
    int n_stuck = 0;
    for (size_t i = 0; i < rules.size(); ++i)
        if (!productive[i] && ++n_stuck <= 8) stuck += fmt::format("{}'{}'", stuck.empty() ? "" : ", ", rules[i].name);
    if (n_stuck > 0)
        throw GrammarError(fmt::format("grammar: {} rule{} never end{} (every alternative recurses): {}{}", n_stuck,
                                       n_stuck > 1 ? "s" : "", n_stuck > 1 ? "" : "s", stuck,
                                       n_stuck > 8 ? ", ..." : ""));
}

int64_t Grammar::n_symbols() const {
    int64_t n = 0;
    for (const Rule& r : rules)
        for (const Sequence& s : r.alternatives) n += static_cast<int64_t>(s.size());
    return n;
}

namespace {

std::string gbnf_byte(uint8_t b, bool in_class) {
    if (b == '\n') return "\\n";
    if (b == '\r') return "\\r";
    if (b == '\t') return "\\t";
    if (b == '\\') return "\\\\";
    if (!in_class && b == '"') return "\\\"";
    if (in_class && (b == ']' || b == '-' || b == '^')) return {'\\', static_cast<char>(b)};
    if (b < 0x20 || b >= 0x7f) return fmt::format("\\x{:02X}", b);
    return std::string(1, static_cast<char>(b));
}

std::string gbnf_class(const ByteSet& s) {
    if (s.count() == 1)
        for (int b = 0; b < 256; ++b)
            if (s.has(static_cast<uint8_t>(b))) return fmt::format("\"{}\"", gbnf_byte(static_cast<uint8_t>(b), false));
    std::string out = "[";
    for (int b = 0; b < 256;) {
        if (!s.has(static_cast<uint8_t>(b))) {
            ++b;
            continue;
        }
        int e = b;
        while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
        out += gbnf_byte(static_cast<uint8_t>(b), true);
        if (e > b + 1) out += '-';
        if (e > b) out += gbnf_byte(static_cast<uint8_t>(e), true);
        b = e + 1;
    }
    return out + "]";
}

}  // namespace

std::string Grammar::to_gbnf() const {
    std::string out;
    const auto emit = [&](const Rule& r) {
        out += r.name + " ::=";
        if (r.counted()) {  // GBNF's own bounded repetition
            const Symbol& s = r.alternatives[0][0];
            const std::string item = s.is_rule() ? rules[static_cast<size_t>(s.rule)].name : gbnf_class(s.bytes);
            out += fmt::format(" {}{{{},{}}}\n", item, r.min, r.max);
            return;
        }
        for (size_t a = 0; a < r.alternatives.size(); ++a) {
            if (a > 0) out += " |";
            if (r.alternatives[a].empty()) out += " \"\"";
            for (const Symbol& s : r.alternatives[a])
                out += " " + (s.is_rule() ? rules[static_cast<size_t>(s.rule)].name : gbnf_class(s.bytes));
        }
        out += "\n";
    };
    if (root >= 0 && root < static_cast<int32_t>(rules.size())) emit(rules[static_cast<size_t>(root)]);
    for (size_t i = 0; i < rules.size(); ++i)
        if (static_cast<int32_t>(i) != root) emit(rules[i]);
    return out;
}

void Builder::count(int64_t n) {
    n_symbols_ += n;
    if (n_symbols_ > max_symbols_)
        throw GrammarError(fmt::format("grammar too large: more than {} symbols", max_symbols_));
}

int32_t Builder::rule(std::string_view name) {
    std::string base(name.empty() ? "r" : name), unique = base;
    // Suffixes are tried from the last one given for this base, so n rules of one name cost O(n), not O(n²).
    for (int& i = next_suffix_[base]; names_.count(unique); ++i) unique = fmt::format("{}-{}", base, i + 1);
    names_.insert(unique);
    g_.rules.push_back(Rule{unique, {}});
    count(1);
    return static_cast<int32_t>(g_.rules.size() - 1);
}

void Builder::add_alternative(int32_t r, Sequence seq) {
    count(static_cast<int64_t>(seq.size()));
    g_.rules.at(static_cast<size_t>(r)).alternatives.push_back(std::move(seq));
}

Symbol Builder::literal(std::string_view s, std::string_view hint) {
    Sequence seq;
    for (unsigned char c : s) seq.push_back(Symbol::terminal(ByteSet::of(c)));
    if (seq.size() == 1) return seq[0];
    return this->seq(std::move(seq), hint);
}

Symbol Builder::seq(Sequence items, std::string_view hint) {
    if (items.size() == 1) return items[0];
    const int32_t r = rule(hint);
    add_alternative(r, std::move(items));
    return Symbol::ref(r);
}

Symbol Builder::alt(std::vector<Sequence> alternatives, std::string_view hint) {
    if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
    const int32_t r = rule(hint);
    for (Sequence& s : alternatives) add_alternative(r, std::move(s));
    return Symbol::ref(r);
}

Symbol Builder::optional(const Symbol& s, std::string_view hint) { return alt({{s}, {}}, hint); }

Symbol Builder::embed(const Grammar& g) {
    g.validate();
    std::vector<int32_t> to(g.rules.size());
    for (size_t r = 0; r < g.rules.size(); ++r) to[r] = rule(g.rules[r].name);
    for (size_t r = 0; r < g.rules.size(); ++r) {
        g_.rules[static_cast<size_t>(to[r])].min = g.rules[r].min;
        g_.rules[static_cast<size_t>(to[r])].max = g.rules[r].max;
        for (const Sequence& alternative : g.rules[r].alternatives) {
            Sequence copy = alternative;
            for (Symbol& sym : copy)
                if (sym.is_rule()) sym.rule = to[static_cast<size_t>(sym.rule)];
            add_alternative(to[r], std::move(copy));
        }
    }
    return Symbol::ref(to[static_cast<size_t>(g.root)]);
}

Symbol Builder::repeat(const Symbol& item, int64_t min, int64_t max, std::string_view hint) {
    if (min < 0 || (max >= 0 && max < min))
        throw GrammarError(fmt::format("grammar: repetition {{{},{}}} is empty", min, max));
    if (std::max(min, max) > kMaxRepeat)
        throw GrammarError(fmt::format("grammar: repetition bound above {}", kMaxRepeat));
    // item{min,max} as one rule that the matcher reads with a count (Rule::max): one rule whatever the bounds.
    const auto counted = [&](int64_t lo, int64_t hi) {
        const int32_t r = rule(hint);
        set_repeat(r, item, lo, hi);
        return Symbol::ref(r);
    };
    if (max < 0) {  // item{min} star, star ::= item star | ε
        const int32_t star = rule(std::string(hint) + "-star");
        add_alternative(star, {item, Symbol::ref(star)});
        add_alternative(star, {});
        if (min == 0) return Symbol::ref(star);
        return seq({min == 1 ? item : counted(min, min), Symbol::ref(star)}, hint);
    }
    if (max == 0) return alt({{}}, hint);  // item{0,0}: ε
    if (min == 1 && max == 1) return item;
    return counted(min, max);
}

void Builder::set_repeat(int32_t r, const Symbol& item, int64_t min, int64_t max) {
    Rule& rule = g_.rules.at(static_cast<size_t>(r));
    if (!rule.alternatives.empty() || max < 1 || max < min || min < 0 || max > kMaxRepeat)
        throw GrammarError(fmt::format("grammar: rule '{}' cannot be made {{{},{}}}", rule.name, min, max));
    add_alternative(r, {item});
    rule.min = static_cast<uint32_t>(min);
    rule.max = static_cast<uint32_t>(max);
}

namespace {

// UTF-8 encodings of [lo, hi] within one encoded length, as sequences of byte ranges (the standard split into
// ranges whose continuation bytes span 0x80..0xBF fully or share a prefix).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Sequence>& out) {
    static constexpr uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int len = 1; len < 4; ++len) {  // one encoded length at a time
        if (lo <= kMax[len - 1] && hi > kMax[len - 1]) {
            utf8_sequences(lo, kMax[len - 1], out);
            utf8_sequences(kMax[len - 1] + 1, hi, out);
            return;
        }
    }
    const int len = hi <= 0x7F ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    if (len == 1) {
        out.push_back({Symbol::terminal(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)))});
        return;
    }
    // Split until, at every continuation position, lo and hi share the bits above it or span it whole: then each
    // byte position is one range.
    for (int i = 1; i < len; ++i) {
        const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low bits of i continuation bytes
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_sequences(lo, lo | m, out);
                utf8_sequences((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                utf8_sequences(lo, (hi & ~m) - 1, out);
                utf8_sequences(hi & ~m, hi, out);
                return;
            }
        }
    }
    const auto enc = [len](uint32_t cp) {
        std::array<uint8_t, 4> b{};
        static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
        for (int i = len - 1; i > 0; --i) {
            b[static_cast<size_t>(i)] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
            cp >>= 6;
        }
        b[0] = static_cast<uint8_t>(kLead[len] | cp);
        return b;
    };
    const auto a = enc(lo), z = enc(hi);
    Sequence s;
    for (size_t i = 0; i < static_cast<size_t>(len); ++i) s.push_back(Symbol::terminal(ByteSet::range(a[i], z[i])));
    out.push_back(std::move(s));
}

}  // namespace

Symbol Builder::utf8_range(uint32_t lo, uint32_t hi, std::string_view hint) {
    if (lo > hi || hi > 0x10FFFF) throw GrammarError(fmt::format("grammar: code point range U+{:X}..U+{:X}", lo, hi));
    std::vector<Sequence> alts;
    const auto add = [&](uint32_t a, uint32_t b) {
        if (a <= b) utf8_sequences(a, b, alts);
    };
    if (hi < 0xD800 || lo > 0xDFFF) {
        add(lo, hi);
    } else {  // no surrogates
        add(lo, std::min<uint32_t>(hi, 0xD7FF));
        add(std::max<uint32_t>(lo, 0xE000), hi);
    }
    if (alts.empty())
        throw GrammarError(fmt::format("grammar: code point range U+{:X}..U+{:X} holds only surrogates", lo, hi));
    return alt(std::move(alts), hint);
}

Symbol Builder::utf8_char_except(const ByteSet& exclude_ascii, std::string_view hint) {
    ByteSet ascii = ByteSet::range(0, 0x7F);
    ascii = ascii.intersect(exclude_ascii.complement());
    std::vector<Sequence> alts;
    if (!ascii.empty()) alts.push_back({Symbol::terminal(ascii)});
    utf8_sequences(0x80, 0xD7FF, alts);
    utf8_sequences(0xE000, 0x10FFFF, alts);
    return alt(std::move(alts), hint);
}

Symbol Builder::text_without(std::string_view forbidden, std::string_view hint) {
    const auto m = forbidden.size();
    if (m == 0) throw GrammarError("grammar: text_without needs a non-empty string");
    // fail[q]: the longest proper border of forbidden[0, q); next(q, c): the matched prefix after byte c.
    std::vector<size_t> fail(m + 1, 0);
    for (size_t q = 1, k = 0; q < m; ++q) {
        while (k > 0 && forbidden[q] != forbidden[k]) k = fail[k];
        if (forbidden[q] == forbidden[k]) ++k;
        fail[q + 1] = k;
    }
    const auto next = [&](size_t q, uint8_t c) {
        while (q > 0 && static_cast<uint8_t>(forbidden[q]) != c) q = fail[q];
        return static_cast<uint8_t>(forbidden[q]) == c ? q + 1 : 0;
    };
    std::vector<int32_t> state(m);
    for (size_t q = 0; q < m; ++q) state[q] = rule(fmt::format("{}-{}", hint, q));
    for (size_t q = 0; q < m; ++q) {
        std::vector<ByteSet> to(m);  // bytes leading from q to each state; to m (a match) is left out
        for (int c = 0; c < 256; ++c) {
            const size_t r = next(q, static_cast<uint8_t>(c));
            if (r < m) to[r].add(static_cast<uint8_t>(c));
        }
        add_alternative(state[q], {});
        for (size_t r = 0; r < m; ++r)
            if (!to[r].empty()) add_alternative(state[q], {Symbol::terminal(to[r]), Symbol::ref(state[r])});
    }
    return Symbol::ref(state[0]);
}

Grammar Builder::finish(int32_t root) {
    g_.root = root;
    g_.validate();
    Grammar out = std::move(g_);
    g_ = Grammar{};
    names_.clear();
    next_suffix_.clear();
    n_symbols_ = 0;
    return out;
}

}  // namespace megactx::grammar
