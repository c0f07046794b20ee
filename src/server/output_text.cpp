#include "server/output_text.h"

#include <utility>

#include "core/error.h"

namespace megactx {

std::vector<bool> decodable_ids(const Tokenizer& tokenizer, int64_t vocab_size) {
    std::vector<bool> ok(static_cast<size_t>(vocab_size), false);
    for (size_t id = 0; id < ok.size() && id < tokenizer.vocab_size(); ++id) {
        try {
            tokenizer.token_str(static_cast<int32_t>(id));  // Error for an id the tokenizer lacks
            ok[id] = true;
        } catch (const Error&) {
        }
    }
    return ok;
}

OutputText::OutputText(const Tokenizer& tokenizer, const std::vector<bool>& decodable, std::vector<std::string> stops)
    : decoder_(tokenizer, true), decodable_(decodable), stop_(std::move(stops)) {}

std::string OutputText::push(int32_t id, bool* matched) {
    *matched = false;
    if (id < 0 || static_cast<size_t>(id) >= decodable_.size() || !decodable_[static_cast<size_t>(id)]) return "";
    return stop_.push(decoder_.push(id), matched);
}

std::string OutputText::finish() {
    bool matched = false;
    std::string tail = stop_.push(decoder_.flush(), &matched);
    if (!matched) tail += stop_.flush();
    return tail;
}

}  // namespace megactx
