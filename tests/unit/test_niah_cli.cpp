// `megactx eval niah` end to end on a random tiny model: the grid runs through the engine and writes the table,
// the JSON and a PNG a decoder accepts (the accuracy of a random model is about 0; only the mechanics are
// checked). A trained model's accuracy: NiahCli.ModelReachesAccuracy, enabled by MEGACTX_NIAH_MODEL.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "eval/heatmap.h"
#include "eval/niah.h"
#include "png_decode.h"
#include "test_util.h"

namespace megactx {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::CliResult;
using test::shell_quoted;

// A haystack of short paragraphs without digits.
std::string haystack_text() {
    static const char* words[] = {"the", "river", "bank", "over", "quiet", "stone", "a", "light", "moved", "north"};
    std::string out;
    for (int i = 0; i < 60; ++i) {
        out += "Once";
        for (int w = 0; w < 5 + i % 9; ++w) out += std::string(" ") + words[(i * 7 + w * 3) % 10];
        out += ".\n";
    }
    return out;
}

class NiahCli : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = dir_ / "model";
        const CliResult r = run("gen-model --preset tiny --seed 0 --out " + shell_quoted(model_));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        test::write_text(model_ + "/haystack.txt", haystack_text());
    }

    CliResult run(const std::string& args) { return test::run_megactx(dir_, args); }

    // `eval niah` on `model` writing out.json and out.png; the parsed JSON (null when the command failed).
    json niah(const std::string& model, const std::string& args, CliResult* r) {
        *r = run("eval niah --model " + shell_quoted(model) + " --out " + shell_quoted(json_) + " --png " +
                 shell_quoted(png_) + " " + args);
        if (r->exit_code != 0) return nullptr;
        return json::parse(test::read_text(json_));
    }

    static void expect_error(const CliResult& r, const std::string& part) {
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_EQ(r.err.rfind("megactx: error: ", 0), 0u) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_NE(r.err.find(part), std::string::npos) << "'" << part << "' not in: " << r.err;
    }

    test::TempDir dir_;
    std::string model_, json_ = dir_ / "out.json", png_ = dir_ / "out.png";
};

TEST_F(NiahCli, RunsTheGridAndWritesTableJsonAndPng) {
    CliResult r;
    const json j = niah(model_, "--lengths 128,256 --depths 0,1 --samples 2 --seed 3", &r);
    ASSERT_EQ(r.exit_code, 0) << r.err;

    EXPECT_EQ(j["task"], "niah");
    EXPECT_EQ(j["model"], "model");
    EXPECT_EQ(j["device"], "cpu");
    EXPECT_EQ(j["seed"], 3);
    EXPECT_EQ(j["samples"], 2);
    EXPECT_EQ(j["lengths"], json({128, 256}));
    EXPECT_EQ(j["depths"], json({0.0, 1.0}));
    ASSERT_EQ(j["cells"].size(), 4u);
    ASSERT_EQ(j["results"].size(), 8u);
    int64_t correct = 0;
    for (size_t i = 0; i < 4; ++i) {
        const json& c = j["cells"][i];
        EXPECT_EQ(c["length"], i < 2 ? 128 : 256) << i;
        EXPECT_EQ(c["depth"], i % 2 == 0 ? 0.0 : 1.0) << i;
        EXPECT_EQ(c["total"], 2);
        EXPECT_LE(c["correct"].get<int64_t>(), 2);
        EXPECT_DOUBLE_EQ(c["accuracy"].get<double>(), c["correct"].get<double>() / 2.0);
        EXPECT_LE(c["mean_prompt_tokens"].get<double>(), c["length"].get<double>());
        EXPECT_GT(c["mean_prompt_tokens"].get<double>(), 0.5 * c["length"].get<double>());
        correct += c["correct"].get<int64_t>();
    }
    EXPECT_DOUBLE_EQ(j["accuracy"].get<double>(), static_cast<double>(correct) / 8.0);
    ASSERT_EQ(j["per_length"].size(), 2u);
    EXPECT_EQ(j["per_length"][1]["length"], 256);
    EXPECT_EQ(j["per_length"][1]["total"], 4);
    for (const json& s : j["results"]) {
        EXPECT_GE(s["passkey"].get<int64_t>(), 10000);
        EXPECT_LE(s["prompt_tokens"].get<int64_t>(), s["length"].get<int64_t>());
        EXPECT_EQ(s["correct"].get<bool>(),
                  niah::is_correct(s["output"].get<std::string>(), s["passkey"].get<int64_t>()));
    }
    EXPECT_GT(j["elapsed_s"].get<double>(), 0.0);
    EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_EQ(j["prompt_tokens"].get<int64_t>() + 0, [&] {
        int64_t n = 0;
        for (const json& s : j["results"]) n += s["prompt_tokens"].get<int64_t>();
        return n;
    }());

    // the table: rows = depths, columns = lengths
    test::expect_contains(r.out, {"depth", "128", "256", "\n0 ", "\n1 ", "\nall ", "accuracy"});
    test::expect_contains(r.err, {"megactx eval niah: 8 samples"});

    test::DecodedPng png;
    ASSERT_TRUE(test::decode_png(test::read_bytes(png_), &png));
    EXPECT_GT(png.width, 200u);
    EXPECT_GT(png.height, 150u);
    const Rgb cell = heat_colour(j["cells"][0]["accuracy"].get<double>());
    size_t n_cell = 0;
    for (size_t i = 0; i + 2 < png.rgb.size(); i += 3)
        n_cell += Rgb{png.rgb[i], png.rgb[i + 1], png.rgb[i + 2]} == cell;
    EXPECT_GT(n_cell, 500u);

    // The same samples and greedy answers one sequence at a time: batching changes nothing.
    CliResult again;
    const json k = niah(model_, "--lengths 128,256 --depths 0,1 --samples 2 --seed 3 --max-num-seqs 1", &again);
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(k["results"], j["results"]);
}

TEST_F(NiahCli, BadInputGivesOneErrorLine) {
    const std::string grid = " --lengths 128 --depths 0.5 --samples 1";
    CliResult r;
    niah(model_, "--lengths 12X", &r);
    expect_error(r, "--lengths: '12X' is not a length");
    niah(model_, "--depths 2", &r);
    expect_error(r, "--depths: '2' is not a depth in [0, 1]");
    niah(model_, "--lengths 16 --depths 0.5 --samples 1", &r);
    expect_error(r, "length 16: the question and the needle alone take");
    niah(model_, grid + " --max-model-len 28", &r);  // room for 16-token prompts only
    expect_error(r, "length 16: the question and the needle alone take");
    niah(model_, grid + " --max-model-len 12", &r);
    expect_error(r, "the maximum context length 12 (--max-model-len) leaves no room");
    r = run("eval niah --model " + shell_quoted(model_) + grid + " --out " + shell_quoted(dir_ / "no/such/dir/x.json"));
    expect_error(r, "--out");
    niah(model_, grid + " --haystack " + shell_quoted(dir_ / "none.txt"), &r);
    expect_error(r, "none.txt: cannot open the haystack file");
    fs::remove(model_ + "/haystack.txt");
    niah(model_, grid, &r);
    expect_error(r, "no --haystack given and the model directory has no haystack.txt");
    EXPECT_FALSE(fs::exists(json_));
    EXPECT_FALSE(fs::exists(png_));
    r = run("eval");
    EXPECT_NE(r.exit_code, 0);
}

// A length the model's context cannot hold together with the answer (1M on a 1M model) runs with prompts that leave
// room for it, and says so.
TEST_F(NiahCli, LengthsBeyondTheContextLeaveRoomForTheAnswer) {
    CliResult r;
    const json j = niah(model_, "--lengths 256 --depths 0,1 --samples 2 --max-model-len 200", &r);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(j["lengths"], json({256}));
    ASSERT_EQ(j["results"].size(), 4u);
    for (const json& s : j["results"]) {
        EXPECT_EQ(s["length"], 256);
        EXPECT_LE(s["prompt_tokens"].get<int64_t>(), 200 - niah::kMaxNewTokens);
        EXPECT_GT(s["prompt_tokens"].get<int64_t>(), 120);  // filled up to the cap, less one paragraph at most
    }
    test::expect_contains(r.err, {"--lengths 256: prompts of at most 188 tokens"});
}

TEST_F(NiahCli, HelpShowsTheDefaults) {
    const CliResult r = run("eval niah --help");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    test::expect_contains(r.out, {"--lengths TEXT=1024,2048,4096", "K = 1024, M = 1048576",
                                  "--depths TEXT=0,0.25,0.5,0.75,1", "--samples INT:[1, 100000]=5",
                                  "--seed UINT:NONNEGATIVE=0", "(default: haystack.txt in the model directory)",
                                  "--max-num-seqs INT:[1, 4096]=64", "--device TEXT=cpu"});
}

// A trained model's accuracy, for a model directory holding haystack.txt: MEGACTX_NIAH_MODEL=DIR, and optionally
// MEGACTX_NIAH_MIN_ACCURACY (default 0.9), MEGACTX_NIAH_LENGTHS (default 1K,2K,4K), MEGACTX_NIAH_ARGS (more flags,
// e.g. --device cuda). Skipped without MEGACTX_NIAH_MODEL.
TEST_F(NiahCli, ModelReachesAccuracy) {
    const char* model = std::getenv("MEGACTX_NIAH_MODEL");
    if (!model || !*model) GTEST_SKIP() << "set MEGACTX_NIAH_MODEL to a trained model directory";
    const char* min = std::getenv("MEGACTX_NIAH_MIN_ACCURACY");
    const char* lengths = std::getenv("MEGACTX_NIAH_LENGTHS");
    const char* extra = std::getenv("MEGACTX_NIAH_ARGS");
    CliResult r;
    const json j =
        niah(model, std::string("--lengths ") + (lengths ? lengths : "1K,2K,4K") + " " + (extra ? extra : ""), &r);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GE(j["accuracy"].get<double>(), min ? std::atof(min) : 0.9) << r.out;
}

}  // namespace
}  // namespace megactx
