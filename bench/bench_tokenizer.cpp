// Tokenizer encode throughput, single thread: every line of a JSONL corpus (one JSON string per line) is
// encoded with add_special_tokens=true; the first pass starts with an empty word cache, later passes reuse it.
// Prints one JSON object. Usage: bench_tokenizer MODEL_DIR CORPUS.jsonl [PASSES]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s MODEL_DIR CORPUS.jsonl [PASSES]\n", argv[0]);
        return 2;
    }
    const int passes = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
    try {
        using clock = std::chrono::steady_clock;
        const auto t_load = clock::now();
        const megactx::Tokenizer tok = megactx::Tokenizer::load(argv[1]);
        const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();
        std::vector<std::string> lines;
        std::ifstream in(argv[2], std::ios::binary);
        std::string line;
        size_t bytes = 0;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            lines.push_back(nlohmann::json::parse(line).get<std::string>());
            bytes += lines.back().size();
        }
        std::vector<double> seconds;
        size_t n_ids = 0;
        for (int p = 0; p < passes; ++p) {
            size_t ids = 0;
            const auto t0 = clock::now();
            for (const auto& l : lines) ids += tok.encode(l, true).size();
            seconds.push_back(std::chrono::duration<double>(clock::now() - t0).count());
            n_ids = ids;
        }
        double best = seconds[0];
        for (double s : seconds) best = std::min(best, s);
        const nlohmann::json out = {{"impl", "megactx"},
                                    {"lines", lines.size()},
                                    {"bytes", bytes},
                                    {"ids", n_ids},
                                    {"passes", passes},
                                    {"load_s", load_s},
                                    {"first_pass_s", seconds[0]},
                                    {"best_pass_s", best},
                                    {"mb_per_s_first", bytes / seconds[0] / 1e6},
                                    {"mb_per_s_best", bytes / best / 1e6}};
        std::printf("%s\n", out.dump().c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
        return 1;
    }
    return 0;
}
