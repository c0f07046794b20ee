// A compiled pre-tokenizer regex (PCRE2, 8-bit, UTF + UCP, JIT). Patterns are written for Oniguruma, which
// the Rust tokenizers library uses; `\s`/`\S` are rewritten to Unicode White_Space as Oniguruma defines them.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace megactx {

class Regex {
public:
    // `literal` = match `pattern` as a plain string. `where` names the file and field for error messages.
    Regex(const std::string& pattern, bool literal, const std::string& where);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Leftmost match in subject at or after `start` (a code point boundary of valid UTF-8). Returns false when
    // there is none; else sets [begin, end).
    bool find(std::string_view subject, size_t start, size_t& begin, size_t& end) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The pattern with \s and \S replaced by explicit White_Space classes (exposed for tests).
std::string rewrite_oniguruma(const std::string& pattern);

}  // namespace megactx
