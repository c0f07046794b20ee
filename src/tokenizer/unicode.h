// UTF-8 helpers for the tokenizer: validation with U+FFFD replacement (the WHATWG "maximal subpart" rule that
// JavaScript's TextDecoder and Rust's from_utf8_lossy follow), the GPT-2 byte-level alphabet, Unicode
// White_Space, and Unicode normalization (NFC/NFD/NFKC/NFKD through ICU, confined to unicode.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace megactx::utf8 {

// Appends `bytes` to `out`, replacing every ill-formed subsequence by U+FFFD. With final_chunk = false a
// trailing sequence that is well-formed so far but incomplete is left unconsumed; returns the number of bytes
// consumed. Decoding a byte string in pieces this way gives exactly the text of decoding it whole.
size_t append_lossy(std::string& out, std::string_view bytes, bool final_chunk = true);

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool is_valid(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
inline uint32_t next_cp(std::string_view s, size_t& i) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
        ++i;
        return b0;
    }
    if (b0 < 0xE0) {
        const uint32_t cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
        i += 2;
        return cp;
    }
    if (b0 < 0xF0) {
        const uint32_t cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                            (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
        i += 3;
        return cp;
    }
    const uint32_t cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
                        ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
                        (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
    i += 4;
    return cp;
}

// The code point ending just before s[end] (valid UTF-8); sets `start` to its first byte.
uint32_t prev_cp(std::string_view s, size_t end, size_t& start);

void append_cp(std::string& out, uint32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s use).
bool is_white_space(uint32_t cp);
// Unicode alphanumeric (general category L* or N*), for added tokens' single_word rule.
bool is_alphanumeric(uint32_t cp);

// The GPT-2 byte-level alphabet: every byte maps to one printable code point.
const std::array<std::string, 256>& byte_to_unicode();
// Inverse of byte_to_unicode: code point → byte, or -1 for a code point outside the alphabet.
int byte_of_unicode(uint32_t cp);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

}  // namespace megactx::utf8
