#include "tokenizer/chat_json.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace megactx::chat {

namespace {

enum class Utf8 { kValid, kInvalid, kIncomplete };

// Classifies the UTF-8 sequence starting at s[i] (RFC 3629 ranges: no overlongs, no surrogates, ≤ U+10FFFF).
Utf8 utf8_at(std::string_view s, size_t i, size_t* len, uint32_t* cp) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
        *len = 1;
        *cp = b0;
        return Utf8::kValid;
    }
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *len = 1;
        return Utf8::kInvalid;
    }
    uint32_t c = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < n; ++k) {
        if (i + k >= s.size()) {
            *len = 1;
            return Utf8::kIncomplete;
        }
        const auto b = static_cast<unsigned char>(s[i + k]);
        const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *len = 1;
            return Utf8::kInvalid;
        }
        c = (c << 6) | (b & 0x3F);
    }
    *len = n;
    *cp = c;
    return Utf8::kValid;
}

bool py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python repr(float): shortest round-trip digits; fixed notation for decimal exponents in [-4, 16), else
// d.ddde±XX with at least two exponent digits.
void append_py_float(std::string& out, double v) {
    if (std::isnan(v)) {
        out += "NaN";
        return;
    }
    if (std::isinf(v)) {
        out += v < 0 ? "-Infinity" : "Infinity";
        return;
    }
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
    std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // e.g. "-1.25e+03"
    std::string digits;
    size_t i = 0;
    if (sci[0] == '-') {
        out += '-';
        i = 1;
    }
    for (; i < sci.size() && sci[i] != 'e'; ++i)
        if (sci[i] != '.') digits += sci[i];
    const int exp10 = std::stoi(std::string(sci.substr(i + 1)));
    const int n = static_cast<int>(digits.size());
    if (exp10 >= -4 && exp10 < 16) {
        const int point = exp10 + 1;  // digits before the decimal point
        if (point <= 0) {
            out += "0.";
            out.append(static_cast<size_t>(-point), '0');
            out += digits;
        } else if (point >= n) {
            out += digits;
            out.append(static_cast<size_t>(point - n), '0');
            out += ".0";
        } else {
            out += digits.substr(0, static_cast<size_t>(point));
            out += '.';
            out += digits.substr(static_cast<size_t>(point));
        }
        return;
    }
    out += digits[0];
    if (n > 1) {
        out += '.';
        out += digits.substr(1);
    }
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out += e;
}

void append_py_json(std::string& out, const Json& v) {
    switch (v.type()) {
        case Json::value_t::null:
            out += "null";
            break;
        case Json::value_t::boolean:
            out += v.get<bool>() ? "true" : "false";
            break;
        case Json::value_t::number_integer:
            out += std::to_string(v.get<int64_t>());
            break;
        case Json::value_t::number_unsigned:
            out += std::to_string(v.get<uint64_t>());
            break;
        case Json::value_t::number_float:
            append_py_float(out, v.get<double>());
            break;
        case Json::value_t::string:
            out += '"';
            append_json_escaped(out, v.get_ref<const std::string&>());
            out += '"';
            break;
        case Json::value_t::array: {
            out += '[';
            bool first = true;
            for (const auto& e : v) {
                if (!first) out += ", ";
                first = false;
                append_py_json(out, e);
            }
            out += ']';
            break;
        }
        case Json::value_t::object: {
            out += '{';
            bool first = true;
            for (const auto& [k, e] : v.items()) {
                if (!first) out += ", ";
                first = false;
                out += '"';
                append_json_escaped(out, k);
                out += "\": ";
                append_py_json(out, e);
            }
            out += '}';
            break;
        }
        default:  // binary / discarded: never produced by parsing JSON text
            out += "null";
            break;
    }
}

}  // namespace

std::string py_json_dumps(const Json& v) {
    std::string out;
    append_py_json(out, v);
    return out;
}

void append_json_escaped(std::string& out, std::string_view s) {
    static const char* kHex = "0123456789abcdef";
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            switch (c) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                case '\b': out += "\\b"; break;
                case '\f': out += "\\f"; break;
                default:
                    if (c < 0x20) {
                        out += "\\u00";
                        out += kHex[c >> 4];
                        out += kHex[c & 15];
                    } else {
                        out += static_cast<char>(c);
                    }
            }
            ++i;
            continue;
        }
        size_t len = 1;
        uint32_t cp = 0;
        if (utf8_at(s, i, &len, &cp) == Utf8::kValid) {
            out.append(s.substr(i, len));
        } else {
            out += "\xEF\xBF\xBD";  // U+FFFD for each byte that does not start a valid sequence
        }
        i += len;
    }
}

size_t utf8_complete_prefix(std::string_view s) {
    // Only the last three bytes can start a sequence that is still incomplete.
    const size_t start = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t i = start; i < s.size(); ++i) {
        if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // continuation byte
        size_t len = 1;
        uint32_t cp = 0;
        if (utf8_at(s, i, &len, &cp) == Utf8::kIncomplete) return i;
    }
    return s.size();
}

std::string_view py_strip(std::string_view s) {
    size_t first = s.size(), end = 0;
    for (size_t i = 0; i < s.size();) {
        size_t len = 1;
        uint32_t cp = 0;
        const bool space = utf8_at(s, i, &len, &cp) == Utf8::kValid && py_isspace(cp);
        if (!space) {
            if (first == s.size()) first = i;
            end = i + len;
        }
        i += len;
    }
    return first == s.size() ? std::string_view() : s.substr(first, end - first);
}

}  // namespace megactx::chat
