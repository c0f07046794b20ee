// The Earley recogniser behind Matcher. The token masks call advance()/allowed()/rollback() at every node of the
// vocabulary trie, so the grammar is compiled once into flat arrays and the chart is a few flat vectors that only
// grow at the end and shrink on rollback: no allocation per byte once the buffers have reached their working size.
//
// An item is (dotted position, origin). Every production owns len + 1 consecutive dotted positions, and for each
// position the symbol after the dot is precomputed. ε is handled with Aycock & Horspool's predictor: predicting a
// nullable rule also moves the dot over it, so completions of empty spans are never needed. Right recursion (a
// JSON string's `chars ::= char chars | ε`) would make every byte complete a chain as long as the input; Leo's
// deterministic-reduction items cut each such chain to one step. What predicting each rule brings is precomputed
// too (its closure, as a bundle of items), since re-deriving the same predictions at every byte is most of the work
// on real grammars.
//
// A counted rule (Rule::max > 0, item{min,max}) has one production whose dotted positions are its counts: position
// base + i is "i items read", for i = 0..max, so reading an item moves the dot one position on, as in any
// production, and every position from min on may also complete the rule. These positions are numbered after the
// real ones and computed, never stored (Compiled::next() and its neighbours), so a bound of 65535 costs no more
// than a bound of 5. The dot never moves over an item by ε: when the item derives ε, min is taken as 0, and the
// position i then already allows all that i + 1 would.
#include "grammar/matcher.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace megactx::grammar {

namespace {

constexpr int32_t kTerminal = -1;  // Compiled::next() codes below 0: the symbol after the dot is a terminal,
constexpr int32_t kEnd = -2;       // or there is none (the item is complete)
constexpr uint32_t kLeoNone = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kLeoUnresolved = kLeoNone - 1;
constexpr uint32_t kLeoBusy = kLeoNone - 2;
constexpr uint64_t kRuleTag = uint64_t{1} << 31;  // dotted positions and rules are below 2^31

// A counted rule's production (see the top of this file).
struct Counted {
    int32_t rule;
    uint32_t base;      // the dotted position after 0 items; base + i after i items, i = 0..max
    uint32_t min, max;  // min is 0 when the item derives ε (item{m,n} is then item{0,n})
    int32_t item;       // the item: a rule, or kTerminal
    int32_t item_arg;   // the terminal's index when the item is one
    bool one_way;       // the item derives no ε and none of its strings is a proper prefix of another
};

// The grammar as flat arrays, shared by every copy of a matcher (it never changes after construction).
struct Compiled {
    // Per real dotted position (below n_real): the rule after the dot, kTerminal or kEnd; the terminal's index
    // (kTerminal) or the lhs (kEnd); the rule its production belongs to. Read through next(), arg() and lhs(),
    // which also answer for counted rules' positions (n_real and above).
    std::vector<int32_t> real_next, real_arg, real_lhs;
    uint32_t n_real = 0;
    uint32_t n_positions = 0;          // real and counted
    std::vector<ByteSet> terminals;    // one per terminal occurrence
    std::vector<uint32_t> rule_begin;  // rule r's productions start at dotted positions starts[rule_begin[r]..]
    std::vector<uint32_t> starts;
    std::vector<uint8_t> nullable;  // per rule
    uint32_t start_pos = 0;         // `start ::= root` (a rule of its own), dot before root
    uint32_t accept_pos = 0;        // the same, dot after root
    int32_t n_rules = 0;            // including `start`
    std::vector<Counted> counted;     // the counted rules, by base: those of max below kSmallCount first
    std::vector<int32_t> counted_of;  // per rule: its index in `counted`, or -1
    // counted_at()'s lookup: the index in `counted` of each position of the small rules (a few per rule), and
    // where the large ones begin in `counted` (found by binary search: a grammar has few large bounds).
    std::vector<uint32_t> small_counted;
    uint32_t n_small = 0;
    // Per rule, the items (as dotted positions; their origin is the set predicting) that predicting it brings, dot
    // moves over nullable rules included and complete ones left out: bundle[bundle_begin[r]..bundle_begin[r + 1]],
    // and the union of their terminals. has_bundle is 0 for a rule whose closure was too large to store: it is
    // predicted one production at a time.
    std::vector<uint32_t> bundle_begin, bundle;
    std::vector<ByteSet> bundle_allowed;
    std::vector<uint8_t> has_bundle;
    // Per rule, made when first needed (Matcher::repetition): the bytes its strings may begin with, and the bytes
    // that may follow it anywhere in the grammar (standard FIRST and FOLLOW sets; over-approximations are safe).
    mutable std::once_flag sets_once;
    mutable std::vector<ByteSet> first, follow;

    bool is_counted(uint32_t pos) const { return pos >= n_real; }
    // The counted rule whose production holds dotted position `pos` (is_counted(pos)).
    const Counted& counted_at(uint32_t pos) const {
        if (pos - n_real < small_counted.size()) return counted[small_counted[pos - n_real]];
        const auto it = std::upper_bound(counted.begin() + n_small, counted.end(), pos,
                                         [](uint32_t p, const Counted& r) { return p < r.base; });
        return *(it - 1);
    }
    const Counted* counted_rule(int32_t rule) const {
        const int32_t i = rule >= 0 ? counted_of[static_cast<size_t>(rule)] : -1;
        return i >= 0 ? &counted[static_cast<size_t>(i)] : nullptr;
    }
    int32_t next(uint32_t pos) const {
        if (pos < n_real) return real_next[pos];
        const Counted& r = counted_at(pos);
        return pos - r.base < r.max ? r.item : kEnd;
    }
    int32_t arg(uint32_t pos) const {
        if (pos < n_real) return real_arg[pos];
        const Counted& r = counted_at(pos);
        return pos - r.base < r.max ? r.item_arg : r.rule;
    }
    int32_t lhs(uint32_t pos) const { return pos < n_real ? real_lhs[pos] : counted_at(pos).rule; }
    // Whether the production may complete at `pos`: at its end, or at a count of min or more.
    bool completes(uint32_t pos) const {
        if (pos < n_real) return real_next[pos] == kEnd;
        const Counted& r = counted_at(pos);
        return pos - r.base >= r.min;
    }
};

constexpr uint32_t kSmallCount = 64;             // counted rules of a smaller max are looked up directly
constexpr size_t kMaxBundle = 512;               // dotted positions in one rule's closure
constexpr size_t kMaxBundles = size_t{4} << 20;  // over all rules

// Fills the prediction bundles (see Compiled), each by a walk over the rules its prediction reaches.
void compute_bundles(Compiled& c) {
    const auto n = static_cast<size_t>(c.n_rules);
    c.bundle_begin.assign(n + 1, 0);
    c.bundle_allowed.assign(n, ByteSet{});
    c.has_bundle.assign(n, 0);
    std::vector<uint32_t> seen(n, 0), queue;
    for (size_t r = 0; r < n; ++r) {
        c.bundle_begin[r] = static_cast<uint32_t>(c.bundle.size());
        if (c.bundle.size() >= kMaxBundles) continue;
        const size_t begin = c.bundle.size();
        queue.assign(1, static_cast<uint32_t>(r));
        seen[r] = static_cast<uint32_t>(r) + 1;
        ByteSet allowed;
        bool fits = true;
        for (size_t q = 0; q < queue.size() && fits; ++q) {
            for (uint32_t p = c.rule_begin[queue[q]]; p < c.rule_begin[queue[q] + 1] && fits; ++p) {
                for (uint32_t pos = c.starts[p];; ++pos) {
                    const int32_t sym = c.next(pos);
                    if (sym == kEnd) break;
                    c.bundle.push_back(pos);
                    if (sym == kTerminal) {
                        allowed.add(c.terminals[static_cast<size_t>(c.arg(pos))]);
                        break;
                    }
                    if (seen[static_cast<size_t>(sym)] != r + 1) {
                        seen[static_cast<size_t>(sym)] = static_cast<uint32_t>(r) + 1;
                        queue.push_back(static_cast<uint32_t>(sym));
                    }
                    // A counted rule's dot never moves over its item by ε.
                    if (!c.nullable[static_cast<size_t>(sym)] || c.is_counted(pos)) break;
                }
                fits = c.bundle.size() - begin <= kMaxBundle;
            }
        }
        if (!fits) {
            c.bundle.resize(begin);
            continue;
        }
        c.has_bundle[r] = 1;
        c.bundle_allowed[r] = allowed;
    }
    c.bundle_begin[n] = static_cast<uint32_t>(c.bundle.size());
}

using ByteStrings = std::vector<std::vector<ByteSet>>;  // byte strings as sequences of byte sets
constexpr size_t kMaxFlatStrings = 256, kMaxFlatLength = 8;
constexpr int kMaxFlatDepth = 8;

// Appends to `out` every concatenation of a string of `a` and one of `b`; false when that makes too many or too
// long strings.
bool product(const ByteStrings& a, const ByteStrings& b, ByteStrings& out) {
    if (a.size() * b.size() > kMaxFlatStrings) return false;
    for (const auto& s : a) {
        for (const auto& t : b) {
            if (s.size() + t.size() > kMaxFlatLength) return false;
            out.push_back(s);
            out.back().insert(out.back().end(), t.begin(), t.end());
        }
    }
    return true;
}

// The strings rule r derives, as sequences of byte sets, when they are few and short (a JSON string's character, a
// UTF-8 range): false otherwise (many, long, or recursive).
bool flatten(const Compiled& c, int32_t r, int depth, ByteStrings& out) {
    if (depth > kMaxFlatDepth) return false;
    out.clear();
    if (const Counted* rc = c.counted_rule(r)) {  // item^k for k = min..max
        ByteStrings item;
        if (rc->item == kTerminal) {
            item.push_back({c.terminals[static_cast<size_t>(rc->item_arg)]});
        } else if (!flatten(c, rc->item, depth + 1, item)) {
            return false;
        }
        ByteStrings power(1);  // item^0
        for (uint32_t k = 0;; ++k) {
            if (k >= rc->min) out.insert(out.end(), power.begin(), power.end());
            if (out.size() > kMaxFlatStrings) return false;
            if (k == rc->max) return true;
            ByteStrings longer;
            if (!product(power, item, longer)) return false;
            power = std::move(longer);
        }
    }
    const auto ru = static_cast<size_t>(r);
    for (uint32_t p = c.rule_begin[ru]; p < c.rule_begin[ru + 1]; ++p) {
        ByteStrings seqs(1);
        for (uint32_t pos = c.starts[p]; c.next(pos) != kEnd; ++pos) {
            if (c.next(pos) == kTerminal) {
                for (auto& s : seqs) s.push_back(c.terminals[static_cast<size_t>(c.arg(pos))]);
            } else {
                ByteStrings sub, longer;
                if (!flatten(c, c.next(pos), depth + 1, sub) || !product(seqs, sub, longer)) return false;
                seqs = std::move(longer);
            }
            for (const auto& s : seqs)
                if (s.size() > kMaxFlatLength) return false;
        }
        out.insert(out.end(), seqs.begin(), seqs.end());
        if (out.size() > kMaxFlatStrings) return false;
    }
    return true;
}

// No string is empty or a proper prefix of another (checked set by set: a sufficient condition).
bool prefix_free(const ByteStrings& strings) {
    for (const auto& a : strings) {
        if (a.empty()) return false;
        for (const auto& b : strings) {
            if (a.size() >= b.size()) continue;
            bool prefix = true;
            for (size_t i = 0; i < a.size() && prefix; ++i) prefix = !a[i].intersect(b[i]).empty();
            if (prefix) return false;
        }
    }
    return true;
}

// Fills Counted::one_way: whether the bytes a repetition of the item reads split into items one way only (see
// Matcher::repetition), from the item's strings when they are few and short.
void find_one_way_items(Compiled& c) {
    std::unordered_map<int32_t, bool> item_ok;  // by the item's rule
    for (Counted& r : c.counted) {
        if (r.item == kTerminal) {
            r.one_way = true;
            continue;
        }
        const auto [it, fresh] = item_ok.emplace(r.item, false);
        ByteStrings strings;
        if (fresh) it->second = flatten(c, r.item, 0, strings) && prefix_free(strings);
        r.one_way = it->second;
    }
}

// The bytes the symbols from dotted position `pos` to the production's end may begin with (Compiled::first must be
// filled); `nullable`: they may derive the empty string.
ByteSet first_of(const Compiled& c, uint32_t pos, bool& nullable) {
    ByteSet out;
    if (c.is_counted(pos)) {  // the item, when another may come; nullable from min on
        const int32_t sym = c.next(pos);
        if (sym == kTerminal) out.add(c.terminals[static_cast<size_t>(c.arg(pos))]);
        if (sym >= 0) out.add(c.first[static_cast<size_t>(sym)]);
        nullable = c.completes(pos);
        return out;
    }
    for (; c.next(pos) != kEnd; ++pos) {
        if (c.next(pos) == kTerminal) {
            out.add(c.terminals[static_cast<size_t>(c.arg(pos))]);
            nullable = false;
            return out;
        }
        out.add(c.first[static_cast<size_t>(c.next(pos))]);
        if (!c.nullable[static_cast<size_t>(c.next(pos))]) {
            nullable = false;
            return out;
        }
    }
    nullable = true;
    return out;
}

// Grows sets[to] by `add`; true when it grew.
bool grow(std::vector<ByteSet>& sets, size_t to, const ByteSet& add) {
    const ByteSet before = sets[to];
    sets[to].add(add);
    return !(sets[to] == before);
}

using Edges = std::vector<std::pair<uint32_t, uint32_t>>;  // (from, to): sets[to] includes sets[from]

// Propagates sets along edges until nothing grows (a worklist over the edges grouped by their source).
void propagate(std::vector<ByteSet>& sets, const Edges& edges) {
    std::vector<uint32_t> begin(sets.size() + 1, 0), to(edges.size());
    for (const auto& e : edges) ++begin[e.first + 1];
    for (size_t i = 1; i < begin.size(); ++i) begin[i] += begin[i - 1];
    std::vector<uint32_t> at(begin.begin(), begin.end() - 1);
    for (const auto& e : edges) to[at[e.first]++] = e.second;
    std::vector<uint32_t> work;
    std::vector<uint8_t> queued(sets.size(), 0);
    for (uint32_t r = 0; r < sets.size(); ++r) {
        if (sets[r].empty() || begin[r] == begin[r + 1]) continue;
        queued[r] = 1;
        work.push_back(r);
    }
    while (!work.empty()) {
        const uint32_t from = work.back();
        work.pop_back();
        queued[from] = 0;
        for (uint32_t k = begin[from]; k < begin[from + 1]; ++k) {
            if (grow(sets, to[k], sets[from]) && !queued[to[k]]) {
                queued[to[k]] = 1;
                work.push_back(to[k]);
            }
        }
    }
}

// Fills Compiled::first and follow.
void compute_first_follow(const Compiled& c) {
    const auto n = static_cast<size_t>(c.n_rules);
    Edges edges;  // FIRST: a rule -> the rules whose productions begin with it
    c.first.assign(n, ByteSet{});
    for (size_t r = 0; r < n; ++r) {
        if (const Counted* rc = c.counted_rule(static_cast<int32_t>(r))) {  // begins with its item
            if (rc->item == kTerminal) c.first[r].add(c.terminals[static_cast<size_t>(rc->item_arg)]);
            if (rc->item >= 0) edges.emplace_back(static_cast<uint32_t>(rc->item), static_cast<uint32_t>(r));
            continue;
        }
        for (uint32_t p = c.rule_begin[r]; p < c.rule_begin[r + 1]; ++p) {
            for (uint32_t pos = c.starts[p]; c.next(pos) != kEnd; ++pos) {
                if (c.next(pos) == kTerminal) {
                    c.first[r].add(c.terminals[static_cast<size_t>(c.arg(pos))]);
                    break;
                }
                edges.emplace_back(static_cast<uint32_t>(c.next(pos)), static_cast<uint32_t>(r));
                if (!c.nullable[static_cast<size_t>(c.next(pos))]) break;
            }
        }
    }
    propagate(c.first, edges);
    edges.clear();  // FOLLOW: a production's rule -> the rules ending it
    c.follow.assign(n, ByteSet{});
    for (size_t r = 0; r < n; ++r) {
        if (const Counted* rc = c.counted_rule(static_cast<int32_t>(r))) {  // an item, then another or the end
            if (rc->item < 0) continue;
            if (rc->max >= 2) c.follow[static_cast<size_t>(rc->item)].add(c.first[static_cast<size_t>(rc->item)]);
            edges.emplace_back(static_cast<uint32_t>(r), static_cast<uint32_t>(rc->item));
            continue;
        }
        for (uint32_t p = c.rule_begin[r]; p < c.rule_begin[r + 1]; ++p) {
            for (uint32_t pos = c.starts[p]; c.next(pos) != kEnd; ++pos) {
                if (c.next(pos) == kTerminal) continue;
                bool rest_nullable = false;
                c.follow[static_cast<size_t>(c.next(pos))].add(first_of(c, pos + 1, rest_nullable));
                if (rest_nullable) edges.emplace_back(static_cast<uint32_t>(r), static_cast<uint32_t>(c.next(pos)));
            }
        }
    }
    propagate(c.follow, edges);
}

std::shared_ptr<const Compiled> compile(const Grammar& g) {
    auto c = std::make_shared<Compiled>();
    const auto n = static_cast<int32_t>(g.rules.size());
    c->n_rules = n + 1;
    c->counted_of.assign(static_cast<size_t>(n) + 1, -1);
    const auto terminal = [&](const ByteSet& bytes) {
        c->terminals.push_back(bytes);
        return static_cast<int32_t>(c->terminals.size() - 1);
    };
    const auto add_production = [&](int32_t lhs, const Sequence& seq) {
        c->starts.push_back(static_cast<uint32_t>(c->real_next.size()));
        for (const Symbol& s : seq) {
            c->real_next.push_back(s.is_rule() ? s.rule : kTerminal);
            c->real_arg.push_back(s.is_rule() ? 0 : terminal(s.bytes));
        }
        c->real_next.push_back(kEnd);
        c->real_arg.push_back(lhs);
        c->real_lhs.resize(c->real_next.size(), lhs);
    };
    for (int32_t r = 0; r < n; ++r) {
        const Rule& rule = g.rules[static_cast<size_t>(r)];
        c->rule_begin.push_back(static_cast<uint32_t>(c->starts.size()));
        if (rule.counted()) {  // its start is numbered below, after every real position
            const Symbol& item = rule.alternatives.at(0).at(0);
            c->counted_of[static_cast<size_t>(r)] = static_cast<int32_t>(c->counted.size());
            c->counted.push_back({r, static_cast<uint32_t>(c->starts.size()), rule.min, rule.max,
                                  item.is_rule() ? item.rule : kTerminal, item.is_rule() ? 0 : terminal(item.bytes),
                                  false});
            c->starts.push_back(0);
            continue;
        }
        for (const Sequence& seq : rule.alternatives) add_production(r, seq);
    }
    // `start` is never referenced, so its completion is never folded into a Leo chain: accepting() looks for it.
    c->rule_begin.push_back(static_cast<uint32_t>(c->starts.size()));
    c->start_pos = static_cast<uint32_t>(c->real_next.size());
    add_production(n, {Symbol::ref(g.root)});
    c->accept_pos = c->start_pos + 1;
    c->rule_begin.push_back(static_cast<uint32_t>(c->starts.size()));
    c->n_real = static_cast<uint32_t>(c->real_next.size());
    // Counted positions after the real ones: the small rules first, each position of theirs indexed.
    std::stable_partition(c->counted.begin(), c->counted.end(), [](const Counted& r) { return r.max < kSmallCount; });
    uint64_t next_base = c->n_real;
    for (size_t i = 0; i < c->counted.size(); ++i) {
        Counted& r = c->counted[i];
        const uint32_t start = r.base;  // held the index of its entry in `starts` until now
        r.base = static_cast<uint32_t>(std::min<uint64_t>(next_base, kRuleTag));
        c->starts[start] = r.base;
        c->counted_of[static_cast<size_t>(r.rule)] = static_cast<int32_t>(i);
        next_base += uint64_t{r.max} + 1;
        if (r.max < kSmallCount) {
            c->small_counted.resize(next_base - c->n_real, static_cast<uint32_t>(i));
            c->n_small = static_cast<uint32_t>(i) + 1;
        }
    }
    if (next_base >= kRuleTag) throw GrammarError("grammar: too large for the matcher");
    c->n_positions = static_cast<uint32_t>(next_base);

    c->nullable.assign(static_cast<size_t>(n) + 1, 0);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r <= n; ++r) {
            const auto ru = static_cast<size_t>(r);
            if (c->nullable[ru]) continue;
            if (const Counted* rc = c->counted_rule(r)) {
                if (rc->min == 0 || (rc->item >= 0 && c->nullable[static_cast<size_t>(rc->item)]))
                    c->nullable[ru] = changed = true;
                continue;
            }
            for (uint32_t p = c->rule_begin[ru]; p < c->rule_begin[ru + 1]; ++p) {
                uint32_t pos = c->starts[p];
                while (c->real_next[pos] >= 0 && c->nullable[static_cast<size_t>(c->real_next[pos])]) ++pos;
                if (c->real_next[pos] == kEnd) {
                    c->nullable[ru] = 1;
                    changed = true;
                    break;
                }
            }
        }
    }
    for (Counted& r : c->counted)  // an item that derives ε makes every count from 0 on complete
        if (r.item >= 0 && c->nullable[static_cast<size_t>(r.item)]) r.min = 0;
    compute_bundles(*c);
    find_one_way_items(*c);
    return c;
}

struct Item {
    uint32_t pos;
    uint32_t origin;
};

// An item of a set whose next symbol is a rule: completions of that rule from this set advance it.
struct Waiter {
    int32_t rule;
    Item item;
    // Where a completion of `rule` from this set leads after the chain of deterministic reductions above it (Leo):
    // used only when this waiter is the set's one waiter on `rule` and the rule is its last symbol; kLeoUnresolved
    // until first needed.
    Item leo;
    // Kept in the first of the set's waiters on `rule` only: the key of what a completion of `rule` from this set
    // continues with (Impl::continuation); kKeyUnresolved until first needed.
    uint64_t cont;
};

struct Set {
    uint32_t item_end, scan_end, wait_end;  // ends in items, scans, waits (each set starts where the last ended)
    bool accepting;
    ByteSet allowed;
    uint64_t key;  // Matcher::state_key() of this set; kKeyUnresolved until first asked
};

// Keys (see Matcher::state_key). Hashes are mixed so that these few reserved values practically never come out.
constexpr uint64_t kKeyUnresolved = 0;
constexpr uint64_t kKeyBusy = 1;                 // being computed: meeting it again is a cycle
constexpr uint64_t kLocal = 2;                   // an item's origin is the set being keyed
constexpr uint64_t kAcceptCont = 3;              // the continuation of the start rule's completion: accept
constexpr uint64_t kTransparent = ~uint64_t{0};  // an element standing for all elements of a continuation

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

using Element = std::pair<uint64_t, uint64_t>;

// The hash of a set of (a, b) elements, elems[begin ..], independent of their order and of duplicates: the range is
// sorted and deduplicated in place.
uint64_t hash_elements(std::vector<Element>& elems, size_t begin, uint64_t seed) {
    const auto first = elems.begin() + static_cast<ptrdiff_t>(begin);
    std::sort(first, elems.end());
    elems.erase(std::unique(first, elems.end()), elems.end());
    uint64_t h = mix(seed + (elems.size() - begin));
    for (auto it = first; it != elems.end(); ++it)
        h = mix(h ^ mix(it->first + 0x9E3779B97F4A7C15ull) ^ (mix(it->second) * 31));
    return h < 16 ? h + 16 : h;  // clear of the reserved values
}

// A key no other state has: for states whose canonical key this matcher cannot compute (a cycle of
// continuations within one set, from left recursion). Distinct across matchers too, so it never hits a cache.
uint64_t unique_key() {
    static std::atomic<uint64_t> counter{0};
    return mix(counter.fetch_add(1, std::memory_order_relaxed) ^ 0x5DEECE66Dull) | 16;
}

}  // namespace

struct Matcher::Impl {
    std::shared_ptr<const Compiled> g;
    std::vector<Item> items;    // every set's worklist, set after set (items from bundles skip it)
    std::vector<Item> scans;    // every set's items whose next symbol is a terminal
    std::vector<Waiter> waits;  // every set's waiters, sorted by rule within a set
    std::vector<Set> sets;

    // Scratch for building one set. Items are deduplicated by a slot per dotted position holding the first origin
    // seen there in this set (stamped, so nothing is cleared between sets); the rare second origin at a position
    // goes to an open-addressing table cleared after each set. Completions done (rule, origin) likewise.
    struct Seen {
        uint32_t stamp, origin;
    };
    uint32_t stamp = 0;
    std::vector<Seen> pos_seen, rule_done;
    // Per large counted rule, the first of its items in this set: its positions have no slot of their own (those
    // of the small ones, numbered right after the real positions, do).
    struct CountedSeen {
        uint32_t stamp, pos, origin;
    };
    std::vector<CountedSeen> counted_seen;
    std::vector<uint32_t> rule_stamp;  // the rule was predicted in this set
    std::vector<uint64_t> table;
    std::vector<uint32_t> table_used;
    std::vector<uint32_t> leo_path;
    // Scratch for keys: elements of the sets being hashed and waiters on the chains being followed, each level of
    // the recursion using the tail past where its caller's ended.
    std::vector<Element> key_elems;
    std::vector<Waiter*> key_chain;

    // The set a reset returns to: 0, or 1 for a matcher started inside a production (at_position), whose set 0 is
    // an empty context that nothing waits in. An item from origin 0 at a dotted position in [accept_lo, accept_hi]
    // accepts: the start rule's end; the end of the production an at_position() matcher started in, or the counts
    // from min on of a counted rule.
    uint32_t base = 0;
    uint32_t accept_lo, accept_hi;
    // A matcher started inside a production that stops at accept_hi before its end (at_position(pos, end)): what
    // reaches accept_hi accepts and reads nothing more. Its keys are salted apart from those of matchers that read on.
    bool stops = false;
    uint64_t key_salt = 0;

    explicit Impl(std::shared_ptr<const Compiled> compiled) : Impl(std::move(compiled), kEnd) {}

    // pos == kEnd (as unsigned): the start of the grammar; otherwise inside a production at that dotted position,
    // reading up to `end` (kEnd: the production's end).
    Impl(std::shared_ptr<const Compiled> compiled, uint32_t pos, uint32_t end = static_cast<uint32_t>(kEnd))
        : g(std::move(compiled)), accept_lo(g->accept_pos), accept_hi(g->accept_pos) {
        const Compiled& c = *g;
        pos_seen.assign(c.n_real + c.small_counted.size(), {0, 0});
        counted_seen.assign(c.counted.size(), {0, 0, 0});
        table.assign(64, 0);
        rule_done.assign(static_cast<size_t>(c.n_rules), {0, 0});
        rule_stamp.assign(static_cast<size_t>(c.n_rules), 0);
        // Room for a few hundred bytes of input before anything grows.
        items.reserve(4096);
        scans.reserve(2048);
        waits.reserve(2048);
        sets.reserve(512);
        if (pos == static_cast<uint32_t>(kEnd)) {
            const uint32_t k = begin_set();
            add({c.start_pos, 0});
            close(k);
            return;
        }
        if (pos >= c.n_positions || c.next(pos) == kEnd)
            throw std::out_of_range("Matcher::at_position: no such position");
        base = 1;
        const bool to_end = end == static_cast<uint32_t>(kEnd);
        if (c.is_counted(pos)) {
            // Counts: from min on, up to max; to `end` (a later count of the same rule), every count on the way.
            const Counted& r = c.counted_at(pos);
            accept_lo = to_end ? r.base + std::max(r.min, pos - r.base) : pos;
            accept_hi = r.base + r.max;
            if (!to_end && (end <= pos || end > accept_hi))
                throw std::out_of_range("Matcher::at_position: the end is not a later count of the same rule");
        } else {
            accept_lo = pos;
            while (c.next(accept_lo) != kEnd && accept_lo != end) ++accept_lo;
            if (!to_end && (accept_lo != end || end == pos))
                throw std::out_of_range("Matcher::at_position: the end is not later in the same production");
        }
        if (!to_end) {
            // Stopped short of the production's end, or accepting counts below min: keys of their own.
            accept_hi = end;
            stops = c.is_counted(pos) || c.next(end) != kEnd;
            if (stops) key_salt = mix(uint64_t{end} * 0x9E3779B97F4A7C15ull + 0x5709ull);
        } else if (!c.is_counted(pos)) {
            accept_hi = accept_lo;
        }
        close(begin_set());  // the empty context
        const uint32_t k = begin_set();
        add({pos, 0});
        close(k);
    }

    // Hashes grammar structure for position_shape() and Repetition::item_shape: the symbols read first, then every
    // rule they reach, numbered in the order met, each hashed in turn; `seed` tells kinds of shapes apart. A counted
    // rule's production hashes as its bounds and its item, a counted position as the counts left.
    struct ShapeHash {
        static constexpr size_t kMaxSymbols = 20000;
        const Compiled& c;
        uint64_t h;
        std::unordered_map<int32_t, uint32_t> number{};  // rule -> the order it was met in
        std::vector<int32_t> queue{};
        size_t n = 0;

        void symbol(int32_t next, int32_t arg) {
            ++n;
            if (next == kTerminal) {
                const ByteSet& t = c.terminals[static_cast<size_t>(arg)];
                h = mix(h ^ 0x7E4Bull);
                for (const uint64_t w : t.words) h = mix(h ^ w);
                return;
            }
            const auto [it, fresh] = number.emplace(next, static_cast<uint32_t>(queue.size()));
            if (fresh) queue.push_back(next);
            h = mix(h ^ (uint64_t{it->second} << 8 | 0x2E));
        }
        // What is read from dotted position p to the production's end.
        void rest(uint32_t p) {
            if (c.is_counted(p)) {  // min..max more items, from min's count on
                const Counted& r = c.counted_at(p);
                const uint32_t i = p - r.base;
                h = mix(h ^ (uint64_t{r.min > i ? r.min - i : 0} << 32 | (r.max - i)) ^ 0xC0C0ull);
                if (i < r.max) symbol(r.item, r.item_arg);
            } else {
                for (; c.next(p) != kEnd; ++p) symbol(c.next(p), c.arg(p));
            }
            h = mix(h ^ 0xE4Dull);
        }
        // The rules met so far and those they reach; 0: too large.
        uint64_t finish() {
            for (size_t q = 0; q < queue.size(); ++q) {
                const auto r = static_cast<size_t>(queue[q]);
                h = mix(h ^ (uint64_t{c.rule_begin[r + 1] - c.rule_begin[r]} << 8 | 0x41));
                for (uint32_t a = c.rule_begin[r]; a < c.rule_begin[r + 1]; ++a) rest(c.starts[a]);
                if (n > kMaxSymbols) return 0;
            }
            return h | 1;
        }
    };

    // The hash of what is read from dotted position `pos` to the production's end and of every rule that reaches.
    uint64_t shape(uint32_t pos) const {
        ShapeHash s{*g, mix(0x5AA9Eull)};
        s.rest(pos);
        return s.finish();
    }

    // A repetition at `pos`, or at the start of the one production of the rule after it (an email's local part
    // begins the email), a few levels down. Down there, only one of at least one item: what follows an empty one
    // would be read by an item predicted at this byte, which is no kernel position (that of `pos` is one).
    bool repetition(uint32_t pos, Matcher::Repetition& out) const {
        const Compiled& c = *g;
        if (pos >= c.n_positions) return false;
        for (int level = 0; level < 8; ++level) {
            if (repetition_at(pos, out)) return level == 0 || out.min > 0;
            const int32_t r = c.next(pos);
            if (r < 0 || c.counted_rule(r) != nullptr ||
                c.rule_begin[static_cast<size_t>(r) + 1] - c.rule_begin[static_cast<size_t>(r)] != 1)
                break;
            pos = c.starts[c.rule_begin[static_cast<size_t>(r)]];
        }
        return false;
    }

    ByteSet follow_bytes(uint32_t pos) const {
        const Compiled& c = *g;
        std::call_once(c.sets_once, [&c] { compute_first_follow(c); });
        return pos < c.n_positions ? c.follow[static_cast<size_t>(c.lhs(pos))] : ByteSet{};
    }

    uint32_t literal_length(uint32_t pos) const {
        const Compiled& c = *g;
        if (pos >= c.n_positions) return 0;
        if (c.is_counted(pos)) {  // an exact count of a byte left: that many bytes
            const Counted& r = c.counted_at(pos);
            const uint32_t i = pos - r.base;
            return r.item == kTerminal && r.min == r.max ? r.max - i : 0;
        }
        uint32_t n = 0;
        for (; c.next(pos) != kEnd; ++pos, ++n)
            if (c.next(pos) != kTerminal) return 0;
        return n;
    }

    ByteSet first_bytes(uint32_t pos) const {
        const Compiled& c = *g;
        std::call_once(c.sets_once, [&c] { compute_first_follow(c); });
        bool nullable = false;
        return pos < c.n_positions ? first_of(c, pos, nullable) : ByteSet{};
    }

    // A counted rule of an item that splits one way, at one of its own positions (items already read there) or
    // before it in another production.
    bool repetition_at(uint32_t pos, Matcher::Repetition& out) const {
        const Compiled& c = *g;
        std::call_once(c.sets_once, [&c] { compute_first_follow(c); });
        if (c.is_counted(pos)) {
            const Counted& r = c.counted_at(pos);
            const uint32_t i = pos - r.base;
            if (!r.one_way || i == r.max) return false;
            out.min = r.min > i ? r.min - i : 0;
            out.max = r.max - i;
            out.follow = c.follow[static_cast<size_t>(r.rule)];
            return describe_item(r, out);
        }
        const Counted* r = c.counted_rule(c.next(pos));
        if (r == nullptr || !r->one_way) return false;
        out.min = r->min;
        out.max = r->max;
        bool rest_nullable = false;
        out.follow = first_of(c, pos + 1, rest_nullable);
        if (rest_nullable) out.follow.add(c.follow[static_cast<size_t>(c.lhs(pos))]);
        return describe_item(*r, out);
    }

    // Fills the item's part of `out`: the rule's positions from 0 items to max, and the item itself.
    bool describe_item(const Counted& r, Matcher::Repetition& out) const {
        const Compiled& c = *g;
        out.rule_start = r.base;
        out.rule_end = r.base + r.max;
        out.rule_max = r.max;
        ShapeHash s{c, mix(0x17E35ull)};
        s.symbol(r.item, r.item_arg);
        out.item_shape = s.finish();
        out.item_is_byte = r.item == kTerminal;
        out.item_bytes = out.item_is_byte ? c.terminals[static_cast<size_t>(r.item_arg)] : ByteSet{};
        out.item_first = out.item_is_byte ? out.item_bytes : c.first[static_cast<size_t>(r.item)];
        return out.item_shape != 0;
    }

    void kernel(std::vector<uint32_t>& out) const {
        const uint32_t k = static_cast<uint32_t>(sets.size()) - 1;
        out.clear();
        if (k == 0) out.push_back(g->start_pos);
        for (uint32_t i = items_begin(k); i < sets[k].item_end; ++i)
            if (items[i].origin != k && g->next(items[i].pos) != kEnd) out.push_back(items[i].pos);
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
    }

    uint32_t items_begin(uint32_t k) const { return k == 0 ? 0 : sets[k - 1].item_end; }
    uint32_t scans_begin(uint32_t k) const { return k == 0 ? 0 : sets[k - 1].scan_end; }
    uint32_t waits_begin(uint32_t k) const { return k == 0 ? 0 : sets[k - 1].wait_end; }

    uint32_t begin_set() {
        if (++stamp == 0) {  // wrapped: old stamps could look current
            std::fill(pos_seen.begin(), pos_seen.end(), Seen{0, 0});
            std::fill(rule_done.begin(), rule_done.end(), Seen{0, 0});
            std::fill(rule_stamp.begin(), rule_stamp.end(), 0);
            std::fill(counted_seen.begin(), counted_seen.end(), CountedSeen{0, 0, 0});
            stamp = 1;
        }
        return static_cast<uint32_t>(sets.size());
    }

    // Inserts `key` (never 0) into the table; false when it was there already.
    bool table_insert(uint64_t key) {
        if (2 * (table_used.size() + 1) > table.size()) grow_table();
        const size_t mask = table.size() - 1;
        size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
        while (table[h] != 0) {
            if (table[h] == key) return false;
            h = (h + 1) & mask;
        }
        table[h] = key;
        table_used.push_back(static_cast<uint32_t>(h));
        return true;
    }

    void grow_table() {
        std::vector<uint64_t> old;
        old.swap(table);
        table.assign(old.size() * 2, 0);
        std::vector<uint32_t> used;
        used.swap(table_used);
        for (uint32_t h : used) table_insert(old[h]);
    }

    void clear_table() {
        for (uint32_t h : table_used) table[h] = 0;
        table_used.clear();
    }

    // Marks (index, origin) as seen in this set; false when it was already. `tag` keeps the table's keys for
    // positions and rules apart.
    bool first_time(Seen& s, uint32_t index, uint32_t origin, uint64_t tag) {
        if (s.stamp != stamp) {
            s = {stamp, origin};
            return true;
        }
        return s.origin != origin && table_insert((uint64_t{origin} + 1) << 32 | tag | index);
    }

    // Marks the item (pos, origin) as seen in this set; false when it was already. A large counted rule's positions
    // share one slot, its first item in the set; the rare others go to the table.
    bool first_at(uint32_t pos, uint32_t origin) {
        if (pos < pos_seen.size()) return first_time(pos_seen[pos], pos, origin, 0);
        CountedSeen& s = counted_seen[static_cast<size_t>(&g->counted_at(pos) - g->counted.data())];
        if (s.stamp != stamp) {
            s = {stamp, pos, origin};
            return true;
        }
        return (s.pos != pos || s.origin != origin) && table_insert((uint64_t{origin} + 1) << 32 | pos);
    }

    // Adds `it` to the set being built unless it is there.
    void add(Item it) {
        if (first_at(it.pos, it.origin)) items.push_back(it);
    }

    // The waiters on `rule` in set j (a finished set), as a range of waits.
    std::pair<Waiter*, Waiter*> waiters(uint32_t j, int32_t rule) {
        Waiter* b = waits.data() + waits_begin(j);
        Waiter* e = waits.data() + sets[j].wait_end;
        b = std::lower_bound(b, e, rule, [](const Waiter& w, int32_t r) { return w.rule < r; });
        Waiter* f = b;
        while (f != e && f->rule == rule) ++f;
        return {b, f};
    }

    // Runs prediction and completion over set k's items until nothing new comes, then records the set.
    void close(uint32_t k) {
        const Compiled& c = *g;
        const uint32_t wait_start = static_cast<uint32_t>(waits.size());
        ByteSet allowed;
        bool accepting = false;
        for (size_t i = items_begin(k); i < items.size(); ++i) {
            const Item it = items[i];
            // The symbol after the dot, its argument, and the rule this item completes (-1: none). A counted rule
            // from min items on completes, and below max may read another item too.
            int32_t sym, arg, completed = -1;
            if (!c.is_counted(it.pos)) {
                sym = c.real_next[it.pos];
                arg = c.real_arg[it.pos];
                if (sym == kEnd) completed = arg;
            } else {
                const Counted& r = c.counted_at(it.pos);
                const uint32_t n = it.pos - r.base;
                sym = n < r.max ? r.item : kEnd;
                arg = r.item_arg;
                if (n >= r.min) completed = r.rule;
            }
            if (it.origin == 0 && it.pos >= accept_lo && it.pos <= accept_hi) {
                accepting = true;
                if (stops && it.pos == accept_hi) continue;  // at_position(pos, end): read up to its end
            }
            // Completions of empty spans (origin k) need nothing: the predictor already moved past nullables.
            if (completed >= 0 && it.origin != k &&
                first_time(rule_done[static_cast<size_t>(completed)], static_cast<uint32_t>(completed), it.origin,
                           kRuleTag)) {  // not completed from this origin already
                const auto [b, e] = waiters(it.origin, completed);
                if (e - b == 1 && c.next(b->item.pos + 1) == kEnd) {
                    add(leo(b));
                } else {
                    for (const Waiter* w = b; w != e; ++w) add({w->item.pos + 1, w->item.origin});
                }
            }
            if (sym == kTerminal) {
                scans.push_back(it);
                const ByteSet& t = c.terminals[static_cast<size_t>(arg)];
                for (size_t w = 0; w < 4; ++w) allowed.words[w] |= t.words[w];
            } else if (sym >= 0) {
                waits.push_back({sym, it, {kLeoUnresolved, 0}, kKeyUnresolved});
                predict(sym, k, allowed);
                // Over a nullable rule by ε; never a counted rule's item (see the top of this file).
                if (c.nullable[static_cast<size_t>(sym)] && !c.is_counted(it.pos)) add({it.pos + 1, it.origin});
            }
        }
        clear_table();
        sort_waiters(wait_start);
        sets.push_back({static_cast<uint32_t>(items.size()), static_cast<uint32_t>(scans.size()),
                        static_cast<uint32_t>(waits.size()), accepting, allowed, kKeyUnresolved});
    }

    // Adds the items predicting `rule` brings to set k. A bundle goes straight to the scanners and waiters (it is
    // closed, so its items need no processing, and so are the bundles of the rules it predicts); otherwise the
    // productions go through the worklist.
    void predict(int32_t rule, uint32_t k, ByteSet& allowed) {
        const Compiled& c = *g;
        const auto r = static_cast<size_t>(rule);
        if (rule_stamp[r] == stamp) return;
        rule_stamp[r] = stamp;
        if (!c.has_bundle[r]) {
            for (uint32_t p = c.rule_begin[r]; p < c.rule_begin[r + 1]; ++p) add({c.starts[p], k});
            return;
        }
        for (size_t w = 0; w < 4; ++w) allowed.words[w] |= c.bundle_allowed[r].words[w];
        for (uint32_t b = c.bundle_begin[r]; b < c.bundle_begin[r + 1]; ++b) {
            const uint32_t pos = c.bundle[b];
            const int32_t sym = c.next(pos);
            if (sym >= 0) rule_stamp[static_cast<size_t>(sym)] = stamp;
            if (!first_at(pos, k)) continue;
            if (sym == kTerminal) {
                scans.push_back({pos, k});
            } else {
                waits.push_back({sym, {pos, k}, {kLeoUnresolved, 0}, kKeyUnresolved});
            }
        }
    }

    // Sorts the waiters from `begin` on by rule: insertion sort, as a set holds few.
    void sort_waiters(size_t begin) {
        if (waits.size() - begin > 32) {
            std::sort(waits.begin() + static_cast<ptrdiff_t>(begin), waits.end(),
                      [](const Waiter& a, const Waiter& b) { return a.rule < b.rule; });
            return;
        }
        for (size_t i = begin + 1; i < waits.size(); ++i) {
            const Waiter w = waits[i];
            size_t j = i;
            for (; j > begin && waits[j - 1].rule > w.rule; --j) waits[j] = waits[j - 1];
            waits[j] = w;
        }
    }

    // The Leo item of `w` (Leo 1991), a waiter alone on its rule in its set and with the rule last: a completion of
    // the rule from that set completes `w` too, and so on up the chain of such waiters, so the completion may jump
    // straight to the top of the chain. Found when first asked and kept in the waiter: it depends only on the sets
    // up to the waiter's own, which a rollback pops together with it.
    Item leo(Waiter* w) {
        const Compiled& c = *g;
        leo_path.clear();
        Item top{kLeoNone, 0};
        for (Waiter* cur = w;;) {
            if (cur->leo.pos != kLeoUnresolved) {
                if (cur->leo.pos != kLeoBusy) top = cur->leo;  // known already; busy: a cycle, stop below it
                break;
            }
            cur->leo.pos = kLeoBusy;
            leo_path.push_back(static_cast<uint32_t>(cur - waits.data()));
            const Item done{cur->item.pos + 1, cur->item.origin};
            const auto [b, e] = waiters(done.origin, c.arg(done.pos));
            if (e - b != 1 || c.next(b->item.pos + 1) != kEnd) {
                top = done;
                break;
            }
            cur = b;
        }
        if (top.pos == kLeoNone) {
            const Waiter& last = waits[leo_path.back()];
            top = {last.item.pos + 1, last.item.origin};
        }
        for (uint32_t i : leo_path) waits[i].leo = top;
        return top;
    }

    // The key of set k (see Matcher::state_key): the set of its items that still expect a symbol, each as its dotted
    // position and, for an item from an earlier set, the continuation of its rule from there. Complete items are
    // left out: their completions are already in the set. Items predicted here are "local", so the key names no
    // position.
    uint64_t set_key(uint32_t k) {
        Set& set = sets[k];
        if (set.key != kKeyUnresolved) return set.key;
        const Compiled& c = *g;
        bool cyclic = false;
        key_elems.clear();
        key_chain.clear();
        const auto add_item = [&](const Item& it) {
            const uint64_t cont = it.origin == k ? kLocal : continuation(it.origin, c.lhs(it.pos), cyclic);
            key_elems.emplace_back(it.pos, cont);
        };
        for (uint32_t i = scans_begin(k); i < set.scan_end; ++i) add_item(scans[i]);
        for (uint32_t i = waits_begin(k); i < set.wait_end; ++i) add_item(waits[i].item);
        set.key =
            cyclic ? unique_key() : hash_elements(key_elems, 0, (set.accepting ? 0xACCE97ull : 0x0DDull) ^ key_salt);
        return set.key;
    }

    // The key of what follows a completion of `rule` from set j: the set's waiters on `rule`, each with the dot
    // moved over it. A waiter that this completes in turn is transparent: it stands for the continuation of its
    // own rule from its own origin. So a chain of right recursion (every byte of a JSON string completes one more
    // level of `chars ::= char chars | ε`) collapses to the item above the chain, and the key repeats. Kept in the
    // set's first waiter on `rule`. `cyclic` is set when the key cannot be computed canonically (a continuation
    // that leads back to itself within one set, through left recursion); the caller then gives up on the key.
    uint64_t continuation(uint32_t j, int32_t rule, bool& cyclic) {
        const Compiled& c = *g;
        // A chain of single waiters completed in turn (Leo's deterministic reductions) is followed in a loop, not
        // by recursion, since it may be as long as the input; every waiter on it gets the same key.
        const size_t chain_begin = key_chain.size();
        uint64_t result = kKeyUnresolved;
        for (;;) {
            // `start`, or the production a matcher at_position() started in: nothing waits on it; its completion
            // accepts.
            if (rule == c.n_rules - 1 || (j == 0 && base == 1)) {
                result = kAcceptCont;
                break;
            }
            const auto [b, e] = waiters(j, rule);
            if (b == e) throw std::logic_error("Matcher: a completion without waiters");
            if (b->cont == kKeyBusy) {
                cyclic = true;
                result = unique_key();
                break;
            }
            if (b->cont != kKeyUnresolved) {
                result = b->cont;
                break;
            }
            const uint32_t adv = b->item.pos + 1;
            if (e - b == 1 && c.next(adv) == kEnd && adv != c.accept_pos) {
                b->cont = kKeyBusy;
                key_chain.push_back(b);
                rule = c.lhs(adv);
                j = b->item.origin;
                continue;
            }
            b->cont = kKeyBusy;
            key_chain.push_back(b);
            const size_t begin = key_elems.size();
            bool inner_cyclic = false;
            for (const Waiter* w = b; w != e; ++w) {
                const uint32_t p = w->item.pos + 1;
                Element el{p, kAcceptCont};
                if (p != c.accept_pos) {
                    // Computed before the element is appended: the call appends (and removes) its own elements.
                    const uint64_t cont = continuation(w->item.origin, c.lhs(p), inner_cyclic);
                    el = {c.next(p) == kEnd ? kTransparent : uint64_t{p}, cont};
                }
                key_elems.push_back(el);
            }
            if (inner_cyclic) {
                cyclic = true;
                result = unique_key();
            } else if (key_elems.size() - begin == 1 && key_elems[begin].first == kTransparent) {
                result = key_elems[begin].second;  // stands for exactly what the one transparent continuation does
            } else {
                result = hash_elements(key_elems, begin, 0xC0417ull);
            }
            key_elems.resize(begin);
            break;
        }
        for (size_t i = chain_begin; i < key_chain.size(); ++i) key_chain[i]->cont = result;
        key_chain.resize(chain_begin);
        return result;
    }

    bool advance(uint8_t byte) {
        const uint32_t k = static_cast<uint32_t>(sets.size()) - 1;
        if (!sets[k].allowed.has(byte)) return false;
        const Compiled& c = *g;
        const uint32_t n = begin_set();
        for (uint32_t i = scans_begin(k); i < sets[k].scan_end; ++i) {
            const Item it = scans[i];
            if (c.terminals[static_cast<size_t>(c.arg(it.pos))].has(byte)) add({it.pos + 1, it.origin});
        }
        close(n);
        return true;
    }

    void rollback(size_t n) {
        if (n + base >= sets.size()) throw std::out_of_range("Matcher::rollback: more bytes than were read");
        sets.resize(sets.size() - n);
        items.resize(sets.back().item_end);
        scans.resize(sets.back().scan_end);
        waits.resize(sets.back().wait_end);
    }
};

Matcher::Matcher(const Grammar& g) {
    g.validate();
    impl_ = new Impl(compile(g));
}

Matcher::~Matcher() { delete impl_; }

Matcher::Matcher(const Matcher& o) : impl_(new Impl(*o.impl_)) {}

Matcher& Matcher::operator=(const Matcher& o) {
    if (this != &o) {
        Impl* copy = new Impl(*o.impl_);
        delete impl_;
        impl_ = copy;
    }
    return *this;
}

bool Matcher::advance(uint8_t b) { return impl_->advance(b); }

bool Matcher::advance(std::string_view s) {
    for (size_t i = 0; i < s.size(); ++i) {
        if (!impl_->advance(static_cast<uint8_t>(s[i]))) {
            if (i > 0) impl_->rollback(i);
            return false;
        }
    }
    return true;
}

void Matcher::rollback(size_t n_bytes) {
    if (n_bytes > 0) impl_->rollback(n_bytes);
}

void Matcher::reset() { impl_->rollback(impl_->sets.size() - 1 - impl_->base); }

size_t Matcher::position() const { return impl_->sets.size() - 1 - impl_->base; }

void Matcher::kernel_positions(std::vector<uint32_t>& out) const { impl_->kernel(out); }

Matcher Matcher::at_position(uint32_t pos) const { return Matcher(new Impl(impl_->g, pos)); }

uint64_t Matcher::position_shape(uint32_t pos) const { return impl_->shape(pos); }

bool Matcher::repetition(uint32_t pos, Repetition& out) const { return impl_->repetition(pos, out); }

ByteSet Matcher::first_bytes(uint32_t pos) const { return impl_->first_bytes(pos); }

uint32_t Matcher::literal_length(uint32_t pos) const { return impl_->literal_length(pos); }

ByteSet Matcher::follow_bytes(uint32_t pos) const { return impl_->follow_bytes(pos); }

Matcher Matcher::at_position(uint32_t pos, uint32_t end) const { return Matcher(new Impl(impl_->g, pos, end)); }

bool Matcher::accepting() const { return impl_->sets.back().accepting; }

ByteSet Matcher::allowed() const { return impl_->sets.back().allowed; }

uint64_t Matcher::state_key() const { return impl_->set_key(static_cast<uint32_t>(impl_->sets.size()) - 1); }

bool matches(const Grammar& g, std::string_view text) {
    Matcher m(g);
    return m.advance(text) && m.accepting();
}

}  // namespace megactx::grammar
