// `megactx grammar masks`: the token masks the engine computes along a text, as JSON, so that another implementation
// (tests/server/xgrammar_compare.test.mjs runs xgrammar) can be compared with them state by state; and the
// vocabulary those masks are over (`--vocab`), so the other side builds exactly the same one.
#pragma once

#include "grammar/grammar.h"
#include "grammar_cmd.h"

namespace megactx {

// {"n_tokens", "stop_ids", "tokens": [hex of each id's bytes; "" for a token never allowed (special)]}.
int run_vocab(const GrammarOptions& o);
// For the text (--text, --text-file), or each text of --jsonl (one JSON string a line, one output line each):
// {"n_tokens", "ids": the text's tokens, "masks": [allowed ids before token i (i = 0..n), as inclusive [lo, hi]
// ranges], "refused": the first token the mask refused (-1: none; masks then stop at it), "accepting"}. Exit 1
// when a text has a token refused.
int run_masks(const GrammarOptions& o, const grammar::Grammar& g);

}  // namespace megactx
