// Needle in a haystack: the list flags, the pinned seed mixing (which the training data's generator must
// reproduce), and the samples' contract: deterministic, the needle exactly once at the token depth asked for,
// the prompt exactly the server's GLM-5 rendering, at most L tokens and within one paragraph of L.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "eval/niah.h"
#include "model/gen_tokenizer.h"
#include "test_util.h"

namespace megactx {
namespace {

using niah::Sample;
using niah::SampleGenerator;

// Paragraphs of 6–30 lowercase words (no digits, so the passkey is the only number in a document).
std::vector<std::string> haystack(int n, uint32_t seed) {
    static const std::vector<std::string> words = {"the",   "river",  "bank", "over", "quiet", "stone", "a",    "light",
                                                   "moved", "slowly", "and",  "then", "north", "field", "wind", "of"};
    std::mt19937 rng(seed);
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
        std::string p = "Once";
        const int n_words = 6 + static_cast<int>(rng() % 25);
        for (int w = 0; w < n_words; ++w) p += " " + words[rng() % words.size()];
        out.push_back(p + ".");
    }
    return out;
}

class Niah : public ::testing::Test {
  protected:
    Niah() {
        write_glm_tokenizer(dir_.path().string(), 512);
        tok_ = std::make_unique<Tokenizer>(Tokenizer::load(dir_.path().string()));
    }
    int64_t cost(const std::string& paragraph) const {
        return static_cast<int64_t>(tok_->encode(paragraph + "\n", false).size());
    }
    static size_t count(const std::string& text, const std::string& part) {
        size_t n = 0;
        for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
        return n;
    }
    // The document's parts in order (haystack paragraphs and the needle).
    static std::vector<std::string> parts(const Sample& s) {
        const std::string doc = s.content.substr(0, s.content.size() - niah::kQuestion.size() - 1);
        std::vector<std::string> out;
        size_t pos = 0;
        for (size_t nl; (nl = doc.find('\n', pos)) != std::string::npos; pos = nl + 1)
            out.push_back(doc.substr(pos, nl - pos));
        out.push_back(doc.substr(pos));
        return out;
    }

    test::TempDir dir_;
    std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Niah, LengthsTakeKAndMSuffixes) {
    EXPECT_EQ(niah::parse_lengths("1024,2K, 4k,1M"), (std::vector<int64_t>{1024, 2048, 4096, 1048576}));
    EXPECT_EQ(niah::parse_lengths("300"), (std::vector<int64_t>{300}));
    for (const char* bad : {"1.5K", "4G", "", "1,,2", "K", "-5", "0"}) {
        EXPECT_NE(test::error_of([&] { niah::parse_lengths(bad); }).find("--lengths"), std::string::npos) << bad;
    }
    EXPECT_NE(test::error_of([&] { niah::parse_lengths("1K,1024"); }).find("1024 appears twice"), std::string::npos);
    EXPECT_EQ(niah::length_label(4096), "4K");
    EXPECT_EQ(niah::length_label(1048576), "1M");
    EXPECT_EQ(niah::length_label(3 * 1048576), "3M");
    EXPECT_EQ(niah::length_label(1000), "1000");
    EXPECT_EQ(niah::length_label(1536), "1536");
}

TEST_F(Niah, DepthsAreFractionsOfTheDocument) {
    EXPECT_EQ(niah::parse_depths("0,0.25,0.5,0.75,1"), (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
    for (const char* bad : {"1.5", "-0.1", "x", "0.5x", "", "nan"}) {
        EXPECT_NE(test::error_of([&] { niah::parse_depths(bad); }).find("--depths"), std::string::npos) << bad;
    }
    EXPECT_NE(test::error_of([&] { niah::parse_depths("0.5,0.5001"); }).find("same depth"), std::string::npos);
    EXPECT_EQ(niah::depth_label(0.25), "0.25");
    EXPECT_EQ(niah::depth_label(1.0), "1");
    EXPECT_EQ(niah::depth_label(0.0), "0");
    EXPECT_EQ(niah::depth_label(0.1), "0.1");
}

// Pinned values (docs/demo-model.md): splitmix64 chained over seed, L, round(1000 d), j seeds std::mt19937_64; the
// first draw gives the passkey, the second the start paragraph. Computed independently in Python.
TEST_F(Niah, SeedMixingIsPinned) {
    EXPECT_EQ(niah::sample_seed(0, 1024, 0.5, 0), 3543983709438857387ull);
    EXPECT_EQ(niah::sample_seed(0, 4096, 0.0, 3), 4803823850668599060ull);
    EXPECT_EQ(niah::sample_seed(7, 1048576, 1.0, 1), 3922593705848885851ull);
    EXPECT_EQ(niah::sample_seed(0, 1024, 0.5004, 0), niah::sample_seed(0, 1024, 0.5, 0));  // depth to 1/1000
    const SampleGenerator gen(*tok_, haystack(1000, 1));
    const Sample a = gen.make(1024, 0.5, 0, 0);
    EXPECT_EQ(a.passkey, 157983);
    EXPECT_EQ(a.start_paragraph, 220);
    const Sample b = gen.make(4096, 0.0, 3, 0);
    EXPECT_EQ(b.passkey, 906022);
    EXPECT_EQ(b.start_paragraph, 910);
}

TEST_F(Niah, SamplesAreDeterministic) {
    const SampleGenerator gen(*tok_, haystack(50, 2));
    const Sample a = gen.make(2048, 0.25, 1, 9), b = gen.make(2048, 0.25, 1, 9);
    EXPECT_EQ(a.prompt, b.prompt);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.passkey, b.passkey);
    EXPECT_NE(gen.make(2048, 0.25, 1, 10).prompt, a.prompt);  // another seed
    EXPECT_NE(gen.make(2048, 0.25, 2, 9).prompt, a.prompt);   // another sample index
}

// The prompt is the server's rendering of one user message with thinking off; the document is the haystack's
// paragraphs in order from the start paragraph (wrapping around) with the needle as one more paragraph.
TEST_F(Niah, PromptIsTheChatRenderingOfTheDocumentAndQuestion) {
    const std::vector<std::string> hay = haystack(5, 3);  // short: the document wraps around several times
    const SampleGenerator gen(*tok_, hay);
    const Sample s = gen.make(1024, 0.5, 0, 0);
    const std::string needle = "The passkey is " + std::to_string(s.passkey) + ".";
    EXPECT_EQ(s.prompt, "[gMASK]<sop><|user|>" + s.content + "<|assistant|><think></think>");
    EXPECT_EQ(s.prompt, niah::render_prompt(s.content));
    EXPECT_EQ(s.tokens, tok_->encode(s.prompt, false));
    // Each part ends with its line break and the question follows the last one (no blank line).
    EXPECT_EQ(s.content.substr(s.content.size() - niah::kQuestion.size() - 1), "\n" + std::string(niah::kQuestion));
    EXPECT_NE(s.content[s.content.size() - niah::kQuestion.size() - 2], '\n');
    EXPECT_GE(s.passkey, 10000);
    EXPECT_LE(s.passkey, 999999);
    const std::vector<std::string> p = parts(s);
    ASSERT_EQ(static_cast<int64_t>(p.size()), s.n_paragraphs + 1);
    EXPECT_GT(s.n_paragraphs, 10);
    EXPECT_EQ(p[static_cast<size_t>(s.needle_before)], needle);
    for (int64_t i = 0, k = 0; i < s.n_paragraphs + 1; ++i) {
        if (i == s.needle_before) continue;
        EXPECT_EQ(p[static_cast<size_t>(i)], hay[static_cast<size_t>((s.start_paragraph + k++) % 5)]) << i;
    }
}

// Exactly one needle; the prompt fits in L and a further paragraph would not have; the needle sits at the
// boundary whose token offset is closest to d of the document's tokens.
TEST_F(Niah, NeedleOnceAtTheTokenDepthWithinTheLength) {
    const std::vector<std::string> hay = haystack(300, 4);
    const SampleGenerator gen(*tok_, hay);
    int64_t max_cost = 0;
    for (const auto& p : hay) max_cost = std::max(max_cost, cost(p));
    for (int64_t length : {200, 1000, 4096}) {
        for (double d : {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0}) {
            for (int64_t j = 0; j < 3; ++j) {
                const Sample s = gen.make(length, d, j, 1);
                const std::string at =
                    "L=" + std::to_string(length) + " d=" + std::to_string(d) + " j=" + std::to_string(j);
                EXPECT_EQ(count(s.content, "The passkey is "), 1u) << at;
                EXPECT_EQ(count(s.content, std::to_string(s.passkey)), 1u) << at;
                EXPECT_LE(static_cast<int64_t>(s.tokens.size()), length) << at;
                EXPECT_GT(static_cast<int64_t>(s.tokens.size()), length - max_cost - 4) << at;
                // c_k: tokens of the document's paragraphs before boundary k
                std::vector<int64_t> c = {0};
                const std::vector<std::string> p = parts(s);
                for (int64_t i = 0; i < s.n_paragraphs + 1; ++i)
                    if (i != s.needle_before) c.push_back(c.back() + cost(p[static_cast<size_t>(i)]));
                const double target = d * static_cast<double>(c.back());
                for (const int64_t ci : c) {
                    EXPECT_LE(std::abs(static_cast<double>(c[static_cast<size_t>(s.needle_before)]) - target),
                              std::abs(static_cast<double>(ci) - target) + 1e-9)
                        << at;
                }
                if (d == 0.0) {
                    EXPECT_EQ(s.needle_before, 0) << at;
                }
                if (d == 1.0) {
                    EXPECT_EQ(s.needle_before, s.n_paragraphs) << at;
                }
            }
        }
    }
}

// With paragraphs all the same size the needle's position is monotonic in depth and round(d · n).
TEST_F(Niah, NeedlePositionIsMonotonicInDepth) {
    const SampleGenerator gen(*tok_, std::vector<std::string>(7, "Once the river moved slowly over the quiet stone."));
    double last = -1;
    for (int i = 0; i <= 20; ++i) {
        const double d = i / 20.0;
        const Sample s = gen.make(2048, d, 0, 5);
        ASSERT_GT(s.n_paragraphs, 20);
        const double at = static_cast<double>(s.needle_before) / static_cast<double>(s.n_paragraphs);
        EXPECT_GE(at, last) << d;
        EXPECT_LE(std::abs(at - d), 0.5 / static_cast<double>(s.n_paragraphs) + 1e-9) << d;
        last = at;
        const size_t needle = s.content.find("The passkey is ");
        EXPECT_LE(std::abs(static_cast<double>(needle) / static_cast<double>(s.content.size()) - d), 0.1) << d;
    }
}

TEST_F(Niah, TooShortALengthIsAnError) {
    const SampleGenerator gen(*tok_, haystack(10, 5));
    EXPECT_NE(
        test::error_of([&] { gen.make(16, 0.5, 0, 0); }).find("length 16: the question and the needle alone take"),
        std::string::npos);
}

TEST_F(Niah, ScoringTakesTheFirstRunOfDigits) {
    EXPECT_TRUE(niah::is_correct("The passkey is 123456.", 123456));
    EXPECT_TRUE(niah::is_correct("123456", 123456));
    EXPECT_TRUE(niah::is_correct("passkey: 98765 (not 11111)", 98765));
    EXPECT_FALSE(niah::is_correct("1234567", 123456));  // a longer run is another number
    EXPECT_FALSE(niah::is_correct("0123456", 123456));
    EXPECT_FALSE(niah::is_correct("12 then 123456", 123456));
    EXPECT_FALSE(niah::is_correct("The passkey is", 123456));
    EXPECT_FALSE(niah::is_correct("", 123456));
    EXPECT_EQ(niah::needle_sentence(42), "The passkey is 42.");
}

TEST_F(Niah, HaystackFileIsOneParagraphPerLine) {
    const std::string path = dir_ / "h.txt";
    test::write_text(path, "First paragraph.\r\n\nSecond one.\n\n\nThird");
    EXPECT_EQ(niah::read_haystack(path), (std::vector<std::string>{"First paragraph.", "Second one.", "Third"}));
    test::write_text(path, "\n\n");
    EXPECT_NE(test::error_of([&] { niah::read_haystack(path); }).find("no paragraphs"), std::string::npos);
    EXPECT_NE(test::error_of([&] { niah::read_haystack(dir_ / "none.txt"); }).find("cannot open the haystack"),
              std::string::npos);
}

}  // namespace
}  // namespace megactx
