// Runs a Grammar over bytes (issue 51): an Earley recogniser, so any context-free grammar works (left recursion,
// ambiguity, ε rules), one Earley set per byte read. Bytes are taken one at a time or as a string, all or none;
// rollback() undoes the last bytes read (a rejected draft token, a jump-forward undone), since every set is kept.
// allowed() is the set of bytes that may come next — the token masks (grammar/token_mask.h) walk the vocabulary's
// byte trie with it, advancing and rolling back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace megactx::grammar {

class Matcher {
  public:
    // `g` is validated and must outlive the matcher.
    explicit Matcher(const Grammar& g);
    ~Matcher();
    Matcher(const Matcher&);
    Matcher& operator=(const Matcher&);

    bool advance(uint8_t b);            // false: `b` may not come next; nothing changes
    bool advance(std::string_view s);   // all of `s` or, when some byte is refused, nothing
    void rollback(size_t n_bytes);      // undo the last n bytes read (at most position())
    void reset();                       // back to the start
    size_t position() const;            // bytes read since the start
    bool accepting() const;             // the bytes read form a whole sentence of the root rule
    ByteSet allowed() const;            // the bytes advance() would take now
    bool finished() const { return accepting() && allowed().empty(); }  // nothing may follow
    // A key of the current state: two states of matchers over the same grammar (at any positions) with equal keys
    // accept the same futures — the same byte strings, accepting() the same after each — up to 64-bit hash
    // collisions. Positions where the grammar loops (inside a JSON string, a number, between array items) give
    // equal keys, so the key can index caches of work that depends only on the future (token masks). A state
    // whose key cannot be made canonical (left recursion within one position) gets a key no other state has.
    // Computed when first asked and kept with the position (const, but not safe against concurrent calls).
    uint64_t state_key() const;

    // For the token masks' per-position precomputation (grammar/token_mask.h). The current state's kernel: the
    // dotted positions (opaque indices into the compiled grammar) of its items that began before this byte and still
    // expect a symbol, plus the start before any byte. Every item of the state is one of these or predicted from
    // one, so a token the state allows is read, from its first byte, inside the rest of some kernel item's
    // production — until that production completes and its context takes over. Sorted, without repeats.
    void kernel_positions(std::vector<uint32_t>& out) const;
    // A matcher over the same grammar that starts inside one production, at dotted position `pos` (from
    // kernel_positions), with no context around it: it reads what the rest of that production derives, and
    // accepting() is true where the production is complete. The grammar must outlive it.
    Matcher at_position(uint32_t pos) const;
    // A hash of what at_position(pos) reads, from the grammar's structure alone (the rest of the production and
    // every rule it reaches, numbered in the order met): equal across grammars that share the piece (a JSON string's
    // body), so work on it can be shared between them (up to 64-bit collisions). 0 when the piece is too large
    // (over 20,000 symbols) to be worth hashing.
    uint64_t position_shape(uint32_t pos) const;

    // A bounded repetition at `pos`: a counted rule (Builder::repeat's item{m,n}, Rule::max), either at one of its
    // own positions (some items read, `min`..`max` more to come, then its rule completes) or next in pos's
    // production (then `min`..`max` items, and what follows the rule is read past the repetition's end, like what
    // follows it in the production), or at the start of the one production of the rule after `pos`. Only for an
    // item that derives no empty string and none of whose strings is a proper prefix of another (a JSON string's
    // character, a byte class), so that the bytes read split into items one way only. The token masks analyse such
    // an item once and derive every count of it (grammar/token_mask.h).
    struct Repetition {
        uint64_t item_shape;  // the item's structure, as position_shape hashes it: equal items, equal shapes
        uint32_t min, max;    // items the repetition reads from `pos`
        uint32_t rule_start;  // the counted rule's position before any item: at_position(rule_start, rule_end)
        uint32_t rule_end;    //   reads 0..rule_max items, accepting after each; rule_end is after rule_max items
        uint32_t rule_max;    // the counted rule's max
        bool item_is_byte;    // the item is one byte of `item_bytes`
        ByteSet item_bytes;
        ByteSet item_first;  // the bytes the item may begin with
        ByteSet follow;      // bytes that may come right after the repetition (a superset)
    };
    bool repetition(uint32_t pos, Repetition& out) const;
    // The bytes at_position(pos) may read first (a superset).
    ByteSet first_bytes(uint32_t pos) const;
    // How many bytes at_position(pos) reads when the rest of its production is byte sets only; 0 otherwise.
    uint32_t literal_length(uint32_t pos) const;
    // The bytes that may come right after pos's production, wherever its rule is used (a superset).
    ByteSet follow_bytes(uint32_t pos) const;
    // A matcher that reads the production from dotted position `pos` up to `end` (a later position of the same
    // production), accepts there and reads nothing past it. In a counted rule, whose positions are counts, it reads
    // up to end - pos items and accepts after each, below the rule's min too. Its state keys are its own: never
    // equal to those of a matcher that reads on.
    Matcher at_position(uint32_t pos, uint32_t end) const;

  private:
    struct Impl;
    explicit Matcher(Impl* impl) : impl_(impl) {}
    Impl* impl_;
};

// The whole of `text` is a sentence of `g`.
bool matches(const Grammar& g, std::string_view text);

}  // namespace megactx::grammar
