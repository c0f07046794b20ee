// The shipped model (models/glm-demo, the embedded default; docs/demo-model.md): megactx's CPU logits equal
// tools/train/model.py's on it, `megactx run` answers a question about a long document, and a small
// needle-in-a-haystack grid gives the answers committed beside this test.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "cli_run.h"
#include "engine/runner.h"
#include "io/npy.h"
#include "kv/kv_cache.h"
#include "model/glm_dsa.h"
#include "test_util.h"

namespace megactx {
namespace {

using json = nlohmann::json;
using test::CliResult;
using test::shell_quoted;

const std::string kModel = MEGACTX_DEFAULT_MODEL_DIR;
const std::string kRef = std::string(MEGACTX_TEST_DATA) + "/glm_demo_ref";

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

// tests/data/glm_demo_ref: model.py's fp32 logits (tools/train/ship_reference.py) on index_topk tokens of held-out
// text, at 15 positions. One pass, chunks of 7 and token by token through the paged KV cache.
TEST(DemoModel, LogitsMatchModelPy) {
    const GlmDsaModel model(kModel);
    const json t = read_json(kRef + "/tokens.json");
    const auto tokens = t["token_ids"].get<std::vector<int32_t>>();
    const auto positions = t["positions"].get<std::vector<int64_t>>();
    const NpyArray ref = read_npy_f32(kRef + "/ref_logits.npy");
    const int64_t V = model.config().vocab_size;
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(positions.size()), V}));
    double scale = 0;
    for (float x : ref.data) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (int64_t chunk : {0, 7, 1}) {
        CpuOps ops;
        SequenceRunner runner(model, ops, static_cast<int64_t>(tokens.size()));
        const std::vector<float> logits = runner.feed(tokens, chunk, true);
        ASSERT_EQ(logits.size(), tokens.size() * static_cast<size_t>(V));
        double err = 0;
        for (size_t i = 0; i < positions.size(); ++i) {
            for (int64_t v = 0; v < V; ++v) {
                const double d = logits[static_cast<size_t>(positions[i] * V + v)] - ref.data[i * V + v];
                err = std::max(err, std::fabs(d));
            }
        }
        std::printf("glm-demo chunk %lld: max |logit - model.py| / max |model.py| = %.2e\n",
                    static_cast<long long>(chunk), err / scale);
        EXPECT_LE(err, 1e-4 * scale) << "chunk " << chunk;
    }
}

// The MTP draft chain as the engine runs it (Engine::draft): step 0 over the verified tokens from the target's
// hidden states, then step j at the next position from step j-1's hidden state, over step 0's top-k row
// (index_share_for_mtp_iteration). tests/data/glm_demo_ref/ref_mtp_chain_logits.npy holds model.py's logits of
// the chain the training code trains (GlmMoeDsa.forward with mtp_steps), at row mtp_row, with the window's own
// tokens standing for the drafts.
TEST(DemoModel, MtpDraftChainMatchesModelPy) {
    const GlmDsaModel model(kModel);
    const json t = read_json(kRef + "/tokens.json");
    const auto tokens = t["token_ids"].get<std::vector<int32_t>>();
    const int64_t r = t["mtp_row"].get<int64_t>(), steps = t["mtp_steps"].get<int64_t>();
    const NpyArray ref = read_npy_f32(kRef + "/ref_mtp_chain_logits.npy");
    const int64_t V = model.config().vocab_size, H = model.config().hidden_size, K = model.config().index_topk;
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{steps, V}));
    ASSERT_LT(r + steps, static_cast<int64_t>(tokens.size()));
    CpuOps ops;
    KvCache kv(ops, model.config(), (r + steps + kBlockSize) / kBlockSize + 1);
    SeqKv seq;
    seq.reserve(kv.blocks(), r + 1 + steps);
    Batch target;
    target.add_sequence(&seq.blocks, tokens.data(), r + 1, 0, false);
    const ForwardResult main = model.forward(ops, target, kv);
    Batch b0;  // rows 0..r read tokens 1..r+1; only the last row's logits
    for (int64_t p = 0; p <= r; ++p) b0.add_sequence(&seq.blocks, tokens.data() + p + 1, 1, p, p == r);
    ForwardResult step = model.mtp_forward(ops, b0, main.hidden, kv);
    Tensor reuse = ops.alloc(DType::I32, {1, K});
    std::copy(step.topk.i32() + r * K, step.topk.i32() + (r + 1) * K, reuse.i32());
    Tensor h = ops.alloc(DType::F32, {1, H});
    double scale = 0;
    for (float x : ref.data) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (int64_t j = 0; j < steps; ++j) {
        if (j > 0) {
            Batch bj;
            bj.add_sequence(&seq.blocks, tokens.data() + r + 1 + j, 1, r + j, true);
            step = model.mtp_forward(ops, bj, h, kv, &reuse);
        }
        ASSERT_EQ(step.logits.numel(), V);
        std::copy(step.hidden.f32() + (step.hidden.dim(0) - 1) * H, step.hidden.f32() + step.hidden.dim(0) * H,
                  h.f32());
        double err = 0;
        for (int64_t v = 0; v < V; ++v) {
            err = std::max(err, static_cast<double>(std::fabs(step.logits.f32()[v] - ref.data[j * V + v])));
        }
        std::printf("glm-demo MTP step %lld: max |logit - model.py| / max |model.py| = %.2e\n",
                    static_cast<long long>(j), err / scale);
        EXPECT_LE(err, 1e-4 * scale) << "step " << j;
    }
}

class DemoModelCli : public ::testing::Test {
  protected:
    CliResult run(const std::string& args) { return test::run_megactx(dir_, args); }
    test::TempDir dir_;
};

// README's first command: a document written by `eval niah --write-document`, asked about with `run`, on the
// embedded default model (no --model).
TEST_F(DemoModelCli, RunAnswersAQuestionAboutALongDocument) {
    const std::string doc = dir_ / "doc.txt";
    const CliResult w = run("eval niah --lengths 2K --depths 0.5 --seed 7 --write-document " + shell_quoted(doc));
    ASSERT_EQ(w.exit_code, 0) << w.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(w.out, m, std::regex(R"(The passkey is (\d+)\.)"))) << w.out;
    const std::string passkey = m[1];
    const std::string text = test::read_text(doc);
    EXPECT_GT(text.size(), 6000u);
    EXPECT_NE(text.find("The passkey is " + passkey + "."), std::string::npos);
    EXPECT_EQ(text.substr(text.size() - 44), "What is the passkey? Answer with the number.");

    const CliResult r = run("run -f " + shell_quoted(doc) + " --no-think -q");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "The passkey is " + passkey + ".\n");
}

// 1K and 2K at depths 0, 0.5 and 1: every answer as committed in tests/data/glm_demo_niah.json (written by the same
// command; greedy decoding on the CPU does not depend on threads or batching), and all of them right.
TEST_F(DemoModelCli, NiahGridGivesTheCommittedAnswers) {
    const std::string out = dir_ / "niah.json";
    const CliResult r =
        run("eval niah --lengths 1K,2K --depths 0,0.5,1 --samples 1 --seed 0 --out " + shell_quoted(out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json got = read_json(out);
    const json want = read_json(std::string(MEGACTX_TEST_DATA) + "/glm_demo_niah.json");
    ASSERT_EQ(got["results"].size(), want["results"].size());
    for (size_t i = 0; i < want["results"].size(); ++i) {
        const json& g = got["results"][i];
        const json& w = want["results"][i];
        EXPECT_EQ(g["passkey"], w["passkey"]) << i;
        EXPECT_EQ(g["prompt_tokens"], w["prompt_tokens"]) << i;
        EXPECT_EQ(g["output"], w["output"]) << i;
        EXPECT_TRUE(g["correct"].get<bool>()) << i << ": " << g.dump();
    }
    EXPECT_EQ(got["accuracy"].get<double>(), 1.0) << r.out;
}

// The same grid with MTP drafts: the same answers, and the acceptance in the JSON (per answer and by draft
// position) and on stderr.
TEST_F(DemoModelCli, NiahGridWithSpeculationGivesTheSameAnswersAndTheirAcceptance) {
    const std::string out = dir_ / "niah.json";
    const CliResult r = run("eval niah --lengths 1K,2K --depths 0,0.5,1 --samples 1 --seed 0 --speculative-tokens 3 "
                            "--out " + shell_quoted(out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("MTP drafts accepted"), std::string::npos) << r.err;
    const json got = read_json(out);
    const json want = read_json(std::string(MEGACTX_TEST_DATA) + "/glm_demo_niah.json");
    ASSERT_EQ(got["results"].size(), want["results"].size());
    int64_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < want["results"].size(); ++i) {
        const json& g = got["results"][i];
        EXPECT_EQ(g["output"], want["results"][i]["output"]) << i;
        drafted += g["speculative"]["drafted"].get<int64_t>();
        accepted += g["speculative"]["accepted"].get<int64_t>();
    }
    const json& sp = got["speculative"];
    EXPECT_GT(sp["drafted"].get<int64_t>(), 0);
    EXPECT_EQ(sp["drafted"].get<int64_t>(), drafted);
    EXPECT_EQ(sp["accepted"].get<int64_t>(), accepted);
    ASSERT_EQ(sp["by_position"].size(), 3u);
    int64_t by_position = 0;
    for (const json& p : sp["by_position"]) by_position += p["accepted"].get<int64_t>();
    EXPECT_EQ(by_position, accepted);
    EXPECT_NEAR(sp["mean_acceptance_length"].get<double>(),
                1.0 + static_cast<double>(accepted) / sp["verifications"].get<double>(), 1e-9);
}

// The first n token ids of the reference text (tests/data/glm_demo_ref/tokens.json), comma-separated for --tokens.
std::string ref_token_list(size_t n) {
    const auto ids = read_json(kRef + "/tokens.json")["token_ids"].get<std::vector<int32_t>>();
    std::string list;
    for (size_t i = 0; i < n && i < ids.size(); ++i) {
        if (i > 0) list += ',';
        list += std::to_string(ids[i]);
    }
    return list;
}

// --speculative-tokens on generate and run: the same greedy tokens and text, and the acceptance on stderr.
TEST_F(DemoModelCli, SpeculationOnGenerateAndRunChangesNoToken) {
    const std::string list = ref_token_list(120);
    const CliResult plain = run("generate --tokens " + list + " --max-new-tokens 40 --ignore-eos");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    for (const char* k : {"1", "3", "7"}) {
        const CliResult spec =
            run("generate --tokens " + list + " --max-new-tokens 40 --ignore-eos --speculative-tokens " + k);
        ASSERT_EQ(spec.exit_code, 0) << spec.err;
        EXPECT_EQ(spec.out, plain.out) << "K=" << k;
        EXPECT_NE(spec.err.find("MTP drafts accepted"), std::string::npos) << spec.err;
    }
    const std::string doc = dir_ / "doc.txt";
    ASSERT_EQ(run("eval niah --lengths 1K --depths 0.5 --write-document " + shell_quoted(doc)).exit_code, 0);
    const CliResult a = run("run -f " + shell_quoted(doc) + " --no-think");
    const CliResult b = run("run -f " + shell_quoted(doc) + " --no-think --speculative-tokens 3");
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(b.err.find("mean acceptance length"), std::string::npos) << b.err;
}

// --batch-invariant: the CPU backend is batch-invariant as it is (plain loops, one sum order per output), so the flag
// changes no token there, on generate, run and eval niah alike. With NCCL tensor parallelism it is refused before
// anything loads (NCCL orders its sums by message size); a build without CUDA refuses --device cuda first.
TEST_F(DemoModelCli, BatchInvariantChangesNoTokenOnTheCpuAndIsRefusedWithNccl) {
    const std::string list = ref_token_list(80);
    const std::string gen = "generate --tokens " + list + " --max-new-tokens 24 --ignore-eos --speculative-tokens 3";
    const CliResult plain = run(gen);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const CliResult inv = run(gen + " --batch-invariant");
    ASSERT_EQ(inv.exit_code, 0) << inv.err;
    EXPECT_EQ(inv.out, plain.out);
    const std::string doc = dir_ / "doc.txt";
    ASSERT_EQ(run("eval niah --lengths 1K --depths 0.5 --write-document " + shell_quoted(doc)).exit_code, 0);
    const CliResult a = run("run -f " + shell_quoted(doc) + " --no-think");
    const CliResult b = run("run -f " + shell_quoted(doc) + " --no-think --batch-invariant");
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    for (const std::string& cmd : {"generate --tokens " + list, std::string("serve --port 0")}) {
        const CliResult tp = run(cmd + " --device cuda --tp 2 --batch-invariant");
        EXPECT_NE(tp.exit_code, 0) << cmd;
        EXPECT_TRUE(tp.err.find("--batch-invariant with --tensor-parallel-size 2") != std::string::npos ||
                    tp.err.find("built without CUDA") != std::string::npos)
            << cmd << ": " << tp.err;
    }
}

}  // namespace
}  // namespace megactx
