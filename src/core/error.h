// Errors: every user-facing failure is one megactx::Error whose message names the file, tensor, field or
// parameter and what was expected (design.md §8). Throw with MEGACTX_FAIL / MEGACTX_CHECK.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace megactx {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace megactx

#define MEGACTX_FAIL(...) throw ::megactx::Error(fmt::format(__VA_ARGS__))
#define MEGACTX_CHECK(cond, ...)          \
    do {                                  \
        if (!(cond)) MEGACTX_FAIL(__VA_ARGS__); \
    } while (0)
