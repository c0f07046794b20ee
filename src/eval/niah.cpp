#include "eval/niah.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <mutex>
#include <random>

#include "core/error.h"
#include "server/output_text.h"
#include "tokenizer/chat.h"

namespace megactx::niah {

namespace {

std::vector<std::string> split_list(const std::string& list, const std::string& flag) {
    std::vector<std::string> out;
    size_t pos = 0;
    for (;;) {
        const size_t comma = list.find(',', pos);
        std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        MEGACTX_CHECK(a != std::string::npos, "{}: empty entry in '{}'", flag, list);
        out.push_back(item.substr(a, b - a + 1));
        if (comma == std::string::npos) return out;
        pos = comma + 1;
    }
}

int64_t depth_key(double depth) { return std::llround(depth * 1000.0); }

}  // namespace

std::vector<int64_t> parse_lengths(const std::string& list, const std::string& flag) {
    std::vector<int64_t> out;
    for (const std::string& item : split_list(list, flag)) {
        size_t n_digits = 0;
        while (n_digits < item.size() && item[n_digits] >= '0' && item[n_digits] <= '9') ++n_digits;
        const std::string suffix = item.substr(n_digits);
        const int64_t mul = suffix.empty()                   ? 1
                            : suffix == "K" || suffix == "k" ? 1024
                            : suffix == "M" || suffix == "m" ? 1048576
                                                             : 0;
        MEGACTX_CHECK(n_digits > 0 && n_digits <= 9 && mul > 0,
                      "{}: '{}' is not a length in tokens (examples: 1024, 4K = 4096, 1M = 1048576)", flag, item);
        const int64_t v = std::stoll(item.substr(0, n_digits)) * mul;
        MEGACTX_CHECK(v >= 1, "{}: lengths must be at least 1, got '{}'", flag, item);
        MEGACTX_CHECK(std::find(out.begin(), out.end(), v) == out.end(), "{}: {} appears twice", flag, v);
        out.push_back(v);
    }
    return out;
}

std::vector<double> parse_depths(const std::string& list, const std::string& flag) {
    std::vector<double> out;
    for (const std::string& item : split_list(list, flag)) {
        size_t used = 0;
        double v = -1;
        try {
            v = std::stod(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        MEGACTX_CHECK(used == item.size() && v >= 0.0 && v <= 1.0, "{}: '{}' is not a depth in [0, 1]", flag, item);
        for (double d : out) {
            MEGACTX_CHECK(depth_key(d) != depth_key(v), "{}: {} and {} are the same depth to three decimals", flag,
                          depth_label(d), item);
        }
        out.push_back(v);
    }
    return out;
}

std::string length_label(int64_t length) {
    if (length >= 1048576 && length % 1048576 == 0) return fmt::format("{}M", length / 1048576);
    if (length >= 1024 && length % 1024 == 0) return fmt::format("{}K", length / 1024);
    return std::to_string(length);
}

std::string depth_label(double depth) {
    std::string s = fmt::format("{:.3f}", static_cast<double>(depth_key(depth)) / 1000.0);
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    return s;
}

std::vector<std::string> read_haystack(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    MEGACTX_CHECK(in.good(), "{}: cannot open the haystack file", path);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) out.push_back(std::move(line));
    }
    MEGACTX_CHECK(!out.empty(), "{}: the haystack file has no paragraphs (one per line)", path);
    return out;
}

uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t sample_seed(uint64_t seed, int64_t length, double depth, int64_t index) {
    uint64_t h = splitmix64(seed);
    h = splitmix64(h ^ static_cast<uint64_t>(length));
    h = splitmix64(h ^ static_cast<uint64_t>(depth_key(depth)));
    return splitmix64(h ^ static_cast<uint64_t>(index));
}

std::string render_prompt(const std::string& content) {
    chat::Message m;
    m.role = chat::Role::kUser;
    m.content = content;
    chat::ChatOptions opt;
    opt.add_generation_prompt = true;
    opt.enable_thinking = false;
    return chat::render_chat(chat::ChatFormat::kGlm5, {m}, chat::Json(), opt);
}

std::string needle_sentence(int64_t passkey) { return fmt::format("The passkey is {}.", passkey); }

SampleGenerator::SampleGenerator(const Tokenizer& tokenizer, std::vector<std::string> paragraphs)
    : tok_(tokenizer), paragraphs_(std::move(paragraphs)) {
    MEGACTX_CHECK(!paragraphs_.empty(), "the haystack has no paragraphs");
    cost_.reserve(paragraphs_.size());
    for (const std::string& p : paragraphs_) cost_.push_back(static_cast<int64_t>(tok_.encode(p + "\n", false).size()));
    frame_ = static_cast<int64_t>(tok_.encode(render_prompt(std::string(kQuestion)), false).size());
}

Sample SampleGenerator::make(int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens) const {
    MEGACTX_CHECK(depth >= 0.0 && depth <= 1.0, "depth {} is outside [0, 1]", depth);
    Sample s;
    s.length = length;
    s.depth = depth;
    s.index = index;
    std::mt19937_64 rng(sample_seed(seed, length, depth, index));
    s.passkey = kPasskeyMin + static_cast<int64_t>(rng() % static_cast<uint64_t>(kPasskeyMax - kPasskeyMin + 1));
    const auto n_haystack = static_cast<uint64_t>(paragraphs_.size());
    s.start_paragraph = static_cast<int64_t>(rng() % n_haystack);
    const std::string needle = needle_sentence(s.passkey);
    s.answer = std::to_string(s.passkey);
    s.reference = needle;

    // The estimate: the frame (the prompt around an empty document) plus each part's tokens with its "\n".
    const auto part = [&](int64_t i) {
        return static_cast<size_t>((s.start_paragraph + i) % static_cast<int64_t>(n_haystack));
    };
    const int64_t budget = max_tokens > 0 ? std::min(length, max_tokens) : length;
    int64_t total = frame_ + static_cast<int64_t>(tok_.encode(needle + "\n", false).size());
    MEGACTX_CHECK(total <= budget, "length {}: the question and the needle alone take {} tokens", budget, total);
    int64_t n = 0;
    while (total + cost_[part(n)] <= budget) total += cost_[part(n++)];

    const int64_t key = depth_key(depth);
    for (;;) {
        // The boundary k (needle before document paragraph k) whose token offset c_k is closest to depth · c_n,
        // compared exactly as |1000 · c_k - round(1000 · depth) · c_n|; a tie goes to the smaller k.
        std::vector<int64_t> c(static_cast<size_t>(n) + 1, 0);
        for (int64_t i = 0; i < n; ++i) c[static_cast<size_t>(i) + 1] = c[static_cast<size_t>(i)] + cost_[part(i)];
        const int64_t target = key * c.back();
        int64_t best = 0;
        for (int64_t k = 1; k <= n; ++k) {
            if (std::llabs(1000 * c[static_cast<size_t>(k)] - target) <
                std::llabs(1000 * c[static_cast<size_t>(best)] - target))
                best = k;
        }
        std::string doc;
        for (int64_t i = 0; i < n; ++i) {
            if (i == best) doc += needle + "\n";
            doc += paragraphs_[part(i)];
            doc += '\n';
        }
        if (best == n) doc += needle + "\n";
        s.n_paragraphs = n;
        s.needle_before = best;
        s.content = doc + std::string(kQuestion);  // every part ends in "\n", the question comes after the last
        s.prompt = render_prompt(s.content);
        s.tokens = tok_.encode(s.prompt, false);
        if (static_cast<int64_t>(s.tokens.size()) <= budget || n == 0) break;
        --n;  // merges across the joins made the prompt longer than the estimate: one paragraph fewer
    }
    MEGACTX_CHECK(static_cast<int64_t>(s.tokens.size()) <= budget,
                  "length {}: the question and the needle alone take {} tokens", budget, s.tokens.size());
    return s;
}

bool is_correct(std::string_view output, int64_t passkey) {
    const auto digit = [](char c) { return c >= '0' && c <= '9'; };
    const auto first = std::find_if(output.begin(), output.end(), digit);
    const auto last = std::find_if_not(first, output.end(), digit);
    return first != output.end() &&
           std::string_view(&*first, static_cast<size_t>(last - first)) == std::to_string(passkey);
}

double Report::accuracy() const {
    int64_t c = 0, t = 0;
    for (const Cell& x : cells) {
        c += x.correct;
        t += x.total;
    }
    return t ? static_cast<double>(c) / static_cast<double>(t) : 0.0;
}

double Report::length_accuracy(size_t i_length) const {
    int64_t c = 0, t = 0;
    for (size_t i_depth = 0; i_depth < grid.depths.size(); ++i_depth) {
        c += cell(i_length, i_depth).correct;
        t += cell(i_length, i_depth).total;
    }
    return t ? static_cast<double>(c) / static_cast<double>(t) : 0.0;
}

int64_t prompt_cap(int64_t max_model_len) { return max_model_len - kMaxNewTokens; }

double Report::prefill_tokens_per_s() const {
    return elapsed_s > 0 ? static_cast<double>(prompt_tokens - cached_prompt_tokens) / elapsed_s : 0.0;
}

Task passkey_task(const SampleGenerator& gen) {
    Task t;
    t.name = "niah";
    t.max_new_tokens = kMaxNewTokens;
    t.make = [&gen](int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens, bool absent) {
        MEGACTX_CHECK(!absent, "eval niah has no absent-fact samples");
        return gen.make(length, depth, index, seed, max_tokens);
    };
    t.correct = [](std::string_view output, const Sample& s) { return is_correct(output, s.passkey); };
    return t;
}

Report run_grid(Engine& engine, const Tokenizer& tokenizer, const std::vector<std::string>& haystack,
                const Grid& grid) {
    const SampleGenerator gen(tokenizer, haystack);
    return run_grid(engine, tokenizer, passkey_task(gen), grid);
}

Report run_grid(Engine& engine, const Tokenizer& tokenizer, const Task& task, const Grid& grid) {
    using Clock = std::chrono::steady_clock;
    MEGACTX_CHECK(!grid.lengths.empty() && !grid.depths.empty(), "the grid needs at least one length and one depth");
    MEGACTX_CHECK(grid.samples >= 1, "--samples must be at least 1, got {}", grid.samples);
    const int64_t new_tokens = task.max_new_tokens;
    const int64_t cap = engine.max_model_len() - new_tokens;
    MEGACTX_CHECK(cap >= 1,
                  "the maximum context length {} (--max-model-len) leaves no room for a prompt and {} new "
                  "tokens",
                  engine.max_model_len(), new_tokens);
    const int64_t longest = std::min(*std::max_element(grid.lengths.begin(), grid.lengths.end()), cap) + new_tokens;
    MEGACTX_CHECK(longest <= engine.kv_capacity_tokens(),
                  "--lengths: a sample takes up to {} tokens (prompt and {} new tokens), more than the KV cache holds "
                  "({} tokens; raise --kv-cache-memory)",
                  longest, new_tokens, engine.kv_capacity_tokens());

    MEGACTX_CHECK(grid.absent >= 0, "absent samples must be >= 0, got {}", grid.absent);
    Report r;
    r.task = task.name;
    r.max_new_tokens = new_tokens;
    r.grid = grid;
    const auto t_prepare = Clock::now();
    const auto n_depths = static_cast<int64_t>(grid.depths.size());
    const int64_t per_cell = grid.samples + grid.absent;
    const int64_t n_samples = static_cast<int64_t>(grid.lengths.size()) * n_depths * per_cell;
    std::vector<Sample> samples(static_cast<size_t>(n_samples));
    std::vector<std::exception_ptr> failed(samples.size());  // the first one in grid order is reported
    // Each sample encodes its whole prompt (a million tokens at 1M): in parallel, the tokenizer is thread-safe.
#pragma omp parallel for schedule(dynamic)
    for (int64_t i = 0; i < n_samples; ++i) {
        try {
            const int64_t cell = i / per_cell, index = i % per_cell;
            samples[static_cast<size_t>(i)] =
                task.make(grid.lengths[static_cast<size_t>(cell / n_depths)],
                          grid.depths[static_cast<size_t>(cell % n_depths)], index, grid.seed, cap,
                          index >= grid.samples);
        } catch (...) {
            failed[static_cast<size_t>(i)] = std::current_exception();
        }
    }
    for (const std::exception_ptr& e : failed)
        if (e) std::rethrow_exception(e);
    r.prepare_s = std::chrono::duration<double>(Clock::now() - t_prepare).count();

    struct Slot {
        std::vector<int32_t> output;
        FinishReason finish = FinishReason::kNone;
        std::string error;
        int64_t n_cached = 0;
        SpecStats spec;
    };
    std::vector<Slot> slots(samples.size());
    std::mutex mu;
    std::condition_variable cv;
    size_t n_done = 0;
    GenerationParams gp;  // greedy: SamplingParams' temperature 0
    gp.max_tokens = new_tokens;
    const auto t0 = Clock::now();
    std::vector<int64_t> ids;
    const auto wait_for = [&](size_t n) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return n_done == n; });
    };
    for (size_t i = 0; i < samples.size(); ++i) {
        const auto sink = [&, i](const TokenEvent& ev) {
            std::lock_guard<std::mutex> lock(mu);
            Slot& s = slots[i];
            if (ev.token >= 0) {
                s.output.push_back(ev.token);
                s.spec = ev.spec;  // the request's drafts so far
                return true;
            }
            s.finish = ev.finish;
            s.error = ev.error;
            s.n_cached = ev.n_cached_prompt;
            ++n_done;
            cv.notify_all();
            return true;
        };
        try {
            ids.push_back(engine.submit(samples[i].tokens, gp, sink));
        } catch (...) {  // the sinks of the requests already queued point here: end them before leaving
            for (int64_t id : ids) engine.cancel(id);
            wait_for(ids.size());
            throw;
        }
    }
    wait_for(samples.size());
    r.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();

    const std::vector<bool> decodable = decodable_ids(tokenizer, engine.model().config().vocab_size);
    r.cells.resize(samples.size() / static_cast<size_t>(per_cell));
    for (size_t i = 0; i < samples.size(); ++i) {
        const Sample& s = samples[i];
        const Slot& slot = slots[i];
        MEGACTX_CHECK(slot.finish != FinishReason::kError && slot.finish != FinishReason::kCancelled,
                      "sample {} of length {}, depth {}: generation failed: {}", s.index, s.length,
                      depth_label(s.depth), slot.error.empty() ? finish_reason_name(slot.finish) : slot.error);
        SampleResult res;
        res.length = s.length;
        res.depth = s.depth;
        res.index = s.index;
        res.passkey = s.passkey;
        res.answer = s.answer;
        res.absent = s.absent;
        res.prompt_tokens = static_cast<int64_t>(s.tokens.size());
        OutputText text(tokenizer, decodable, {});
        bool matched = false;
        for (int32_t t : slot.output) res.output += text.push(t, &matched);
        res.output += text.finish();
        res.correct = task.correct(res.output, s);
        res.spec = slot.spec;
        r.spec.add(slot.spec);
        Cell& c = r.cells[i / static_cast<size_t>(per_cell)];
        c.length = s.length;
        c.depth = s.depth;
        if (s.absent) {
            r.absent_correct += res.correct;
            r.absent_total += 1;
        } else {
            c.correct += res.correct;
            c.total += 1;
            c.prompt_tokens += res.prompt_tokens;
        }
        r.prompt_tokens += res.prompt_tokens;
        r.cached_prompt_tokens += slot.n_cached;
        r.generated_tokens += static_cast<int64_t>(slot.output.size());
        r.results.push_back(std::move(res));
    }
    return r;
}

nlohmann::json report_json(const Report& r, const std::string& model, const std::string& device) {
    using Json = nlohmann::json;
    Json cells = Json::array(), per_length = Json::array(), results = Json::array();
    for (const Cell& c : r.cells) {
        cells.push_back({{"length", c.length},
                         {"depth", c.depth},
                         {"correct", c.correct},
                         {"total", c.total},
                         {"accuracy", c.accuracy()},
                         {"mean_prompt_tokens", c.total ? static_cast<double>(c.prompt_tokens) / c.total : 0.0}});
    }
    for (size_t i = 0; i < r.grid.lengths.size(); ++i) {
        int64_t correct = 0, total = 0;
        for (size_t d = 0; d < r.grid.depths.size(); ++d) {
            correct += r.cell(i, d).correct;
            total += r.cell(i, d).total;
        }
        per_length.push_back({{"length", r.grid.lengths[i]},
                              {"correct", correct},
                              {"total", total},
                              {"accuracy", r.length_accuracy(i)}});
    }
    const bool speculative = r.spec.verifications > 0;
    for (const SampleResult& s : r.results) {
        Json j = {{"length", s.length},
                  {"depth", s.depth},
                  {"index", s.index},
                  {"prompt_tokens", s.prompt_tokens},
                  {"output", s.output},
                  {"correct", s.correct}};
        if (r.task == "niah") {
            j["passkey"] = s.passkey;
        } else {
            j["answer"] = s.answer;
            j["absent"] = s.absent;
        }
        if (speculative) j["speculative"] = {{"drafted", s.spec.drafted}, {"accepted", s.spec.accepted}};
        results.push_back(std::move(j));
    }
    const Json absent =
        r.absent_total > 0 ? Json{{"correct", r.absent_correct},
                                  {"total", r.absent_total},
                                  {"accuracy", static_cast<double>(r.absent_correct) / static_cast<double>(r.absent_total)}}
                           : Json();
    return Json{{"task", r.task},
                {"model", model},
                {"device", device},
                {"seed", r.grid.seed},
                {"samples", r.grid.samples},
                {"lengths", r.grid.lengths},
                {"depths", r.grid.depths},
                {"max_new_tokens", r.max_new_tokens},
                {"cells", cells},
                {"accuracy", r.accuracy()},
                {"per_length", per_length},
                {"absent_samples", r.grid.absent},
                {"absent", absent},
                {"elapsed_s", r.elapsed_s},
                {"prepare_s", r.prepare_s},
                {"prompt_tokens", r.prompt_tokens},
                {"cached_prompt_tokens", r.cached_prompt_tokens},
                {"generated_tokens", r.generated_tokens},
                {"prefill_tokens_per_s", r.prefill_tokens_per_s()},
                {"speculative", speculative ? spec_json(r.spec) : Json()},
                {"results", results}};
}

nlohmann::json spec_json(const SpecStats& s) {
    nlohmann::json at = nlohmann::json::array();
    for (size_t i = 0; i < s.drafted_at.size(); ++i)
        at.push_back({{"drafted", s.drafted_at[i]}, {"accepted", s.accepted_at[i]}});
    return {{"verifications", s.verifications},
            {"drafted", s.drafted},
            {"accepted", s.accepted},
            {"mean_acceptance_length", s.mean_acceptance_length()},
            {"by_position", at},
            {"acceptance_lengths", s.accept_length}};
}

std::string report_table(const Report& r) {
    const auto pct = [](double v) { return fmt::format("{:.0f}%", 100.0 * v); };
    std::vector<size_t> width;
    for (int64_t l : r.grid.lengths) width.push_back(std::max<size_t>(6, length_label(l).size() + 2));
    std::string out = fmt::format("{:<8}", "depth");
    for (size_t i = 0; i < r.grid.lengths.size(); ++i)
        out += fmt::format("{:>{}}", length_label(r.grid.lengths[i]), width[i]);
    out += '\n';
    for (size_t d = 0; d < r.grid.depths.size(); ++d) {
        out += fmt::format("{:<8}", depth_label(r.grid.depths[d]));
        for (size_t i = 0; i < r.grid.lengths.size(); ++i)
            out += fmt::format("{:>{}}", pct(r.cell(i, d).accuracy()), width[i]);
        out += '\n';
    }
    out += fmt::format("{:<8}", "all");
    for (size_t i = 0; i < r.grid.lengths.size(); ++i)
        out += fmt::format("{:>{}}", pct(r.length_accuracy(i)), width[i]);
    const int64_t n_present = static_cast<int64_t>(r.results.size()) - r.absent_total;
    out += fmt::format("\naccuracy {} ({} samples)\n", pct(r.accuracy()), n_present);
    if (r.absent_total > 0)
        out += fmt::format("absent facts refused {} ({} of {})\n",
                           pct(static_cast<double>(r.absent_correct) / static_cast<double>(r.absent_total)),
                           r.absent_correct, r.absent_total);
    return out;
}

Heatmap report_heatmap(const Report& r, const std::string& title) {
    Heatmap h;
    h.title = title;
    h.x_title = "CONTEXT LENGTH (TOKENS)";
    h.y_title = "DEPTH";
    for (int64_t l : r.grid.lengths) h.x_labels.push_back(length_label(l));
    for (double d : r.grid.depths) h.y_labels.push_back(depth_label(d));
    h.values.assign(r.grid.depths.size(), std::vector<double>(r.grid.lengths.size(), 0.0));
    for (size_t d = 0; d < r.grid.depths.size(); ++d)
        for (size_t i = 0; i < r.grid.lengths.size(); ++i) h.values[d][i] = r.cell(i, d).accuracy();
    return h;
}

}  // namespace megactx::niah
