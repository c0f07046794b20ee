// `megactx grammar maskbench` on a few hand-written MaskBench-style files (the real data is not in the repository):
// instances written as Python's json.dumps writes them, the counts of compiled schemas, compile errors by reason,
// valid instances rejected and invalid ones accepted (which are named), and the summary JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "../../tools/grammar_maskbench.h"
#include "test_util.h"
#include "tokenizer/chat_json.h"

namespace megactx {
namespace {

using json = nlohmann::ordered_json;

// MaskBench writes instances with json.dumps(data, indent=None, ensure_ascii=False): chat::py_json_dumps.
TEST(GrammarMaskbench, InstancesAreWrittenAsPythonJsonDumps) {
    EXPECT_EQ(chat::py_json_dumps(json::parse(R"({"b": [1, 2.0, true, null], "a": {}, "c": []})")),
              R"({"b": [1, 2.0, true, null], "a": {}, "c": []})");
    EXPECT_EQ(chat::py_json_dumps(json::parse(R"("é\n\t\u0001\"\\/")")), "\"é\\n\\t\\u0001\\\"\\\\/\"");
    // Python's float repr: shortest digits; an exponent below 1e-4 and from 1e16, with two digits at least.
    EXPECT_EQ(chat::py_json_dumps(json::parse("[0.1, 1e-05, 0.0001, 1e15, 1e16, 1.5e-7, -0.0, 123.456, 2.5e+300]")),
              "[0.1, 1e-05, 0.0001, 1000000000000000.0, 1e+16, 1.5e-07, -0.0, 123.456, 2.5e+300]");
    EXPECT_EQ(chat::py_json_dumps(json::parse("-12345678901234567")), "-12345678901234567");
}

TEST(GrammarMaskbench, CompileErrorReasonsDropWhereAndValues) {
    EXPECT_EQ(compile_error_reason("json schema: unsupported keyword 'not' (at /properties/a/not)"),
              "unsupported keyword 'not'");
    EXPECT_EQ(compile_error_reason("json schema: $ref \"#/x/y\" names nothing (at /items)"), "$ref \"…\" names nothing");
    EXPECT_EQ(compile_error_reason("json schema: maxLength 100000 is above the 4096 a grammar can spell out (at /m)"),
              "maxLength N is above the N a grammar can spell out");
}

void write(const test::TempDir& dir, const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
}

TEST(GrammarMaskbench, CountsAndNamesTheFailures) {
    test::TempDir data, out;
    // Bounded integer: one valid instance, two invalid ones (out of range, wrong type), and one marked valid that is
    // not (the runner must report it as a valid instance rejected).
    write(data, "a.json", R"({"schema": {"type": "object", "properties": {"days": {"type": "integer", "minimum": 1,
        "maximum": 14}}, "required": ["days"]}, "tests": [{"valid": true, "data": {"days": 3, "note": "x"}},
        {"valid": false, "data": {"days": 15}}, {"valid": false, "data": {"days": "3"}},
        {"valid": true, "data": {"days": 20}}]})");
    // An unsupported keyword: a compile error, counted by its reason.
    write(data, "b.json", R"({"schema": {"type": "object", "dependencies": {"a": ["b"]}},
        "tests": [{"valid": true, "data": {}}]})");
    // "10" is a prefix of allowed numbers: every token is allowed, only the end of sequence refuses it.
    write(data, "c.json", R"({"schema": {"type": "integer", "minimum": 100}, "tests": [{"valid": false, "data": 10},
        {"valid": true, "data": 100}, {"valid": true, "data": 1.5}]})");
    write(data, "d.json", R"({"schema": {"type": "array", "items": {"type": "number"}}, "tests": [
        {"valid": true, "data": [1.0, 1e-05, 2.5]}]})");
    const std::string log = out / "log.txt", summary = out / "s.json", lines = out / "p.jsonl";
    const std::string cmd = std::string(MEGACTX_BIN) + " grammar maskbench --data " + data.path().string() +
                            " --json " + summary + " --per-schema " + lines + " > " + log + " 2>&1";
    const int st = std::system(cmd.c_str());
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    ASSERT_TRUE(WIFEXITED(st)) << text.str();
    EXPECT_EQ(WEXITSTATUS(st), 1) << text.str();  // a valid instance was rejected
    const json j = json::parse(std::ifstream(summary));
    EXPECT_EQ(j["schemas"], 4);
    EXPECT_EQ(j["compiled"], 3);
    EXPECT_EQ(j["compile_errors"], 1);
    EXPECT_EQ(j["compile_errors_top"][0]["reason"], "unsupported keyword 'dependencies'");
    EXPECT_EQ(j["valid_instances"], 5);
    EXPECT_EQ(j["valid_rejected"], 2);  // a.json's {"days": 20} and c.json's 1.5
    EXPECT_EQ(j["invalid_instances"], 3);
    EXPECT_EQ(j["invalid_accepted"], 0);
    EXPECT_EQ(j["invalid_refused_only_at_end"], 1);
    EXPECT_EQ(j["schemas_with_valid_rejected"], 2);
    ASSERT_EQ(j["failures"].size(), 2u);
    EXPECT_EQ(j["failures"][0].get<std::string>().rfind("a.json: test 3 (valid) rejected", 0), 0u) << j["failures"];
    EXPECT_EQ(j["failures"][1].get<std::string>().rfind("c.json: test 2 (valid) rejected", 0), 0u) << j["failures"];
    EXPECT_GT(j["masks"].get<int>(), 10);
    EXPECT_NE(text.str().find("FAIL a.json: test 3"), std::string::npos) << text.str();

    // The per-schema lines of two shards merge into the same counts.
    for (const char* shard : {"0/2", "1/2"}) {
        const std::string c = std::string(MEGACTX_BIN) + " grammar maskbench --data " + data.path().string() +
                              " --shard " + shard + " --per-schema " + out / (std::string(1, shard[0]) + ".jsonl") +
                              " > /dev/null 2>&1";
        ASSERT_TRUE(WIFEXITED(std::system(c.c_str())));
    }
    const std::string merged = out / "m.json";
    std::system((std::string(MEGACTX_BIN) + " grammar maskbench --merge " + out / "0.jsonl" + " " + out / "1.jsonl" +
                 " --json " + merged + " > /dev/null 2>&1")
                    .c_str());
    const json m = json::parse(std::ifstream(merged));
    EXPECT_EQ(m["schemas"], 4);
    EXPECT_EQ(m["valid_rejected"], 2);
    EXPECT_EQ(m["masks"], j["masks"]);
}

}  // namespace
}  // namespace megactx
