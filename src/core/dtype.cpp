#include "core/dtype.h"

#include <algorithm>
#include <cmath>

namespace megactx {

size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::F16: return 2;
        case DType::BF16: return 2;
        case DType::F8_E4M3: return 1;
        case DType::I32: return 4;
        case DType::I64: return 8;
    }
    return 0;
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::F16: return "F16";
        case DType::BF16: return "BF16";
        case DType::F8_E4M3: return "F8_E4M3";
        case DType::I32: return "I32";
        case DType::I64: return "I64";
    }
    return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
    static constexpr struct {
        std::string_view name;
        DType type;
    } kTypes[] = {{"F32", DType::F32},         {"F16", DType::F16}, {"BF16", DType::BF16},
                  {"F8_E4M3", DType::F8_E4M3}, {"I32", DType::I32}, {"I64", DType::I64}};
    for (const auto& t : kTypes) {
        if (t.name == s) {
            *out = t.type;
            return true;
        }
    }
    return false;
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0) {
        v = std::ldexp(static_cast<float>(man), -24);
    } else if (exp == 31) {
        v = man ? NAN : INFINITY;
    } else {
        v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
    }
    return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const float a = std::fabs(f);
    if (std::isnan(f)) return sign | 0x7e00u;
    if (a >= 65520.0f) return sign | 0x7c00u;
    if (a < std::ldexp(1.0f, -14)) {  // subnormal: units of 2^-24, round to nearest even
        const float q = std::nearbyint(a * std::ldexp(1.0f, 24));
        return sign | static_cast<uint16_t>(q);
    }
    int e;
    const float m = std::frexp(a, &e);                          // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint(m * 2048.0f);                      // 11 significant bits
    if (q == 2048.0f) {
        q = 1024.0f;
        ++e;
    }
    const uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
    if (exp >= 31) return sign | 0x7c00u;
    return sign | static_cast<uint16_t>((exp << 10) | (static_cast<uint32_t>(q) - 1024u));
}

uint8_t f32_to_fp8e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    const float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7e;  // saturate (e4m3fn has no infinity)
    // Below the smallest normal (2^-6) the codes count units of 2^-9; code 8 is 2^-6 itself.
    if (a < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
    int e;
    const float m = std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1): biased exponent e + 6
    int biased = e + 6;
    int mant = static_cast<int>(std::nearbyint((2.0f * m - 1.0f) * 8.0f));  // 3 bits, ties to even
    if (mant == 8) {
        mant = 0;
        ++biased;
    }
    return sign | static_cast<uint8_t>(std::min((biased << 3) | mant, 0x7e));
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
    const auto* p = static_cast<const uint8_t*>(src);
    switch (t) {
        case DType::F32: std::memcpy(dst, p, n * 4); break;
        case DType::BF16:
            for (size_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = bf16_to_f32(h);
            }
            break;
        case DType::F16:
            for (size_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = f16_to_f32(h);
            }
            break;
        case DType::F8_E4M3:
            for (size_t i = 0; i < n; ++i) dst[i] = fp8e4m3_to_f32(p[i]);
            break;
        case DType::I32:
            for (size_t i = 0; i < n; ++i) {
                int32_t v;
                std::memcpy(&v, p + 4 * i, 4);
                dst[i] = static_cast<float>(v);
            }
            break;
        case DType::I64:
            for (size_t i = 0; i < n; ++i) {
                int64_t v;
                std::memcpy(&v, p + 8 * i, 8);
                dst[i] = static_cast<float>(v);
            }
            break;
    }
}

}  // namespace megactx
