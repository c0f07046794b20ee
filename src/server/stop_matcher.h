// Stop strings over streamed text: holds back just enough of the tail to recognise a stop string that spans
// pieces, and cuts the output right before the first match (OpenAI semantics: the stop string itself is not
// returned). Emitted text never ends inside a UTF-8 character.
#pragma once

#include <string>
#include <vector>

namespace megactx {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops);
    // Adds a piece; returns the text that is now safe to emit. Sets *matched when a stop string appeared
    // (the returned text then ends right before it, and later pushes return nothing).
    std::string push(const std::string& piece, bool* matched);
    // End of output: the held-back tail (empty after a match).
    std::string flush();

private:
    std::vector<std::string> stops_;
    size_t max_len_ = 0;
    std::string held_;
    bool matched_ = false;
};

}  // namespace megactx
