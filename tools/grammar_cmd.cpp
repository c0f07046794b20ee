#include "grammar_cmd.h"
#include "grammar_masks.h"
#include "text_file.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/constraint.h"
#include "grammar/frontends.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

grammar::Grammar compile_from(const GrammarOptions& o) {
    grammar::JsonSchemaOptions jo;
    jo.max_whitespace = o.max_whitespace;
    jo.additional_properties_default = !o.strict;
    if (!o.json_schema_file.empty()) return grammar::compile_json_schema(read_text_file(o.json_schema_file), jo);
    if (!o.grammar_file.empty()) return grammar::parse_gbnf(read_text_file(o.grammar_file));
    if (!o.choices.empty()) return grammar::compile_choices(o.choices);
    return grammar::compile_regex(o.regex);
}

// Printable form of a token's bytes for messages.
std::string shown(std::string_view s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n') out += "\\n";
        else if (c == '"' || c == '\\') out += {'\\', static_cast<char>(c)};
        else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out += static_cast<char>(c);
    }
    return out;
}

int run_check(const GrammarOptions& o, const grammar::Grammar& g) {
    const std::string text = o.text_file.empty() ? o.text : read_text_file(o.text_file);
    grammar::Matcher m(g);
    if (o.bytes_only) {
        for (size_t i = 0; i < text.size(); ++i) {
            if (!m.advance(static_cast<uint8_t>(text[i]))) {
                std::printf("no match: byte %zu ('%s') refused after \"%s\"\n", i, shown(text.substr(i, 1)).c_str(),
                            shown(text.substr(i > 40 ? i - 40 : 0, std::min<size_t>(i, 40))).c_str());
                return 1;
            }
        }
        if (!m.accepting()) {
            std::printf("no match: the text ends where the grammar does not (after %zu bytes)\n", text.size());
            return 1;
        }
        std::printf("match: %zu bytes\n", text.size());
        return 0;
    }
    const Tokenizer tok = Tokenizer::load(o.model);
    const auto vocab_ptr = load_vocab(tok);
    const grammar::TokenVocab& vocab = *vocab_ptr;
    const std::vector<int32_t> ids = tok.encode(text, false);
    grammar::TokenMask mask;
    size_t offset = 0;
    double mask_ms = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        const auto t0 = Clock::now();
        vocab.fill_mask(m, mask);
        mask_ms += ms_since(t0);
        const std::string& b = tok.token_bytes(ids[i]);
        if (!mask.allowed(ids[i])) {
            std::printf("no match: token %zu (id %d, \"%s\") at byte %zu refused after \"%s\"; %lld tokens allowed "
                        "there\n",
                        i, ids[i], shown(b).c_str(), offset,
                        shown(text.substr(offset > 40 ? offset - 40 : 0, std::min<size_t>(offset, 40))).c_str(),
                        static_cast<long long>(mask.count()));
            return 1;
        }
        m.advance(b);
        offset += b.size();
    }
    vocab.fill_mask(m, mask);
    if (!m.accepting()) {
        std::printf("no match: the text ends where the grammar does not (after %zu tokens, %zu bytes)\n", ids.size(),
                    offset);
        return 1;
    }
    std::printf("match: %zu tokens, %zu bytes; mask %.3f ms a token on average\n", ids.size(), offset,
                ids.empty() ? 0.0 : mask_ms / static_cast<double>(ids.size()));
    return 0;
}

int run_compile(const GrammarOptions& o, const grammar::Grammar& g, double compile_ms) {
    std::printf("rules %zu, symbols %lld, compiled in %.3f ms\n", g.rules.size(), static_cast<long long>(g.n_symbols()),
                compile_ms);
    if (o.print_gbnf) std::printf("%s", g.to_gbnf().c_str());
    const Tokenizer tok = Tokenizer::load(o.model);
    auto t0 = Clock::now();
    const auto vocab_ptr = load_vocab(tok);
    const grammar::TokenVocab& vocab = *vocab_ptr;
    const double vocab_ms = ms_since(t0);
    grammar::Matcher m(g);
    grammar::TokenMask mask;
    t0 = Clock::now();
    vocab.fill_mask(m, mask);
    std::printf("vocabulary %zu tokens (trie of %zu nodes, built in %.1f ms, once per model); first mask %.3f ms, "
                "%lld tokens allowed\n",
                vocab.n_tokens(), vocab.n_nodes(), vocab_ms, ms_since(t0), static_cast<long long>(mask.count()));
    return 0;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Every NAME.schema.json with its NAME.instance.json under o.bench_dir: compile, the first mask, then a mask before
// every token of the instance (as the engine computes them while decoding it), on one thread.
int run_bench(const GrammarOptions& o) {
    const Tokenizer tok = Tokenizer::load(o.model);
    auto t0 = Clock::now();
    const auto vocab = load_vocab(tok);
    const double vocab_ms = ms_since(t0);
    std::vector<std::filesystem::path> schemas;
    for (const auto& e : std::filesystem::directory_iterator(o.bench_dir))
        if (e.path().string().ends_with(".schema.json")) schemas.push_back(e.path());
    std::sort(schemas.begin(), schemas.end());
    MEGACTX_CHECK(!schemas.empty(), "{}: no *.schema.json files", o.bench_dir);
    grammar::JsonSchemaOptions jo;
    jo.max_whitespace = o.max_whitespace;
    jo.additional_properties_default = !o.strict;
    std::vector<double> all_us, first_ms;
    nlohmann::json cases = nlohmann::json::array();
    int n_failed = 0;
    std::printf("%-16s %7s %10s %10s %10s %10s %10s\n", "case", "tokens", "first ms", "p50 us", "p99 us", "max us",
                "compile ms");
    for (const auto& path : schemas) {
        const std::string name = path.filename().string().substr(0, path.filename().string().size() - 12);
        const std::string instance = read_text_file((path.parent_path() / (name + ".instance.json")).string());
        t0 = Clock::now();
        grammar::Grammar g;
        try {
            g = grammar::compile_json_schema(read_text_file(path.string()), jo);
        } catch (const grammar::GrammarError& e) {
            std::printf("%-16s does not compile: %s\n", name.c_str(), e.what());
            cases.push_back({{"case", name}, {"error", e.what()}});
            ++n_failed;
            continue;
        }
        const double compile_ms = ms_since(t0);
        grammar::Matcher m(g);
        grammar::TokenMask mask;
        // One per compiled grammar, as the engine keeps one per constraint.
        std::unique_ptr<grammar::MaskCache> masks;
        if (!o.no_cache) masks = std::make_unique<grammar::MaskCache>();
        const std::vector<int32_t> ids = tok.encode(instance, false);
        std::vector<double> us;
        bool ok = true;
        for (size_t i = 0; i <= ids.size() && ok; ++i) {
            const auto t = Clock::now();
            vocab->fill_mask(m, mask, masks.get());
            us.push_back(ms_since(t) * 1e3);
            if (i == ids.size()) {
                ok = m.accepting();
            } else {
                ok = mask.allowed(ids[i]) && m.advance(tok.token_bytes(ids[i]));
            }
        }
        if (!ok) {
            std::printf("%-16s the instance does not match its schema\n", name.c_str());
            cases.push_back({{"case", name}, {"error", "instance refused"}});
            ++n_failed;
            continue;
        }
        const double first = compile_ms + us[0] / 1e3;
        first_ms.push_back(first);
        all_us.insert(all_us.end(), us.begin(), us.end());
        std::printf("%-16s %7zu %10.3f %10.1f %10.1f %10.1f %10.3f\n", name.c_str(), ids.size(), first,
                    percentile(us, 0.5), percentile(us, 0.99), percentile(us, 1.0), compile_ms);
        cases.push_back({{"case", name}, {"tokens", ids.size()}, {"compile_ms", compile_ms}, {"first_mask_ms", first},
                         {"mask_us_p50", percentile(us, 0.5)}, {"mask_us_p99", percentile(us, 0.99)},
                         {"mask_us_max", percentile(us, 1.0)}});
    }
    std::printf("all: %zu masks, per token p50 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us; time to first mask "
                "p50 %.3f ms, max %.3f ms; vocabulary %zu tokens, trie built in %.1f ms\n",
                all_us.size(), percentile(all_us, 0.5), percentile(all_us, 0.99), percentile(all_us, 0.999),
                percentile(all_us, 1.0), percentile(first_ms, 0.5), percentile(first_ms, 1.0), vocab->n_tokens(),
                vocab_ms);
    if (!o.json_out.empty()) {
        std::ifstream cpuinfo("/proc/cpuinfo");
        std::string line, cpu;
        while (cpu.empty() && std::getline(cpuinfo, line))
            if (line.rfind("model name", 0) == 0) cpu = line.substr(line.find(':') + 2);
        const std::time_t now = std::time(nullptr);
        char date[32];
        std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
        nlohmann::json j = {{"version", MEGACTX_VERSION_STRING},
                            {"date", date},
                            {"cpu", cpu},
                            {"threads", 1},
                            {"tokenizer", o.model},
                            {"max_whitespace", o.max_whitespace},
                            {"vocab_tokens", vocab->n_tokens()},
                            {"vocab_trie_ms", vocab_ms},
                            {"masks", all_us.size()},
                            {"mask_us_p50", percentile(all_us, 0.5)},
                            {"mask_us_p99", percentile(all_us, 0.99)},
                            {"mask_us_p999", percentile(all_us, 0.999)},
                            {"mask_us_max", percentile(all_us, 1.0)},
                            {"first_mask_ms_p50", percentile(first_ms, 0.5)},
                            {"first_mask_ms_max", percentile(first_ms, 1.0)},
                            {"cases", cases}};
        std::ofstream(o.json_out) << j.dump(2) << "\n";
    }
    return n_failed == 0 ? 0 : 1;
}

void add_maskbench_command(CLI::App* cmd, GrammarOptions& o) {
    auto* mb = o.maskbench = cmd->add_subcommand(
        "maskbench", "MaskBench (guidance-ai/jsonschemabench maskbench/data): schemas compiled, valid instances "
                     "accepted, invalid ones rejected, mask time per token and time to first mask, one thread");
    auto* data = mb->add_option("--data", o.mb.data_dir, "maskbench/data: one JSON file per schema and its tests")
                     ->check(CLI::ExistingDirectory);
    auto* merge = mb->add_option("--merge", o.mb.merge_files,
                                 "Summarize --per-schema files of earlier runs (the shards) instead of running");
    data->excludes(merge);
    mb->add_option("--model", o.model, "Model directory whose tokenizer.json gives the vocabulary (default: the "
                                          "embedded glm-demo model)");
    mb->add_option("--limit", o.mb.limit, "The first N files (of the shard; 0: all)")->check(CLI::NonNegativeNumber);
    mb->add_option("--shard", o.mb_shard, "i/n: every n-th file from the i-th (0-based) of the sorted list");
    mb->add_option("--json", o.mb.json_out, "Write the summary as JSON");
    mb->add_option("--per-schema", o.mb.per_schema_out, "Write one JSON line per schema (with its mask times)");
    mb->add_option("--timeout-ms", o.mb.timeout_ms, "A compile or one mask past this counts the schema as a timeout")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600000));
    mb->add_option("--max-whitespace", o.mb.max_whitespace, "Whitespace bytes allowed at each place")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
}

int maskbench_main(GrammarOptions o) {
    if (o.mb.data_dir.empty() && o.mb.merge_files.empty()) {
        std::fprintf(stderr, "megactx grammar maskbench: give --data (or --merge)\n");
        return 2;
    }
    if (!o.mb_shard.empty()) {
        const size_t slash = o.mb_shard.find('/');
        try {
            o.mb.shard = std::stoi(o.mb_shard.substr(0, slash));
            o.mb.n_shards = slash == std::string::npos ? 0 : std::stoi(o.mb_shard.substr(slash + 1));
        } catch (const std::exception&) {
            o.mb.n_shards = 0;
        }
        if (o.mb.n_shards < 1 || o.mb.shard < 0 || o.mb.shard >= o.mb.n_shards) {
            std::fprintf(stderr, "megactx grammar maskbench: --shard %s: want i/n with 0 <= i < n\n", o.mb_shard.c_str());
            return 2;
        }
    }
    o.mb.model = o.model;
    return run_maskbench(o.mb);
}

}  // namespace

std::shared_ptr<const grammar::TokenVocab> load_vocab(const Tokenizer& tok) {
    return make_token_vocab(tok, tok.eos_id() >= 0 ? std::vector<int32_t>{tok.eos_id()} : std::vector<int32_t>{});
}

CLI::App* add_grammar_command(CLI::App& app, GrammarOptions& o) {
    auto* cmd = app.add_subcommand("grammar", "Structured outputs offline: check a text against a JSON Schema, regex "
                                              "or grammar through the token masks; compile statistics");
    cmd->require_subcommand(1);
    const auto source_flags = [&o](CLI::App* sub) {
        auto* js = sub->add_option("--json-schema", o.json_schema_file, "JSON Schema file");
        auto* re = sub->add_option("--regex", o.regex, "Regular expression the whole text must match");
        auto* gr = sub->add_option("--grammar", o.grammar_file, "GBNF grammar file (llama.cpp's format; start rule root)");
        auto* ch = sub->add_option("--choice", o.choices, "One allowed string (repeat the flag)");
        js->excludes(re, gr, ch);
        re->excludes(gr, ch);
        gr->excludes(ch);
        sub->add_option("--model", o.model, "Model directory whose tokenizer.json gives the vocabulary (default: the "
                                            "embedded glm-demo model)");
        sub->add_option("--max-whitespace", o.max_whitespace,
                        "JSON Schema: whitespace bytes allowed at each place JSON allows them (0: compact)")
            ->capture_default_str()
            ->check(CLI::Range(0, 64));
        sub->add_flag("--strict", o.strict,
                      "JSON Schema: no properties beyond those declared unless additionalProperties says so "
                      "(OpenAI's strict mode)");
    };
    o.check = cmd->add_subcommand("check", "Does a text match? Exit 0 yes, 1 no (the first token refused), 2 bad grammar");
    source_flags(o.check);
    const auto text_flags = [&o](CLI::App* sub) {
        auto* t = sub->add_option("--text", o.text, "The text");
        auto* tf = sub->add_option("--text-file", o.text_file, "A file holding the text");
        t->excludes(tf);
    };
    text_flags(o.check);
    o.check->add_flag("--bytes", o.bytes_only, "Match the bytes alone, without the tokenizer's tokens");
    o.compile = cmd->add_subcommand("compile", "Compile a grammar: its size, compile time and first mask time");
    source_flags(o.compile);
    o.compile->add_flag("--print", o.print_gbnf, "Print the compiled grammar as GBNF");
    o.masks = cmd->add_subcommand("masks", "The allowed token ids before each token of a text and after the last, "
                                           "as JSON; --vocab: the vocabulary's bytes and stop ids");
    source_flags(o.masks);
    text_flags(o.masks);
    o.masks->add_flag("--no-cache", o.no_cache,
                      "The plain trie walk for every mask (default: the engine's path, a MaskCache with the masks "
                      "put together from kernel positions)");
    o.masks->add_option("--jsonl", o.jsonl, "One text per line, each a JSON string; one JSON line out per text")
        ->excludes(o.masks->get_option("--text"), o.masks->get_option("--text-file"));
    o.masks
        ->add_flag("--vocab", o.print_vocab, "Print each id's bytes (hex; empty: a special token, never allowed) "
                                             "and the stop ids instead")
        ->excludes(o.masks->get_option("--json-schema"), o.masks->get_option("--regex"),
                   o.masks->get_option("--grammar"), o.masks->get_option("--choice"));
    o.bench = cmd->add_subcommand("bench", "Mask time per token over JSON Schemas and instances "
                                           "(DIR/NAME.schema.json + DIR/NAME.instance.json), one thread");
    o.bench->add_option("--dir", o.bench_dir, "Directory of cases")->required()->check(CLI::ExistingDirectory);
    o.bench->add_option("--model", o.model, "Model directory whose tokenizer.json gives the vocabulary (default: the "
                                            "embedded glm-demo model)");
    o.bench->add_option("--json", o.json_out, "Write the figures as JSON");
    o.bench->add_flag("--no-cache", o.no_cache, "Walk the vocabulary for every mask (no masks cached by state)");
    o.bench->add_option("--max-whitespace", o.max_whitespace, "Whitespace bytes allowed at each place")
        ->capture_default_str()
        ->check(CLI::Range(0, 64));
    o.bench->add_flag("--strict", o.strict, "additionalProperties false unless a schema says otherwise");
    add_maskbench_command(cmd, o);
    return cmd;
}

int grammar_main(const GrammarOptions& o) {
    if (*o.bench) return run_bench(o);
    if (*o.masks && o.print_vocab) return run_vocab(o);
    if (*o.maskbench) return maskbench_main(o);
    if (o.json_schema_file.empty() && o.regex.empty() && o.grammar_file.empty() && o.choices.empty()) {
        std::fprintf(stderr, "megactx grammar: give one of --json-schema, --regex, --grammar, --choice\n");
        return 2;
    }
    grammar::Grammar g;
    const auto t0 = Clock::now();
    try {
        g = compile_from(o);
    } catch (const grammar::GrammarError& e) {
        std::fprintf(stderr, "megactx grammar: %s\n", e.what());
        return 2;
    }
    const double compile_ms = ms_since(t0);
    if (*o.masks) return run_masks(o, g);
    return *o.check ? run_check(o, g) : run_compile(o, g, compile_ms);
}

}  // namespace megactx
