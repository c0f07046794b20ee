// PCRE2 wrapper: the only file that includes pcre2.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace megactx {

namespace {

// Unicode White_Space, the set Oniguruma's \s matches (PCRE2's UCP \s omits U+0085).
constexpr const char* kWhiteSpaceRanges = "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}"
                                          "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// Per-thread match state: match data (only the whole match is used) and a JIT stack big enough for long words.
struct MatchState {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_match_context* context = [this] {
        pcre2_match_context* c = pcre2_match_context_create(nullptr);
        if (stack != nullptr) pcre2_jit_stack_assign(c, nullptr, stack);
        return c;
    }();
    ~MatchState() {
        pcre2_match_context_free(context);
        pcre2_jit_stack_free(stack);
        pcre2_match_data_free(data);
    }
};

MatchState& match_state() {
    thread_local MatchState state;
    return state;
}

}  // namespace

std::string rewrite_oniguruma(const std::string& p) {
    std::string out;
    out.reserve(p.size() + 64);
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            if (e == 's') {
                out += in_class ? std::string(kWhiteSpaceRanges) : "[" + std::string(kWhiteSpaceRanges) + "]";
            } else if (e == 'S' && !in_class) {
                out += "[^" + std::string(kWhiteSpaceRanges) + "]";
            } else if (e == 'u' && i + 5 < p.size() && std::all_of(p.begin() + static_cast<long>(i) + 2,
                                                                   p.begin() + static_cast<long>(i) + 6, ::isxdigit)) {
                // Oniguruma's \uHHHH is PCRE2's \x{HHHH}.
                out += "\\x{" + p.substr(i + 2, 4) + "}";
                i += 4;
            } else {
                out += c;
                out += e;
            }
            ++i;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            out += c;
            // A ']' (or '^]') right after the opening bracket is a literal.
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out += c;
    }
    return out;
}

struct Regex::Impl {
    pcre2_code* code = nullptr;
    bool jit = false;
};

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) : impl_(std::make_unique<Impl>()) {
    const std::string src = literal ? pattern : rewrite_oniguruma(pattern);
    uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (literal) options = PCRE2_UTF | PCRE2_LITERAL;
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(src.data()), src.size(),
                                options, &err, &err_offset, nullptr);
    if (impl_->code == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        MEGACTX_FAIL("{}: cannot compile regex '{}' at offset {}: {}", where, pattern, static_cast<size_t>(err_offset),
                     reinterpret_cast<const char*>(msg));
    }
    impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
    if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

bool Regex::find(std::string_view subject, size_t start, size_t& begin, size_t& end) const {
    MatchState& ms = match_state();
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, subject.size(), start, 0, ms.data, ms.context)
                        : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
        // The interpreter keeps its backtracking state on the heap, so it handles what the JIT stack cannot.
        rc = pcre2_match(impl_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, ms.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        MEGACTX_FAIL("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
    begin = ov[0];
    end = ov[1];
    return true;
}

}  // namespace megactx
