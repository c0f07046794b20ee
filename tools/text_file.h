// A whole file as a string, for the subcommands that take --text-file / --json-schema / --grammar.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace megactx {

inline std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    MEGACTX_CHECK(in.good(), "{}: cannot open text file", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace megactx
