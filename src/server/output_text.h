// Generated token ids → the text a client is shown, as it streams: the tokenizer's streaming decoder (special
// tokens skipped; an id the tokenizer lacks adds no text, as in Hugging Face's decode()) followed by the stop
// strings, which cut the text right before the first match. Shared by the OpenAI API and `megactx run`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

// Which ids below `vocab_size` the tokenizer maps to text. A model's vocab_size can exceed its tokenizer's
// (padding rows, or gen-model's small preset: 516 of 4096 ids).
std::vector<bool> decodable_ids(const Tokenizer& tokenizer, int64_t vocab_size);

class OutputText {
  public:
    // `decodable` (from decodable_ids) must outlive this object.
    OutputText(const Tokenizer& tokenizer, const std::vector<bool>& decodable, std::vector<std::string> stops);

    // The text that is now certain after token `id` (never part of a UTF-8 character). Sets *matched when a stop
    // string appeared: the text then ends right before it, and later calls return nothing.
    std::string push(int32_t id, bool* matched);
    // End of output: the text held back (an incomplete character, a possible stop-string prefix); empty after a
    // match.
    std::string finish();

  private:
    StreamDecoder decoder_;
    const std::vector<bool>& decodable_;
    StopMatcher stop_;
};

}  // namespace megactx
