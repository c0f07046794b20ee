#include "grammar_cmd.h"

#include <chrono>
#include <cstdio>
#include <fstream>
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

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    MEGACTX_CHECK(f.good(), "cannot read {}", path);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

grammar::Grammar compile_from(const GrammarOptions& o) {
    grammar::JsonSchemaOptions jo;
    jo.max_whitespace = o.max_whitespace;
    jo.additional_properties_default = !o.strict;
    if (!o.json_schema_file.empty()) return grammar::compile_json_schema(read_file(o.json_schema_file), jo);
    if (!o.grammar_file.empty()) return grammar::parse_gbnf(read_file(o.grammar_file));
    if (!o.choices.empty()) return grammar::compile_choices(o.choices);
    return grammar::compile_regex(o.regex);
}

// The vocabulary's bytes and its end-of-output token (the tokenizer's EOS).
std::shared_ptr<const grammar::TokenVocab> load_vocab(const Tokenizer& tok) {
    return make_token_vocab(tok, tok.eos_id() >= 0 ? std::vector<int32_t>{tok.eos_id()} : std::vector<int32_t>{});
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
    const std::string text = o.text_file.empty() ? o.text : read_file(o.text_file);
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

}  // namespace

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
    auto* t = o.check->add_option("--text", o.text, "The text");
    auto* tf = o.check->add_option("--text-file", o.text_file, "A file holding the text");
    t->excludes(tf);
    o.check->add_flag("--bytes", o.bytes_only, "Match the bytes alone, without the tokenizer's tokens");
    o.compile = cmd->add_subcommand("compile", "Compile a grammar: its size, compile time and first mask time");
    source_flags(o.compile);
    o.compile->add_flag("--print", o.print_gbnf, "Print the compiled grammar as GBNF");
    return cmd;
}

int grammar_main(const GrammarOptions& o) {
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
    return *o.check ? run_check(o, g) : run_compile(o, g, compile_ms);
}

}  // namespace megactx
