// `eval facts`: the two splits share no frame, key word or held-out value kind; samples are deterministic, hold the
// asked fact once at the depth asked for among distractors that share a word with it, or leave it out when absent;
// the judge; and the command end to end on a random tiny model (its accuracy is about 0: only the mechanics, the
// JSON and the training lines are checked), with bad flags as clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_run.h"
#include "eval/facts.h"
#include "model/gen_tokenizer.h"
#include "test_util.h"

namespace megactx {
namespace {

using facts::Split;
using json = nlohmann::json;
using test::CliResult;
using test::shell_quoted;

std::vector<std::string> haystack() {
    static const char* words[] = {"the", "river", "bank", "over", "quiet", "stone", "a", "light", "moved", "north"};
    std::vector<std::string> out;
    for (int i = 0; i < 60; ++i) {
        std::string p = "Once";
        for (int w = 0; w < 5 + i % 9; ++w) p += std::string(" ") + words[(i * 7 + w * 3) % 10];
        out.push_back(p + ".");
    }
    return out;
}

size_t count(const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
}

// The frame's literal pieces (between its {E} {A} {V} slots) appear in `text` in order, case aside.
bool fits_frame(const std::string& text, const std::string& frame) {
    std::string lower;
    for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t at = 0, i = 0;
    while (i < frame.size()) {
        const size_t slot = frame.find('{', i);
        std::string piece = frame.substr(i, slot == std::string::npos ? std::string::npos : slot - i);
        for (char& c : piece) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (!piece.empty()) {
            const size_t found = lower.find(piece, at);
            if (found == std::string::npos) return false;
            at = found + piece.size();
        }
        if (slot == std::string::npos) break;
        i = slot + 3;
    }
    return true;
}

TEST(FactsVocabulary, SplitsShareNoFrameOrKeyWord) {
    const facts::SplitVocabulary& a = facts::vocabulary(Split::kTrain);
    const facts::SplitVocabulary& b = facts::vocabulary(Split::kHeldOut);
    const auto disjoint = [](const std::vector<std::string>& x, const std::vector<std::string>& y, const char* what) {
        for (const std::string& s : x) EXPECT_EQ(std::count(y.begin(), y.end(), s), 0) << what << ": " << s;
    };
    disjoint(a.adjectives, b.adjectives, "adjective");
    disjoint(a.nouns, b.nouns, "noun");
    disjoint(a.attributes, b.attributes, "attribute");
    disjoint(a.sentence_frames, b.sentence_frames, "sentence frame");
    disjoint(a.question_frames, b.question_frames, "question frame");
    // coined entity words: an open vocabulary, disjoint between the splits and from the curated words
    EXPECT_EQ(a.coined.size(), 2000u);
    EXPECT_EQ(b.coined.size(), 500u);
    disjoint(a.coined, b.coined, "coined word");
    for (const auto* v : {&a, &b}) {
        disjoint(a.coined, v->adjectives, "coined word");
        disjoint(b.coined, v->nouns, "coined word");
        EXPECT_EQ(std::set<std::string>(v->coined.begin(), v->coined.end()).size(), v->coined.size());
    }
    // a value kind the training split never sees
    EXPECT_TRUE(std::any_of(b.kinds.begin(), b.kinds.end(), [&](const std::string& k) {
        return std::count(a.kinds.begin(), a.kinds.end(), k) == 0;
    }));
}

class Facts : public ::testing::Test {
  protected:
    Facts() {
        write_glm_tokenizer(dir_.path().string(), 512);
        tok_ = std::make_unique<Tokenizer>(Tokenizer::load(dir_.path().string()));
    }
    test::TempDir dir_;
    std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Facts, SamplesHoldTheAskedFactOnceAmongDistractors) {
    for (Split split : {Split::kTrain, Split::kHeldOut}) {
        const facts::FactsGenerator gen(*tok_, haystack(), split);
        const facts::SplitVocabulary& v = facts::vocabulary(split);
        std::set<std::string> values;
        int64_t coined = 0;
        for (int64_t j = 0; j < 24; ++j) {
            const double depth = static_cast<double>(j % 5) / 4.0;
            const niah::Sample s = gen.make(1024, depth, j, 7, 0, false);
            const niah::Sample again = gen.make(1024, depth, j, 7, 0, false);
            EXPECT_EQ(s.content, again.content);
            EXPECT_EQ(s.prompt, niah::render_prompt(s.content));
            EXPECT_LE(s.tokens.size(), 1024u);
            EXPECT_GT(s.tokens.size(), 900u);  // filled to within a paragraph or two
            EXPECT_FALSE(s.absent);
            EXPECT_EQ(count(s.content, s.answer), 1u) << s.content;
            EXPECT_NE(s.reference.find(s.answer), std::string::npos);
            // the asked entity's first word is the split's: curated or coined
            const size_t of = s.reference.find(" of the ");
            ASSERT_NE(of, std::string::npos) << s.reference;
            const std::string first = s.reference.substr(of + 8, s.reference.find(' ', of + 8) - of - 8);
            EXPECT_TRUE(std::count(v.adjectives.begin(), v.adjectives.end(), first) +
                            std::count(v.coined.begin(), v.coined.end(), first) ==
                        1)
                << first;
            coined += std::count(v.coined.begin(), v.coined.end(), first);
            values.insert(s.answer);
            // The question comes last, in one of the split's frames (its words around the key).
            const std::string question = s.content.substr(s.content.rfind('\n') + 1);
            EXPECT_TRUE(std::any_of(v.question_frames.begin(), v.question_frames.end(), [&](const std::string& f) {
                return fits_frame(question, f);
            })) << question;
            // The asked fact's line sits at round(depth · n) paragraphs into the document.
            std::istringstream lines(s.content);
            int64_t paragraphs_before = 0;
            bool found = false;
            for (std::string line; std::getline(lines, line);) {
                if (line.find(s.answer) != std::string::npos) {
                    found = true;
                    break;
                }
                paragraphs_before += line.rfind("Once", 0) == 0;
            }
            ASSERT_TRUE(found);
            EXPECT_EQ(paragraphs_before, s.needle_before) << "depth " << depth;
            EXPECT_EQ(s.needle_before, std::llround(depth * static_cast<double>(s.n_paragraphs)));
            const niah::Sample absent = gen.make(1024, depth, j, 7, 0, true);
            EXPECT_TRUE(absent.absent);
            EXPECT_EQ(absent.answer, std::string(facts::kRefusal));
            EXPECT_EQ(count(absent.content, s.answer), 0u);
        }
        EXPECT_GT(values.size(), 20u);
        EXPECT_GT(coined, 4) << "coined entity words are as common as curated ones";
        EXPECT_LT(coined, 20);
    }
    const facts::FactsGenerator gen(*tok_, haystack(), Split::kHeldOut);
    EXPECT_NE(test::error_of([&] { gen.make(20, 0.5, 0, 0, 0, false); })
                  .find("length 20: the question and the facts alone take"),
              std::string::npos);
}

TEST(FactsJudge, ValuesAndRefusals) {
    niah::Sample s;
    s.answer = "Mira  Okafor";
    EXPECT_TRUE(facts::is_correct("The owner of the old mill is mira okafor.", s));
    EXPECT_FALSE(facts::is_correct("The owner of the old mill is Mira.", s));
    s.answer = "K7Q-2931";
    EXPECT_TRUE(facts::is_correct("k7q-2931", s));
    EXPECT_FALSE(facts::is_correct("K7Q-2932", s));
    s.absent = true;
    s.answer = std::string(facts::kRefusal);
    EXPECT_TRUE(facts::is_correct("The document does not say.", s));
    EXPECT_FALSE(facts::is_correct("The code is 1234.", s));
}

class FactsCli : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = dir_ / "model";
        const CliResult r = run("gen-model --preset tiny --seed 0 --out " + shell_quoted(model_));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        std::string text;
        for (const std::string& p : haystack()) text += p + "\n";
        test::write_text(model_ + "/haystack.txt", text);
    }
    CliResult run(const std::string& args) { return test::run_megactx(dir_, args); }
    test::TempDir dir_;
    std::string model_;
};

TEST_F(FactsCli, RunsTheGridWritesTrainingLinesAndRejectsBadFlags) {
    const std::string out = dir_ / "facts.json";
    CliResult r = run("eval facts --model " + shell_quoted(model_) + " --lengths 256 --depths 0,1 --samples 2 " +
                      "--absent 1 --seed 4 --out " + shell_quoted(out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("absent facts refused"), std::string::npos) << r.out;
    const json j = json::parse(test::read_text(out));
    EXPECT_EQ(j["task"], "facts");
    EXPECT_EQ(j["split"], "held-out");
    EXPECT_EQ(j["max_new_tokens"], facts::kMaxNewTokens);
    ASSERT_EQ(j["results"].size(), 6u);  // 2 cells × (2 + 1)
    EXPECT_EQ(j["absent"]["total"], 2);
    int64_t absent = 0;
    for (const json& s : j["results"]) absent += s["absent"].get<bool>();
    EXPECT_EQ(absent, 2);
    for (const json& c : j["cells"]) EXPECT_EQ(c["total"], 2);

    const std::string lines = dir_ / "train.jsonl";
    r = run("eval facts --model " + shell_quoted(model_) + " --in-distribution --lengths 256,512 --depths 0.5 " +
            "--samples 3 --absent 1 --write-jsonl " + shell_quoted(lines));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream in(test::read_text(lines));
    int64_t n = 0;
    for (std::string line; std::getline(in, line); ++n) {
        const json s = json::parse(line);
        EXPECT_NE(s["prompt"].get<std::string>().find(s["content"].get<std::string>()), std::string::npos);
        if (!s["absent"].get<bool>()) {
            EXPECT_NE(s["content"].get<std::string>().find(s["answer"].get<std::string>()), std::string::npos);
        }
        EXPECT_LE(s["prompt_tokens"].get<int64_t>(), s["length"].get<int64_t>());
    }
    EXPECT_EQ(n, 8);  // 2 lengths × 1 depth × (3 + 1)

    for (const auto& [args, part] : std::vector<std::pair<std::string, std::string>>{
             {"--absent -1", "--absent"}, {"--lengths 12x", "--lengths"}, {"--depths 2", "--depths"},
             {"--lengths 20", "length 20: the question and the facts alone take"}}) {
        r = run("eval facts --model " + shell_quoted(model_) + " " + args);
        EXPECT_NE(r.exit_code, 0) << args;
        EXPECT_NE(r.err.find(part), std::string::npos) << args << ": " << r.err;
    }
    r = run("eval niah --model " + shell_quoted(model_) + " --absent 1");
    EXPECT_NE(r.exit_code, 0);  // a facts flag
}

}  // namespace
}  // namespace megactx
