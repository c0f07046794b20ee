// OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with an HTTP status (design.md §8).
#pragma once

#include <stdexcept>
#include <string>

namespace megactx {

struct ApiError : std::runtime_error {
    int status;
    std::string type, param, code;
    ApiError(int status_, std::string message, std::string param_ = "", std::string code_ = "")
        : std::runtime_error(std::move(message)), status(status_), param(std::move(param_)), code(std::move(code_)) {
        type = status == 401   ? "authentication_error"
               : status == 404 ? "not_found_error"
               : status == 429 ? "rate_limit_error"
               : status >= 500 ? "server_error"
                               : "invalid_request_error";
    }
};

// The JSON body for an error.
std::string api_error_body(int status, const std::string& message, const std::string& type = "",
                           const std::string& param = "", const std::string& code = "");

}  // namespace megactx
