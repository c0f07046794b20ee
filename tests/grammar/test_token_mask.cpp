// Token masks: the trie walk gives exactly the tokens whose bytes the matcher reads (checked token by token against
// a copy of the matcher), stop tokens only where the grammar may end, and the matcher left as it was.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace megactx::grammar {
namespace {

// Each token allowed iff a copy of the matcher reads all its bytes; stop tokens iff it accepts.
void expect_mask_exact(const TokenVocab& vocab, Matcher& m) {
    TokenMask mask;
    const size_t pos = m.position();
    vocab.fill_mask(m, mask);
    EXPECT_EQ(m.position(), pos);
    for (size_t id = 0; id < vocab.n_tokens(); ++id) {
        const auto i = static_cast<int32_t>(id);
        bool want;
        if (std::find(vocab.stop_ids().begin(), vocab.stop_ids().end(), i) != vocab.stop_ids().end()) {
            want = m.accepting();
        } else if (vocab.bytes(i).empty()) {
            want = false;
        } else {
            Matcher copy = m;
            want = copy.advance(vocab.bytes(i));
        }
        ASSERT_EQ(mask.allowed(i), want) << "token " << id << " '" << vocab.bytes(i) << "' at byte " << pos;
    }
}

Grammar digits_then_x() {  // root ::= [0-9]{1,3} "x"
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.repeat(b.bytes(ByteSet::range('0', '9')), 1, 3), b.literal("x")});
    return b.finish(root);
}

TEST(TokenMask, SmallVocabularyStepByStep) {
    const std::vector<std::string> bytes = {"", "1", "12", "123", "1234", "x", "1x", "2x", "a", "12x", "<eos>", "9"};
    const TokenVocab vocab(bytes, {10});
    const Grammar g = digits_then_x();
    Matcher m(g);
    TokenMask mask;
    vocab.fill_mask(m, mask);
    EXPECT_EQ(mask.count(), 7);  // 1 12 123 1x 2x 12x 9
    EXPECT_FALSE(mask.allowed(4));
    EXPECT_FALSE(mask.allowed(10));
    ASSERT_TRUE(m.advance("12"));
    vocab.fill_mask(m, mask);
    EXPECT_TRUE(mask.allowed(1));   // 121
    EXPECT_FALSE(mask.allowed(2));  // 1212: four digits
    EXPECT_TRUE(mask.allowed(5));   // x
    EXPECT_TRUE(mask.allowed(6));   // 1x
    EXPECT_FALSE(mask.allowed(9));  // 12x: four digits
    EXPECT_FALSE(mask.allowed(10));
    ASSERT_TRUE(m.advance("x"));
    vocab.fill_mask(m, mask);
    EXPECT_EQ(mask.count(), 1);
    EXPECT_TRUE(mask.allowed(10));  // only the end
}

TEST(TokenMask, StopTokensRejectOutOfRange) { EXPECT_THROW(TokenVocab({"a"}, {3}), GrammarError); }

TEST(TokenMask, RandomVocabulariesMatchTheMatcher) {
    // root ::= ( "ab" | "a" [b-d]* "c" | "{" root "}" )+   over random tokens of the alphabet {a,b,c,d,{,}}
    Builder b;
    const int32_t root = b.rule("root"), item = b.rule("item");
    b.add_alternative(item, {b.literal("ab")});
    b.add_alternative(item, {b.literal("a"), b.repeat(b.bytes(ByteSet::range('b', 'd')), 0, -1), b.literal("c")});
    b.add_alternative(item, {b.literal("{"), Symbol::ref(root), b.literal("}")});
    b.add_alternative(root, {b.repeat(Symbol::ref(item), 1, -1)});
    const Grammar g = b.finish(root);
    std::mt19937 rng(7);
    const std::string alphabet = "abcd{}";
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<std::string> bytes(200);
        for (auto& t : bytes) {
            const int len = 1 + static_cast<int>(rng() % 4);
            for (int i = 0; i < len; ++i) t += alphabet[rng() % alphabet.size()];
        }
        bytes[0] = "";  // an id the vocabulary lacks
        const TokenVocab vocab(bytes, {1});
        Matcher m(g);
        // A random walk through allowed tokens, checking the mask at every step.
        for (int step = 0; step < 12; ++step) {
            expect_mask_exact(vocab, m);
            TokenMask mask;
            vocab.fill_mask(m, mask);
            std::vector<int32_t> ok;
            for (int32_t id = 2; id < 200; ++id)
                if (mask.allowed(id)) ok.push_back(id);
            if (ok.empty()) break;
            ASSERT_TRUE(m.advance(vocab.bytes(ok[rng() % ok.size()])));
        }
    }
}

}  // namespace
}  // namespace megactx::grammar
