#include "grammar_maskbench.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "engine/constraint.h"
#include "grammar/frontends.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "text_file.h"
#include "tokenizer/chat_json.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

// What one schema gave. Travels from the child process to the parent (and into --per-schema) as JSON.
struct SchemaResult {
    std::string name;
    std::string status;  // compiled, compile error, unreadable, timeout, crash
    std::string error;   // the compile error, or what went wrong
    double compile_ms = 0, ttfm_ms = 0;
    int n_valid = 0, n_valid_rejected = 0, n_invalid = 0, n_invalid_accepted = 0;
    int n_invalid_refused_at_end = 0;  // invalid instances whose every token was allowed, refused by the missing EOS
    std::vector<double> mask_us;
    std::vector<std::string> failures;  // a valid instance rejected or an invalid one accepted: which, where
};

json to_json(const SchemaResult& r) {
    json us = json::array();
    for (const double x : r.mask_us) us.push_back(std::round(x * 100) / 100);
    return {{"name", r.name},
            {"status", r.status},
            {"error", r.error},
            {"compile_ms", r.compile_ms},
            {"ttfm_ms", r.ttfm_ms},
            {"valid", r.n_valid},
            {"valid_rejected", r.n_valid_rejected},
            {"invalid", r.n_invalid},
            {"invalid_accepted", r.n_invalid_accepted},
            {"invalid_refused_at_end", r.n_invalid_refused_at_end},
            {"failures", r.failures},
            {"mask_us", us}};
}

SchemaResult from_json(const json& j) {
    SchemaResult r;
    r.name = j.at("name");
    r.status = j.at("status");
    r.error = j.at("error");
    r.compile_ms = j.at("compile_ms");
    r.ttfm_ms = j.at("ttfm_ms");
    r.n_valid = j.at("valid");
    r.n_valid_rejected = j.at("valid_rejected");
    r.n_invalid = j.at("invalid");
    r.n_invalid_accepted = j.at("invalid_accepted");
    r.n_invalid_refused_at_end = j.at("invalid_refused_at_end");
    r.failures = j.at("failures").get<std::vector<std::string>>();
    r.mask_us = j.at("mask_us").get<std::vector<double>>();
    return r;
}

// The tokenizer, the vocabulary and the limit, shared by every schema.
struct Bench {
    const Tokenizer& tok;
    const grammar::TokenVocab& vocab;
    int32_t eos;
    int timeout_ms;
    grammar::JsonSchemaOptions schema_options;
};

// The process's real-time timer: when it fires, SIGALRM ends the child (the parent counts a timeout).
void arm_timer(int ms) {
    itimerval t{};
    t.it_value.tv_sec = ms / 1000;
    t.it_value.tv_usec = (ms % 1000) * 1000;
    setitimer(ITIMER_REAL, &t, nullptr);
}

void disarm_timer() {
    itimerval t{};
    setitimer(ITIMER_REAL, &t, nullptr);
}

double timed_mask(const Bench& b, grammar::Matcher& m, grammar::TokenMask& mask, grammar::MaskCache& cache) {
    arm_timer(b.timeout_ms);
    const auto t0 = Clock::now();
    b.vocab.fill_mask(m, mask, &cache);
    const double us = us_since(t0);
    disarm_timer();
    return us;
}

std::string shown(std::string_view s, size_t max_bytes = 60) {
    std::string out;
    for (const char ch : s.substr(0, max_bytes)) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == '"' || c == '\\')
            out += fmt::format("\\x{:02x}", c);
        else
            out += ch;
    }
    return out;
}

// Walks one instance through the masks from the start state. Empty: every token and then EOS allowed; otherwise
// where it was refused.
std::string walk_instance(const Bench& b, const std::string& text, grammar::Matcher& m, grammar::MaskCache& cache,
                          std::vector<double>& mask_us) {
    m.reset();
    grammar::TokenMask mask;
    const std::vector<int32_t> ids = b.tok.encode(text, false);
    size_t offset = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        mask_us.push_back(timed_mask(b, m, mask, cache));
        const std::string& bytes = b.tok.token_bytes(ids[i]);
        const size_t from = offset > 30 ? offset - 30 : 0;
        if (!mask.allowed(ids[i]) || !m.advance(bytes))
            return fmt::format("token {} \"{}\" refused at byte {} after \"{}\"", i, shown(bytes), offset,
                               shown(text.substr(from, offset - from)));
        offset += bytes.size();
    }
    mask_us.push_back(timed_mask(b, m, mask, cache));
    return mask.allowed(b.eos) ? "" : "no end of sequence allowed after the whole instance";
}

void run_tests(const Bench& b, const json& tests, const grammar::Grammar& g, grammar::MaskCache& cache,
               SchemaResult& r) {
    grammar::Matcher m(g);
    for (size_t i = 0; i < tests.size(); ++i) {
        const bool valid = tests[i].at("valid").get<bool>();
        const std::string text = chat::py_json_dumps(tests[i].at("data"));
        const std::string refused = walk_instance(b, text, m, cache, r.mask_us);
        (valid ? r.n_valid : r.n_invalid)++;
        if (valid && !refused.empty()) {
            ++r.n_valid_rejected;
            r.failures.push_back(
                fmt::format("test {} (valid) rejected: {}; instance \"{}\"", i, refused, shown(text, 200)));
        } else if (!valid && refused.empty()) {
            ++r.n_invalid_accepted;
            r.failures.push_back(fmt::format("test {} (invalid) accepted: \"{}\"", i, shown(text, 200)));
        } else if (!valid && refused.starts_with("no end of sequence")) {
            ++r.n_invalid_refused_at_end;
        }
    }
}

// One schema file, in this process: compile (timed with its first mask), then every test instance.
SchemaResult run_schema(const Bench& b, const std::filesystem::path& file) {
    SchemaResult r;
    r.name = file.filename().string();
    json doc;
    try {
        doc = json::parse(read_text_file(file.string()));
    } catch (const std::exception& e) {
        r.status = "unreadable";
        r.error = e.what();
        return r;
    }
    const std::string schema = doc.at("schema").dump();
    grammar::Grammar g;
    arm_timer(b.timeout_ms);
    const auto t0 = Clock::now();
    try {
        g = grammar::compile_json_schema(schema, b.schema_options);
    } catch (const std::exception& e) {
        disarm_timer();
        r.status = "compile error";
        r.error = e.what();
        return r;
    }
    r.compile_ms = us_since(t0) / 1e3;
    disarm_timer();
    grammar::MaskCache cache;
    grammar::Matcher m(g);
    grammar::TokenMask mask;
    r.ttfm_ms = r.compile_ms + timed_mask(b, m, mask, cache) / 1e3;
    r.status = "compiled";
    run_tests(b, doc.contains("tests") ? doc["tests"] : json::array(), g, cache, r);
    return r;
}

// Schemas run one after another in a worker process (forked from this one, so it shares the vocabulary), which a
// compile or a mask past the limit (the worker's timer) or a crash ends alone: the schema is counted as a timeout or
// a crash and the next one starts a new worker. A worker serves many schemas, as a server process does: a process
// forked per schema paid, on every schema, the copy-on-write faults of its first writes to the memory it shares with
// its parent (compile and first mask 4-30x the same process's, BFCL_java_0: 2.5 vs 0.56 ms to compile).
class Worker {
  public:
    explicit Worker(const Bench& b) : b_(b) {}
    ~Worker() { stop(); }
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    SchemaResult run(const std::filesystem::path& file) {
        if (pid_ < 0) start();
        const std::string line = file.string() + "\n";
        std::string reply;
        if (write_all(to_, line) && read_line(reply)) return from_json(json::parse(reply));
        return died(file);
    }

  private:
    void start() {
        std::fflush(stdout);
        std::fflush(stderr);
        int down[2], up[2];
        MEGACTX_CHECK(pipe(down) == 0 && pipe(up) == 0, "maskbench: pipe failed");
        pid_ = fork();
        MEGACTX_CHECK(pid_ >= 0, "maskbench: fork failed");
        if (pid_ == 0) {
            close(down[1]);
            close(up[0]);
            serve(down[0], up[1]);
            _exit(0);
        }
        close(down[0]);
        close(up[1]);
        to_ = down[1];
        from_ = up[0];
        buffered_.clear();
    }

    // The worker: a path per line in, a result (JSON) per line out, until its input closes.
    void serve(int in, int out) const {
        std::string pending;
        char buf[4096];
        for (;;) {
            const size_t nl = pending.find('\n');
            if (nl == std::string::npos) {
                const ssize_t n = read(in, buf, sizeof buf);
                if (n <= 0) return;
                pending.append(buf, static_cast<size_t>(n));
                continue;
            }
            const std::filesystem::path file = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            std::string result;
            try {
                result = to_json(run_schema(b_, file)).dump();
            } catch (const std::exception& e) {
                SchemaResult r;
                r.name = file.filename().string();
                r.status = "crash";
                r.error = e.what();
                result = to_json(r).dump();
            }
            if (!write_all(out, result + "\n")) return;
        }
    }

    bool read_line(std::string& line) {
        char buf[65536];
        for (;;) {
            if (const size_t nl = buffered_.find('\n'); nl != std::string::npos) {
                line = buffered_.substr(0, nl);
                buffered_.erase(0, nl + 1);
                return true;
            }
            const ssize_t n = read(from_, buf, sizeof buf);
            if (n <= 0) return false;
            buffered_.append(buf, static_cast<size_t>(n));
        }
    }

    // The worker ended while on `file`: its timer (a timeout) or a crash.
    SchemaResult died(const std::filesystem::path& file) {
        int st = 0;
        close(to_);
        close(from_);
        waitpid(pid_, &st, 0);
        pid_ = -1;
        SchemaResult r;
        r.name = file.filename().string();
        const bool alarm = WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM;
        r.status = alarm ? "timeout" : "crash";
        r.error = alarm             ? fmt::format("a compile or a mask past {} ms", b_.timeout_ms)
                  : WIFSIGNALED(st) ? fmt::format("signal {}", WTERMSIG(st))
                                    : fmt::format("exit status {}", WEXITSTATUS(st));
        return r;
    }

    void stop() {
        if (pid_ < 0) return;
        close(to_);  // the worker reads the end of its input and exits
        close(from_);
        int st = 0;
        waitpid(pid_, &st, 0);
        pid_ = -1;
    }

    static bool write_all(int fd, const std::string& s) {
        size_t done = 0;
        while (done < s.size()) {
            const ssize_t n = write(fd, s.data() + done, s.size() - done);
            if (n <= 0) return false;
            done += static_cast<size_t>(n);
        }
        return true;
    }

    const Bench& b_;
    pid_t pid_ = -1;
    int to_ = -1, from_ = -1;
    std::string buffered_;
};

std::vector<std::filesystem::path> shard_files(const MaskbenchOptions& o) {
    std::vector<std::filesystem::path> all;
    for (const auto& e : std::filesystem::directory_iterator(o.data_dir))
        if (e.path().extension() == ".json") all.push_back(e.path());
    std::sort(all.begin(), all.end());
    MEGACTX_CHECK(!all.empty(), "{}: no *.json files", o.data_dir);
    std::vector<std::filesystem::path> mine;
    for (size_t i = 0; i < all.size(); ++i)
        if (static_cast<int>(i % static_cast<size_t>(o.n_shards)) == o.shard) mine.push_back(all[i]);
    if (o.limit > 0 && mine.size() > static_cast<size_t>(o.limit)) mine.resize(static_cast<size_t>(o.limit));
    return mine;
}

double percentile(std::vector<double>& sorted, double q) {
    if (sorted.empty()) return 0;
    return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size())))];
}

struct Summary {
    int n_schemas = 0, n_compiled = 0, n_compile_errors = 0, n_unreadable = 0, n_timeouts = 0, n_crashes = 0;
    int n_valid = 0, n_valid_rejected = 0, n_invalid = 0, n_invalid_accepted = 0, n_invalid_refused_at_end = 0;
    int n_schemas_valid_rejected = 0, n_schemas_invalid_accepted = 0, n_over_1s = 0;
    std::map<std::string, int> reasons;
    std::vector<double> mask_us, ttfm_ms;
    std::vector<std::string> failures, timeouts, crashes;

    void add(const SchemaResult& r) {
        ++n_schemas;
        if (r.status == "compile error") {
            ++n_compile_errors;
            ++reasons[compile_error_reason(r.error)];
        } else if (r.status == "unreadable") {
            ++n_unreadable;
        } else if (r.status == "timeout" || r.status == "crash") {
            ++(r.status == "timeout" ? n_timeouts : n_crashes);
            n_over_1s += r.status == "timeout";
            (r.status == "timeout" ? timeouts : crashes).push_back(r.name + ": " + r.error);
        } else {
            add_compiled(r);
        }
    }

    void add_compiled(const SchemaResult& r) {
        ++n_compiled;
        n_valid += r.n_valid;
        n_valid_rejected += r.n_valid_rejected;
        n_invalid += r.n_invalid;
        n_invalid_accepted += r.n_invalid_accepted;
        n_invalid_refused_at_end += r.n_invalid_refused_at_end;
        n_schemas_valid_rejected += r.n_valid_rejected > 0;
        n_schemas_invalid_accepted += r.n_invalid_accepted > 0;
        n_over_1s += r.ttfm_ms > 1000;
        ttfm_ms.push_back(r.ttfm_ms);
        mask_us.insert(mask_us.end(), r.mask_us.begin(), r.mask_us.end());
        for (const auto& f : r.failures) failures.push_back(r.name + ": " + f);
    }

    std::vector<std::pair<std::string, int>> top_reasons(size_t n) const {
        std::vector<std::pair<std::string, int>> v(reasons.begin(), reasons.end());
        std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        if (v.size() > n) v.resize(n);
        return v;
    }
};

json summary_json(Summary& s, const MaskbenchOptions& o) {
    std::sort(s.mask_us.begin(), s.mask_us.end());
    std::sort(s.ttfm_ms.begin(), s.ttfm_ms.end());
    json reasons = json::array();
    for (const auto& [why, n] : s.top_reasons(10)) reasons.push_back({{"reason", why}, {"schemas", n}});
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    return {{"version", MEGACTX_VERSION_STRING},
            {"date", date},
            {"tokenizer", o.model},
            {"threads", 1},
            {"timeout_ms", o.timeout_ms},
            {"max_whitespace", o.max_whitespace},
            {"shard", fmt::format("{}/{}", o.shard, o.n_shards)},
            {"schemas", s.n_schemas},
            {"compiled", s.n_compiled},
            {"compile_errors", s.n_compile_errors},
            {"compile_errors_top", reasons},
            {"unreadable", s.n_unreadable},
            {"timeouts", s.n_timeouts},
            {"crashes", s.n_crashes},
            {"valid_instances", s.n_valid},
            {"valid_rejected", s.n_valid_rejected},
            {"invalid_instances", s.n_invalid},
            {"invalid_accepted", s.n_invalid_accepted},
            {"invalid_refused_only_at_end", s.n_invalid_refused_at_end},
            {"schemas_with_valid_rejected", s.n_schemas_valid_rejected},
            {"schemas_with_invalid_accepted", s.n_schemas_invalid_accepted},
            {"masks", s.mask_us.size()},
            {"mask_us",
             {{"p50", percentile(s.mask_us, 0.5)},
              {"p90", percentile(s.mask_us, 0.9)},
              {"p99", percentile(s.mask_us, 0.99)},
              {"p999", percentile(s.mask_us, 0.999)},
              {"max", percentile(s.mask_us, 1.0)}}},
            {"ttfm_ms",
             {{"p50", percentile(s.ttfm_ms, 0.5)},
              {"p99", percentile(s.ttfm_ms, 0.99)},
              {"max", percentile(s.ttfm_ms, 1.0)}}},
            {"schemas_over_1s", s.n_over_1s},
            {"failures", s.failures},
            {"timeout_schemas", s.timeouts},
            {"crash_schemas", s.crashes}};
}

void print_summary(const json& j) {
    std::printf("schemas %d: compiled %d, compile errors %d, unreadable %d, timeouts %d, crashes %d\n",
                j["schemas"].get<int>(), j["compiled"].get<int>(), j["compile_errors"].get<int>(),
                j["unreadable"].get<int>(), j["timeouts"].get<int>(), j["crashes"].get<int>());
    for (const auto& r : j["compile_errors_top"])
        std::printf("  %6d  %s\n", r["schemas"].get<int>(), r["reason"].get<std::string>().c_str());
    std::printf("valid instances %d: accepted %d, rejected %d (in %d schemas)\n", j["valid_instances"].get<int>(),
                j["valid_instances"].get<int>() - j["valid_rejected"].get<int>(), j["valid_rejected"].get<int>(),
                j["schemas_with_valid_rejected"].get<int>());
    std::printf(
        "invalid instances %d: rejected %d (%d of them only by the end of sequence), accepted %d (in %d "
        "schemas)\n",
        j["invalid_instances"].get<int>(), j["invalid_instances"].get<int>() - j["invalid_accepted"].get<int>(),
        j["invalid_refused_only_at_end"].get<int>(), j["invalid_accepted"].get<int>(),
        j["schemas_with_invalid_accepted"].get<int>());
    const auto& m = j["mask_us"];
    std::printf("masks %zu: p50 %.1f us, p90 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us\n",
                j["masks"].get<size_t>(), m["p50"].get<double>(), m["p90"].get<double>(), m["p99"].get<double>(),
                m["p999"].get<double>(), m["max"].get<double>());
    const auto& t = j["ttfm_ms"];
    std::printf(
        "time to first mask (compile + first mask): p50 %.3f ms, p99 %.3f ms, max %.3f ms; schemas over 1 s "
        "(timeouts and crashes included) %d\n",
        t["p50"].get<double>(), t["p99"].get<double>(), t["max"].get<double>(), j["schemas_over_1s"].get<int>());
    for (const auto& f : j["failures"]) std::printf("FAIL %s\n", f.get<std::string>().c_str());
    for (const auto& f : j["timeout_schemas"]) std::printf("TIMEOUT %s\n", f.get<std::string>().c_str());
    for (const auto& f : j["crash_schemas"]) std::printf("CRASH %s\n", f.get<std::string>().c_str());
}

void run_files(const MaskbenchOptions& o, Summary& s) {
    const Tokenizer tok = Tokenizer::load(o.model);
    MEGACTX_CHECK(tok.eos_id() >= 0, "{}: the tokenizer has no end-of-sequence token", o.model);
    const auto vocab = make_token_vocab(tok, {tok.eos_id()});
    grammar::JsonSchemaOptions so;
    so.max_whitespace = o.max_whitespace;
    so.additional_properties_default = true;
    const Bench b{tok, *vocab, tok.eos_id(), o.timeout_ms, so};
    const auto files = shard_files(o);
    std::ofstream per_schema;
    if (!o.per_schema_out.empty()) per_schema.open(o.per_schema_out);
    const auto t0 = Clock::now();
    signal(SIGPIPE, SIG_IGN);  // a worker that died: its pipe's write fails instead of ending this process
    Worker worker(b);
    for (size_t i = 0; i < files.size(); ++i) {
        const SchemaResult r = worker.run(files[i]);
        if (per_schema.is_open()) per_schema << to_json(r).dump() << "\n" << std::flush;
        s.add(r);
        if ((i + 1) % 500 == 0 || i + 1 == files.size())
            std::fprintf(stderr, "maskbench: %zu / %zu schemas, %d compiled, %.0f s\n", i + 1, files.size(),
                         s.n_compiled, us_since(t0) / 1e6);
    }
}

void merge_files(const MaskbenchOptions& o, Summary& s) {
    for (const auto& path : o.merge_files) {
        std::ifstream in(path);
        MEGACTX_CHECK(in.good(), "{}: cannot open", path);
        for (std::string line; std::getline(in, line);)
            if (!line.empty()) s.add(from_json(json::parse(line)));
    }
}

}  // namespace

std::string compile_error_reason(const std::string& message) {
    std::string m = message;
    if (m.starts_with("json schema: ")) m = m.substr(13);
    if (const size_t at = m.rfind(" (at "); at != std::string::npos && m.ends_with(")")) m.resize(at);
    std::string out;
    for (size_t i = 0; i < m.size(); ++i) {
        if (m[i] == '"') {
            const size_t close = m.find('"', i + 1);
            out += "\"…\"";
            if (close == std::string::npos) break;
            i = close;
        } else if (std::isdigit(static_cast<unsigned char>(m[i]))) {
            out += 'N';
            while (i + 1 < m.size() && std::isdigit(static_cast<unsigned char>(m[i + 1]))) ++i;
        } else {
            out += m[i];
        }
    }
    return out.size() > 100 ? out.substr(0, 100) + "…" : out;
}

int run_maskbench(const MaskbenchOptions& o) {
    Summary s;
    if (o.merge_files.empty())
        run_files(o, s);
    else
        merge_files(o, s);
    json j = summary_json(s, o);
    print_summary(j);
    if (!o.json_out.empty()) std::ofstream(o.json_out) << j.dump(2) << "\n";
    return s.n_valid_rejected == 0 && s.n_invalid_accepted == 0 ? 0 : 1;
}

}  // namespace megactx
