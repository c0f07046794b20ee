// Structured outputs in the engine (issue 51): a request's output follows a grammar, token by token, through masks
// over its logits before sampling. The grammar engine (src/grammar) knows bytes and tokens; this is where a
// sequence's generated tokens meet it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace megactx {

class Tokenizer;

// What a request asks for, shared and immutable (compiled once, possibly cached across requests).
struct OutputConstraint {
    std::shared_ptr<const grammar::Grammar> grammar;
    std::shared_ptr<const grammar::TokenVocab> vocab;  // the model's vocabulary as bytes; its stop ids end the output
    int32_t start_after = -1;  // the constraint starts after this token (a thinking model's end of thinking); -1: at once
    // Masks by matcher state for this grammar and vocabulary, shared by every sequence that follows this constraint
    // (thread-safe); null: every mask walks the vocabulary.
    std::shared_ptr<grammar::MaskCache> masks;
};

// The model's vocabulary for masks: every token's bytes except the special tokens (never grammar text), and the
// ids that end the output (`stop_ids`: the model's end-of-sequence tokens), allowed where the grammar may end.
// Warmed (warm_json_pieces) before it is returned.
std::shared_ptr<const grammar::TokenVocab> make_token_vocab(const Tokenizer& tok, const std::vector<int32_t>& stop_ids);

// Analyses, in the vocabulary's shared cache, the pieces of grammar every JSON Schema shares (a string's body,
// numbers, whitespace, the character of a string of bounded length), by walking JSON texts through the masks of a
// few grammars: so the first schema a server sees does not pay for them in its first masks. A few milliseconds per
// model.
void warm_json_pieces(const grammar::TokenVocab& vocab);

// One sequence's progress through its constraint: a matcher over the bytes generated since the constraint started.
class ConstraintState {
  public:
    explicit ConstraintState(std::shared_ptr<const OutputConstraint> c);

    // Sets to -inf the logits [vocab] of the tokens the grammar refuses after the tokens generated so far and then
    // `extra` (the drafts a verification row follows). Returns the tokens left allowed; 0 leaves the row untouched
    // (no token of the vocabulary continues the output), -1 too (`extra` itself leaves the grammar: a row that a
    // verification never uses, since the draft before it has probability 0).
    int64_t mask(float* logits, int64_t vocab, const std::vector<int32_t>& extra);
    // Computes the mask for the next token now (no drafts), so that mask() finds it ready: the engine calls it while
    // the forward pass runs on the device.
    void prepare();
    // The token was generated. False: the grammar refuses it (only a caller that ignored the mask gets this).
    bool accept(int32_t token);
    bool active() const { return active_; }
    // The mask prepare() computed for the next token (no drafts), when the constraint is active and the mask allows
    // a token; null otherwise. The engine applies it on the backend (Ops::mask_rows) and takes the row's argmax
    // there, so a greedy constrained row's logits never leave the device.
    const grammar::TokenMask* ready_mask() const;
    // The last mask without drafts allowed nothing: no token of the vocabulary continues the output.
    bool stuck() const { return stuck_; }
    // Why accept() refused a token, for the request's error.
    std::string error() const;
    size_t bytes() const { return matcher_.position(); }

  private:
    bool is_stop(int32_t token) const;

    std::shared_ptr<const OutputConstraint> c_;
    grammar::Matcher matcher_;
    grammar::TokenMask mask_;
    bool active_;
    bool ended_ = false;  // a stop token was accepted
    bool stuck_ = false;
    int32_t refused_ = -1;  // the last token accept() saw
    bool prepared_ = false;  // mask_ holds the mask after the tokens accepted so far
};

}  // namespace megactx
