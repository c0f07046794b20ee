// UTF-8 decoding with replacement, the byte-level alphabet and normalization. The only file that includes ICU.
#include "tokenizer/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "core/error.h"

namespace megactx::utf8 {

namespace {

// Length of the sequence a lead byte starts (0 = not a lead byte) and the allowed range of the second byte.
struct Lead {
    uint8_t len, lo, hi;
};

constexpr Lead lead_of(unsigned char b) {
    if (b < 0x80) return {1, 0, 0};
    if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};
    if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};
}

constexpr const char* kReplacement = "\xEF\xBF\xBD";

}  // namespace

size_t append_lossy(std::string& out, std::string_view s, bool final_chunk) {
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        // ASCII run fast path.
        size_t j = i;
        while (j < n && static_cast<unsigned char>(s[j]) < 0x80) ++j;
        out.append(s.data() + i, j - i);
        i = j;
        if (i == n) break;
        const Lead l = lead_of(static_cast<unsigned char>(s[i]));
        if (l.len == 0) {
            out += kReplacement;
            ++i;
            continue;
        }
        // Count how many bytes of the sequence are well-formed.
        size_t k = 1;
        while (k < l.len && i + k < n) {
            const auto c = static_cast<unsigned char>(s[i + k]);
            const bool ok = k == 1 ? (c >= l.lo && c <= l.hi) : (c >= 0x80 && c <= 0xBF);
            if (!ok) break;
            ++k;
        }
        if (k == l.len) {
            out.append(s.data() + i, k);
            i += k;
        } else if (i + k == n && !final_chunk) {
            return i;  // a well-formed but incomplete tail: wait for more bytes
        } else {
            out += kReplacement;  // one U+FFFD for the maximal well-formed prefix
            i += k;
        }
    }
    return n;
}

bool is_valid(std::string_view s) {
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        if (static_cast<unsigned char>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const Lead l = lead_of(static_cast<unsigned char>(s[i]));
        if (l.len == 0 || i + l.len > n) return false;
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        if (c1 < l.lo || c1 > l.hi) return false;
        for (size_t k = 2; k < l.len; ++k) {
            const auto c = static_cast<unsigned char>(s[i + k]);
            if (c < 0x80 || c > 0xBF) return false;
        }
        i += l.len;
    }
    return true;
}

uint32_t prev_cp(std::string_view s, size_t end, size_t& start) {
    start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    return next_cp(s, i);
}

void append_cp(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

bool is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

bool is_alphanumeric(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    const auto c = static_cast<UChar32>(cp);
    if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
    const int8_t t = u_charType(c);
    return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

const std::array<std::string, 256>& byte_to_unicode() {
    // Printable Latin-1 bytes stand for themselves; the other 68 bytes take U+0100.. in byte order.
    static const std::array<std::string, 256> table = [] {
        std::array<std::string, 256> t;
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            append_cp(t[b], printable ? b : next++);
        }
        return t;
    }();
    return table;
}

int byte_of_unicode(uint32_t cp) {
    static const std::vector<int> inverse = [] {
        std::vector<int> v(324, -1);
        const auto& t = byte_to_unicode();
        for (int b = 0; b < 256; ++b) {
            size_t i = 0;
            v[next_cp(t[b], i)] = b;
        }
        return v;
    }();
    return cp < inverse.size() ? inverse[cp] : -1;
}

std::string normalize(std::string_view s, NormalForm form) {
    bool ascii = true;
    for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return std::string(s);  // ASCII is invariant under all four forms
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2* norm = nullptr;
    switch (form) {
        case NormalForm::NFC: norm = unorm2_getNFCInstance(&err); break;
        case NormalForm::NFD: norm = unorm2_getNFDInstance(&err); break;
        case NormalForm::NFKC: norm = unorm2_getNFKCInstance(&err); break;
        case NormalForm::NFKD: norm = unorm2_getNFKDInstance(&err); break;
    }
    MEGACTX_CHECK(U_SUCCESS(err), "tokenizer: ICU normalizer unavailable ({})", u_errorName(err));
    // UTF-8 → UTF-16 (ICU's normalizer works on UTF-16), normalize, and back.
    int32_t n16 = 0;
    u_strFromUTF8(nullptr, 0, &n16, s.data(), static_cast<int32_t>(s.size()), &err);
    err = U_ZERO_ERROR;
    std::vector<UChar> in(static_cast<size_t>(n16) + 1);
    u_strFromUTF8(in.data(), n16 + 1, &n16, s.data(), static_cast<int32_t>(s.size()), &err);
    MEGACTX_CHECK(U_SUCCESS(err), "tokenizer: text is not UTF-8 ({})", u_errorName(err));
    std::vector<UChar> outv(static_cast<size_t>(n16) * 4 + 16);
    int32_t m = unorm2_normalize(norm, in.data(), n16, outv.data(), static_cast<int32_t>(outv.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
        err = U_ZERO_ERROR;
        outv.resize(static_cast<size_t>(m) + 1);
        m = unorm2_normalize(norm, in.data(), n16, outv.data(), static_cast<int32_t>(outv.size()), &err);
    }
    MEGACTX_CHECK(U_SUCCESS(err), "tokenizer: normalization failed ({})", u_errorName(err));
    int32_t n8 = 0;
    u_strToUTF8(nullptr, 0, &n8, outv.data(), m, &err);
    err = U_ZERO_ERROR;
    std::string out(static_cast<size_t>(n8), '\0');
    u_strToUTF8(out.data(), n8, &n8, outv.data(), m, &err);
    if (err == U_STRING_NOT_TERMINATED_WARNING) err = U_ZERO_ERROR;
    MEGACTX_CHECK(U_SUCCESS(err), "tokenizer: normalization failed ({})", u_errorName(err));
    return out;
}

}  // namespace megactx::utf8
