// Parity check against @huggingface/tokenizers on the generated corpus: for every line, the ids with and
// without special tokens must equal the reference's, decode(ids) must equal the reference's decode and the
// original text, and a StreamDecoder fed one id at a time must produce decode(ids).
// Usage: tokenizer_parity_check MODEL_DIR CORPUS.jsonl REF_DIR
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot open");
    std::vector<nlohmann::json> out;
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
}

std::string show(const std::vector<int32_t>& v) { return nlohmann::json(v).dump().substr(0, 300); }

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s MODEL_DIR CORPUS.jsonl REF_DIR\n", argv[0]);
        return 2;
    }
    try {
        const megactx::Tokenizer tok = megactx::Tokenizer::load(argv[1]);
        const auto corpus = read_jsonl(argv[2]);
        const std::string ref = argv[3];
        const auto ids_special = read_jsonl(ref + "/ids_special.jsonl");
        const auto ids_plain = read_jsonl(ref + "/ids_nospecial.jsonl");
        const auto decoded = read_jsonl(ref + "/decoded.jsonl");
        if (ids_special.size() != corpus.size() || ids_plain.size() != corpus.size() || decoded.size() != corpus.size()) {
            std::fprintf(stderr, "reference files do not have one line per corpus line\n");
            return 1;
        }
        size_t bytes = 0, n_ids = 0, bad_special = 0, bad_plain = 0, bad_decode = 0, bad_round = 0, bad_stream = 0;
        auto report = [](size_t& counter, size_t line, const std::string& what) {
            if (counter++ < 5) std::fprintf(stderr, "line %zu: %s\n", line + 1, what.c_str());
        };
        for (size_t i = 0; i < corpus.size(); ++i) {
            const std::string& text = corpus[i].get_ref<const std::string&>();
            bytes += text.size();
            const auto a = tok.encode(text, true), b = tok.encode(text, false);
            n_ids += a.size();
            const auto ea = ids_special[i].get<std::vector<int32_t>>(), eb = ids_plain[i].get<std::vector<int32_t>>();
            if (a != ea) report(bad_special, i, "ids (special) " + show(a) + " != reference " + show(ea));
            if (b != eb) report(bad_plain, i, "ids (no special) " + show(b) + " != reference " + show(eb));
            const std::string d = tok.decode(a);
            if (d != decoded[i].get_ref<const std::string&>()) report(bad_decode, i, "decode differs from reference");
            if (tok.decode(b) != text) report(bad_round, i, "decode(encode(text)) != text");
            megactx::StreamDecoder sd(tok);
            std::string streamed;
            for (int32_t id : a) streamed += sd.push(id);
            streamed += sd.flush();
            if (streamed != d) report(bad_stream, i, "streamed decode differs from decode");
        }
        std::printf("tokenizer parity: %zu lines, %zu bytes, %zu ids; mismatches: ids(special) %zu, ids(no special) %zu, "
                    "decode %zu, round trip %zu, stream %zu\n",
                    corpus.size(), bytes, n_ids, bad_special, bad_plain, bad_decode, bad_round, bad_stream);
        return bad_special + bad_plain + bad_decode + bad_round + bad_stream == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tokenizer_parity_check: %s\n", e.what());
        return 1;
    }
}
