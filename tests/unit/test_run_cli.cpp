// `megactx run` through the real binary on a random tiny model: the streamed answer is exactly what `generate`
// gives for the same rendered prompt (greedy), reasoning goes to stderr, --raw skips the template, the chat
// re-renders its history, and bad input is one error line.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "cli_run.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"

namespace megactx {
namespace {

using test::CliResult;
using test::shell_quoted;

class RunCli : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = dir_ / "model";
        const CliResult r = run("gen-model --preset tiny --seed 0 --out " + shell_quoted(model_));
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }

    CliResult run(const std::string& args, const std::string& stdin_text = "") {
        return test::run_megactx(dir_, args, stdin_text);
    }
    CliResult run_cmd(const std::string& args, const std::string& stdin_text = "") {
        return run("run --model " + shell_quoted(model_) + " " + args, stdin_text);
    }

    // `generate` (greedy) on the encoding of `prompt`, decoded without special tokens.
    std::string generate_text(const std::string& prompt, bool add_special, int n_new) {
        const std::string file = dir_ / "prompt.txt";
        test::write_text(file, prompt);
        const CliResult ids = run("tokenize --model " + shell_quoted(model_) + " --text-file " + shell_quoted(file) +
                                  (add_special ? "" : " --no-special"));
        EXPECT_EQ(ids.exit_code, 0) << ids.err;
        const std::string list = ids.out.substr(1, ids.out.find(']') - 1);  // "[1,2,3]\n" -> "1,2,3"
        const CliResult gen = run("generate --model " + shell_quoted(model_) + " --tokens " + list +
                                  " --max-new-tokens " + std::to_string(n_new));
        EXPECT_EQ(gen.exit_code, 0) << gen.err;
        std::string out = gen.out;
        while (!out.empty() && out.back() == '\n') out.pop_back();
        if (out.empty()) return "";
        const CliResult text = run("detokenize --skip-special --model " + shell_quoted(model_) + " --ids " + out);
        EXPECT_EQ(text.exit_code, 0) << text.err;
        return text.out;
    }

    // run ends its answer with a line break unless the text already does.
    static std::string as_printed(const std::string& answer) {
        return answer.empty() || answer.back() == '\n' ? answer : answer + "\n";
    }
    // The rendered prompt that --print-prompt wrote first on stderr (one line when the prompt has no line break).
    static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

    // One error line, exit status 1, nothing on stdout.
    static void expect_error(const CliResult& r, const std::string& part) {
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err.rfind("megactx: error: ", 0), 0u) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_NE(r.err.find(part), std::string::npos) << "'" << part << "' not in: " << r.err;
    }

    test::TempDir dir_;
    std::string model_;
};

TEST_F(RunCli, StreamsWhatGenerateGivesForTheRenderedPrompt) {
    const CliResult r = run_cmd("-p 'Hello there' --no-think --temperature 0 -n 24 --print-prompt -q");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string prompt = "[gMASK]<sop><|user|>Hello there<|assistant|><think></think>";
    EXPECT_EQ(r.err, prompt + "\n");
    const std::string expected = generate_text(prompt, false, 24);
    ASSERT_EQ(expected.find("think>"), std::string::npos) << "the parser would route this text; pick another prompt";
    EXPECT_GT(expected.size(), 10u);
    EXPECT_EQ(r.out, as_printed(expected));
    // Without --model: the embedded default (models/glm-demo), as if named
    const CliResult embedded = run("run -p 'Hello there' --no-think --temperature 0 -n 24 -q");
    ASSERT_EQ(embedded.exit_code, 0) << embedded.err;
    EXPECT_EQ(embedded.out, run("run --model " + shell_quoted(MEGACTX_DEFAULT_MODEL_DIR) +
                                " -p 'Hello there' --no-think --temperature 0 -n 24 -q")
                                .out);
}

TEST_F(RunCli, RawSendsThePlainTextAsACompletion) {
    const CliResult r = run_cmd("--raw -p 'Once upon a time' --temperature 0 -n 16 --print-prompt -q");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "Once upon a time\n");
    EXPECT_EQ(r.out, as_printed(generate_text("Once upon a time", true, 16)));
}

// Thinking on (the default): the prompt opens <think>, the reasoning goes to stderr and the answer after
// </think> to stdout, split as the server's output parser splits them.
TEST_F(RunCli, ReasoningGoesToStderrAndTheAnswerToStdout) {
    const CliResult r = run_cmd("-p 'Hello there' --temperature 0 -n 40 --print-prompt -q");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string prompt = "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hello there<|assistant|><think>";
    ASSERT_EQ(r.err.substr(0, prompt.size() + 1), prompt + "\n");
    chat::ChatOptions opt;
    const chat::ParsedOutput parsed = chat::parse_output(generate_text(prompt, false, 40),
                                                         chat::parser_options_for(chat::ChatFormat::kGlm5, opt, {}));
    ASSERT_FALSE(parsed.reasoning.empty());
    EXPECT_EQ(r.err.substr(prompt.size() + 1), as_printed(parsed.reasoning));
    EXPECT_EQ(r.out, as_printed(parsed.content));
}

// Each turn re-renders the whole conversation: the second prompt holds the first question and answer, and
// the prefix cache serves the first turn's full blocks. Nothing after /exit runs.
TEST_F(RunCli, InteractiveRendersTheHistory) {
    std::string first = "first question";
    for (int i = 0; i < 12; ++i) first += " about the river and the stone";  // more than one 64-token block
    const std::string flags = "--no-think --temperature 0 -n 6 --print-prompt";
    const CliResult one = run_cmd("-p " + shell_quoted(first) + " " + flags + " -q");
    ASSERT_EQ(one.exit_code, 0) << one.err;
    std::string answer = one.out.substr(0, one.out.size() - (one.out.ends_with("\n") ? 1 : 0));
    const std::string p1 = "[gMASK]<sop><|user|>" + first + "<|assistant|><think></think>";
    const std::string p2 =
        p1 + std::string(chat::py_strip(answer)) + "<|user|>second question<|assistant|><think></think>";

    const CliResult r = run_cmd("-i " + flags, first + "\nsecond question\n/exit\nthird question\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::regex stats(
        R"(megactx run: prompt (\d+) tokens \((\d+) cached\), generated (\d+) tokens, prefill [\d.]+ tok/s, decode [\d.]+ tok/s\n)");
    std::vector<std::smatch> lines;
    for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), stats); it != std::sregex_iterator(); ++it) {
        lines.push_back(*it);
    }
    ASSERT_EQ(lines.size(), 2u) << r.err;
    const std::string err_prompts = std::regex_replace(r.err, stats, "");
    EXPECT_EQ(err_prompts, p1 + "\n" + p2 + "\n");
    EXPECT_EQ(r.out.substr(0, one.out.size()), one.out);
    EXPECT_EQ(std::stoi(lines[0][2]), 0);
    EXPECT_GE(std::stoi(lines[1][2]), 64);  // the first turn's blocks, from the prefix cache
    EXPECT_GT(std::stoi(lines[1][1]), std::stoi(lines[0][1]));
    EXPECT_EQ(r.err.find("third"), std::string::npos);
}

TEST_F(RunCli, ClearStartsANewConversation) {
    const CliResult r = run_cmd("-i --no-think --temperature 0 -n 4 --print-prompt -q --system 'Be brief.'",
                                "a question\n/clear\nb question\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string p2 = "[gMASK]<sop><|system|>Be brief.<|user|>b question<|assistant|><think></think>";
    EXPECT_EQ(first_line(r.err), "[gMASK]<sop><|system|>Be brief.<|user|>a question<|assistant|><think></think>");
    EXPECT_TRUE(r.err.ends_with(p2 + "\n")) << r.err;
}

TEST_F(RunCli, PromptFileAndStdinGiveTheSameAnswer) {
    const std::string flags = " --no-think --temperature 0 -n 12 -q";
    const CliResult a = run_cmd("-p 'Tell me more'" + flags);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    test::write_text(dir_ / "p.txt", "Tell me more");
    const CliResult b = run_cmd("-f " + shell_quoted(dir_ / "p.txt") + flags);
    const CliResult c = run_cmd("--prompt-file -" + flags, "Tell me more");
    EXPECT_EQ(b.out, a.out);
    EXPECT_EQ(c.out, a.out);
}

TEST_F(RunCli, StopStringCutsTheAnswer) {
    const std::string prompt = "[gMASK]<sop><|user|>Hello there<|assistant|><think></think>";
    const std::string text = generate_text(prompt, false, 24);
    size_t at = 4;  // three letters well inside the answer
    while (at + 3 < text.size() && !(std::isalpha(static_cast<unsigned char>(text[at])) &&
                                     std::isalpha(static_cast<unsigned char>(text[at + 1])) &&
                                     std::isalpha(static_cast<unsigned char>(text[at + 2]))))
        ++at;
    ASSERT_LT(at + 3, text.size()) << text;
    const std::string stop = text.substr(at, 3);
    const CliResult r = run_cmd("-p 'Hello there' --no-think --temperature 0 -n 24 -q --stop " + shell_quoted(stop));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, as_printed(text.substr(0, text.find(stop))));
}

// Without --temperature the model's generation_config.json decides, as transformers reads it: sampling only with
// do_sample; greedy without the file.
TEST_F(RunCli, SamplingDefaultsComeFromGenerationConfig) {
    const std::string flags = "-p 'Hello there' --no-think -n 24 -q";
    const CliResult greedy = run_cmd(flags + " --temperature 0");
    ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
    EXPECT_EQ(run_cmd(flags).out, greedy.out);
    const std::string config = model_ + "/generation_config.json";
    test::write_text(config, R"({"do_sample": true, "temperature": 1.0, "top_p": 1.0})");
    const CliResult s1 = run_cmd(flags + " --seed 3"), s2 = run_cmd(flags + " --seed 3");
    ASSERT_EQ(s1.exit_code, 0) << s1.err;
    EXPECT_EQ(s1.out, s2.out);
    EXPECT_NE(s1.out, greedy.out);
    EXPECT_EQ(run_cmd(flags + " --seed 3 --temperature 0").out, greedy.out);
    test::write_text(config, R"({"do_sample": false, "temperature": 0.6})");
    EXPECT_EQ(run_cmd(flags + " --seed 3").out, greedy.out);
    test::write_text(config, "{not json");
    expect_error(run_cmd(flags), "generation_config.json: not valid JSON");
}

TEST_F(RunCli, BadInputGivesOneErrorLine) {
    expect_error(run_cmd("-f " + shell_quoted(dir_ / "missing.txt")), "missing.txt: cannot open the prompt file");
    expect_error(run_cmd(""), "give --prompt TEXT, --prompt-file FILE or --interactive");
    expect_error(run_cmd("-p ''"), "the prompt is empty");
    std::string long_prompt;
    for (int i = 0; i < 100; ++i) long_prompt += "many words ";
    expect_error(run_cmd("-p " + shell_quoted(long_prompt) + " --max-model-len 64"),
                 "the maximum context length is 64");
    expect_error(run_cmd("--raw -i -p x"), "--raw");
    expect_error(run_cmd("-i -f -"), "--prompt-file cannot be '-'");
    expect_error(run_cmd("-p x --kv-cache-memory 12Q"), "--kv-cache-memory");
    expect_error(run("run --model " + shell_quoted(dir_ / "none") + " -p x"), "missing config.json");
    test::write_text(model_ + "/tokenizer.json", "{");
    expect_error(run_cmd("-p x"), "tokenizer.json");
    // A value CLI11 validates is a usage error, as for every command: exit 105 and one line naming the flag.
    const CliResult range = run_cmd("-p x --temperature 5");
    EXPECT_EQ(range.exit_code, 105);
    EXPECT_EQ(first_line(range.err), "--temperature: must be between 0 and 2, got 5");
}

// Every option's default is in --help, as a value or, where it depends on something else, in words.
TEST_F(RunCli, HelpShowsTheDefaults) {
    const CliResult r = run("run --help");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    test::expect_contains(
        r.out, {"--max-new-tokens INT:POSITIVE=256", "--min-p FLOAT:[0, 1]=0", "--max-num-seqs INT:[1, 4096]=1",
                "(default: generation_config.json's when do_sample, else 0)", "(default: random)",
                "(default: on, as the server's enable_thinking)", "--device TEXT=cpu",
                "(default: the embedded glm-demo model)"});
}

TEST_F(RunCli, StatsLineCountsThePrompt) {
    const CliResult r = run_cmd("-p 'Hello there' --no-think --temperature 0 -n 5 --ignore-eos");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::regex stats(
        R"(megactx run: prompt 12 tokens \(0 cached\), generated 5 tokens, prefill [\d.]+ tok/s, decode [\d.]+ tok/s\n)");
    EXPECT_TRUE(std::regex_match(r.err, stats)) << r.err;
}

}  // namespace
}  // namespace megactx
