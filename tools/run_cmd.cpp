#include "run_cmd.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_checks.h"
#include "core/error.h"
#include "server/output_text.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
    auto* sub =
        app.add_subcommand("run", "One prompt → the answer streamed as it is generated (--interactive: a chat)");
    sub->add_option("--model", o.engine.model_dir, "Model directory (default: the embedded glm-demo model)");
    o.prompt_opt = sub->add_option("--prompt,-p", o.prompt, "The user message (with --raw: the text to continue)");
    o.prompt_file_opt = sub->add_option("--prompt-file,-f", o.prompt_file, "Read the prompt from FILE (- = stdin)");
    o.prompt_opt->excludes(o.prompt_file_opt);
    sub->add_option("--system", o.system, "A system message before the conversation");
    sub->add_flag("--think,!--no-think", o.think,
                  "Reasoning before the answer, shown on stderr (default: on, as the server's enable_thinking)");
    sub->add_flag("--raw", o.raw, "Send the text as a plain completion, without the chat template");
    sub->add_flag("--interactive,-i", o.interactive,
                  "Chat on stdin, one message per line, with history (/clear resets it, /exit or EOF quits)");
    sub->add_option("--max-new-tokens,-n", o.max_new_tokens, "Tokens to generate at most per answer")
        ->capture_default_str()
        ->check(positive<int64_t>());
    o.temperature_opt = sub->add_option("--temperature", o.temperature,
                                        "0 = greedy (default: generation_config.json's when do_sample, else 0)")
                            ->check(in_range(0.0f, 2.0f));
    o.top_p_opt =
        sub->add_option("--top-p", o.top_p, "Nucleus sampling mass in (0, 1] (default: as --temperature, else 1)")
            ->check(in_range(1e-9f, 1.0f));
    o.top_k_opt =
        sub->add_option("--top-k", o.top_k, "Sample among the k most likely (default: as --temperature, else 0 = all)")
            ->check(non_negative<int64_t>());
    sub->add_option("--min-p", o.min_p, "Drop tokens below min_p × p(most likely)")
        ->capture_default_str()
        ->check(in_range(0.0f, 1.0f));
    o.seed_opt =
        sub->add_option("--seed", o.seed, "RNG seed for sampling (default: random)")->check(non_negative<uint64_t>());
    sub->add_flag("--ignore-eos", o.ignore_eos, "Do not stop at the model's EOS ids");
    sub->add_option("--stop", o.stop, "Stop before this text (repeatable)");
    sub->add_flag("--quiet,-q", o.quiet, "No statistics line after the answer");
    sub->add_flag("--print-prompt", o.print_prompt, "Print each rendered prompt to stderr before its answer");
    o.engine.max_num_seqs = 1;  // one conversation: the KV pool holds one sequence of --max-model-len
    add_engine_flags(sub, o.engine, o.backend);
    add_backend_flags(sub, o.backend);
    return sub;
}

namespace {

std::string read_prompt_file(const std::string& path) {
    std::ostringstream ss;
    if (path == "-") {
        ss << std::cin.rdbuf();
        return ss.str();
    }
    std::ifstream in(path, std::ios::binary);
    MEGACTX_CHECK(in.good() && !std::filesystem::is_directory(path), "{}: cannot open the prompt file", path);
    ss << in.rdbuf();
    return ss.str();
}

// The defaults of generation_config.json as transformers reads them: sampling only when do_sample is true, then
// its temperature, top_p, top_k and min_p where given; greedy without the file.
SamplingParams sampling_defaults(const std::string& model_dir) {
    SamplingParams sp;
    const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
    std::ifstream in(path);
    if (!in.good()) return sp;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        MEGACTX_FAIL("{}: not valid JSON: {}", path, e.what());
    }
    MEGACTX_CHECK(j.is_object(), "{}: expected a JSON object", path);
    if (!j.value("do_sample", false)) return sp;
    try {
        sp.temperature = j.value("temperature", 1.0f);
        sp.top_p = j.value("top_p", 1.0f);
        sp.top_k = j.value("top_k", int64_t{0});
        sp.min_p = j.value("min_p", 0.0f);
    } catch (const nlohmann::json::exception& e) {
        MEGACTX_FAIL("{}: {}", path, e.what());
    }
    return sp;
}

class Runner {
  public:
    Runner(const RunOptions& o, Engine& engine, const Tokenizer& tok, GenerationParams gen)
        : o_(o),
          engine_(engine),
          tok_(tok),
          gen_(std::move(gen)),
          decodable_(decodable_ids(tok, engine.model().config().vocab_size)),
          dim_(isatty(STDERR_FILENO) != 0) {
        chat_.enable_thinking = o.think;
        const std::string& model_type = engine.model().config().model_type;
        const auto format = chat::chat_format_for_model_type(model_type);
        MEGACTX_CHECK(format.has_value(), "model_type '{}' has no chat format", model_type);
        format_ = *format;
        if (!o.system.empty()) system_ = chat::Message{chat::Role::kSystem, o.system, std::nullopt, {}, ""};
        clear();
    }

    void clear() {
        history_.clear();
        if (system_) history_.push_back(*system_);
    }

    // One turn: the user's text (with --raw the whole prompt, encoded as /v1/completions does) → the answer on
    // stdout. The history grows by the user message and the answer only when the turn succeeds.
    void turn(const std::string& text) {
        std::vector<chat::Message> messages = history_;
        messages.push_back(chat::Message{chat::Role::kUser, text, std::nullopt, {}, ""});
        const std::string rendered =
            o_.raw ? text : chat::render_chat(format_, messages, chat::Json(), chat_);
        std::vector<int32_t> ids = o_.raw ? tok_.encode(text, true) : tok_.encode(rendered, false);
        if (o_.print_prompt) std::fprintf(stderr, "%s\n", rendered.c_str());
        MEGACTX_CHECK(!ids.empty(), "the prompt is empty");
        const int64_t limit = std::min(engine_.max_model_len(), engine_.kv_capacity_tokens());
        const auto n_prompt = static_cast<int64_t>(ids.size());
        MEGACTX_CHECK(n_prompt < limit, "the prompt is {} tokens; the maximum context length is {}{}", n_prompt, limit,
                      limit < engine_.max_model_len() ? " (the KV cache; raise --kv-cache-memory)" : "");
        GenerationParams gen = gen_;
        gen.max_tokens = std::min(gen.max_tokens, limit - n_prompt);

        chat::ParserOptions popt = chat::parser_options_for(format_, chat_, chat::Json());
        popt.start_in_reasoning = !o_.raw && chat::prompt_opens_reasoning(rendered);
        Stream st(tok_, decodable_, o_.stop, popt);
        const auto t_submit = Clock::now();
        engine_.submit(std::move(ids), gen, [this, &st](const TokenEvent& ev) {
            std::lock_guard<std::mutex> lock(st.mu);
            if (ev.token >= 0) {
                if (st.n_generated == 0) st.t_first = Clock::now();
                st.t_last = Clock::now();
                ++st.n_generated;
                bool matched = false;
                show(st, st.text.push(ev.token, &matched));
                return !matched;
            }
            show(st, st.text.finish());
            if (!o_.raw) emit(st, st.parser.finish());
            st.finish = ev.finish;
            st.error = ev.error;
            st.n_prompt = ev.n_prompt;
            st.n_cached = ev.n_cached_prompt;
            st.spec = ev.spec;
            st.done = true;
            st.cv.notify_all();
            return true;
        });
        std::unique_lock<std::mutex> lock(st.mu);
        st.cv.wait(lock, [&] { return st.done; });
        end_reasoning(st);
        if (!st.last_out.empty() && st.last_out.back() != '\n') std::fputc('\n', stdout);
        std::fflush(stdout);
        MEGACTX_CHECK(st.finish != FinishReason::kError, "generation failed: {}", st.error);
        messages.push_back(chat::Message{chat::Role::kAssistant,
                                         st.content,
                                         st.reasoning.empty() ? std::nullopt : std::optional(st.reasoning),
                                         {},
                                         ""});
        history_ = std::move(messages);
        if (!o_.quiet) {
            const auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
            const double prefill_s = st.n_generated ? secs(st.t_first - t_submit) : secs(Clock::now() - t_submit);
            const double decode_s = secs(st.t_last - st.t_first);
            std::fprintf(stderr,
                         "megactx run: prompt %lld tokens (%lld cached), generated %lld tokens, prefill %.1f tok/s, "
                         "decode %.1f tok/s\n",
                         static_cast<long long>(st.n_prompt), static_cast<long long>(st.n_cached),
                         static_cast<long long>(st.n_generated),
                         prefill_s > 0 ? static_cast<double>(st.n_prompt - st.n_cached) / prefill_s : 0.0,
                         st.n_generated > 1 && decode_s > 0 ? static_cast<double>(st.n_generated - 1) / decode_s : 0.0);
            if (st.spec.verifications > 0)
                std::fprintf(stderr, "megactx run: %s\n", st.spec.summary().c_str());
        }
    }

  private:
    using Clock = std::chrono::steady_clock;

    struct Stream {
        Stream(const Tokenizer& tok, const std::vector<bool>& decodable, const std::vector<std::string>& stops,
               chat::ParserOptions po)
            : text(tok, decodable, stops), parser(std::move(po)) {}
        std::mutex mu;
        std::condition_variable cv;
        OutputText text;
        chat::StreamingOutputParser parser;
        std::string content, reasoning;
        std::string last_out, last_err;  // the last piece written to stdout / stderr
        bool in_reasoning = false, done = false;
        FinishReason finish = FinishReason::kNone;
        std::string error;
        int64_t n_prompt = 0, n_cached = 0, n_generated = 0;
        SpecStats spec;
        Clock::time_point t_first, t_last;
    };

    void show(Stream& st, const std::string& text) {
        if (text.empty()) return;
        if (o_.raw) {
            write(stdout, text, st.last_out);
        } else {
            emit(st, st.parser.feed(text));
        }
    }

    void emit(Stream& st, const std::vector<chat::StreamDelta>& deltas) {
        for (const chat::StreamDelta& d : deltas) {
            if (d.kind == chat::StreamDelta::Kind::kReasoning) {
                if (!st.in_reasoning && dim_) std::fputs("\033[2m", stderr);
                st.in_reasoning = true;
                st.reasoning += d.text;
                write(stderr, d.text, st.last_err);
            } else if (d.kind == chat::StreamDelta::Kind::kContent) {
                end_reasoning(st);
                st.content += d.text;
                write(stdout, d.text, st.last_out);
            }
        }
    }

    // Closes the reasoning on stderr: the colour reset and a line break, so the answer starts on its own line.
    void end_reasoning(Stream& st) {
        if (!st.in_reasoning) return;
        st.in_reasoning = false;
        if (dim_) std::fputs("\033[0m", stderr);
        if (!st.last_err.empty() && st.last_err.back() != '\n') std::fputc('\n', stderr);
        std::fflush(stderr);
    }

    static void write(FILE* f, const std::string& text, std::string& last) {
        if (text.empty()) return;
        std::fwrite(text.data(), 1, text.size(), f);
        std::fflush(f);
        last = text;
    }

    const RunOptions& o_;
    Engine& engine_;
    const Tokenizer& tok_;
    GenerationParams gen_;
    std::vector<bool> decodable_;
    bool dim_;
    chat::ChatOptions chat_;
    chat::ChatFormat format_ = chat::ChatFormat::kGlm5;  // the model's, by its model_type
    std::optional<chat::Message> system_;
    std::vector<chat::Message> history_;
};

}  // namespace

int run_main(RunOptions& o) {
    const bool has_prompt = o.prompt_opt->count() > 0 || o.prompt_file_opt->count() > 0;
    MEGACTX_CHECK(has_prompt || o.interactive, "run: give --prompt TEXT, --prompt-file FILE or --interactive");
    MEGACTX_CHECK(!(o.raw && o.interactive),
                  "run: --raw sends one plain completion; it does not combine with --interactive");
    MEGACTX_CHECK(!(o.interactive && o.prompt_file == "-"),
                  "run: --interactive reads the chat from stdin, so --prompt-file cannot be '-'");
    const std::string first = o.prompt_file_opt->count() ? read_prompt_file(o.prompt_file) : o.prompt;
    MEGACTX_CHECK(!has_prompt || !first.empty(), "run: the prompt is empty");
    const std::string& dir = o.engine.model_dir;
    const Tokenizer tok = load_model_tokenizer(dir, "run");

    GenerationParams gen;
    gen.sampling = sampling_defaults(dir);
    if (o.temperature_opt->count()) gen.sampling.temperature = o.temperature;
    if (o.top_p_opt->count()) gen.sampling.top_p = o.top_p;
    if (o.top_k_opt->count()) gen.sampling.top_k = o.top_k;
    gen.sampling.min_p = o.min_p;
    gen.sampling.seed =
        o.seed_opt->count() ? o.seed : std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
    gen.sampling.validate();
    gen.max_tokens = o.max_new_tokens;
    gen.ignore_eos = o.ignore_eos;

    set_engine_backend(o.engine, o.backend);
    LoadedEngine loaded = load_engine(o.engine);
    Engine& engine = *loaded.engine;
    engine.start();
    Runner runner(o, engine, tok, gen);
    if (!o.interactive) {
        runner.turn(first);
        return 0;
    }
    const bool tty = isatty(STDIN_FILENO) != 0;
    const auto guarded = [&](const std::string& text) {
        try {
            runner.turn(text);
        } catch (const Error& e) {  // a chat goes on after a message that does not fit
            std::fprintf(stderr, "megactx: error: %s\n", e.what());
        }
    };
    if (has_prompt) guarded(first);
    for (std::string line;;) {
        if (tty) std::fputs("> ", stderr);
        if (!std::getline(std::cin, line)) break;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line == "/exit") break;
        if (line == "/clear") {
            runner.clear();
            if (tty) std::fputs("(history cleared)\n", stderr);
            continue;
        }
        if (line.empty()) continue;
        guarded(line);
    }
    if (tty) std::fputc('\n', stderr);
    return 0;
}

}  // namespace megactx
