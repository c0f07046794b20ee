#include "eval_cmd.h"

#include <cstdio>
#include <filesystem>

#include "cli_checks.h"
#include "core/error.h"
#include "eval/niah.h"
#include "eval/png.h"
#include "io/atomic_file.h"

namespace megactx {

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o) {
    auto* eval = app.add_subcommand("eval", "Evaluation tasks through the engine (niah: needle in a haystack)");
    eval->require_subcommand(1);
    auto* sub = eval->add_subcommand("niah", "Needle-in-a-haystack accuracy over a grid of lengths and depths");
    o.niah = sub;
    sub->add_option("--model", o.engine.model_dir, "Model directory (default: the embedded glm-demo model)");
    sub->add_option("--haystack", o.haystack,
                    "UTF-8 text, one paragraph per line (default: haystack.txt in the model directory)");
    sub->add_option("--lengths", o.lengths, "Prompt lengths in tokens, comma-separated; K = 1024, M = 1048576")
        ->capture_default_str();
    sub->add_option("--depths", o.depths, "Needle depths in [0, 1], comma-separated")->capture_default_str();
    sub->add_option("--samples", o.samples, "Samples per (length, depth) cell")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 100000));
    sub->add_option("--seed", o.seed, "Seed of the samples (passkeys, where the document starts)")
        ->capture_default_str()
        ->check(non_negative<uint64_t>());
    sub->add_option("--out", o.out, "Write the results as JSON");
    sub->add_option("--png", o.png, "Write the accuracy heatmap as PNG");
    sub->add_option("--write-document", o.write_document,
                    "Write the first sample's user message (the document with its needle, then the question) to "
                    "FILE, print its passkey, and exit without running the model");
    sub->add_flag("--quiet,-q", o.quiet, "No summary line on stderr");
    add_engine_flags(sub, o.engine, o.backend);
    add_backend_flags(sub, o.backend);
    return eval;
}

namespace {

void check_writable_dir(const std::string& path, const char* flag) {
    if (path.empty()) return;
    const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
    MEGACTX_CHECK(std::filesystem::is_directory(parent), "{} {}: the directory {} does not exist", flag, path,
                  parent.string());
}

int niah_main(EvalOptions& o) {
    namespace fs = std::filesystem;
    niah::Grid grid;
    grid.lengths = niah::parse_lengths(o.lengths);
    grid.depths = niah::parse_depths(o.depths);
    grid.samples = o.samples;
    grid.seed = o.seed;
    check_writable_dir(o.out, "--out");
    check_writable_dir(o.png, "--png");
    check_writable_dir(o.write_document, "--write-document");
    const std::string& dir = o.engine.model_dir;
    const Tokenizer tok = load_model_tokenizer(dir, "eval niah");
    std::string haystack = o.haystack;
    if (haystack.empty()) {
        haystack = (fs::path(dir) / "haystack.txt").string();
        MEGACTX_CHECK(fs::exists(haystack),
                      "no --haystack given and the model directory has no haystack.txt ({}); pass a UTF-8 text file "
                      "with one paragraph per line",
                      haystack);
    }
    const std::vector<std::string> paragraphs = niah::read_haystack(haystack);
    if (!o.write_document.empty()) {
        // The document `megactx run -f FILE` answers about: the grid's first cell, sample 0, as the grid builds it.
        const niah::SampleGenerator gen(tok, paragraphs);
        const niah::Sample s = gen.make(grid.lengths[0], grid.depths[0], 0, grid.seed);
        write_file_atomically(o.write_document, [&](std::ostream& os) { os << s.content; });
        std::printf("%s: %zu tokens as a prompt, the needle \"%s\" before paragraph %lld of %lld\n",
                    o.write_document.c_str(), s.tokens.size(), niah::needle_sentence(s.passkey).c_str(),
                    static_cast<long long>(s.needle_before), static_cast<long long>(s.n_paragraphs));
        return 0;
    }

    set_engine_backend(o.engine, o.backend);
    LoadedEngine loaded = load_engine(o.engine);
    loaded.engine->start();
    const niah::Report report = niah::run_grid(*loaded.engine, tok, paragraphs, grid);
    loaded.engine->stop();

    const std::string model = served_name_for(dir);
    const std::string device =
        o.backend.tp.n_gpus > 1 ? fmt::format("{} x{}", o.backend.device, o.backend.tp.n_gpus) : o.backend.device;
    std::fputs(niah::report_table(report).c_str(), stdout);
    std::fflush(stdout);
    if (!o.out.empty()) {
        const std::string text = niah::report_json(report, model, device).dump(2) + "\n";
        write_file_atomically(o.out, [&](std::ostream& os) { os << text; });
    }
    if (!o.png.empty()) {
        const std::string title = fmt::format("NEEDLE IN A HAYSTACK: {} ({:.0f}%)", model, 100.0 * report.accuracy());
        write_png(o.png, render_heatmap(niah::report_heatmap(report, title)));
    }
    if (!o.quiet) {
        const int64_t cap = niah::prompt_cap(loaded.engine->max_model_len());
        for (const int64_t length : grid.lengths) {
            if (length > cap && cap >= 1)
                std::fprintf(stderr,
                             "megactx eval niah: --lengths %lld: prompts of at most %lld tokens (the maximum context "
                             "length %lld less %lld new tokens)\n",
                             static_cast<long long>(length), static_cast<long long>(cap),
                             static_cast<long long>(loaded.engine->max_model_len()),
                             static_cast<long long>(niah::kMaxNewTokens));
        }
        std::fprintf(stderr,
                     "megactx eval niah: %zu samples, accuracy %.1f%%, prompts built in %.2f s, engine %.2f s, prefill "
                     "%.1f tok/s (%lld prompt tokens, %lld from the prefix cache)\n",
                     report.results.size(), 100.0 * report.accuracy(), report.prepare_s, report.elapsed_s,
                     report.prefill_tokens_per_s(), static_cast<long long>(report.prompt_tokens),
                     static_cast<long long>(report.cached_prompt_tokens));
        if (report.spec.verifications > 0)
            std::fprintf(stderr, "megactx eval niah: %s\n", report.spec.summary().c_str());
    }
    return 0;
}

}  // namespace

int eval_main(EvalOptions& o) {
    if (*o.niah) return niah_main(o);
    MEGACTX_FAIL("eval: name a task (niah)");
}

}  // namespace megactx
