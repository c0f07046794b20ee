// megactx: the command-line entry point. Subcommands are thin: they parse flags and call the library.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_checks.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "engine_setup.h"
#include "eval_cmd.h"
#include "grammar_cmd.h"
#include "io/npy.h"
#include "model/cost.h"
#include "model/gen_model.h"
#include "model/gen_tokenizer.h"
#include "model/glm_dsa.h"
#include "parallel/comm_thread.h"
#include "parallel/shard_plan.h"
#include "parallel/tp_group.h"
#include "run_cmd.h"
#include "server/serve.h"
#include "text_file.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/tokenizer.h"

#ifndef MEGACTX_DEFAULT_MODEL_DIR
#define MEGACTX_DEFAULT_MODEL_DIR ""
#endif
#ifndef MEGACTX_VERSION_STRING
#define MEGACTX_VERSION_STRING "unknown"
#endif

namespace megactx {
namespace {

std::vector<int32_t> parse_token_list(const std::string& s, const char* flag = "--tokens") {
    std::vector<int32_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        MEGACTX_CHECK(a != std::string::npos, "{}: empty entry in '{}'", flag, s);
        item = item.substr(a, b - a + 1);
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        MEGACTX_CHECK(used == item.size() && v >= INT32_MIN && v <= INT32_MAX, "{}: '{}' is not an integer token id",
                      flag, item);
        out.push_back(static_cast<int32_t>(v));
    }
    return out;
}

std::vector<int32_t> read_tokens_file(const std::string& path) {
    std::ifstream in(path);
    MEGACTX_CHECK(in.good(), "{}: cannot open tokens file", path);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        MEGACTX_FAIL("{}: not valid JSON: {}", path, e.what());
    }
    if (j.is_object()) {
        MEGACTX_CHECK(j.contains("token_ids"), "{}: expected a JSON list or an object with a 'token_ids' list", path);
        j = j["token_ids"];
    }
    MEGACTX_CHECK(j.is_array(), "{}: expected a JSON list of token ids", path);
    std::vector<int32_t> out;
    for (size_t i = 0; i < j.size(); ++i) {
        MEGACTX_CHECK(j[i].is_number_integer() && j[i].get<int64_t>() >= INT32_MIN && j[i].get<int64_t>() <= INT32_MAX,
                      "{}: entry {} ({}) is not an integer token id", path, i, j[i].dump());
        out.push_back(j[i].get<int32_t>());
    }
    return out;
}

std::string model_dir_or_default(const std::string& dir) {
    if (!dir.empty()) return dir;
    const std::string d = MEGACTX_DEFAULT_MODEL_DIR;
    MEGACTX_CHECK(!d.empty() && std::filesystem::exists(d + "/config.json"),
                  "no --model given and the embedded default model is missing at '{}' (models/glm-demo in the source "
                  "tree); pass --model DIR",
                  d);
    return d;
}

std::string join(const std::vector<int32_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(v[i]);
    }
    return s;
}

std::string json_ids(const std::vector<int32_t>& ids) { return "[" + join(ids) + "]"; }

// `megactx tokenize`: one JSON array of ids, or with --jsonl one array per input line (each a JSON string).
void run_tokenize(const std::string& model, const std::string& text, const std::string& text_file,
                  const std::string& jsonl, bool no_special, size_t n_inputs) {
    MEGACTX_CHECK(n_inputs == 1, "tokenize: give exactly one of --text, --text-file, --jsonl");
    const Tokenizer tok = Tokenizer::load(model);
    if (jsonl.empty()) {
        const std::string input = text_file.empty() ? text : read_text_file(text_file);
        std::printf("%s\n", json_ids(tok.encode(input, !no_special)).c_str());
        return;
    }
    std::ifstream in(jsonl, std::ios::binary);
    MEGACTX_CHECK(in.good(), "{}: cannot open JSONL file", jsonl);
    std::string line, out;
    for (size_t n = 1; std::getline(in, line); ++n) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            MEGACTX_FAIL("{}: line {} is not valid JSON: {}", jsonl, n, e.what());
        }
        MEGACTX_CHECK(j.is_string(), "{}: line {} is not a JSON string", jsonl, n);
        out += json_ids(tok.encode(j.get_ref<const std::string&>(), !no_special));
        out += '\n';
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
}

// `megactx train-tokenizer`: byte-level BPE on the files' text, written as a GLM tokenizer directory. Every
// input is read and checked before the output directory is made.
void run_train_tokenizer(const std::vector<std::string>& files, int64_t vocab_size, const std::string& out_dir) {
    namespace fs = std::filesystem;
    const auto t0 = std::chrono::steady_clock::now();
    const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    const auto max_merges = static_cast<size_t>(glm_max_merges(vocab_size));
    BpeTrainer trainer(glm_pre_tokenizer());
    size_t n_bytes = 0;
    for (const std::string& f : files) {
        MEGACTX_CHECK(!fs::is_directory(f), "{}: is a directory, not a text file", f);
        const std::string text = read_text_file(f);
        n_bytes += text.size();
        trainer.add_text(text);
    }
    MEGACTX_CHECK(n_bytes > 0, "--text-file: no text to train on ({} empty)",
                  files.size() == 1 ? files[0] + " is" : "every file is");
    MEGACTX_CHECK(!fs::exists(out_dir) || fs::is_directory(out_dir), "--out {}: exists and is not a directory",
                  out_dir);
    fs::create_directories(out_dir);
    std::fprintf(stderr, "megactx train-tokenizer: %.1f MB of text, %lld words (%zu distinct) in %.1f s\n",
                 static_cast<double>(n_bytes) / 1e6, static_cast<long long>(trainer.n_words()),
                 trainer.n_distinct_words(), seconds());
    const nlohmann::json model = trainer.train(max_merges, [&](size_t n) {
        if (n % 500 == 0) {
            std::fprintf(stderr, "megactx train-tokenizer: %zu/%zu merges (%.1f s)\n", n, max_merges, seconds());
        }
    });
    const size_t n_merges = model["merges"].size(), n_tokens = model["vocab"].size();
    if (n_tokens < 256 + max_merges) {  // the special tokens stay at the top ids: --vocab-size holds
        const std::string why =
            n_merges < max_merges
                ? fmt::format("the text gives {} of the {} merges (then no pair occurs twice)", n_merges, max_merges)
                : std::string("some merges make a string an earlier merge made");
        std::fprintf(stderr, "megactx train-tokenizer: warning: ids %zu to %zu are unused: %s\n", n_tokens,
                     256 + max_merges - 1, why.c_str());
    }
    write_glm_tokenizer(out_dir, vocab_size, model);
    std::fprintf(stderr,
                 "megactx train-tokenizer: wrote %s: vocab size %lld (256 bytes, %zu merges, %zu special tokens) in "
                 "%.1f s\n",
                 out_dir.c_str(), static_cast<long long>(vocab_size), n_merges, glm_special_tokens().size(), seconds());
}

}  // namespace
}  // namespace megactx

int main(int argc, char** argv) {
    using namespace megactx;
    CLI::App app{"megactx: million-token contexts for DeepSeek-Sparse-Attention models"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "megactx " MEGACTX_VERSION_STRING);

    std::string model, tokens, tokens_file, out, preset = "tiny", dtype, config_path;
    int64_t chunk = 0, max_new = 16, top_k = 0, context = 1048576, shards = 0;
    float temperature = 0.0f, top_p = 1.0f;
    uint64_t seed = 0;
    bool ignore_eos = false, as_json = false;
    BackendFlags bf;                    // --device, --tensor-parallel-size, ... of logits, generate, serve
    std::string kv_memory, kv_offload;  // logits / generate
    const auto add_backend_options = [&](CLI::App* sub) {
        add_backend_flags(sub, bf);
        if (sub->get_name() == "logits" || sub->get_name() == "generate") {
            sub->add_option("--kv-cache-memory", kv_memory,
                            "Device KV tier size, e.g. 1GiB (default: what the sequence needs)");
            sub->add_option("--kv-offload-memory", kv_offload,
                            "Host KV tier size, e.g. 16GiB: latent rows beyond the device tier, fetched as selected "
                            "(default: none)");
        }
    };

    auto* logits = app.add_subcommand("logits", "Logits at every position of a token sequence → .npy [n, vocab]");
    logits->add_option("--model", model, "Model directory (default: the embedded glm-demo model)");
    auto* tok_opt = logits->add_option("--tokens", tokens, "Comma-separated token ids");
    auto* tf_opt = logits->add_option("--tokens-file", tokens_file, "JSON list, or object with 'token_ids'");
    tok_opt->excludes(tf_opt);
    logits->add_option("--out", out, "Output .npy (float32 little-endian)")->required();
    logits->add_option("--chunk", chunk, "Tokens per forward through the KV cache (0 = one pass, 1 = token by token)")
        ->capture_default_str()
        ->check(non_negative<int64_t>());
    add_backend_options(logits);

    auto* gen = app.add_subcommand("generate", "Token ids in, token ids out");
    gen->add_option("--model", model, "Model directory (default: the embedded glm-demo model)");
    auto* gtok = gen->add_option("--tokens", tokens, "Comma-separated prompt token ids");
    auto* gtf = gen->add_option("--tokens-file", tokens_file, "JSON list, or object with 'token_ids'");
    gtok->excludes(gtf);
    gen->add_option("--max-new-tokens", max_new, "Tokens to generate")
        ->capture_default_str()
        ->check(non_negative<int64_t>());
    gen->add_option("--temperature", temperature, "0 = greedy")->capture_default_str();
    gen->add_option("--top-p", top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
    gen->add_option("--top-k", top_k, "Sample among the k most likely (0 = all)")->capture_default_str();
    gen->add_option("--seed", seed, "RNG seed for sampling")->capture_default_str()->check(non_negative<uint64_t>());
    gen->add_flag("--ignore-eos", ignore_eos, "Do not stop at the config's EOS ids");
    int64_t gen_spec = 0;
    gen->add_option("--speculative-tokens", gen_spec,
                    "MTP speculative decoding: draft tokens per step, verified exactly (0 = off)")
        ->capture_default_str()
        ->check(in_range<int64_t>(0, 7));
    add_backend_options(gen);

    auto* gm = app.add_subcommand("gen-model", "Write a deterministic random model in the Hugging Face layout");
    gm->add_option("--out", out, "Output directory")->required();
    gm->add_option("--preset", preset, "tiny | small | glm52-mini | glm52-shape | dsv32-mini | dsv32-shape")
        ->capture_default_str();
    gm->add_option("--seed", seed, "Seed")->capture_default_str()->check(non_negative<uint64_t>());
    gm->add_option("--dtype", dtype, "f32 | bf16 | fp8 (default: f32 for tiny, bf16 otherwise)");
    gm->add_option("--shards", shards, "Number of safetensors shards (default 1; 4 for glm52-shape)")
        ->check(positive<int64_t>());
    int64_t gm_layers = 0;
    std::string index_pattern;
    gm->add_option("--layers", gm_layers, "Decoder layers (default: the preset's)")->check(in_range<int64_t>(1, 1024));
    int64_t gm_experts = 0, gm_experts_per_tok = 0;
    gm->add_option("--experts", gm_experts, "Routed experts (default: the preset's; GLM-5.2 has 256)")
        ->check(in_range<int64_t>(1, 4096));
    gm->add_option("--experts-per-tok", gm_experts_per_tok, "Experts per token (default: the preset's; GLM-5.2: 8)")
        ->check(in_range<int64_t>(1, 64));
    gm->add_option("--index-pattern", index_pattern,
                   "Which layers run the indexer, F/S letters repeated over the layers (F: all full; FSSS: 1 in 4)");

    std::string text, text_file, jsonl, ids_arg;
    bool no_special = false, skip_special = false;
    auto* tokz = app.add_subcommand("tokenize", "Text → token ids (JSON array) with the model's tokenizer.json");
    tokz->add_option("--model", model,
                     "Model directory holding tokenizer.json, or the file itself (default: the "
                     "embedded glm-demo model)");
    auto* text_opt = tokz->add_option("--text", text, "Text to encode");
    auto* text_file_opt = tokz->add_option("--text-file", text_file, "File whose whole contents are encoded");
    auto* jsonl_opt = tokz->add_option("--jsonl", jsonl, "One JSON string per line; prints one JSON array per line");
    tokz->add_flag("--no-special", no_special, "Like add_special_tokens=False: no BOS/EOS from the post-processor");
    auto* detok = app.add_subcommand("detokenize", "Token ids → text");
    detok->add_option("--model", model,
                      "Model directory holding tokenizer.json, or the file itself (default: the "
                      "embedded glm-demo model)");
    detok->add_option("--ids", ids_arg, "Comma-separated token ids")->required();
    detok->add_flag("--skip-special", skip_special, "Drop special added tokens");

    std::vector<std::string> train_files;
    int64_t train_vocab = 0;
    auto* train_tok = app.add_subcommand("train-tokenizer",
                                         "Learn a byte-level BPE from text files → GLM-style tokenizer.json and "
                                         "tokenizer_config.json");
    train_tok->add_option("--text-file", train_files, "Training text (repeat the flag for several files)")->required();
    const auto n_special = static_cast<int64_t>(glm_special_tokens().size());
    train_tok->add_option("--vocab-size", train_vocab, "All tokens: 256 bytes + merges + the GLM special tokens")
        ->required()
        ->check(in_range<int64_t>(256 + n_special, int64_t{1} << 20));
    train_tok->add_option("--out", out, "Output directory")->required();

    auto* cost = app.add_subcommand("cost", "Per-token FLOPs, bytes and KV memory at a context length");
    cost->add_option("--config", config_path, "config.json (or a model directory)")->required();
    cost->add_option("--context", context, "Context length L")->capture_default_str()->check(positive<int64_t>());
    cost->add_flag("--json", as_json, "Print JSON");

    ParallelOptions po;
    double gpu_memory_gib = 126.0;
    int64_t plan_context = 1048576;
    auto* plan = app.add_subcommand(
        "plan", "Sharding plan over the GPUs of a node (or of pipeline stages) and the KV it then holds");
    plan->add_option("--config", config_path, "config.json (or a model directory)")->required();
    plan->add_option("--tensor-parallel-size", po.n_gpus, "GPUs of the node")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 1024));
    plan->add_flag("--expert-parallel", po.expert_parallel, "Split the routed experts across the GPUs");
    plan->add_flag("--indexer-split", po.indexer_split, "Split the indexer by heads (default: replicated)");
    plan->add_flag("--layer-split", po.layer_split, "Each GPU keeps the KV of a contiguous group of layers");
    plan->add_option(
            "--pipeline-parallel-size,--pp", po.pp,
            "Pipeline stages of --tensor-parallel-size GPUs each (layers split across them, e.g. one per node)")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 1024));
    plan->add_option("--gpu-memory-gib", gpu_memory_gib, "Memory per GPU for weights + KV (126 = 0.9 · H200)")
        ->capture_default_str()
        ->check(positive<double>());
    plan->add_option("--context", plan_context, "Sequence length for the capacity line")
        ->capture_default_str()
        ->check(positive<int64_t>());

    ServeOptions so;
    auto* serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server (continuous batching, prefix caching)");
    serve->add_option("--model", so.model_dir, "Model directory (default: the embedded glm-demo model)");
    serve->add_option("--host", so.host, "Address to listen on")->capture_default_str();
    serve->add_option("--port", so.port, "Port (0: any free port)")->capture_default_str()->check(in_range(0, 65535));
    add_engine_flags(serve, so, bf);
    serve->add_option("--served-model-name", so.served_model_name, "Model name in the API (default: directory name)");
    serve->add_option("--api-key", so.api_key, "Require 'Authorization: Bearer KEY'");
    serve->add_option("--max-body-bytes", so.max_body_bytes, "Largest request body")
        ->capture_default_str()
        ->check(positive<int64_t>());
    add_backend_options(serve);
    bool no_access_log = false;
    serve->add_flag("--no-access-log", no_access_log, "No access line per request on stderr");
    serve->add_option("--log-interval", so.log_interval_s, "Seconds between throughput lines while busy (0: none)")
        ->capture_default_str()
        ->check(in_range(0.0, 86400.0));

    RunOptions run_opts;
    CLI::App* run = add_run_command(app, run_opts);
    EvalOptions eval_opts;
    CLI::App* eval = add_eval_command(app, eval_opts);
    GrammarOptions grammar_opts;
    CLI::App* grammar_cmd = add_grammar_command(app, grammar_opts);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    try {
        // --nnodes: every command with the backend flags checks them; a node other than 0 runs its ranks only.
        BackendFlags* node_flags = *run ? &run_opts.backend : *eval ? &eval_opts.backend : &bf;
        if (*logits || *gen || *serve || *run || *eval) {
            resolve_dist(*node_flags);
            if (is_follower_node(*node_flags)) {
                const std::string dir = *serve  ? so.model_dir
                                        : *run  ? run_opts.engine.model_dir
                                        : *eval ? eval_opts.engine.model_dir
                                                : model;
                return follower_main(model_dir_or_default(dir), *node_flags);
            }
        }
        if (*logits || *gen) {
            if (tokens.empty() && tokens_file.empty()) MEGACTX_FAIL("one of --tokens or --tokens-file is required");
            const std::vector<int32_t> ids =
                tokens_file.empty() ? parse_token_list(tokens) : read_tokens_file(tokens_file);
            const KvFormat kv_format = resolve_kv_format(bf.device, bf.kv_dtype);
            const std::optional<bool> hadamard = parse_indexer_hadamard(bf.indexer_hadamard);
            std::unique_ptr<TensorParallelGroup> group;
            std::unique_ptr<GlmDsaModel> single;
            std::unique_ptr<Ops> backend;
            if (bf.tp.n_gpus > 1 || bf.tp.pp > 1 || bf.dist.nnodes > 1) {
                group = make_group(model_dir_or_default(model), bf, 0.9);
            } else {
                single = std::make_unique<GlmDsaModel>(model_dir_or_default(model));
                single->override_indexer_hadamard(hadamard);
                backend = make_backend(bf.device, 0.9, bf.batch_invariant);
            }
            const GlmDsaModel& m = group ? group->model() : *single;
            Ops& ops = group ? group->ops() : *backend;
            const int64_t kv_bytes = kv_memory.empty() ? 0 : parse_byte_size(kv_memory, "--kv-cache-memory");
            const int64_t kv_host = kv_offload.empty() ? 0 : parse_byte_size(kv_offload, "--kv-offload-memory");
            if (*logits) {
                validate_tokens(m.config(), ids);
                SequenceRunner runner(m, ops, static_cast<int64_t>(ids.size()), kv_format, kv_bytes, kv_host);
                const std::vector<float> l = runner.feed(ids, chunk, true);
                write_npy_f32(out, {static_cast<int64_t>(ids.size()), m.config().vocab_size}, l.data());
                std::fprintf(stderr, "wrote %s [%zu, %lld]\n", out.c_str(), ids.size(),
                             static_cast<long long>(m.config().vocab_size));
            } else {
                SamplingParams sp{temperature, top_p, top_k, seed};
                sp.validate();
                validate_tokens(m.config(), ids, max_new);
                std::vector<int32_t> out_ids;
                if (gen_spec == 0) {
                    SequenceRunner runner(m, ops, static_cast<int64_t>(ids.size()) + max_new, kv_format, kv_bytes,
                                          kv_host);
                    const std::vector<int32_t> all = runner.generate(ids, max_new, sp, !ignore_eos);
                    out_ids.assign(all.begin() + static_cast<long>(ids.size()), all.end());
                } else {
                    // Speculation runs in the serving engine (one request): the drafts and their verification.
                    EngineConfig ec;
                    ec.kv_format = kv_format;
                    ec.speculative_tokens = gen_spec;
                    ec.n_kv_blocks =
                        (static_cast<int64_t>(ids.size()) + max_new + gen_spec + kBlockSize) / kBlockSize + 1;
                    if (kv_host > 0) {  // the tiers' budgets decide the blocks
                        ec.n_kv_blocks = 0;
                        ec.kv_cache_bytes = kv_bytes;
                        ec.kv_offload_bytes = kv_host;
                    } else if (kv_bytes > 0) {
                        ec.n_kv_blocks =
                            std::min(ec.n_kv_blocks, kv_bytes / (m.kv_bytes_per_token_max(kv_format) * kBlockSize));
                    }
                    ec.scheduler.max_num_seqs = 1;
                    Engine engine(m, ops, ec);
                    GenerationParams gp;
                    gp.sampling = sp;
                    gp.max_tokens = max_new;
                    gp.ignore_eos = ignore_eos;
                    SpecStats spec;
                    std::string error;
                    engine.submit(ids, gp, [&](const TokenEvent& ev) {
                        if (ev.token >= 0) out_ids.push_back(ev.token);
                        if (ev.finish == FinishReason::kError) error = ev.error;
                        spec = ev.spec;
                        return true;
                    });
                    while (engine.step()) {
                    }
                    MEGACTX_CHECK(error.empty(), "generation failed: {}", error);
                    std::fprintf(stderr, "megactx generate: %s\n", spec.summary().c_str());
                }
                std::printf("%s\n", join(out_ids).c_str());
            }
        } else if (*gm) {
            GenModelOptions o;
            o.preset = preset;
            o.seed = seed;
            o.dtype = dtype;
            o.shards = shards;
            o.layers = gm_layers;
            o.index_pattern = index_pattern;
            o.experts = gm_experts;
            o.experts_per_tok = gm_experts_per_tok;
            generate_model(out, o);
            std::fprintf(stderr, "wrote %s model to %s\n", preset.c_str(), out.c_str());
        } else if (*tokz) {
            run_tokenize(model_dir_or_default(model), text, text_file, jsonl, no_special,
                         text_opt->count() + text_file_opt->count() + jsonl_opt->count());
        } else if (*train_tok) {
            run_train_tokenizer(train_files, train_vocab, out);
        } else if (*detok) {
            const Tokenizer tok = Tokenizer::load(model_dir_or_default(model));
            const std::string out = tok.decode(parse_token_list(ids_arg, "--ids"), skip_special);
            std::fwrite(out.data(), 1, out.size(), stdout);
        } else if (*serve) {
            // OpenMP threads that spin while waiting steal the cores the HTTP threads need (docs/server.md):
            // the server runs with the passive wait policy unless the user chose one. libgomp reads it only
            // when it loads, so the process re-executes itself once with the variable set.
            if (!std::getenv("OMP_WAIT_POLICY")) {
                setenv("OMP_WAIT_POLICY", "passive", 1);
                execv("/proc/self/exe", argv);  // returns only on failure: then carry on with the default
            }
            so.model_dir = model_dir_or_default(so.model_dir);
            so.access_log = !no_access_log;
            set_engine_backend(so, bf);
            return serve_main(so);
        } else if (*run) {
            run_opts.engine.model_dir = model_dir_or_default(run_opts.engine.model_dir);
            return run_main(run_opts);
        } else if (*grammar_cmd) {
            grammar_opts.model = model_dir_or_default(grammar_opts.model);
            return grammar_main(grammar_opts);
        } else if (*eval) {
            eval_opts.engine.model_dir = model_dir_or_default(eval_opts.engine.model_dir);
            return eval_main(eval_opts);
        } else if (*cost) {
            const ModelConfig c = load_config(config_path);
            std::printf("%s", format_cost(compute_cost(c, context), as_json).c_str());
        } else if (*plan) {
            const ModelConfig c = load_config(config_path);
            const ShardPlan p = make_shard_plan(c, po);
            check_weights_fit(c, p, gpu_memory_gib * 1073741824.0);
            std::printf("%s", format_shard_plan(c, p, gpu_memory_gib * 1073741824.0, plan_context).c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "megactx: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
