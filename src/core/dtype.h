// Element types of checkpoint tensors and their conversion to fp32 (the CPU backend computes in fp32).
// fp8 e4m3 is the OCP "fn" variant used by DeepSeek/GLM checkpoints: no infinities, 0x7f/0xff are NaN,
// max finite 448.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace megactx {

enum class DType { F32, F16, BF16, F8_E4M3, I32, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses a safetensors dtype string ("F32", "BF16", ...); returns false for types megactx does not read.
bool parse_dtype(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// fp8 e4m3fn → fp32 through a 256-entry table built at compile time.
namespace detail {
struct Fp8E4M3Table {
    float v[256];
    constexpr Fp8E4M3Table() : v{} {
        for (int i = 0; i < 256; ++i) {
            const int exp = (i >> 3) & 0xf, man = i & 7;
            float r;
            if (exp == 15 && man == 7) {
                r = __builtin_nanf("");
            } else {
                // exp 0 is subnormal: man * 2^-9; otherwise (8 + man) * 2^(exp - 10).
                const int shift = exp == 0 ? -9 : exp - 10;
                float scale = 1.0f;
                for (int s = 0; s < (shift < 0 ? -shift : shift); ++s) scale = shift < 0 ? scale * 0.5f : scale * 2.0f;
                r = static_cast<float>(exp == 0 ? man : 8 + man) * scale;
            }
            v[i] = (i & 0x80) ? -r : r;
        }
    }
};
inline constexpr Fp8E4M3Table kFp8E4M3{};
}  // namespace detail
inline float fp8e4m3_to_f32(uint8_t v) { return detail::kFp8E4M3.v[v]; }
// fp32 → fp8 e4m3fn, round to nearest even, saturating to ±448.
uint8_t f32_to_fp8e4m3(float f);

// Converts n elements of type t starting at src (no alignment needed) to fp32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace megactx
