#include "engine/constraint.h"

#include "grammar/frontends.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

std::shared_ptr<const grammar::TokenVocab> make_token_vocab(const Tokenizer& tok, const std::vector<int32_t>& stop_ids) {
    std::vector<std::string> bytes(tok.vocab_size());
    for (size_t i = 0; i < bytes.size(); ++i) {
        const auto id = static_cast<int32_t>(i);
        if (!tok.is_special(id)) bytes[i] = tok.token_bytes(id);
    }
    std::vector<int32_t> stop;
    for (const int32_t id : stop_ids)
        if (id >= 0 && static_cast<size_t>(id) < bytes.size() && std::find(stop.begin(), stop.end(), id) == stop.end())
            stop.push_back(id);
    auto vocab = std::make_shared<const grammar::TokenVocab>(bytes, stop);
    warm_json_pieces(*vocab);
    return vocab;
}

void warm_json_pieces(const grammar::TokenVocab& vocab) {
    // Every JSON type, strings with escapes and multi-byte characters, nesting, whitespace; through an untyped and
    // a typed grammar (their strings, numbers and whitespace are the same pieces as any schema's). And a string of
    // bounded length: its character's analysis serves every maxLength (a bound above any token's length, so that
    // no token uses up the analysis's items).
    const std::string text =
        "{\"s\": \"ab c\\u00e9\\n\xC3\xA9\xE4\xB8\xAD\", \"n\": -12.5e3, \"i\": 7, \"b\": true, \"z\": null, "
        "\"a\": [\"x\", 1, {\"k\": \"v\"}]}";
    const std::string schema =
        R"({"type":"object","properties":{"s":{"type":"string"},"n":{"type":"number"},"i":{"type":"integer"},)"
        R"("b":{"type":"boolean"},"z":{"type":"null"},"a":{"type":"array"}},"required":["s","n","i","b","z","a"]})";
    const std::pair<grammar::Grammar, std::string> cases[] = {
        {grammar::json_object_grammar(), text},
        {grammar::compile_json_schema(schema), text},
        {grammar::compile_json_schema(R"({"type":"string","maxLength":1024})"), "\"ab\""},
    };
    for (const auto& [g, t] : cases) {
        grammar::Matcher m(g);
        grammar::MaskCache cache(0);
        grammar::TokenMask mask;
        for (const char c : t) {
            vocab.fill_mask(m, mask, &cache);
            if (!m.advance(static_cast<uint8_t>(c))) throw std::logic_error("warm_json_pieces: the text left the grammar");
        }
    }
}

namespace {

const std::string& bytes_of(const grammar::TokenVocab& v, int32_t t) {
    static const std::string kNone;
    return t >= 0 && static_cast<size_t>(t) < v.n_tokens() ? v.bytes(t) : kNone;
}

}  // namespace

ConstraintState::ConstraintState(std::shared_ptr<const OutputConstraint> c)
    : c_(std::move(c)), matcher_(*c_->grammar), active_(c_->start_after < 0) {}

bool ConstraintState::is_stop(int32_t token) const {
    const auto& s = c_->vocab->stop_ids();
    return std::find(s.begin(), s.end(), token) != s.end();
}

int64_t ConstraintState::mask(float* logits, int64_t vocab, const std::vector<int32_t>& extra) {
    bool active = active_;
    size_t read = 0;  // bytes of `extra` the matcher took, rolled back below
    bool off_grammar = ended_;
    for (const int32_t t : extra) {
        if (off_grammar) break;
        if (!active) {
            active = t == c_->start_after;
            continue;
        }
        const std::string& b = bytes_of(*c_->vocab, t);
        if (is_stop(t) || b.empty() || !matcher_.advance(b)) {
            off_grammar = true;
            break;
        }
        read += b.size();
    }
    int64_t n = -1;
    if (!off_grammar && !active) {
        n = vocab;  // thinking: free
    } else if (!off_grammar) {
        if (!(prepared_ && extra.empty())) c_->vocab->fill_mask(matcher_, mask_, c_->masks.get());
        prepared_ = extra.empty();
        n = mask_.count();
        if (n == 0 && extra.empty()) stuck_ = true;
        if (n > 0) {
            const int64_t limit = std::min<int64_t>(vocab, static_cast<int64_t>(c_->vocab->n_tokens()));
            for (int64_t i = 0; i < limit; ++i)
                if (!mask_.allowed(static_cast<int32_t>(i))) logits[i] = -std::numeric_limits<float>::infinity();
            for (int64_t i = limit; i < vocab; ++i) logits[i] = -std::numeric_limits<float>::infinity();
        }
    }
    matcher_.rollback(read);
    return n;
}

std::string ConstraintState::error() const {
    if (stuck_)
        return fmt::format("structured output: no token of the vocabulary continues the output after {} bytes",
                           matcher_.position());
    return fmt::format("structured output: token {} leaves the grammar after {} bytes", refused_, matcher_.position());
}

const grammar::TokenMask* ConstraintState::ready_mask() const {
    if (!active_ || ended_ || stuck_ || !prepared_ || mask_.count() == 0) return nullptr;
    return &mask_;
}

void ConstraintState::prepare() {
    if (!active_ || ended_ || stuck_ || prepared_) return;
    c_->vocab->fill_mask(matcher_, mask_, c_->masks.get());
    prepared_ = true;
}

bool ConstraintState::accept(int32_t token) {
    refused_ = token;
    prepared_ = false;
    if (stuck_) return false;
    if (ended_) return false;
    if (!active_) {
        active_ = token == c_->start_after;
        return true;
    }
    if (is_stop(token)) {
        ended_ = true;
        return matcher_.accepting();
    }
    const std::string& b = bytes_of(*c_->vocab, token);
    return !b.empty() && matcher_.advance(b);
}

}  // namespace megactx
