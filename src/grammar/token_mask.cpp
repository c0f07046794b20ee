// token_mask.h: the vocabulary's byte trie, built once, and the mask walk over it.
#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <fmt/format.h>
#include <iterator>
#include <list>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

namespace megactx::grammar {

int64_t TokenMask::count() const {
    int64_t n = 0;
    for (uint64_t w : words) n += std::popcount(w);
    return n;
}

// What one walk of a bounded repetition's item (Matcher::Repetition: 0..max copies of one item, read by
// Matcher::at_position(rule_start, rule_end)) tells about every count of that item. The item splits bytes into items
// one way, so along a trie path each byte continues the current item or starts the next: a node's `need` is the items
// its path starts (the last perhaps unfinished), its `done` the items the path completes. A repetition of min..max
// items at a kernel position (then whatever its production reads after it) reads a node iff its need is at most
// max: its tokens read entirely inside are those of need <= max, and its cuts (a byte refused where the repetition
// could have completed, see PositionMasks) are the nodes the walk refused after done >= max(min, 1) items, and the
// nodes that would start item max + 1. Tokens running on into what follows the repetition become cuts too: the
// walk over the cuts through the real matcher decides them, so the masks are exactly those of a walk of the
// position itself.
struct TokenVocab::ItemAnalysis {
    struct Refusal {
        uint32_t node, need, done;  // a node refused; its parent's need and done (done >= 1)
    };
    uint32_t max = 0;
    bool complete = true;              // false: too many states, positions are walked whole
    std::vector<uint64_t> accepted;    // the tokens of need <= max
    std::vector<int32_t> tokens;       // the same, by need ascending
    std::vector<uint32_t> need_end;    // tokens of need <= n: tokens[0 .. need_end[n]), n <= the largest need
    std::vector<Refusal> refused;      // ascending by node
    std::vector<uint32_t> starts;      // nodes starting an item after d >= 1 whole items, by d, then by node
    std::vector<uint32_t> starts_end;  // after d items: starts[starts_end[d - 1] .. starts_end[d]), starts_end[0] = 0
    // Nodes whose path completes all `max` items: their subtrees were not read. A repetition of more items reads on
    // there, so they are its cuts too (their tokens then come from the walk through the real matcher).
    std::vector<uint32_t> saturated;
};

// Item analyses by item shape, one per item (the one of the largest max), a few items at most.
class TokenVocab::ItemAnalyses {
  public:
    std::shared_ptr<const ItemAnalysis> find(uint64_t shape) {
        const std::lock_guard<std::mutex> lock(mu_);
        for (auto it = lru_.begin(); it != lru_.end(); ++it) {
            if (it->first != shape) continue;
            lru_.splice(lru_.begin(), lru_, it);
            return lru_.front().second;
        }
        return nullptr;
    }
    void insert(uint64_t shape, std::shared_ptr<const ItemAnalysis> a) {
        const std::lock_guard<std::mutex> lock(mu_);
        for (auto it = lru_.begin(); it != lru_.end(); ++it) {
            if (it->first != shape) continue;
            if (it->second->max >= a->max) return;
            lru_.erase(it);
            break;
        }
        if (lru_.size() >= kMaxItems) lru_.pop_back();
        lru_.emplace_front(shape, std::move(a));
    }
    size_t size() const {
        const std::lock_guard<std::mutex> lock(mu_);
        return lru_.size();
    }

  private:
    static constexpr size_t kMaxItems = 8;  // each about 2 MiB for a 128K-token vocabulary
    mutable std::mutex mu_;
    std::list<std::pair<uint64_t, std::shared_ptr<const ItemAnalysis>>> lru_;  // most recently used first
};

TokenVocab::TokenVocab(const std::vector<std::string>& token_bytes, std::vector<int32_t> stop_ids)
    : n_tokens_(token_bytes.size()),
      bytes_(token_bytes),
      stop_ids_(std::move(stop_ids)),
      items_(std::make_shared<ItemAnalyses>()) {
    for (const int32_t id : stop_ids_)
        if (id < 0 || static_cast<size_t>(id) >= n_tokens_)
            throw GrammarError(fmt::format("token masks: stop token {} outside the vocabulary of {}", id, n_tokens_));
    // The ids in byte order: a trie's depth-first order visits them so; stop tokens are not matched as bytes.
    std::vector<int32_t> order;
    for (size_t i = 0; i < n_tokens_; ++i)
        if (!bytes_[i].empty() && std::find(stop_ids_.begin(), stop_ids_.end(), static_cast<int32_t>(i)) == stop_ids_.end())
            order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
    });
    token_ids_.reserve(order.size());
    // build(lo, hi, depth): the node whose prefix the ids order[lo, hi) share, `depth` bytes long.
    const auto build = [&](auto& self, size_t lo, size_t hi, size_t depth, uint8_t byte, uint32_t parent) -> void {
        const auto me = static_cast<uint32_t>(nodes_.size());
        nodes_.push_back(
            Node{byte, static_cast<uint32_t>(depth), 0, static_cast<uint32_t>(token_ids_.size()), 0, parent});
        max_depth_ = std::max(max_depth_, depth);
        while (lo < hi && bytes_[static_cast<size_t>(order[lo])].size() == depth) {  // tokens ending here come first
            token_ids_.push_back(order[lo++]);
            ++nodes_[me].n_tokens;
        }
        ByteSet below;
        while (lo < hi) {
            const auto c = static_cast<uint8_t>(bytes_[static_cast<size_t>(order[lo])][depth]);
            size_t e = lo;
            while (e < hi && static_cast<uint8_t>(bytes_[static_cast<size_t>(order[e])][depth]) == c) ++e;
            const auto child = static_cast<uint32_t>(nodes_.size());
            self(self, lo, e, depth + 1, c, me);
            below.add(c);
            below.add(below_[child]);
            lo = e;
        }
        nodes_[me].end = static_cast<uint32_t>(nodes_.size());
        below_[me] = below;
    };
    size_t total = 1;  // at most one node per byte of every token, and the root
    for (const int32_t id : order) total += bytes_[static_cast<size_t>(id)].size();
    below_.resize(total);
    build(build, 0, order.size(), 0, 0, 0);
    below_.resize(nodes_.size());
    below_.shrink_to_fit();
}

void TokenVocab::walk(uint32_t node, Matcher& m, TokenMask& out) const {
    const ByteSet allowed = m.allowed();
    for (uint32_t c = node + 1; c < nodes_[node].end; c = nodes_[c].end) {
        const Node& n = nodes_[c];
        if (!allowed.has(n.byte)) continue;
        m.advance(n.byte);  // allowed: it succeeds
        for (uint32_t t = 0; t < n.n_tokens; ++t) out.set(token_ids_[n.first_token + t]);
        if (n.end > c + 1) walk(c, m, out);
        m.rollback(1);
    }
}

bool MaskCache::find(uint64_t key, TokenMask& out) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) {
        ++misses_;
        return false;
    }
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    out.words = it->second->second;
    return true;
}

void MaskCache::insert(uint64_t key, const TokenMask& mask) {
    if (max_masks_ == 0) return;
    const std::lock_guard<std::mutex> lock(mu_);
    if (by_key_.count(key) != 0) return;  // another request computed it meanwhile: the same mask
    if (by_key_.size() >= max_masks_) {
        by_key_.erase(lru_.back().first);
        lru_.pop_back();
    }
    lru_.emplace_front(key, mask.words);
    by_key_.emplace(key, lru_.begin());
}

size_t MaskCache::size() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return by_key_.size();
}

int64_t MaskCache::hits() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return hits_;
}

int64_t MaskCache::misses() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return misses_;
}

std::shared_ptr<const PositionMasks> MaskCache::find_position(uint64_t pos) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = by_position_.find(pos);
    if (it == by_position_.end()) return nullptr;
    position_lru_.splice(position_lru_.begin(), position_lru_, it->second);
    return it->second->second;
}

void MaskCache::insert_position(uint64_t pos, std::shared_ptr<const PositionMasks> masks) {
    if (max_positions_ == 0) return;
    const std::lock_guard<std::mutex> lock(mu_);
    if (by_position_.count(pos) != 0) return;
    if (by_position_.size() >= max_positions_) {
        by_position_.erase(position_lru_.back().first);
        position_lru_.pop_back();
    }
    position_lru_.emplace_front(pos, std::move(masks));
    by_position_.emplace(pos, position_lru_.begin());
}

size_t MaskCache::n_positions() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return by_position_.size();
}

namespace {

// A keyed walk gives up (and the plain walk runs) past this many distinct states: its transition table holds 256
// entries per state, and a grammar whose states never repeat gains nothing from it.
constexpr size_t kMaxWalkStates = 4096;
constexpr uint32_t kUnknown = ~uint32_t{0};
// A state with more kernel positions than this is walked whole rather than put together from its positions.
constexpr size_t kMaxKernel = 16;
// Subtrees of fewer nodes are walked node by node rather than tested for a loop.
constexpr uint32_t kMinSkip = 8;

}  // namespace

// A trie walk over matcher states identified by Matcher::state_key() rather than over the matcher itself: where the
// grammar loops (a JSON string's body), nearly every byte leads back to a state seen before, so a transition already
// taken is a table look-up instead of an Earley step, and the walk is a scan of the trie in node order that skips
// the subtrees of refused bytes. The matcher is advanced only to explore a new transition, lazily along the current
// trie path, and rolled back as the scan leaves the path (and wholly by the destructor). Equal keys mean equal
// futures, so a state's allowed bytes and transitions stand for every path that reaches it.
//
// A state that loops on many bytes (a string's body on every plain character) has them probed all at once; a
// subtree whose bytes all loop there is then allowed whole without visiting its nodes.
// Transitions between matcher states identified by Matcher::state_key(), as the walks below take them: per state its
// allowed bytes, whether it accepts, its loop (once probed) and the state after each byte (kRefused, kUnknown until
// taken). A walk owns one, or the grammar's MaskCache lends its own so that the analyses of kernel positions share
// what they explored (the positions of a bounded repeat pass through the same states one after another).
struct StateTable {
    std::unordered_map<uint64_t, uint32_t> by_key;
    std::vector<ByteSet> allowed, loop;
    std::vector<uint8_t> accepting, probed;
    std::vector<uint32_t> taken, self;  // transitions explored by enter(), of which back to the state
    std::vector<uint32_t> next;         // next[state * 256 + byte]
    size_t size() const { return allowed.size(); }
};

MaskCache::MaskCache(size_t max_masks, size_t max_positions)
    : max_masks_(max_masks), max_positions_(max_positions), table_(std::make_unique<StateTable>()) {}

MaskCache::~MaskCache() = default;

std::pair<std::unique_lock<std::mutex>, StateTable*> MaskCache::analysis_table() {
    std::unique_lock<std::mutex> lock(table_mu_);
    if (table_->size() > kMaxTableStates) *table_ = StateTable{};  // 256 entries a state: bounded
    return {std::move(lock), table_.get()};
}

// A trie walk over matcher states identified by Matcher::state_key() rather than over the matcher itself: where the
// grammar loops (a JSON string's body), nearly every byte leads back to a state seen before, so a transition already
// taken is a table look-up instead of an Earley step, and the walk is a scan of the trie in node order that skips
// the subtrees of refused bytes. The matcher is advanced only to explore a new transition, lazily along the current
// trie path, and rolled back as the scan leaves the path (and wholly by the destructor). Equal keys mean equal
// futures, so a state's allowed bytes and transitions stand for every path that reaches it.
//
// A state that loops on many bytes (a string's body on every plain character) has them probed all at once; a
// subtree whose bytes all loop there is then allowed whole without visiting its nodes.
class TokenVocab::StateWalk {
  public:
    static constexpr uint32_t kRefused = ~uint32_t{0} - 1;

    // `table`: transitions to start from and add to (null: the walk's own).
    StateWalk(Matcher& m, size_t max_depth, StateTable* table = nullptr)
        : m_(m), t_(table != nullptr ? *table : own_), state_at_(max_depth + 1), path_(max_depth + 1) {
        state_at_[0] = intern();
    }
    ~StateWalk() { m_.rollback(synced_); }
    StateWalk(const StateWalk&) = delete;
    StateWalk& operator=(const StateWalk&) = delete;

    // The state after a node at depth d on the current path's first d - 1 bytes: kRefused, or kUnknown when the
    // transition has not been taken yet (the node is allowed; enter() finds the state).
    uint32_t peek(uint32_t d, uint8_t byte) const { return t_.next[size_t{state_at_[d - 1]} * 256 + byte]; }
    // The state after the path's first d bytes accepts (a whole sentence: the production is complete).
    bool accepting(uint32_t d) const { return t_.accepting[state_at_[d]] != 0; }
    // Extends the path with an allowed node at depth d. False: past kMaxWalkStates new states, the walk is abandoned.
    bool enter(uint32_t d, uint8_t byte) {
        const uint32_t from = state_at_[d - 1];
        if (synced_ >= d) {  // the matcher read a sibling path: back to this node's parent
            m_.rollback(synced_ - (d - 1));
            synced_ = d - 1;
        }
        path_[d - 1] = byte;
        if (t_.next[size_t{from} * 256 + byte] == kUnknown) {
            sync(d);
            const uint32_t s = intern();
            if (added_ > kMaxWalkStates) return false;
            t_.next[size_t{from} * 256 + byte] = s;
            ++t_.taken[from];
            if (s == from) ++t_.self[from];
        }
        state_at_[d] = t_.next[size_t{from} * 256 + byte];
        return true;
    }
    // Whether every byte string over `bytes` stays in the state after the path's first d bytes (entered): the
    // state's loop, probed the first time this is asked of a state that allows many bytes.
    bool loops_on(uint32_t d, const ByteSet& bytes) {
        const uint32_t s = state_at_[d];
        if (!t_.probed[s]) {
            // Probed once the transitions taken so far show a loop (most lead back), so that a chain of states
            // (a bounded repeat: each byte leads to the next) is not probed state after state.
            if (t_.self[s] < kMinLoopBytes / 4 || t_.self[s] * 4 < t_.taken[s] * 3) return false;
            t_.probed[s] = 1;
            if (t_.allowed[s].count() < kMinLoopBytes || !probe(d)) return false;
        }
        const ByteSet& l = t_.loop[s];
        for (size_t w = 0; w < 4; ++w)
            if ((bytes.words[w] & ~l.words[w]) != 0) return false;
        return true;
    }

  private:
    static constexpr int kMinLoopBytes = 16;

    // The matcher reads the current path's first d bytes (what it has read is a prefix of the path, see enter()).
    void sync(uint32_t d) {
        if (synced_ >= d) {
            m_.rollback(synced_ - d);
            synced_ = d;
            return;
        }
        for (; synced_ < d; ++synced_)
            if (!m_.advance(path_[synced_])) throw std::logic_error("TokenVocab: a state key misled the walk");
    }

    // Takes every allowed transition of the state after the path's first d bytes and records which lead back.
    bool probe(uint32_t d) {
        const uint32_t s = state_at_[d];
        sync(d);
        ByteSet loop;
        for (int b = 0; b < 256; ++b) {
            if (t_.next[size_t{s} * 256 + static_cast<size_t>(b)] == kUnknown) {
                m_.advance(static_cast<uint8_t>(b));
                const uint32_t t = intern();
                m_.rollback(1);
                if (added_ > kMaxWalkStates) return false;
                t_.next[size_t{s} * 256 + static_cast<size_t>(b)] = t;
            }
            if (t_.next[size_t{s} * 256 + static_cast<size_t>(b)] == s) loop.add(static_cast<uint8_t>(b));
        }
        t_.loop[s] = loop;
        return true;
    }

    uint32_t intern() {
        const auto [it, fresh] = t_.by_key.emplace(m_.state_key(), static_cast<uint32_t>(t_.size()));
        if (fresh) {
            ++added_;
            const ByteSet allowed = m_.allowed();
            t_.allowed.push_back(allowed);
            t_.accepting.push_back(m_.accepting() ? 1 : 0);
            t_.probed.push_back(0);
            t_.taken.push_back(0);
            t_.self.push_back(0);
            t_.loop.emplace_back();
            const size_t base = t_.next.size();
            t_.next.resize(base + 256, kRefused);
            for (int b = 0; b < 256; ++b)
                if (allowed.has(static_cast<uint8_t>(b))) t_.next[base + static_cast<size_t>(b)] = kUnknown;
        }
        return it->second;
    }

    Matcher& m_;
    StateTable own_;
    StateTable& t_;
    size_t added_ = 0;                // states this walk added to t_
    std::vector<uint32_t> state_at_;  // the state after the first d bytes of the current path
    std::vector<uint8_t> path_;
    size_t synced_ = 0;  // m_ has read path_[0 .. synced_) past where the walk began
};

// The tokens of node i's subtree, i's own included: a run of token_ids_.
void TokenVocab::set_subtree(uint32_t i, TokenMask& out) const {
    const uint32_t last = nodes_[i].end == nodes_.size() ? static_cast<uint32_t>(token_ids_.size())
                                                          : nodes_[nodes_[i].end].first_token;
    for (uint32_t t = nodes_[i].first_token; t < last; ++t) out.set(token_ids_[t]);
}

// The keyed walk over the whole trie (cuts null) or over only the subtrees rooted at `cuts` (ascending, none inside
// another), whose tokens it sets; the nodes above them are visited to reach them. `table`: transitions to start from
// and add to (null: the walk's own). False (with `m` as it was): too many states, `out` is incomplete.
bool TokenVocab::walk_by_state(Matcher& m, TokenMask& out, const std::vector<uint32_t>* cuts, StateTable* table) const {
    StateWalk w(m, max_depth_, table);
    if (cuts == nullptr) return walk_subtrees(w, 1, static_cast<uint32_t>(nodes_.size()), out);
    // Each cut is reached from the path to the last one through its parents (not by scanning the siblings on the
    // way: a node may have hundreds of children).
    std::vector<uint32_t> path(max_depth_ + 1, 0), above;  // path[d]: the node entered at depth d <= path_depth
    uint32_t path_depth = 0;
    for (const uint32_t cut : *cuts) {
        above.clear();  // the cut's ancestors below the path, deepest first
        for (uint32_t a = nodes_[cut].parent; a != 0; a = nodes_[a].parent) {
            if (nodes_[a].depth <= path_depth && path[nodes_[a].depth] == a) break;
            above.push_back(a);
        }
        path_depth = nodes_[cut].depth - 1 - static_cast<uint32_t>(above.size());  // the part still on the path
        bool reached = true;
        for (auto it = above.rbegin(); it != above.rend() && reached; ++it) {
            const Node& n = nodes_[*it];
            if (w.peek(n.depth, n.byte) == StateWalk::kRefused) {
                reached = false;
                break;
            }
            if (!w.enter(n.depth, n.byte)) return false;
            path[n.depth] = *it;
            path_depth = n.depth;
            for (uint32_t t = 0; t < n.n_tokens; ++t) out.set(token_ids_[n.first_token + t]);  // read whole: allowed
        }
        if (reached && !walk_subtrees(w, cut, nodes_[cut].end, out)) return false;
    }
    return true;
}

// The keyed walk over the subtrees of nodes [from, to) (siblings, or one node's subtree), whose parent is the walk's
// current path. False: too many states.
bool TokenVocab::walk_subtrees(StateWalk& w, uint32_t from, uint32_t to, TokenMask& out) const {
    for (uint32_t i = from; i < to;) {
        const Node& n = nodes_[i];
        if (w.peek(n.depth, n.byte) == StateWalk::kRefused) {
            i = n.end;
            continue;
        }
        if (n.end == i + 1) {
            for (uint32_t t = 0; t < n.n_tokens; ++t) out.set(token_ids_[n.first_token + t]);
            ++i;
            continue;
        }
        if (!w.enter(n.depth, n.byte)) return false;
        // Tokens a matcher reads whole are allowed: the subtree is taken whole when it can be.
        if (n.end - i >= kMinSkip && w.loops_on(n.depth, below_[i])) {
            set_subtree(i, out);
            i = n.end;
            continue;
        }
        for (uint32_t t = 0; t < n.n_tokens; ++t) out.set(token_ids_[n.first_token + t]);
        ++i;
    }
    return true;
}

// What dotted position `pos` of m's grammar allows on its own (PositionMasks): a keyed walk of a matcher started
// there. A token the production reads whole is accepted; a byte the production refuses after it could have
// completed (at a depth past the token's first byte: completing before any byte is the business of the kernel
// items the completion leads to) cuts the subtree off as context-dependent.
std::shared_ptr<const PositionMasks> TokenVocab::analyse_position(const Matcher& m, uint32_t pos,
                                                                   StateTable* table) const {
    auto pm = std::make_shared<PositionMasks>();
    Matcher inner = m.at_position(pos);
    TokenMask accepted;
    accepted.reset(n_tokens_);
    {
        StateWalk w(inner, max_depth_, table);
        std::vector<uint8_t> complete_above(max_depth_ + 1, 0);  // the path completed the production at depth 1..d
        std::vector<ByteSet> lead(max_depth_ + 1);  // the bytes right after those completions, up to depth d
        const auto lead_of = [&](uint32_t d, uint8_t byte) {
            ByteSet l = lead[d - 1];
            if (d >= 2 && w.accepting(d - 1)) l.add(byte);
            return l;
        };
        for (uint32_t i = 1; i < nodes_.size();) {
            const Node& n = nodes_[i];
            const uint32_t d = n.depth;
            if (w.peek(d, n.byte) == StateWalk::kRefused) {
                if (complete_above[d - 1]) {
                    pm->cuts.push_back(i);
                    pm->leads.push_back(lead_of(d, n.byte));
                }
                i = n.end;
                continue;
            }
            if (n.end == i + 1) {
                for (uint32_t t = 0; t < n.n_tokens; ++t) accepted.set(token_ids_[n.first_token + t]);
                ++i;
                continue;
            }
            if (!w.enter(d, n.byte)) {
                pm->complete = false;
                pm->cuts.clear();
                pm->leads.clear();
                return pm;
            }
            if (n.end - i >= kMinSkip && w.loops_on(d, below_[i])) {  // read whole, never refused: no cuts
                set_subtree(i, accepted);
                i = n.end;
                continue;
            }
            for (uint32_t t = 0; t < n.n_tokens; ++t) accepted.set(token_ids_[n.first_token + t]);
            complete_above[d] = complete_above[d - 1] || w.accepting(d);
            lead[d] = lead_of(d, n.byte);
            ++i;
        }
    }
    if (accepted.count() > 0) pm->accepted = std::move(accepted.words);
    return pm;
}

size_t TokenVocab::n_item_analyses() const { return items_->size(); }

namespace {

// The values of (key, value) pairs ordered by key (small integers), stably: values[end[k - 1] .. end[k]) have key k
// (end[k]: the pairs of key <= k).
template <class V>
void bucket_by_key(const std::vector<std::pair<uint32_t, V>>& pairs, std::vector<V>& values,
                   std::vector<uint32_t>& end) {
    uint32_t max_key = 0;
    for (const auto& p : pairs) max_key = std::max(max_key, p.first);
    end.assign(size_t{max_key} + 1, 0);
    for (const auto& p : pairs) ++end[p.first];
    std::vector<uint32_t> at(end.size(), 0);  // where the next value of key k goes
    for (size_t k = 1; k < end.size(); ++k) {
        end[k] += end[k - 1];
        at[k] = end[k - 1];
    }
    values.resize(pairs.size());
    for (const auto& p : pairs) values[at[p.first]++] = p.second;
}

}  // namespace

// The item analysis of a repetition: a walk of its counted rule alone, accepting after every item
// (Matcher::at_position(rule_start, rule_end)), that records each node's need and done (see ItemAnalysis).
std::shared_ptr<const TokenVocab::ItemAnalysis> TokenVocab::analyse_item(const Matcher& m,
                                                                         const Matcher::Repetition& rep,
                                                                         StateTable* table) const {
    if (rep.item_is_byte) return analyse_byte_item(rep.item_bytes, rep.rule_max);
    auto a = std::make_shared<ItemAnalysis>();
    a->max = rep.rule_max;
    Matcher inner = m.at_position(rep.rule_start, rep.rule_end);
    TokenMask accepted;
    accepted.reset(n_tokens_);
    std::vector<std::pair<uint32_t, int32_t>> by_need;  // (need, token)
    std::vector<std::pair<uint32_t, uint32_t>> starts;  // (whole items before, node)
    std::vector<uint32_t> done(max_depth_ + 1, 0);      // items the current path's first d bytes complete
    {
        StateWalk w(inner, max_depth_, table);
        for (uint32_t i = 1; i < nodes_.size();) {
            const Node& n = nodes_[i];
            const uint32_t d = n.depth;
            if (w.peek(d, n.byte) == StateWalk::kRefused) {
                if (d >= 2 && done[d - 1] >= 1) a->refused.push_back({i, done[d - 2] + 1, done[d - 1]});
                i = n.end;
                continue;
            }
            if (d >= 2 && w.accepting(d - 1)) starts.emplace_back(done[d - 1], i);
            for (uint32_t t = 0; t < n.n_tokens; ++t) {
                accepted.set(token_ids_[n.first_token + t]);
                by_need.emplace_back(done[d - 1] + 1, token_ids_[n.first_token + t]);
            }
            if (n.end > i + 1) {
                if (!w.enter(d, n.byte)) {
                    a->complete = false;
                    return a;
                }
                done[d] = done[d - 1] + (w.accepting(d) ? 1 : 0);
                if (done[d] == a->max) a->saturated.push_back(i);
            }
            ++i;
        }
    }
    bucket_by_key(by_need, a->tokens, a->need_end);
    bucket_by_key(starts, a->starts, a->starts_end);
    a->accepted = std::move(accepted.words);
    return a;
}

// The item analysis of a repetition of one byte of `bytes` (a class in a format or a pattern): the same as
// analyse_item's walk would find, from the trie alone (a node's need and done are its depth).
std::shared_ptr<const TokenVocab::ItemAnalysis> TokenVocab::analyse_byte_item(const ByteSet& bytes,
                                                                              uint32_t max) const {
    auto a = std::make_shared<ItemAnalysis>();
    a->max = max;
    TokenMask accepted;
    accepted.reset(n_tokens_);
    std::vector<std::pair<uint32_t, int32_t>> by_need;
    std::vector<std::pair<uint32_t, uint32_t>> starts;
    by_need.reserve(n_tokens_);
    starts.reserve(nodes_.size());
    for (uint32_t i = 1; i < nodes_.size();) {
        const Node& n = nodes_[i];
        if (!bytes.has(n.byte) || n.depth > max) {
            if (n.depth >= 2) a->refused.push_back({i, n.depth - 1, n.depth - 1});
            i = n.end;
            continue;
        }
        if (n.depth >= 2) starts.emplace_back(n.depth - 1, i);
        for (uint32_t t = 0; t < n.n_tokens; ++t) {
            accepted.set(token_ids_[n.first_token + t]);
            by_need.emplace_back(n.depth, token_ids_[n.first_token + t]);
        }
        if (n.depth == max && n.end > i + 1) a->saturated.push_back(i);
        ++i;
    }
    bucket_by_key(by_need, a->tokens, a->need_end);
    bucket_by_key(starts, a->starts, a->starts_end);
    a->accepted = std::move(accepted.words);
    return a;
}

// The tokens of need <= max (see ItemAnalysis), as mask words; empty: none.
std::vector<uint64_t> TokenVocab::derive_accepted(const ItemAnalysis& a, uint32_t max) const {
    const size_t total = a.tokens.size();
    const size_t kept = max < a.need_end.size() ? a.need_end[max] : total;
    if (kept == total) return a.accepted;
    if (kept == 0) return {};
    TokenMask acc;
    if (2 * kept < total) {  // set the few kept, or clear the few dropped
        acc.reset(n_tokens_);
        for (size_t t = 0; t < kept; ++t) acc.set(a.tokens[t]);
    } else {
        acc.words = a.accepted;
        for (size_t t = kept; t < total; ++t)
            acc.words[static_cast<size_t>(a.tokens[t]) >> 6] &= ~(uint64_t{1} << (a.tokens[t] & 63));
    }
    return std::move(acc.words);
}

// The cuts of a repetition of rep.min..rep.max items (see ItemAnalysis), ascending. When nothing that may follow the
// repetition can begin an item (a string's closing quote, an email's "@"), a token leaves it only at a byte refused
// right after a whole item, and only with a byte that may follow it: the other cuts are dropped, since whatever the
// context, a matcher refuses them there.
std::vector<uint32_t> TokenVocab::derive_cuts(const ItemAnalysis& a, const Matcher::Repetition& rep) const {
    const uint32_t min = std::max<uint32_t>(rep.min, 1), max = rep.max;
    const bool apart = rep.follow.intersect(rep.item_first).empty();
    std::vector<uint32_t> cuts, refused;
    for (const ItemAnalysis::Refusal& r : a.refused) {
        if (r.need > max || r.done < min) continue;
        if (!apart || (r.need == r.done && rep.follow.has(nodes_[r.node].byte))) refused.push_back(r.node);
    }
    // Item max + 1 starts: after max whole items (max >= 1, so the repetition could complete there).
    auto first = a.starts.begin() + (max < a.starts_end.size() ? a.starts_end[max - 1] : a.starts.size());
    auto last = a.starts.begin() + (max < a.starts_end.size() ? a.starts_end[max] : a.starts.size());
    if (apart) first = last;
    cuts.reserve(refused.size() + static_cast<size_t>(last - first));
    std::merge(refused.begin(), refused.end(), first, last, std::back_inserter(cuts));
    if (max > a.max) {  // the walk stopped where these read on; nested cuts are dropped by fill_by_positions
        const size_t n = cuts.size();
        cuts.insert(cuts.end(), a.saturated.begin(), a.saturated.end());
        std::inplace_merge(cuts.begin(), cuts.begin() + static_cast<ptrdiff_t>(n), cuts.end());
    }
    return cuts;
}

// The PositionMasks of kernel position `pos` when it is a bounded repetition (Matcher::repetition), derived from
// its item's analysis, which is walked now if there is none and `may_walk`. Null otherwise.
std::shared_ptr<const PositionMasks> TokenVocab::repetition_masks(const Matcher& m, uint32_t pos, MaskCache& cache,
                                                                  bool may_walk) const {
    Matcher::Repetition rep;
    if (!m.repetition(pos, rep)) return nullptr;
    std::shared_ptr<const ItemAnalysis> a = items_->find(rep.item_shape);
    if (a == nullptr) {
        if (!may_walk) return nullptr;
        {
            auto [lock, table] = cache.analysis_table();
            a = analyse_item(m, rep, table);
        }
        items_->insert(rep.item_shape, a);
    }
    auto pm = std::make_shared<PositionMasks>();
    if (!a->complete) {
        pm->complete = false;
        return pm;
    }
    pm->accepted = derive_accepted(*a, rep.max);
    pm->cuts = derive_cuts(*a, rep);
    return pm;
}

// What kernel position `pos` allows on its own: from the grammar's cache, derived from its repetition's item, from
// the vocabulary's cache (by shape), or, when `may_walk`, by a walk (of the item or of the position). Null: none of
// these without a walk. Derived positions are kept in the grammar's cache only: deriving is cheap, and a string of
// thousands of characters would crowd the vocabulary's analyses out.
std::shared_ptr<const PositionMasks> TokenVocab::position_masks(const Matcher& m, uint32_t pos, MaskCache& cache,
                                                                bool may_walk) const {
    std::shared_ptr<const PositionMasks> pm = cache.find_position(pos);
    if (pm != nullptr) return pm;
    if ((pm = repetition_masks(m, pos, cache, false)) != nullptr) {
        cache.insert_position(pos, pm);
        return pm;
    }
    const uint64_t shape = m.position_shape(pos);
    if (shape != 0 && (pm = shared_->find_position(shape)) != nullptr) {
        cache.insert_position(pos, pm);
        return pm;
    }
    if (!may_walk) return nullptr;
    if ((pm = repetition_masks(m, pos, cache, true)) != nullptr) {
        cache.insert_position(pos, pm);
        return pm;
    }
    {
        auto [lock, table] = cache.analysis_table();
        pm = analyse_position(m, pos, table);
    }
    if (shape != 0) shared_->insert_position(shape, pm);
    cache.insert_position(pos, pm);
    return pm;
}

// Whether a walk from kernel position `pos` stays in a small part of the trie: it reads a few bytes only (the last
// character of a hostname label), or the subtrees of the bytes it may begin with (an email's "@" and what follows)
// hold at most 1/16 of the nodes.
bool TokenVocab::narrow_position(const Matcher& m, uint32_t pos) const {
    const uint32_t length = m.literal_length(pos);
    if (length > 0 && length <= 2) return true;
    const ByteSet first = m.first_bytes(pos);
    size_t n = 0;
    for (uint32_t c = 1; c < nodes_.size(); c = nodes_[c].end)
        if (first.has(nodes_[c].byte)) n += nodes_[c].end - c;
    return n <= nodes_.size() / 16;
}

// fill_mask's per-position path: the union of the kernel positions' accepted tokens, then the keyed walk over the
// union of their cuts through `m` itself. False: a state this does not suit (too many kernel positions, a position
// too large to analyse, several positions not analysed yet, too many states in the cuts' walk); `out` is then
// incomplete.
bool TokenVocab::fill_by_positions(Matcher& m, TokenMask& out, MaskCache& cache) const {
    std::vector<uint32_t> kernel;
    m.kernel_positions(kernel);
    if (kernel.size() > kMaxKernel) return false;
    // The positions' analyses (position_masks). One that needs a walk is walked now; when several do, only the
    // first is, and those whose walk is small (narrow_position), and this mask walks the state instead (false):
    // each analysis walks the trie, so a cold state with several wide positions would cost a walk per position
    // (MaskBench's p99.9); later masks find the others. The others are tried again after the first: an item's walk
    // may serve them. Bounded repetitions go first: theirs is an analysis of the item, serving every count (and for
    // a byte class a pass over the trie without the matcher), the cheapest progress; the kernel's own order is only
    // how the grammar is laid out.
    std::vector<std::shared_ptr<const PositionMasks>> found(kernel.size());
    std::vector<size_t> missing;
    for (size_t i = 0; i < kernel.size(); ++i)
        if ((found[i] = position_masks(m, kernel[i], cache, false)) == nullptr) missing.push_back(i);
    Matcher::Repetition rep;
    std::stable_partition(missing.begin(), missing.end(), [&](size_t i) { return m.repetition(kernel[i], rep); });
    for (size_t n = 0; n < missing.size(); ++n) {
        const uint32_t pos = kernel[missing[n]];
        if ((found[missing[n]] = position_masks(m, pos, cache, n == 0 || narrow_position(m, pos))) == nullptr)
            return false;
    }
    std::vector<uint32_t> cuts;
    for (size_t i = 0; i < found.size(); ++i) {
        const PositionMasks& pm = *found[i];
        if (!pm.complete) return false;
        for (size_t w = 0; w < pm.accepted.size(); ++w) out.words[w] |= pm.accepted[w];
        if (pm.leads.empty()) {
            cuts.insert(cuts.end(), pm.cuts.begin(), pm.cuts.end());
            continue;
        }
        const ByteSet follow = m.follow_bytes(kernel[i]);
        for (size_t c = 0; c < pm.cuts.size(); ++c)
            if (!pm.leads[c].intersect(follow).empty()) cuts.push_back(pm.cuts[c]);
    }
    if (cuts.empty()) return true;
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    size_t kept = 0;  // drop cuts inside another's subtree
    for (size_t i = 0; i < cuts.size(); ++i)
        if (kept == 0 || cuts[i] >= nodes_[cuts[kept - 1]].end) cuts[kept++] = cuts[i];
    cuts.resize(kept);
    // Through the grammar's transitions: the states below a kernel position recur from mask to mask (a bounded
    // string's next character meets the states of the last one's, one item further on).
    auto [lock, table] = cache.analysis_table();
    return walk_by_state(m, out, &cuts, table);
}

void TokenVocab::fill_mask(Matcher& m, TokenMask& out, MaskCache* cache) const {
    if (cache == nullptr) {
        fill_mask(m, out);
        return;
    }
    const uint64_t key = m.state_key();
    if (cache->find(key, out) && out.words.size() == (n_tokens_ + 63) / 64) return;
    out.reset(n_tokens_);
    if (!fill_by_positions(m, out, *cache)) {
        out.reset(n_tokens_);
        if (!walk_by_state(m, out, nullptr)) {
            out.reset(n_tokens_);
            walk(0, m, out);
        }
    }
    if (m.accepting())
        for (const int32_t id : stop_ids_) out.set(id);
    cache->insert(key, out);
}

void TokenVocab::fill_mask(Matcher& m, TokenMask& out) const {
    out.reset(n_tokens_);
    walk(0, m, out);
    if (m.accepting())
        for (const int32_t id : stop_ids_) out.set(id);
}

}  // namespace megactx::grammar
