// What every benchmark program records next to its numbers: device, date, commit, load; and its list flags.
#pragma once

#include <omp.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace megactx::bench {

inline std::string run_command(const std::string& cmd) {
    std::string out;
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) return out;
    std::array<char, 256> buf;
    while (fgets(buf.data(), static_cast<int>(buf.size()), f)) out += buf.data();
    pclose(f);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
}

inline nlohmann::json device_info() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model;
    int64_t n_logical = 0;
    while (std::getline(in, line)) {
        if (line.rfind("processor", 0) == 0) ++n_logical;
        if (model.empty() && line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    }
    return {{"cpu", model}, {"logical_cores", n_logical}, {"omp_num_procs", omp_get_num_procs()}};
}

inline std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::array<char, 32> buf;
    std::strftime(buf.data(), buf.size(), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf.data();
}

// The source commit; MEGACTX_COMMIT names it where the tree was copied without .git (the GPU machine).
inline std::string source_commit(const std::string& source_dir) {
    if (const char* c = std::getenv("MEGACTX_COMMIT")) return c;
    return run_command("git -C '" + source_dir + "' rev-parse --short HEAD 2>/dev/null");
}

inline bool source_dirty(const std::string& source_dir) {
    return !run_command("git -C '" + source_dir + "' status --porcelain --untracked-files=no 2>/dev/null").empty();
}

// "1024,4096" → {1024, 4096}; anything but positive integers is an error naming the flag.
inline std::vector<int64_t> parse_positive_list(const std::string& s, const std::string& flag) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t used = 0;
        int64_t v = 0;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        MEGACTX_CHECK(used == item.size() && v > 0, "{}: '{}' is not a positive integer", flag, item);
        out.push_back(v);
    }
    return out;
}

}  // namespace megactx::bench
