// Bad input through the real CLI (design.md §8): each corruption of a valid tiny model, or bad request, gives one
// `megactx: error:` line naming the file, tensor or field, exit status 1 (not a crash), and no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace megactx {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::TempDir;

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

struct RunResult {
    int exit_code = -1;  // -1: killed by a signal
    std::string output;  // stdout and stderr
};

class Cli : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = dir_ / "model";
        out_ = dir_ / "out.npy";
        gen_model(model_);
    }

    void gen_model(const std::string& dir, const std::string& extra = "") {
        const RunResult r = run("gen-model --preset tiny --seed 0 --out '" + dir + "' " + extra);
        ASSERT_EQ(r.exit_code, 0) << r.output;
    }

    // `shell_prefix` runs in the same shell first (e.g. a ulimit).
    RunResult run(const std::string& args, const std::string& shell_prefix = "") {
        const std::string log = dir_ / "log.txt";
        const int status =
            std::system((shell_prefix + std::string(MEGACTX_BIN) + " " + args + " > '" + log + "' 2>&1").c_str());
        RunResult r;
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.output = test::read_text(log);
        return r;
    }

    RunResult logits(const std::string& tokens, const std::string& extra = "") {
        return run("logits --model '" + model_ + "' --tokens=" + tokens + " --out '" + out_ + "' " + extra);
    }

    // One error line, exit status 1, every part named, and no output file (finished or partial).
    void expect_error(const RunResult& r, std::initializer_list<std::string> parts) {
        EXPECT_EQ(r.exit_code, 1) << r.output;
        const size_t first = r.output.find("megactx: error: ");
        EXPECT_NE(first, std::string::npos) << r.output;
        EXPECT_EQ(r.output.find("megactx: error: ", first + 1), std::string::npos)
            << "more than one error: " << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        test::expect_contains(r.output, parts);
        EXPECT_FALSE(fs::exists(out_)) << out_;
        EXPECT_FALSE(fs::exists(out_ + ".tmp")) << out_ << ".tmp";
    }

    void edit_config(const std::function<void(json&)>& edit) {
        const std::string path = model_ + "/config.json";
        json j = json::parse(test::read_text(path));
        edit(j);
        test::write_text(path, j.dump(2));
    }

    // Rewrites the JSON header of a safetensors file, keeping its data section byte for byte.
    static void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
        const auto bytes = test::read_bytes(path);
        uint64_t n = 0;
        std::memcpy(&n, bytes.data(), 8);
        json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
        edit(header);
        const std::vector<uint8_t> data(bytes.begin() + 8 + static_cast<long>(n), bytes.end());
        test::write_bytes(path, test::safetensors_image(header.dump(), data));
    }

    // Rewrites `path` without tensor `name`, through the library's reader and writer.
    static void remove_tensor(const std::string& path, const std::string& name) {
        std::vector<TensorToWrite> keep;
        {
            SafetensorsFile f(path);
            ASSERT_EQ(f.tensors().count(name), 1u) << name;
            for (const auto& [n, t] : f.tensors()) {
                if (n != name) keep.push_back({n, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
            }
        }
        write_safetensors(path, keep);
    }

    std::string weights() const { return model_ + "/model.safetensors"; }

    TempDir dir_;
    std::string model_, out_;
};

TEST_F(Cli, ValidModelWritesLogits) {
    const RunResult r = logits("0,255,511");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(fs::exists(out_));
    EXPECT_FALSE(fs::exists(out_ + ".tmp"));
    const NpyArray a = read_npy_f32(out_);
    ASSERT_EQ(a.shape, (std::vector<int64_t>{3, 512}));
    float lo = a.data[0], hi = a.data[0];
    for (float v : a.data) {
        ASSERT_TRUE(std::isfinite(v));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    EXPECT_GT(hi - lo, 1e-3f);  // real logits, not a zero-filled buffer
}

// Without a usable GPU (a CPU build, or no device here) `--device cuda` is one clear error; the CPU stores f32 KV.
TEST_F(Cli, DeviceAndKvDtypeErrors) {
    const RunResult cuda = logits("1,2,3", "--device cuda");
    if (cuda.exit_code != 0) expect_error(cuda, {"--device cuda"});  // exit 0: a CUDA build on a GPU machine
    fs::remove(out_);
    expect_error(logits("1,2,3", "--kv-cache-dtype fp8"), {"--kv-cache-dtype fp8", "f32 only"});
    expect_error(logits("1,2,3", "--kv-cache-dtype f16"), {"--kv-cache-dtype", "'f16'"});
    const RunResult r = logits("1,2,3", "--device cpu --kv-cache-dtype f32");
    EXPECT_EQ(r.exit_code, 0) << r.output;
}

// --indexer-hadamard auto|on|off: a bad value is one error naming the values; on the CPU's f32 indexer cache the
// rotation does not apply (it precedes FP8 quantisation only), so on gives the logits of off bit for bit.
TEST_F(Cli, IndexerHadamardValues) {
    expect_error(logits("1,2,3", "--indexer-hadamard yes"), {"--indexer-hadamard 'yes'", "expected auto, on or off"});
    ASSERT_EQ(logits("1,2,3", "--indexer-hadamard off").exit_code, 0);
    const NpyArray off = read_npy_f32(out_);
    const RunResult on = logits("1,2,3", "--indexer-hadamard on");
    ASSERT_EQ(on.exit_code, 0) << on.output;
    EXPECT_EQ(read_npy_f32(out_).data, off.data);
}

TEST_F(Cli, PlanPrintsShardsOrNamesTheDimension) {
    const RunResult ok = run("plan --config '" + model_ + "' --tensor-parallel-size 2 --expert-parallel --layer-split");
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_NE(ok.output.find("with LayerSplit:"), std::string::npos) << ok.output;
    EXPECT_NE(ok.output.find("without LayerSplit:"), std::string::npos) << ok.output;
    const RunResult bad = run("plan --config '" + model_ + "' --tensor-parallel-size 3");
    EXPECT_EQ(bad.exit_code, 1) << bad.output;
    EXPECT_NE(bad.output.find("num_attention_heads = 4 does not divide by 3 GPUs"), std::string::npos) << bad.output;
}

// Weights larger than --gpu-memory-gib: one error line saying by how much and what fits, not "0.0 GiB left for KV".
TEST_F(Cli, PlanFailsWhenTheWeightsDoNotFit) {
    const RunResult tight = run("plan --config '" + model_ + "' --gpu-memory-gib 0.001");  // tiny: 1.3 MiB
    expect_error(tight, {"the weights do not fit: 0.0013 GiB per GPU at --tensor-parallel-size 1",
                         "0.00025 GiB more than --gpu-memory-gib 0.001",
                         "what fits: --tensor-parallel-size 2 (0.00074 GiB of weights per GPU)",
                         "or --gpu-memory-gib 0.0013 or more for the weights alone"});
    EXPECT_EQ(tight.output.find("left for KV"), std::string::npos) << tight.output;
    const RunResult none = run("plan --config '" + model_ + "' --tensor-parallel-size 4 --gpu-memory-gib 0.0001");
    expect_error(none, {"the weights do not fit", "no power-of-two --tensor-parallel-size up to 1024"});
    const RunResult fits = run("plan --config '" + model_ + "' --tensor-parallel-size 2 --gpu-memory-gib 0.001");
    EXPECT_EQ(fits.exit_code, 0) << fits.output;
}

TEST_F(Cli, TensorParallelGivesTheOneDeviceResult) {
    ASSERT_EQ(logits("3,1,4,1,5,9,2,6").exit_code, 0);
    const NpyArray single = read_npy_f32(out_);
    fs::remove(out_);
    const RunResult tp = logits("3,1,4,1,5,9,2,6", "--tensor-parallel-size 2 --expert-parallel --chunk 3");
    ASSERT_EQ(tp.exit_code, 0) << tp.output;
    const NpyArray sharded = read_npy_f32(out_);
    ASSERT_EQ(sharded.shape, single.shape);
    for (size_t i = 0; i < single.data.size(); ++i) ASSERT_NEAR(sharded.data[i], single.data[i], 1e-4) << i;
    fs::remove(out_);
    const std::string gen = "generate --model '" + model_ + "' --tokens 1,2,3,4,5 --max-new-tokens 8";
    const RunResult g1 = run(gen), g2 = run(gen + " --tp 4"), g3 = run(gen + " --tp 2 --expert-parallel --layer-split"),
                    g4 = run(gen + " --tp 2 --indexer-split");
    ASSERT_EQ(g1.exit_code, 0) << g1.output;
    EXPECT_EQ(g2.output, g1.output);
    EXPECT_EQ(g3.output, g1.output);
    EXPECT_EQ(g4.output, g1.output);
    expect_error(logits("1,2,3", "--tensor-parallel-size 3"), {"num_attention_heads = 4 does not divide by 3 GPUs"});
    expect_error(logits("1,2,3", "--tp 2 --tp-transport nccl"), {"--tp-transport nccl needs --device cuda"});
}

TEST_F(Cli, ValidShardedModelGivesTheSameLogits) {
    ASSERT_EQ(logits("3,1,4,1,5").exit_code, 0);
    const NpyArray single = read_npy_f32(out_);
    fs::remove(out_);
    model_ = dir_ / "sharded";
    gen_model(model_, "--shards 2");
    ASSERT_TRUE(fs::exists(model_ + "/" + kShard2));
    const RunResult r = logits("3,1,4,1,5");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const NpyArray sharded = read_npy_f32(out_);
    EXPECT_EQ(sharded.shape, single.shape);
    EXPECT_EQ(sharded.data, single.data);
}

// --- flags ----------------------------------------------------------------------------------------------

// `megactx --version`: the project version and the git commit CMake saw at configure time (or "unknown").
TEST_F(Cli, VersionNamesTheReleaseAndCommit) {
    const RunResult r = run("--version");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "megactx " MEGACTX_VERSION_STRING "\n");
    const std::regex form(R"(megactx \d+\.\d+\.\d+ \(commit ([0-9a-f]{4,40}|unknown)\)\n)");
    EXPECT_TRUE(std::regex_match(r.output, form)) << r.output;
}

// Like logits, generate and serve, tokenize and detokenize use the embedded default model (models/glm-demo)
// without --model.
TEST_F(Cli, TokenizeAndDetokenizeDefaultToTheEmbeddedModel) {
    const std::string embedded = MEGACTX_DEFAULT_MODEL_DIR;
    const RunResult ids = run("tokenize --text 'Hello, world'");
    ASSERT_EQ(ids.exit_code, 0) << ids.output;
    EXPECT_EQ(ids.output, run("tokenize --model '" + embedded + "' --text 'Hello, world'").output);
    EXPECT_NE(ids.output, run("tokenize --model '" + model_ + "' --text 'Hello, world'").output);
    const std::string list = ids.output.substr(1, ids.output.find(']') - 1);  // "[1,2,3]\n" -> "1,2,3"
    ASSERT_FALSE(list.empty()) << ids.output;
    const RunResult text = run("detokenize --skip-special --ids " + list);
    ASSERT_EQ(text.exit_code, 0) << text.output;
    EXPECT_EQ(text.output, "Hello, world");
    EXPECT_EQ(text.output, run("detokenize --skip-special --model '" + embedded + "' --ids " + list).output);
}

// Every option that has a default shows it in --help (CLI11 prints "--max-new-tokens INT:NONNEGATIVE=16"), or its
// description says what the default is when it depends on something else ("default: the preset's").
TEST_F(Cli, HelpShowsEveryDefault) {
    const std::set<std::string> no_default = {"--tokens", "--tokens-file", "--out",    "--text",          "--text-file",
                                              "--jsonl",  "--ids",         "--config", "--index-pattern", "--api-key"};
    for (const char* sub : {"logits", "generate", "gen-model", "cost", "plan", "serve", "tokenize", "detokenize"}) {
        const RunResult r = run(std::string(sub) + " --help");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        // One entry per option: its line, and the description on the next when the option part is long.
        std::vector<std::string> entries;
        std::istringstream lines(r.output);
        for (std::string line; std::getline(lines, line);) {
            if (line.rfind("  -", 0) == 0) {
                entries.push_back(line);
            } else if (!entries.empty() && line.rfind("      ", 0) == 0) {
                entries.back() += line;
            }
        }
        int n_checked = 0;
        for (const std::string& e : entries) {
            const std::string head = e.substr(2, e.find("  ", 2) - 2);  // "--seed UINT:NONNEGATIVE=0"
            const std::smatch m = [&] {
                std::smatch x;
                std::regex_search(head, x, std::regex(R"(^(--[\w-]+)\S* (TEXT|INT|UINT|FLOAT))"));
                return x;
            }();
            if (m.empty() || no_default.count(m[1])) continue;  // a flag, or an option without a default
            ++n_checked;
            EXPECT_TRUE(head.find('=') != std::string::npos || e.find("(default") != std::string::npos)
                << sub << ": " << e;
        }
        EXPECT_GT(n_checked, 0) << sub;
    }
    const RunResult gen = run("generate --help");
    test::expect_contains(gen.output, {"--max-new-tokens INT:NONNEGATIVE=16", "--temperature FLOAT=0",
                                       "--top-p FLOAT=1", "--top-k INT=0", "--seed UINT:NONNEGATIVE=0"});
    test::expect_contains(run("plan --help").output,
                          {"--gpu-memory-gib FLOAT:POSITIVE=126", "--context INT:POSITIVE=1048576"});
    test::expect_contains(run("gen-model --help").output, {"--preset TEXT=tiny"});
}

// A numeric flag out of range: CLI11's usage error (exit 105, ValidationError) with one short line naming the flag
// and its bounds in plain numbers (CLI11's own Range printed DBL_MAX in full, 300 digits).
TEST_F(Cli, NumericFlagRangeErrorsAreShort) {
    const std::string gen = "generate --model '" + model_ + "' --tokens 1,2 ";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {gen + "--max-new-tokens -5", "--max-new-tokens: must be >= 0, got -5"},
        {gen + "--max-new-tokens 2.5", "--max-new-tokens: must be an integer >= 0, got 2.5"},
        {gen + "--tp 65", "--tensor-parallel-size: must be between 1 and 64, got 65"},
        {"logits --tokens 1 --out '" + out_ + "' --chunk -1", "--chunk: must be >= 0, got -1"},
        {"gen-model --out '" + dir_ / "m" + "' --layers 0", "--layers: must be between 1 and 1024, got 0"},
        {"gen-model --out '" + dir_ / "m" + "' --experts 5000", "--experts: must be between 1 and 4096, got 5000"},
        {"gen-model --out '" + dir_ / "m" + "' --experts-per-tok 0",
         "--experts-per-tok: must be between 1 and 64, got 0"},
        {"cost --config '" + model_ + "' --context 0", "--context: must be >= 1, got 0"},
        {"plan --config '" + model_ + "' --tensor-parallel-size 0",
         "--tensor-parallel-size: must be between 1 and 1024, got 0"},
        {"plan --config '" + model_ + "' --gpu-memory-gib 0", "--gpu-memory-gib: must be > 0, got 0"},
        {"plan --config '" + model_ + "' --gpu-memory-gib nan", "--gpu-memory-gib: must be a number > 0, got nan"},
        {"plan --config '" + model_ + "' --gpu-memory-gib inf", "--gpu-memory-gib: must be a number > 0, got inf"},
        {"plan --config '" + model_ + "' --context -3", "--context: must be >= 1, got -3"},
        {"serve --port 70000", "--port: must be between 0 and 65535, got 70000"},
        {"serve --max-model-len 0", "--max-model-len: must be between 1 and 1048576, got 0"},
        {"serve --max-num-seqs 5000", "--max-num-seqs: must be between 1 and 4096, got 5000"},
        {"serve --max-num-batched-tokens 0", "--max-num-batched-tokens: must be between 1 and 1048576, got 0"},
        {"serve --gpu-memory-utilization 1.5", "--gpu-memory-utilization: must be between 0.01 and 1, got 1.5"},
    };
    for (const auto& [args, message] : cases) {
        const RunResult r = run(args);
        EXPECT_EQ(r.exit_code, 105) << args << "\n" << r.output;
        EXPECT_EQ(r.output.substr(0, r.output.find('\n')), message) << args;
        EXPECT_LT(r.output.size(), 200u) << args << "\n" << r.output;
    }
    EXPECT_FALSE(fs::exists(out_));
    EXPECT_FALSE(fs::exists(dir_ / "m"));
}

// The seed is a uint64_t: CLI11 read "-1" through strtoull, as 2^64 - 1. A negative seed is an error; the
// largest one still works.
TEST_F(Cli, NegativeSeedIsRejected) {
    const std::string gen = "generate --model '" + model_ + "' --tokens 1,2 --max-new-tokens 2 --temperature 1 ";
    for (const std::string& args : {gen + "--seed -1", "gen-model --out '" + dir_ / "m" + "' --seed -1"}) {
        const RunResult r = run(args);
        EXPECT_EQ(r.exit_code, 105) << args << "\n" << r.output;
        EXPECT_EQ(r.output.substr(0, r.output.find('\n')), "--seed: must be >= 0, got -1") << args;
    }
    EXPECT_FALSE(fs::exists(dir_ / "m"));
    const RunResult top = run(gen + "--seed 18446744073709551615");
    EXPECT_EQ(top.exit_code, 0) << top.output;
    const RunResult over = run(gen + "--seed 18446744073709551616");
    EXPECT_EQ(over.output.substr(0, over.output.find('\n')),
              "--seed: must be >= 0 and at most 18446744073709551615, got 18446744073709551616");
}

// gen-model into a directory that holds an earlier model replaces the files gen-model writes (a 4-shard model's
// index and shards would otherwise be loaded in place of the new 1-shard model) and leaves every other file alone.
TEST_F(Cli, GenModelReplacesAnEarlierModel) {
    ASSERT_EQ(logits("3,1,4,1,5").exit_code, 0);
    const NpyArray want = read_npy_f32(out_);
    fs::remove(out_);
    const std::string dir = dir_ / "reused";
    const RunResult first = run("gen-model --preset tiny --seed 1 --shards 4 --out '" + dir + "'");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    ASSERT_TRUE(fs::exists(dir + "/model-00004-of-00004.safetensors"));
    test::write_text(dir + "/notes.txt", "mine");
    test::write_text(dir + "/model-00001-of-00004.safetensors.bak", "mine");
    fs::create_directories(dir + "/old");
    test::write_text(dir + "/old/model-00001-of-00004.safetensors", "mine");
    test::write_text(dir + "/old/config.json", "mine");

    gen_model(dir);  // seed 0, one file
    for (const char* stale :
         {"model.safetensors.index.json", "model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors"}) {
        EXPECT_FALSE(fs::exists(dir + "/" + stale)) << stale;
    }
    for (const char* kept : {"notes.txt", "model-00001-of-00004.safetensors.bak", "old/config.json",
                             "old/model-00001-of-00004.safetensors"}) {
        EXPECT_EQ(test::read_text(dir + "/" + kept), "mine") << kept;
    }
    model_ = dir;
    const RunResult r = logits("3,1,4,1,5");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_npy_f32(out_).data, want.data);  // the seed-0 model, not the seed-1 shards
    fs::remove(out_);

    gen_model(dir, "--shards 2");
    EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
    EXPECT_TRUE(fs::exists(dir + "/" + kShard2));
    ASSERT_EQ(logits("3,1,4,1,5").exit_code, 0);
    EXPECT_EQ(read_npy_f32(out_).data, want.data);
}

TEST_F(Cli, GenModelRejectsShardCountsBelowOne) {
    for (const char* n : {"0", "-2"}) {
        const RunResult r = run("gen-model --out '" + dir_ / "m" + "' --shards " + n);
        EXPECT_EQ(r.exit_code, 105) << r.output;
        EXPECT_EQ(r.output.substr(0, r.output.find('\n')), std::string("--shards: must be >= 1, got ") + n);
    }
    EXPECT_FALSE(fs::exists(dir_ / "m"));
}

// --- train-tokenizer ---------------------------------------------------------------------------------------

// A tokenizer trained on two files has exactly --vocab-size ids (256 bytes, the merges, the GLM specials on
// top), loads in megactx, round-trips text, keeps each special token whole, and is laid out like gen-model's.
TEST_F(Cli, TrainTokenizerWritesAGlmTokenizerThatRoundTrips) {
    std::string prose, code;
    for (int i = 0; i < 40; ++i) {
        prose += "The quick brown fox jumps over the lazy dog " + std::to_string(i * 37) + " times.\n";
        prose += "A tokenizer learns merges from the pairs of symbols that occur most often in its text.\n";
        code += "for (int i = 0; i < n; ++i) { total += values[i] * " + std::to_string(i) + "; }\n";
    }
    test::write_text(dir_ / "prose.txt", prose + "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e\n");
    test::write_text(dir_ / "code.txt", code);
    const std::string tok = dir_ / "tok";
    const RunResult r = run("train-tokenizer --text-file '" + dir_ / "prose.txt" + "' --text-file '" +
                            dir_ / "code.txt" + "' --vocab-size 400 --out '" + tok + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    test::expect_contains(r.output, {"wrote " + tok + ": vocab size 400 (256 bytes, 112 merges, 32 special tokens)"});
    EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;

    const json t = json::parse(test::read_text(tok + "/tokenizer.json"));
    EXPECT_EQ(t["model"]["merges"].size(), 400u - 256 - 32);
    ASSERT_EQ(t["added_tokens"].size(), 32u);
    for (size_t i = 0; i < 32; ++i) EXPECT_EQ(t["added_tokens"][i]["id"], 368 + i);
    // gen-model's layout: the same pre-tokenizer, decoder, post-processor, special tokens and config.
    const json g = json::parse(test::read_text(model_ + "/tokenizer.json"));
    for (const char* key : {"pre_tokenizer", "decoder", "post_processor", "normalizer"}) {
        EXPECT_EQ(t[key], g[key]) << key;
    }
    for (size_t i = 0; i < 32; ++i) {
        json a = t["added_tokens"][i], b = g["added_tokens"][i];
        a.erase("id");
        b.erase("id");
        EXPECT_EQ(a, b);
    }
    EXPECT_EQ(test::read_text(tok + "/tokenizer_config.json"), test::read_text(model_ + "/tokenizer_config.json"));

    const std::string text = "The lazy fox learns 1110 merges: total += values[i];";
    const RunResult ids = run("tokenize --model '" + tok + "' --no-special --text '" + text + "'");
    ASSERT_EQ(ids.exit_code, 0) << ids.output;
    const json id_list = json::parse(ids.output);
    EXPECT_LT(id_list.size(), text.size() / 2) << ids.output;  // the merges apply
    for (const auto& id : id_list) EXPECT_LT(id.get<int>(), 368);
    const std::string list = ids.output.substr(1, ids.output.find(']') - 1);
    EXPECT_EQ(run("detokenize --model '" + tok + "' --ids " + list).output, text);

    const RunResult specials = run("tokenize --model '" + tok + "' --text '[gMASK]<sop><|user|>\nhi<think></think>'");
    const RunResult plain = run("tokenize --model '" + tok + "' --text '\nhi'");
    ASSERT_EQ(specials.exit_code, 0) << specials.output;
    json want = json::array({370, 372, 375});  // the specials' ids: 368 + their index in the GLM list
    for (const auto& id : json::parse(plain.output)) want.push_back(id);
    want.push_back(390);
    want.push_back(391);
    EXPECT_EQ(json::parse(specials.output), want) << specials.output;
    // The vocabulary is exactly 400 ids: 399 decodes, 400 does not.
    EXPECT_EQ(run("detokenize --model '" + tok + "' --ids 399").output, "</tool_response>");
    test::expect_contains(run("detokenize --model '" + tok + "' --ids 400").output,
                          {"token id 400 is not in the vocabulary (size 400)"});
}

// Text that runs out of pairs before the vocabulary is full: a warning, and the specials still at the top.
TEST_F(Cli, TrainTokenizerOnTooLittleTextWarnsAndKeepsTheSize) {
    test::write_text(dir_ / "small.txt", "hello hello hello");
    const std::string tok = dir_ / "tok";
    const RunResult r =
        run("train-tokenizer --text-file '" + dir_ / "small.txt" + "' --vocab-size 1000 --out '" + tok + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    test::expect_contains(
        r.output, {"warning: ids 261 to 967 are unused: the text gives 5 of the 712 merges (then no pair occurs twice)",
                   "vocab size 1000 (256 bytes, 5 merges"});
    EXPECT_EQ(run("tokenize --model '" + tok + "' --text hello").output, "[259]\n");  // el ell ello hello Ġhello
    EXPECT_EQ(run("detokenize --model '" + tok + "' --ids 999,968").output, "</tool_response><|endoftext|>");
}

TEST_F(Cli, TrainTokenizerBadInput) {
    const std::string tok = dir_ / "tok";
    test::write_text(dir_ / "empty.txt", "");
    test::write_text(dir_ / "text.txt", "some text");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--text-file '" + dir_ / "text.txt" + "' --text-file '" + dir_ / "missing.txt" + "'",
         dir_ / "missing.txt" + ": cannot open text file"},
        {"--text-file '" + dir_ / "empty.txt" + "'",
         "--text-file: no text to train on (" + dir_ / "empty.txt" + " is empty)"},
        {"--text-file '" + dir_.path().string() + "'", dir_.path().string() + ": is a directory, not a text file"},
    };
    for (const auto& [args, message] : cases) {
        expect_error(run("train-tokenizer " + args + " --vocab-size 300 --out '" + tok + "'"), {message});
        EXPECT_FALSE(fs::exists(tok)) << args;
    }
    test::write_text(tok, "a file");
    expect_error(run("train-tokenizer --text-file '" + dir_ / "text.txt" + "' --vocab-size 300 --out '" + tok + "'"),
                 {"--out " + tok + ": exists and is not a directory"});
    fs::remove(tok);
    // Below 256 bytes + 32 specials: a usage error like every numeric flag out of range.
    const RunResult small =
        run("train-tokenizer --text-file '" + dir_ / "text.txt" + "' --vocab-size 287 --out '" + tok + "'");
    EXPECT_EQ(small.exit_code, 105) << small.output;
    EXPECT_EQ(small.output.substr(0, small.output.find('\n')),
              "--vocab-size: must be between 288 and 1048576, got 287");
    EXPECT_FALSE(fs::exists(tok));
    test::expect_contains(run("train-tokenizer --help").output, {"--vocab-size INT:[288, 1048576] REQUIRED"});
}

// --- config.json -------------------------------------------------------------------------------------------

TEST_F(Cli, MissingConfigJson) {
    fs::remove(model_ + "/config.json");
    expect_error(logits("1,2,3"), {model_ + "/config.json", "missing config.json"});
}

TEST_F(Cli, MalformedConfigJson) {
    test::write_text(model_ + "/config.json", "{\"model_type\": \"glm_moe_dsa\", \"vocab_size\": 512,");
    expect_error(logits("1,2,3"), {"config.json", "not valid JSON"});
}

TEST_F(Cli, ConfigMissingField) {
    edit_config([](json& j) { j.erase("hidden_size"); });
    expect_error(logits("1,2,3"), {"config.json", "missing field 'hidden_size'"});
}

TEST_F(Cli, ConfigFieldOfWrongType) {
    edit_config([](json& j) { j["num_attention_heads"] = "4"; });
    expect_error(logits("1,2,3"), {"config.json", "field 'num_attention_heads' must be an integer"});
}

TEST_F(Cli, UnsupportedModelType) {
    edit_config([](json& j) { j["model_type"] = "llama"; });
    expect_error(logits("1,2,3"), {"config.json", "model_type 'llama' is not supported"});
}

TEST_F(Cli, InvalidIndexerTypesValue) {
    edit_config([](json& j) { j["indexer_types"] = {"full", "full", "full", "shared", "sparse", "shared"}; });
    expect_error(logits("1,2,3"), {"config.json", "invalid indexer pattern", "indexer_types[4] = \"sparse\""});
}

TEST_F(Cli, InvalidIndexerTypesLength) {
    edit_config([](json& j) { j["indexer_types"] = {"full", "full", "full", "shared"}; });
    expect_error(logits("1,2,3"), {"config.json", "invalid indexer pattern", "'indexer_types' must be a list of 6"});
}

TEST_F(Cli, InvalidIndexerTypesLayer0Shared) {
    edit_config([](json& j) { j["indexer_types"] = {"shared", "full", "full", "shared", "shared", "shared"}; });
    expect_error(logits("1,2,3"), {"config.json", "invalid indexer pattern", "layer 0 is 'shared'"});
}

TEST_F(Cli, InvalidIndexTopkPattern) {
    edit_config([](json& j) { j["index_topk_pattern"] = "FFFSXS"; });
    expect_error(logits("1,2,3"), {"config.json", "invalid indexer pattern", "index_topk_pattern[4] = 'X'"});
}

TEST_F(Cli, IndexerPatternThatDisagreesWithCheckpoint) {
    // Well-formed, but layer 3 is now full and the checkpoint has no indexer for it.
    edit_config([](json& j) { j["index_topk_pattern"] = "FFFFSS"; });
    expect_error(logits("1,2,3"), {"missing tensor 'model.layers.3.self_attn.indexer.wq_b.weight'"});
}

// --- safetensors -------------------------------------------------------------------------------------------

TEST_F(Cli, MissingWeightsFile) {
    fs::remove(weights());
    expect_error(logits("1,2,3"), {model_, "no model.safetensors or model.safetensors.index.json"});
}

TEST_F(Cli, MissingTensor) {
    remove_tensor(weights(), "model.layers.2.self_attn.kv_b_proj.weight");
    expect_error(logits("1,2,3"), {model_, "missing tensor 'model.layers.2.self_attn.kv_b_proj.weight'"});
}

TEST_F(Cli, WrongShapeInCheckpoint) {
    edit_header(weights(), [](json& h) { h["model.layers.0.self_attn.q_a_proj.weight"]["shape"] = {64, 48}; });
    expect_error(logits("1,2,3"), {"model.safetensors", "tensor 'model.layers.0.self_attn.q_a_proj.weight'",
                                   "has shape [64, 48], expected [48, 64]"});
}

TEST_F(Cli, ConfigDisagreesWithCheckpointShape) {
    edit_config([](json& j) { j["vocab_size"] = 1024; });
    expect_error(logits("1,2,3"),
                 {"model.safetensors", "tensor 'model.embed_tokens.weight' has shape [512, 64], expected [1024, 64]"});
}

TEST_F(Cli, UnsupportedDtypeI8) {
    edit_header(weights(), [](json& h) { h["model.embed_tokens.weight"]["dtype"] = "I8"; });
    expect_error(logits("1,2,3"), {"model.safetensors", "tensor 'model.embed_tokens.weight'", "unsupported dtype I8"});
}

TEST_F(Cli, UnsupportedDtypeF64) {
    edit_header(weights(), [](json& h) { h["model.layers.4.mlp.experts.7.up_proj.weight"]["dtype"] = "F64"; });
    expect_error(logits("1,2,3"), {"model.safetensors", "tensor 'model.layers.4.mlp.experts.7.up_proj.weight'",
                                   "unsupported dtype F64"});
}

TEST_F(Cli, IntegerDtypeWeight) {
    // I32 is a dtype megactx reads (for index tensors), but not as a weight; same byte size as F32.
    edit_header(weights(), [](json& h) { h["model.layers.1.self_attn.o_proj.weight"]["dtype"] = "I32"; });
    expect_error(logits("1,2,3"), {"model.safetensors", "tensor 'model.layers.1.self_attn.o_proj.weight'",
                                   "has dtype I32; weights must be F32, BF16, F16 or F8_E4M3"});
}

TEST_F(Cli, TruncatedSafetensorsData) {
    // The tensor stored last is the one cut short.
    std::string last;
    uint64_t last_end = 0;
    edit_header(weights(), [&](json& h) {
        for (const auto& [name, e] : h.items()) {
            if (name != "__metadata__" && e["data_offsets"][1].get<uint64_t>() > last_end) {
                last = name;
                last_end = e["data_offsets"][1].get<uint64_t>();
            }
        }
    });
    auto bytes = test::read_bytes(weights());
    bytes.resize(bytes.size() - 1000);
    test::write_bytes(weights(), bytes);
    expect_error(logits("1,2,3"),
                 {"model.safetensors", "tensor '" + last + "'", "out of range", "truncated or corrupt"});
}

TEST_F(Cli, TruncatedSafetensorsLengthField) {
    auto bytes = test::read_bytes(weights());
    bytes.resize(5);
    test::write_bytes(weights(), bytes);
    expect_error(logits("1,2,3"), {"model.safetensors", "truncated safetensors file (5 bytes"});
}

TEST_F(Cli, SafetensorsHeaderLengthBeyondFile) {
    auto bytes = test::read_bytes(weights());
    const uint64_t n = bytes.size();
    std::memcpy(bytes.data(), &n, 8);
    test::write_bytes(weights(), bytes);
    expect_error(logits("1,2,3"), {"model.safetensors", fmt::format("header length {} runs past the end", n)});
}

TEST_F(Cli, SafetensorsHeaderNotJson) {
    auto bytes = test::read_bytes(weights());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    std::memset(bytes.data() + 8 + n / 2, 0, 16);  // NUL bytes in the middle of the header: never valid JSON
    test::write_bytes(weights(), bytes);
    expect_error(logits("1,2,3"), {"model.safetensors", "safetensors header is not valid JSON"});
}

TEST_F(Cli, SafetensorsDataOffsetsPastEnd) {
    const uint64_t data_size = fs::file_size(weights());  // larger than the data section
    edit_header(weights(), [&](json& h) { h["model.norm.weight"]["data_offsets"] = {data_size, data_size + 256}; });
    expect_error(logits("1,2,3"), {"model.safetensors", "tensor 'model.norm.weight'",
                                   fmt::format("data_offsets [{}, {}] out of range", data_size, data_size + 256)});
}

TEST_F(Cli, SafetensorsSpanDisagreesWithShape) {
    edit_header(weights(), [](json& h) {
        auto& off = h["model.norm.weight"]["data_offsets"];
        off[1] = off[1].get<uint64_t>() - 4;
    });
    expect_error(logits("1,2,3"), {"model.safetensors", "tensor 'model.norm.weight'", "F32 [64] needs 256 bytes"});
}

// --- sharded checkpoints -----------------------------------------------------------------------------------

class ShardedCli : public Cli {
  protected:
    void SetUp() override {
        Cli::SetUp();
        model_ = dir_ / "sharded";
        gen_model(model_, "--shards 2");
        index_ = json::parse(test::read_text(model_ + "/model.safetensors.index.json"));
    }
    void write_index() { test::write_text(model_ + "/model.safetensors.index.json", index_.dump(2)); }

    static constexpr const char* kLate = "model.layers.5.self_attn.o_proj.weight";  // in the second shard
    json index_;
};

TEST_F(ShardedCli, IndexNamesMissingShard) {
    ASSERT_EQ(index_["weight_map"][kLate], kShard2);
    index_["weight_map"][kLate] = "model-00003-of-00002.safetensors";
    write_index();
    expect_error(logits("1,2,3"), {model_ + "/model-00003-of-00002.safetensors", "cannot open"});
}

TEST_F(ShardedCli, ShardFileDeleted) {
    fs::remove(model_ + "/" + kShard2);
    expect_error(logits("1,2,3"), {kShard2, "cannot open safetensors file"});
}

TEST_F(ShardedCli, TensorMissingFromItsShard) {
    ASSERT_EQ(index_["weight_map"][kLate], kShard2);
    index_["weight_map"][kLate] = kShard1;
    write_index();
    expect_error(logits("1,2,3"), {kShard1, std::string("tensor '") + kLate + "'", "model.safetensors.index.json",
                                   "missing from the shard"});
}

TEST_F(ShardedCli, TensorAbsentFromIndex) {
    index_["weight_map"].erase(kLate);
    write_index();
    expect_error(logits("1,2,3"), {model_, std::string("missing tensor '") + kLate + "'"});
}

TEST_F(ShardedCli, IndexNotJson) {
    test::write_text(model_ + "/model.safetensors.index.json", "{\"weight_map\": {");
    expect_error(logits("1,2,3"), {"model.safetensors.index.json", "not valid JSON"});
}

TEST_F(ShardedCli, CorruptShard) {
    auto bytes = test::read_bytes(model_ + "/" + kShard2);
    bytes.resize(bytes.size() / 2);
    test::write_bytes(model_ + "/" + kShard2, bytes);
    expect_error(logits("1,2,3"), {kShard2, "out of range"});
}

// --- the request -------------------------------------------------------------------------------------------

TEST_F(Cli, NonexistentModelDir) {
    model_ = dir_ / "no-such-model";
    expect_error(logits("1,2,3"), {"no-such-model", "missing config.json"});
}

TEST_F(Cli, TokenIdBeyondVocab) {
    expect_error(logits("1,99999,3"), {"token id 99999 at index 1 is out of range (vocabulary size 512)"});
    expect_error(logits("512"), {"token id 512 at index 0 is out of range"});
}

TEST_F(Cli, NegativeTokenId) { expect_error(logits("5,-1"), {"token id -1 at index 1 is out of range"}); }

TEST_F(Cli, SequenceLongerThanMaxPositionEmbeddings) {
    edit_config([](json& j) { j["max_position_embeddings"] = 8; });
    expect_error(logits("1,2,3,4,5,6,7,8,9"),
                 {"sequence of 9 tokens is longer than the model's context (max_position_embeddings = 8)"});
    expect_error(logits("1,2,3,4,5,6,7,8,9", "--chunk 1"), {"max_position_embeddings = 8"});
    const RunResult r = logits("1,2,3,4,5,6,7,8");  // exactly the limit is fine
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_npy_f32(out_).shape, (std::vector<int64_t>{8, 512}));
}

TEST_F(Cli, GenerateRejectsPromptPlusNewTokensBeyondContext) {
    edit_config([](json& j) { j["max_position_embeddings"] = 8; });
    const RunResult r = run("generate --model '" + model_ + "' --tokens 1,2,3,4,5 --max-new-tokens 4 --temperature 0");
    expect_error(r, {"sequence of 9 tokens", "max_position_embeddings = 8"});
    expect_error(run("generate --model '" + model_ + "' --tokens 1,600 --max-new-tokens 1"),
                 {"token id 600 at index 1 is out of range"});
}

TEST_F(Cli, BadTokensSyntax) {
    expect_error(logits("1,x"), {"--tokens: 'x' is not an integer token id"});
    expect_error(logits("1,2x"), {"--tokens: '2x' is not an integer token id"});
    expect_error(logits("1,,2"), {"--tokens: empty entry in '1,,2'"});
    expect_error(logits("1,99999999999"), {"--tokens: '99999999999' is not an integer token id"});
}

TEST_F(Cli, TokensFileMalformedJson) {
    const std::string tokens = dir_ / "tokens.json";
    const auto run_file = [&] {
        return run("logits --model '" + model_ + "' --tokens-file '" + tokens + "' --out '" + out_ + "'");
    };
    test::write_text(tokens, "[1, 2,");
    expect_error(run_file(), {tokens, "not valid JSON"});
    test::write_text(tokens, "[1, \"2\"]");
    expect_error(run_file(), {tokens, "entry 1 (\"2\") is not an integer token id"});
    test::write_text(tokens, R"({"ids": [1, 2]})");
    expect_error(run_file(), {tokens, "'token_ids'"});
    fs::remove(tokens);
    expect_error(run_file(), {tokens, "cannot open tokens file"});
    test::write_text(tokens, R"({"token_ids": [1, 2, 3]})");  // and the good form works
    EXPECT_EQ(run_file().exit_code, 0);
    EXPECT_EQ(read_npy_f32(out_).shape, (std::vector<int64_t>{3, 512}));
}

TEST_F(Cli, OutputWriteFailureLeavesNoFile) {
    // A 2 KiB file-size limit (SIGXFSZ ignored, so writes fail with EFBIG) and 6 KiB of logits: the write fails
    // part way, and neither out.npy nor out.npy.tmp may be left behind.
    const RunResult r =
        run("logits --model '" + model_ + "' --tokens 1,2,3 --out '" + out_ + "'", "ulimit -f 4; trap '' XFSZ; ");
    expect_error(r, {out_, "write failed"});
}

TEST_F(Cli, UnwritableOutput) {
    out_ = dir_ / "no-such-dir/out.npy";
    expect_error(logits("1,2,3"), {"no-such-dir/out.npy", "cannot write"});
}

}  // namespace
}  // namespace megactx
