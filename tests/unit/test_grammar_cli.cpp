// `megactx grammar check / compile / masks` through the real binary on the embedded model's tokenizer: exit 0 for a
// match, 1 naming the first token refused, 2 for a grammar that does not compile; masks as JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util.h"

namespace megactx {
namespace {

struct CliRun {
    int exit_code = -1;
    std::string output;
};

CliRun grammar(const std::string& args) {
    test::TempDir dir;
    const std::string log = (dir.path() / "out.txt").string();
    const int st = std::system((std::string(MEGACTX_BIN) + " grammar " + args + " > '" + log + "' 2>&1").c_str());
    CliRun r;
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::ifstream in(log);
    std::ostringstream s;
    s << in.rdbuf();
    r.output = s.str();
    return r;
}

std::string write(const test::TempDir& dir, const std::string& name, const std::string& text) {
    const std::string path = (dir.path() / name).string();
    std::ofstream(path) << text;
    return path;
}

TEST(GrammarCli, CheckMatchesThroughTheTokenMasks) {
    test::TempDir dir;
    const std::string schema = write(dir, "s.json", R"({"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "days"],
        "additionalProperties": false})");
    const CliRun ok = grammar("check --json-schema " + schema + " --text '{\"city\": \"Oslo\", \"days\": 3}'");
    EXPECT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_NE(ok.output.find("match:"), std::string::npos) << ok.output;
    const CliRun too_many_days = grammar("check --json-schema " + schema + " --text '{\"city\": \"Oslo\", \"days\": 15}'");
    EXPECT_EQ(too_many_days.exit_code, 1) << too_many_days.output;
    EXPECT_NE(too_many_days.output.find("no match: token"), std::string::npos) << too_many_days.output;
    const CliRun extra = grammar("check --json-schema " + schema + " --text '{\"city\": \"Oslo\", \"days\": 3, \"x\": 1}'");
    EXPECT_EQ(extra.exit_code, 1) << extra.output;
    const CliRun cut = grammar("check --json-schema " + schema + " --text '{\"city\": \"Oslo\"'");
    EXPECT_EQ(cut.exit_code, 1) << cut.output;
    EXPECT_NE(cut.output.find("ends where the grammar does not"), std::string::npos) << cut.output;
}

TEST(GrammarCli, RegexChoiceGbnfAndBytes) {
    test::TempDir dir;
    EXPECT_EQ(grammar("check --regex '[0-9]{3}-[a-z]+' --text 123-abc").exit_code, 0);
    EXPECT_EQ(grammar("check --regex '[0-9]{3}-[a-z]+' --text 12-abc").exit_code, 1);
    EXPECT_EQ(grammar("check --choice red --choice green --text green").exit_code, 0);
    EXPECT_EQ(grammar("check --choice red --choice green --text blue").exit_code, 1);
    const std::string g = write(dir, "g.gbnf", "root ::= item (\",\" item)*\nitem ::= [a-z]+ # a word\n");
    EXPECT_EQ(grammar("check --grammar " + g + " --text abc,de --bytes").exit_code, 0);
    const CliRun bad_byte = grammar("check --grammar " + g + " --text abc,,de --bytes");
    EXPECT_EQ(bad_byte.exit_code, 1);
    EXPECT_NE(bad_byte.output.find("byte 4"), std::string::npos) << bad_byte.output;
}

TEST(GrammarCli, BadGrammarsExitTwoWithTheReason) {
    test::TempDir dir;
    const CliRun re = grammar("check --regex '(a' --text a");
    EXPECT_EQ(re.exit_code, 2) << re.output;
    const std::string g = write(dir, "g.gbnf", "root ::= undefined-rule\n");
    const CliRun gb = grammar("check --grammar " + g + " --text a");
    EXPECT_EQ(gb.exit_code, 2) << gb.output;
    EXPECT_NE(gb.output.find("undefined-rule"), std::string::npos) << gb.output;
    const std::string s = write(dir, "s.json", R"({"type": "integer", "multipleOf": 3})");
    const CliRun js = grammar("compile --json-schema " + s);
    EXPECT_EQ(js.exit_code, 2) << js.output;
    EXPECT_NE(js.output.find("multipleOf"), std::string::npos) << js.output;
    EXPECT_EQ(grammar("check --text a").exit_code, 2);  // no grammar given
}

TEST(GrammarCli, CompileReportsSizeAndMaskTime) {
    const CliRun r = grammar("compile --regex '[a-z]{2,5}' --print");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("rules "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("first mask"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("root ::="), std::string::npos) << r.output;
}

// Whether the ranges [[lo, hi], ...] hold `id`.
bool in_ranges(const nlohmann::json& ranges, int64_t id) {
    for (const auto& r : ranges)
        if (r[0].get<int64_t>() <= id && id <= r[1].get<int64_t>()) return true;
    return false;
}

TEST(GrammarCli, MasksAlongATextOverTheVocabulary) {
    const CliRun v = grammar("masks --vocab");
    ASSERT_EQ(v.exit_code, 0) << v.output;
    const auto vocab = nlohmann::json::parse(v.output);
    const auto& tokens = vocab["tokens"];
    ASSERT_EQ(tokens.size(), vocab["n_tokens"].get<size_t>());
    ASSERT_EQ(vocab["stop_ids"].size(), 1u);
    const int64_t eos = vocab["stop_ids"][0];
    EXPECT_EQ(tokens[static_cast<size_t>(eos)], "");  // special: no bytes
    EXPECT_EQ(tokens[97], "61");                      // "a"

    const CliRun r = grammar("masks --regex 'ab|ac' --text ab");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto out = nlohmann::json::parse(r.output);
    const auto& ids = out["ids"];
    const auto& masks = out["masks"];
    ASSERT_EQ(masks.size(), ids.size() + 1);
    EXPECT_EQ(out["refused"], -1);
    EXPECT_TRUE(out["accepting"].get<bool>());
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(in_ranges(masks[i], ids[i])) << i;
    // Every token allowed first spells "a", "ab" or "ac"; after the whole text, only the end of sequence.
    int64_t n_first = 0;
    for (int64_t id = 0; id < vocab["n_tokens"].get<int64_t>(); ++id) {
        if (!in_ranges(masks[0], id)) continue;
        const std::string hex = tokens[static_cast<size_t>(id)];
        EXPECT_TRUE(hex == "61" || hex == "6162" || hex == "6163") << id << " " << hex;
        ++n_first;
    }
    EXPECT_GE(n_first, 1);
    EXPECT_EQ(masks.back(), nlohmann::json::parse("[[" + std::to_string(eos) + "," + std::to_string(eos) + "]]"));
}

TEST(GrammarCli, MasksOfManyTextsStopAtARefusedToken) {
    test::TempDir dir;
    const std::string jsonl = write(dir, "t.jsonl", "\"123\"\n\"12x\"\n");
    const CliRun r = grammar("masks --regex '[0-9]+' --jsonl " + jsonl);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    std::istringstream lines(r.output);
    std::string first, second;
    ASSERT_TRUE(std::getline(lines, first) && std::getline(lines, second)) << r.output;
    EXPECT_EQ(nlohmann::json::parse(first)["refused"], -1);
    const auto refused = nlohmann::json::parse(second);
    const int64_t at = refused["refused"];
    ASSERT_GE(at, 0);
    EXPECT_EQ(refused["masks"].size(), static_cast<size_t>(at) + 1);  // the masks stop at the refused token
    EXPECT_FALSE(in_ranges(refused["masks"].back(), refused["ids"][static_cast<size_t>(at)]));
    EXPECT_FALSE(refused["accepting"].get<bool>());
}

}  // namespace
}  // namespace megactx
