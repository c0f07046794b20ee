// Bounds for numeric flags, as CLI11 validators with short errors that name the flag and the bounds in plain
// numbers ("--max-new-tokens: must be >= 0, got -5"). CLI11's own Range prints its limits with std::to_string,
// so NonNegativeNumber's upper bound (DBL_MAX) came out as 300 digits.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

namespace megactx {

// `lo` <= value <= `hi`; `want` is the bound as the error states it (">= 0", "between 1 and 64"), `label` as --help
// shows it after the type.
template <typename T>
CLI::Validator numeric_bounds(T lo, T hi, const std::string& want, const std::string& label) {
    const char* kind = std::is_integral_v<T> ? "an integer" : "a number";
    return CLI::Validator(
        [=](std::string& in) -> std::string {
            const char* last = in.data() + in.size();
            // An unsigned T parses no minus sign: "-1" is a number below the bounds, not a non-number.
            const bool negative = std::is_unsigned_v<T> && in.size() > 1 && in[0] == '-';
            T v{};
            const auto [end, ec] = std::from_chars(in.data() + (negative ? 1 : 0), last, v);
            bool number = end == last && ec != std::errc::invalid_argument;  // out of range: a number all the same
            if constexpr (std::is_floating_point_v<T>) number = number && std::isfinite(v);
            if (!number) return fmt::format("must be {} {}, got {}", kind, want, in);
            if (ec == std::errc() && !negative && v >= lo && v <= hi) return {};
            const bool above = ec == std::errc() ? !negative && v > hi : in[0] != '-';  // else out of T's range
            if (above && hi == std::numeric_limits<T>::max()) {
                return fmt::format("must be {} and at most {}, got {}", want, hi, in);
            }
            return fmt::format("must be {}, got {}", want, in);
        },
        label);
}

template <typename T>
CLI::Validator non_negative() {
    return numeric_bounds<T>(T{0}, std::numeric_limits<T>::max(), ">= 0", "NONNEGATIVE");
}

// Integers >= 1, floating-point values > 0.
template <typename T>
CLI::Validator positive() {
    if constexpr (std::is_integral_v<T>) {
        return numeric_bounds<T>(T{1}, std::numeric_limits<T>::max(), ">= 1", "POSITIVE");
    } else {
        return numeric_bounds<T>(std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max(), "> 0",
                                 "POSITIVE");
    }
}

template <typename T>
CLI::Validator in_range(T lo, T hi) {
    return numeric_bounds<T>(lo, hi, fmt::format("between {} and {}", lo, hi), fmt::format("[{}, {}]", lo, hi));
}

}  // namespace megactx
