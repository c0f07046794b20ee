// Structured outputs in the engine: a grammar's masks over a fixture model's logits. Sampled outputs always match
// the grammar and end where it may end; a constraint may start after a given token (thinking); a grammar the
// vocabulary cannot continue ends the request with an error while the engine keeps serving.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_ops.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace megactx {
namespace {

const std::string kFixture = "freq_offset_f32";  // vocabulary 256, EOS 1
constexpr int32_t kEos = 1;

// Token 0 absent, 1 the end, 2..13 the single characters of "0123456789,-", the rest random strings of 1-3 of them.
std::vector<std::string> vocab_bytes() {
    const std::string alphabet = "0123456789,-";
    std::vector<std::string> v(256);
    v[1] = "<eos>";
    for (size_t i = 0; i < alphabet.size(); ++i) v[2 + i] = std::string(1, alphabet[i]);
    std::mt19937 rng(3);
    for (size_t i = 2 + alphabet.size(); i < v.size(); ++i) {
        const int len = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < len; ++k) v[i] += alphabet[rng() % alphabet.size()];
    }
    return v;
}

// root ::= num ("," num){0,3}   num ::= "-"? [0-9]{1,4}
std::shared_ptr<const grammar::Grammar> numbers_grammar() {
    grammar::Builder b;
    const int32_t root = b.rule("root"), num = b.rule("num");
    b.add_alternative(num, {b.optional(b.literal("-")), b.repeat(b.bytes(grammar::ByteSet::range('0', '9')), 1, 4)});
    b.add_alternative(root, {grammar::Symbol::ref(num), b.repeat(b.seq({b.literal(","), grammar::Symbol::ref(num)}), 0, 3)});
    return std::make_shared<const grammar::Grammar>(b.finish(root));
}

struct Result {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    std::string error;
};

struct Harness {
    GlmDsaModel model{test::fixture_dir(kFixture)};
    CpuOps ops;
    std::map<int64_t, Result> out;
    std::shared_ptr<const grammar::TokenVocab> vocab =
        std::make_shared<const grammar::TokenVocab>(vocab_bytes(), std::vector<int32_t>{kEos});

    TokenSink sink() {
        return [this](const TokenEvent& ev) {
            Result& r = out[ev.request_id];
            if (ev.token >= 0) r.tokens.push_back(ev.token);
            if (ev.finish != FinishReason::kNone) {
                r.finish = ev.finish;
                r.error = ev.error;
            }
            return true;
        };
    }
    std::string text(const std::vector<int32_t>& toks, size_t from = 0) const {
        std::string s;
        for (size_t i = from; i < toks.size(); ++i)
            if (toks[i] != kEos) s += vocab->bytes(toks[i]);
        return s;
    }
};

GenerationParams constrained(std::shared_ptr<const OutputConstraint> c, float temperature, uint64_t seed) {
    GenerationParams g;
    g.max_tokens = 40;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.constraint = std::move(c);
    return g;
}

class ConstraintCached : public ::testing::TestWithParam<bool> {};

TEST_P(ConstraintCached, SampledOutputsMatchTheGrammarAndEndWhereItMayEnd) {
    Harness h;
    auto c = std::make_shared<OutputConstraint>();
    c->grammar = numbers_grammar();
    c->vocab = h.vocab;
    if (GetParam()) c->masks = std::make_shared<grammar::MaskCache>(8);  // small: evictions happen
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    Engine e(h.model, h.ops, cfg);
    std::vector<int64_t> ids;
    for (uint64_t seed = 0; seed < 12; ++seed)  // sampled and greedy requests in one batch, with free ones beside
        ids.push_back(e.submit({5, 9, 17, 33, static_cast<int32_t>(40 + seed)},
                               constrained(c, seed % 3 ? 1.0f : 0.0f, seed), h.sink()));
    GenerationParams free_params;
    free_params.max_tokens = 10;
    free_params.ignore_eos = true;
    const int64_t free_id = e.submit({5, 9, 17}, free_params, h.sink());
    while (e.step()) {
    }
    int n_stopped = 0;
    for (const int64_t id : ids) {
        const Result& r = h.out[id];
        const std::string s = h.text(r.tokens);
        EXPECT_TRUE(grammar::matches(*c->grammar, s) || r.finish == FinishReason::kLength) << "'" << s << "'";
        if (r.finish == FinishReason::kStop) {
            ++n_stopped;
            EXPECT_EQ(r.tokens.back(), kEos);
            EXPECT_TRUE(grammar::matches(*c->grammar, s)) << "'" << s << "'";
        } else {
            EXPECT_EQ(r.finish, FinishReason::kLength);
            grammar::Matcher m(*c->grammar);
            EXPECT_TRUE(m.advance(s)) << "'" << s << "' is not even a prefix";
        }
    }
    EXPECT_GT(n_stopped, 0);
    EXPECT_EQ(h.out[free_id].tokens.size(), 10u);  // the free request beside them is not constrained
}

INSTANTIATE_TEST_SUITE_P(MaskCache, ConstraintCached, ::testing::Bool());

TEST(Constraint, SpeculativeGreedyEqualsPlainGreedy) {
    // The MTP drafts are drawn from masked rows and each verification row is masked after the drafts before it:
    // at temperature 0 the tokens are plain constrained decoding's.
    Harness h;
    ASSERT_TRUE(h.model.has_mtp());
    auto c = std::make_shared<OutputConstraint>();
    c->grammar = numbers_grammar();
    c->vocab = h.vocab;
    std::vector<std::vector<int32_t>> runs;
    for (const int64_t k : {0, 1, 3}) {
        EngineConfig cfg;
        cfg.n_kv_blocks = 64;
        cfg.speculative_tokens = k;
        Engine e(h.model, h.ops, cfg);
        std::vector<int64_t> ids;
        for (int32_t i = 0; i < 4; ++i) ids.push_back(e.submit({5, 9, 17, 40 + i}, constrained(c, 0.0f, 0), h.sink()));
        while (e.step()) {
        }
        std::vector<int32_t> all;
        for (const int64_t id : ids) {
            const Result& r = h.out[id];
            EXPECT_NE(r.finish, FinishReason::kError) << r.error;
            all.insert(all.end(), r.tokens.begin(), r.tokens.end());
            all.push_back(-1);
        }
        h.out.clear();
        runs.push_back(all);
    }
    EXPECT_EQ(runs[0], runs[1]);
    EXPECT_EQ(runs[0], runs[2]);
}

TEST(Constraint, GreedyMasksOnTheBackendEqualMasksOnTheHost) {
    // A greedy constrained row without log-probabilities is masked on the backend (Ops::mask_rows) and decided by
    // the backend's argmax; asking for log-probabilities brings its logits to the host and masks them there. The
    // tokens are the same, and a free greedy request beside them decodes as it does alone.
    Harness h;
    auto c = std::make_shared<OutputConstraint>();
    c->grammar = numbers_grammar();
    c->vocab = h.vocab;
    GenerationParams free_params;
    free_params.max_tokens = 12;
    free_params.ignore_eos = true;
    const auto run = [&](int64_t top_logprobs, bool with_free, bool with_sampled) {
        EngineConfig cfg;
        cfg.n_kv_blocks = 64;
        Engine e(h.model, h.ops, cfg);
        std::vector<int64_t> ids;
        for (int32_t i = 0; i < 4; ++i) {
            GenerationParams g = constrained(c, 0.0f, 0);
            g.top_logprobs = top_logprobs;
            ids.push_back(e.submit({5, 9, 17, 40 + i}, g, h.sink()));
        }
        if (with_free) ids.push_back(e.submit({5, 9, 17}, free_params, h.sink()));
        if (with_sampled) e.submit({5, 9, 18}, constrained(c, 1.0f, 7), h.sink());
        while (e.step()) {
        }
        std::vector<std::vector<int32_t>> toks;
        for (const int64_t id : ids) {
            EXPECT_NE(h.out[id].finish, FinishReason::kError) << h.out[id].error;
            toks.push_back(h.out[id].tokens);
        }
        h.out.clear();
        return toks;
    };
    const auto host = run(0, false, false), device = run(-1, false, false);
    EXPECT_EQ(device, host);
    const auto mixed = run(-1, true, true);
    ASSERT_EQ(mixed.size(), 5u);
    EXPECT_EQ(std::vector<std::vector<int32_t>>(mixed.begin(), mixed.begin() + 4), host);
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    Engine alone(h.model, h.ops, cfg);
    const int64_t id = alone.submit({5, 9, 17}, free_params, h.sink());
    while (alone.step()) {
    }
    EXPECT_EQ(mixed[4], h.out[id].tokens);
    EXPECT_EQ(mixed[4].size(), 12u);
}

TEST(Constraint, StartsAfterTheGivenToken) {
    Harness h;
    auto c = std::make_shared<OutputConstraint>();
    c->grammar = numbers_grammar();
    c->vocab = h.vocab;
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    // Free until the model emits the start token; greedy without a constraint tells which token comes first.
    Engine probe(h.model, h.ops, cfg);
    GenerationParams free_params;
    free_params.max_tokens = 1;
    free_params.ignore_eos = true;
    const int64_t pid = probe.submit({5, 9, 17}, free_params, h.sink());
    while (probe.step()) {
    }
    c->start_after = h.out[pid].tokens.at(0);
    h.out.clear();
    Engine e(h.model, h.ops, cfg);  // greedy: the same first token, then the grammar
    const int64_t id = e.submit({5, 9, 17}, constrained(c, 0.0f, 0), h.sink());
    while (e.step()) {
    }
    const Result& r = h.out[id];
    ASSERT_GE(r.tokens.size(), 2u);
    EXPECT_EQ(r.tokens[0], c->start_after);  // the first token was free
    ASSERT_TRUE(r.finish == FinishReason::kStop || r.finish == FinishReason::kLength) << r.error;
    if (r.finish == FinishReason::kStop) {
        EXPECT_TRUE(grammar::matches(*c->grammar, h.text(r.tokens, 1)));
    } else {
        grammar::Matcher m(*c->grammar);
        EXPECT_TRUE(m.advance(h.text(r.tokens, 1))) << h.text(r.tokens, 1);
    }
}

TEST(Constraint, AGrammarTheVocabularyCannotContinueIsTheRequestsError) {
    Harness h;
    grammar::Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.literal("12x")});  // no token holds 'x'
    auto c = std::make_shared<OutputConstraint>();
    c->grammar = std::make_shared<const grammar::Grammar>(b.finish(root));
    c->vocab = h.vocab;
    EngineConfig cfg;
    cfg.n_kv_blocks = 64;
    Engine e(h.model, h.ops, cfg);
    const int64_t bad = e.submit({5, 9, 17}, constrained(c, 1.0f, 1), h.sink());
    GenerationParams free_params;
    free_params.max_tokens = 6;
    free_params.ignore_eos = true;
    const int64_t good = e.submit({5, 9, 18}, free_params, h.sink());
    while (e.step()) {
    }
    EXPECT_EQ(h.out[bad].finish, FinishReason::kError);
    EXPECT_NE(h.out[bad].error.find("no token of the vocabulary continues"), std::string::npos) << h.out[bad].error;
    EXPECT_EQ(h.text(h.out[bad].tokens), "12");  // "1" then "2" (or "12"): then nothing continues
    EXPECT_EQ(h.out[good].tokens.size(), 6u);  // the engine kept serving
}

}  // namespace
}  // namespace megactx
