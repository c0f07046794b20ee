#include "eval_cmd.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "core/error.h"
#include "eval/facts.h"
#include "eval/niah.h"
#include "eval/png.h"
#include "io/atomic_file.h"
#include "server/serve.h"

namespace megactx {

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o) {
    auto* eval = app.add_subcommand("eval", "Evaluation tasks through the engine (niah: needle in a haystack; facts: "
                                            "facts asked in words)");
    eval->require_subcommand(1);
    const auto grid_flags = [&o](CLI::App* sub, const char* seed_help) {
        sub->add_option("--model", o.engine.model_dir, "Model directory (default: the embedded glm-demo model)");
        sub->add_option("--haystack", o.haystack,
                        "UTF-8 text, one paragraph per line (default: haystack.txt in the model directory)");
        sub->add_option("--lengths", o.lengths, "Prompt lengths in tokens, comma-separated; K = 1024, M = 1048576")
            ->capture_default_str();
        sub->add_option("--depths", o.depths, "Depths in [0, 1] of the asked sentence, comma-separated")
            ->capture_default_str();
        sub->add_option("--samples", o.samples, "Samples per (length, depth) cell")
            ->capture_default_str()
            ->check(in_range<int64_t>(1, 100000));
        sub->add_option("--seed", o.seed, seed_help)->capture_default_str()->check(non_negative<uint64_t>());
        sub->add_option("--out", o.out, "Write the results as JSON");
        sub->add_option("--png", o.png, "Write the accuracy heatmap as PNG");
        sub->add_option("--write-document", o.write_document,
                        "Write the first sample's user message (the document, then the question) to FILE and exit "
                        "without running the model");
        sub->add_flag("--quiet,-q", o.quiet, "No summary line on stderr");
        add_engine_flags(sub, o.engine, o.backend);
        add_backend_flags(sub, o.backend);
    };
    o.niah = eval->add_subcommand("niah", "Needle-in-a-haystack accuracy over a grid of lengths and depths");
    grid_flags(o.niah, "Seed of the samples (passkeys, where the document starts)");
    o.facts = eval->add_subcommand("facts", "Facts asked in words over a grid of lengths and depths, absent facts "
                                            "to refuse");
    grid_flags(o.facts, "Seed of the samples (facts, frames, where the document starts)");
    o.facts->add_option("--absent", o.absent, "Samples per cell whose asked fact is not in the document")
        ->capture_default_str()
        ->check(in_range<int64_t>(0, 100000));
    o.facts->add_flag("--in-distribution", o.in_distribution,
                      "The training split's frames, keys and value kinds (default: the held-out ones)");
    o.facts->add_option("--write-jsonl", o.write_jsonl,
                        "Write every sample of the grid as a JSON line (prompt, content, reference answer) to FILE and "
                        "exit without running the model: training data");
    return eval;
}

namespace {

void check_writable_dir(const std::string& path, const char* flag) {
    if (path.empty()) return;
    const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
    MEGACTX_CHECK(std::filesystem::is_directory(parent), "{} {}: the directory {} does not exist", flag, path,
                  parent.string());
}

int grid_main(EvalOptions& o, bool is_facts) {
    namespace fs = std::filesystem;
    const char* name = is_facts ? "eval facts" : "eval niah";
    niah::Grid grid;
    grid.lengths = niah::parse_lengths(o.lengths);
    grid.depths = niah::parse_depths(o.depths);
    grid.samples = o.samples;
    grid.absent = is_facts ? o.absent : 0;
    grid.seed = o.seed;
    check_writable_dir(o.out, "--out");
    check_writable_dir(o.png, "--png");
    check_writable_dir(o.write_document, "--write-document");
    check_writable_dir(o.write_jsonl, "--write-jsonl");
    const std::string& dir = o.engine.model_dir;
    const Tokenizer tok = load_model_tokenizer(dir, name);
    std::string haystack = o.haystack;
    if (haystack.empty()) {
        haystack = (fs::path(dir) / "haystack.txt").string();
        MEGACTX_CHECK(fs::exists(haystack),
                      "no --haystack given and the model directory has no haystack.txt ({}); pass a UTF-8 text file "
                      "with one paragraph per line",
                      haystack);
    }
    const std::vector<std::string> paragraphs = niah::read_haystack(haystack);
    const niah::SampleGenerator passkeys(tok, paragraphs);
    const facts::FactsGenerator fact_gen(tok, paragraphs,
                                         o.in_distribution ? facts::Split::kTrain : facts::Split::kHeldOut);
    const niah::Task task = is_facts ? facts::task(fact_gen) : niah::passkey_task(passkeys);
    if (!o.write_document.empty()) {
        // The document `megactx run -f FILE` answers about: the grid's first cell, sample 0, as the grid builds it.
        const niah::Sample s = task.make(grid.lengths[0], grid.depths[0], 0, grid.seed, 0, false);
        write_file_atomically(o.write_document, [&](std::ostream& os) { os << s.content; });
        std::printf("%s: %zu tokens as a prompt, \"%s\" before paragraph %lld of %lld\n", o.write_document.c_str(),
                    s.tokens.size(), s.reference.c_str(), static_cast<long long>(s.needle_before),
                    static_cast<long long>(s.n_paragraphs));
        return 0;
    }
    if (!o.write_jsonl.empty()) {
        // Every sample of the grid (samples, then absent ones, per cell) with the answer a trained model writes.
        write_file_atomically(o.write_jsonl, [&](std::ostream& os) {
            for (const int64_t length : grid.lengths)
                for (const double depth : grid.depths)
                    for (int64_t j = 0; j < grid.samples + grid.absent; ++j) {
                        const niah::Sample s = task.make(length, depth, j, grid.seed, 0, j >= grid.samples);
                        os << nlohmann::json{{"length", length},         {"depth", depth},
                                             {"index", j},               {"absent", s.absent},
                                             {"prompt", s.prompt},       {"content", s.content},
                                             {"reference", s.reference}, {"answer", s.answer},
                                             {"prompt_tokens", s.tokens.size()}}
                                  .dump()
                           << "\n";
                    }
        });
        return 0;
    }

    set_engine_backend(o.engine, o.backend);
    LoadedEngine loaded = load_engine(o.engine);
    loaded.engine->start();
    const niah::Report report = niah::run_grid(*loaded.engine, tok, task, grid);
    loaded.engine->stop();

    const std::string model = served_name_for(dir);
    const int64_t ranks = o.backend.tp.n_gpus * o.backend.tp.pp;
    const std::string device = ranks > 1 ? fmt::format("{} x{}", o.backend.device, ranks) : o.backend.device;
    std::fputs(niah::report_table(report).c_str(), stdout);
    std::fflush(stdout);
    if (!o.out.empty()) {
        nlohmann::json j = niah::report_json(report, model, device);
        if (is_facts) j["split"] = o.in_distribution ? "train" : "held-out";
        const std::string text = j.dump(2) + "\n";
        write_file_atomically(o.out, [&](std::ostream& os) { os << text; });
    }
    if (!o.png.empty()) {
        const std::string title = fmt::format("{}: {} ({:.0f}%)", is_facts ? "FACTS" : "NEEDLE IN A HAYSTACK", model,
                                              100.0 * report.accuracy());
        write_png(o.png, render_heatmap(niah::report_heatmap(report, title)));
    }
    if (!o.quiet) {
        const int64_t cap = loaded.engine->max_model_len() - task.max_new_tokens;
        for (const int64_t length : grid.lengths) {
            if (length > cap && cap >= 1)
                std::fprintf(stderr,
                             "megactx %s: --lengths %lld: prompts of at most %lld tokens (the maximum context "
                             "length %lld less %lld new tokens)\n",
                             name, static_cast<long long>(length), static_cast<long long>(cap),
                             static_cast<long long>(loaded.engine->max_model_len()),
                             static_cast<long long>(task.max_new_tokens));
        }
        std::fprintf(stderr,
                     "megactx %s: %zu samples, accuracy %.1f%%, prompts built in %.2f s, engine %.2f s, prefill "
                     "%.1f tok/s (%lld prompt tokens, %lld from the prefix cache)\n",
                     name, report.results.size(), 100.0 * report.accuracy(), report.prepare_s, report.elapsed_s,
                     report.prefill_tokens_per_s(), static_cast<long long>(report.prompt_tokens),
                     static_cast<long long>(report.cached_prompt_tokens));
        if (report.spec.verifications > 0)
            std::fprintf(stderr, "megactx %s: %s\n", name, report.spec.summary().c_str());
    }
    return 0;
}

}  // namespace

int eval_main(EvalOptions& o) {
    if (*o.niah) return grid_main(o, false);
    if (*o.facts) return grid_main(o, true);
    MEGACTX_FAIL("eval: name a task (niah, facts)");
}

}  // namespace megactx
