// Facts in a document (`megactx eval facts`): retrieval asked in words, not a template. A document built from a
// haystack (as `eval niah` builds it) holds several facts — an entity, an attribute, a value — written in sentence
// frames of many kinds; one is asked about in a question frame, the others are distractors that share a word with
// it (the same entity with another attribute, or the same attribute of an entity with the same noun). Values are
// numbers of 3–9 digits, words, names, dates or codes. Absent samples leave the asked fact out: the right answer is
// the refusal "The document does not say."
//
// Two disjoint splits of the entity words (curated, and coined from syllables: an open vocabulary), attributes,
// sentence frames, question frames and value kinds: `kTrain`
// for training data, `kHeldOut` (the default of `eval facts`) for measuring retrieval as a skill. The format is
// specified in docs/demo-model.md ("Facts format"); the training data comes from this generator
// (`megactx eval facts --write-jsonl`), so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eval/niah.h"
#include "tokenizer/tokenizer.h"

namespace megactx::facts {

enum class Split { kTrain, kHeldOut };

inline constexpr std::string_view kRefusal = "The document does not say.";
inline constexpr int64_t kMaxNewTokens = 40;
inline constexpr int64_t kDistractors = 3;

struct Fact {
    std::string entity;     // "the northern archive"
    std::string attribute;  // "access code"
    std::string value;      // "K7Q-2931"
    std::string kind;       // number | word | name | date | code
    std::string sentence;   // the fact in one of the split's sentence frames
};

// The vocabulary and frames of a split (for tests and docs). An entity's first word is one of `adjectives` or, as
// often, one of `coined`: words made of syllables (2,000 for training, 500 held out, disjoint), so that the key
// vocabulary is open — a model cannot answer from keys it remembers, only by matching the question's words to the
// document's.
struct SplitVocabulary {
    std::vector<std::string> adjectives, nouns, attributes, sentence_frames, question_frames, kinds, coined;
};
const SplitVocabulary& vocabulary(Split split);

class FactsGenerator {
  public:
    FactsGenerator(const Tokenizer& tokenizer, std::vector<std::string> paragraphs, Split split);
    // A sample of cell (length, depth): the asked fact's sentence at the paragraph boundary nearest the depth, the
    // distractors at random boundaries, the question last. max_tokens > 0 caps the prompt below `length`.
    niah::Sample make(int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens, bool absent) const;
    Split split() const { return split_; }

  private:
    const Tokenizer& tok_;
    std::vector<std::string> paragraphs_;
    std::vector<int64_t> cost_;  // tokens of paragraph + "\n"
    Split split_;
};

// Absent: the output says the document does not say (case-insensitive). Otherwise the output holds the value,
// compared case-insensitively with runs of spaces as one.
bool is_correct(std::string_view output, const niah::Sample& s);

// The task run_grid evaluates (the generator must outlive it).
niah::Task task(const FactsGenerator& gen);

}  // namespace megactx::facts
