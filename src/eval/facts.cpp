#include "eval/facts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <random>
#include <set>

#include "core/error.h"

namespace megactx::facts {

namespace {

// Frames: {E} the entity, {A} the attribute, {V} the value; a leading {E} or {A} is capitalised.
const SplitVocabulary kTrain = {
    {"northern", "silver", "old", "eastern", "hidden", "central", "little", "green", "western", "quiet", "royal",
     "upper", "bright", "lower", "frozen", "golden", "southern", "broken", "first", "grand", "iron", "wooden",
     "red", "outer"},
    {"archive", "vault", "harbour", "library", "station", "tower", "garden", "museum", "bridge", "factory",
     "school", "theatre", "market", "observatory", "bakery", "chapel", "warehouse", "clinic", "mill", "lighthouse",
     "castle", "depot", "workshop", "gallery"},
    {"access code", "budget", "opening year", "owner", "serial number", "password", "room number", "director",
     "colour", "capacity", "head cook", "phone extension", "founder", "inspection date", "lucky number", "motto word",
     "supplier", "postal code", "ticket price", "guard", "alarm code", "inventory id", "chief engineer", "rank"},
    {"The {A} of {E} is {V}.", "{E}'s {A} is {V}.", "{A} of {E}: {V}", "Note that {E} has the {A} {V}.",
     "- {E} / {A}: {V}", "| {E} | {A} | {V} |", "For the record, the {A} for {E} was set to {V}."},
    {"What is the {A} of {E}?", "Tell me the {A} of {E}.", "What {A} does {E} have?",
     "According to the document, what is {E}'s {A}?"},
    {"number", "word", "name", "code"},
    {},
};

const SplitVocabulary kHeldOut = {
    {"misty", "crimson", "hollow", "amber", "distant", "sunken", "scarlet", "copper", "windy", "marble", "ancient",
     "narrow"},
    {"monastery", "quarry", "aquarium", "stadium", "orchard", "embassy", "foundry", "pavilion", "citadel", "canal",
     "brewery", "arsenal"},
    {"secret number", "vault code", "treasurer", "launch date", "badge number", "keeper", "radio channel",
     "storage code", "mascot", "licence number", "curfew hour", "patron"},
    {"Remember: the {A} of {E} is {V}.", "{E} — {A}: {V}.", "According to the records, {E}'s {A} equals {V}.",
     "Key fact: {A} ({E}) = {V}."},
    {"Which {A} belongs to {E}?", "Look up the {A} of {E}.", "I need {E}'s {A}. What is it?"},
    {"date", "number", "code"},
    {},
};

// Words coined from syllables for one split: the same syllables, disjoint words (a word's FNV-1a hash decides its
// split, one in five held out), none of them a curated word.
std::vector<std::string> coined_words(Split split, size_t count, const SplitVocabulary& a, const SplitVocabulary& b) {
    static const char* const kOnsets[] = {"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
                                          "br", "dr", "gl", "kr", "pl", "st", "tr", "sk"};
    static const char* const kVowels[] = {"a", "e", "i", "o", "u", "ai", "ea", "ou"};
    static const char* const kCodas[] = {"", "", "", "n", "r", "l", "s", "m", "th", "x"};
    std::set<std::string> taken;
    for (const SplitVocabulary* v : {&a, &b})
        for (const auto* list : {&v->adjectives, &v->nouns}) taken.insert(list->begin(), list->end());
    std::mt19937_64 rng(0x5eed0f7ac7500000ull);
    const auto any = [&](const auto& arr) { return std::string(arr[rng() % std::size(arr)]); };
    std::vector<std::string> out;
    while (out.size() < count) {
        std::string w;
        const int syllables = 2 + static_cast<int>(rng() % 2);
        for (int i = 0; i < syllables; ++i) w += any(kOnsets) + any(kVowels) + (i + 1 == syllables ? any(kCodas) : "");
        uint64_t h = 0xcbf29ce484222325ull;
        for (unsigned char c : w) h = (h ^ c) * 0x100000001b3ull;
        const Split of = h % 5 == 0 ? Split::kHeldOut : Split::kTrain;
        if (of == split && taken.insert(w).second) out.push_back(w);
    }
    return out;
}

const std::vector<std::string> kWords = {
    "lantern", "pepper", "glacier", "violet", "saddle", "meadow", "cobalt", "falcon", "thistle", "harbor", "velvet",
    "walnut", "ember", "orchid", "tundra", "pebble", "quartz", "willow", "cinder", "juniper", "marigold", "sparrow"};
const std::vector<std::string> kFirst = {"Alice", "Tomas", "Mira", "Jonas", "Priya", "Oskar", "Lena", "Rafael",
                                         "Ingrid", "Kenji", "Amara", "Felix", "Sofia", "Nikolai", "Hana", "Diego"};
const std::vector<std::string> kLast = {"Moreau", "Okafor", "Lindqvist", "Tanaka", "Haddad", "Novak", "Brennan",
                                        "Castillo", "Weber", "Iyer", "Kowalski", "Santos", "Ferreira", "Olsen"};
const std::vector<std::string> kMonths = {"January", "February", "March",     "April",   "May",      "June",
                                          "July",    "August",   "September", "October", "November", "December"};

std::string pick(const std::vector<std::string>& v, std::mt19937_64& rng) {
    return v[static_cast<size_t>(rng() % v.size())];
}

std::string make_value(const std::string& kind, std::mt19937_64& rng) {
    if (kind == "number") {
        const int64_t digits = 3 + static_cast<int64_t>(rng() % 7);  // 3..9
        int64_t lo = 1;
        for (int64_t i = 1; i < digits; ++i) lo *= 10;
        return std::to_string(lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(9 * lo)));
    }
    if (kind == "word") return pick(kWords, rng);
    if (kind == "name") {
        std::string first = pick(kFirst, rng);
        return first + " " + pick(kLast, rng);
    }
    if (kind == "date") {
        const int64_t day = 1 + static_cast<int64_t>(rng() % 28);
        std::string month = pick(kMonths, rng);
        return fmt::format("{} {} {}", day, month, 1900 + rng() % 125);
    }
    // code: three letters or digits, a dash, four digits ("K7Q-2931")
    static const char kAlnum[] = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    std::string c;
    for (int i = 0; i < 3; ++i) c += kAlnum[rng() % (sizeof(kAlnum) - 1)];
    return c + "-" + std::to_string(1000 + rng() % 9000);
}

std::string capitalised(std::string s) {
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return s;
}

std::string fill(const std::string& frame, const Fact& f) {
    std::string out;
    for (size_t i = 0; i < frame.size(); ++i) {
        if (frame[i] == '{' && i + 2 < frame.size() && frame[i + 2] == '}') {
            const char c = frame[i + 1];
            std::string part = c == 'E' ? f.entity : c == 'A' ? f.attribute : f.value;
            out += i == 0 && c != 'V' ? capitalised(part) : part;
            i += 2;
        } else {
            out += frame[i];
        }
    }
    return out;
}

std::string lowered_spaced(std::string_view s) {  // lower case, runs of whitespace as one space
    std::string out;
    for (char c : s) {
        if (std::isspace(static_cast<unsigned char>(c))) {
            if (!out.empty() && out.back() != ' ') out += ' ';
        } else {
            out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        }
    }
    return out;
}

}  // namespace

const SplitVocabulary& vocabulary(Split split) {
    static const SplitVocabulary train = [] {
        SplitVocabulary v = kTrain;
        v.coined = coined_words(Split::kTrain, 2000, kTrain, kHeldOut);
        return v;
    }();
    static const SplitVocabulary held_out = [] {
        SplitVocabulary v = kHeldOut;
        v.coined = coined_words(Split::kHeldOut, 500, kTrain, kHeldOut);
        return v;
    }();
    return split == Split::kTrain ? train : held_out;
}

FactsGenerator::FactsGenerator(const Tokenizer& tokenizer, std::vector<std::string> paragraphs, Split split)
    : tok_(tokenizer), paragraphs_(std::move(paragraphs)), split_(split) {
    MEGACTX_CHECK(!paragraphs_.empty(), "the haystack has no paragraphs");
    cost_.reserve(paragraphs_.size());
    for (const std::string& p : paragraphs_) cost_.push_back(static_cast<int64_t>(tok_.encode(p + "\n", false).size()));
}

niah::Sample FactsGenerator::make(int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens,
                                  bool absent) const {
    MEGACTX_CHECK(depth >= 0.0 && depth <= 1.0, "depth {} is outside [0, 1]", depth);
    const SplitVocabulary& v = vocabulary(split_);
    niah::Sample s;
    s.length = length;
    s.depth = depth;
    s.index = index;
    s.absent = absent;
    // Seeds apart from eval niah's: the same (seed, length, depth, index) draws other numbers here.
    std::mt19937_64 rng(niah::sample_seed(seed ^ 0xfac75fac75fac75full, length, depth, index));
    const auto new_fact = [&](const std::string& adjective, const std::string& noun, const std::string& attribute) {
        Fact f;
        f.entity = "the " + adjective + " " + noun;
        f.attribute = attribute;
        f.kind = pick(v.kinds, rng);
        f.value = make_value(f.kind, rng);
        f.sentence = fill(pick(v.sentence_frames, rng), f);
        return f;
    };
    // An entity's first word: a curated adjective or a coined word, as often.
    const auto first_word = [&] { return rng() % 2 == 0 ? pick(v.adjectives, rng) : pick(v.coined, rng); };
    const std::string adjective = first_word(), noun = pick(v.nouns, rng);
    const std::string attribute = pick(v.attributes, rng);
    const Fact asked = new_fact(adjective, noun, attribute);
    // Distractors share a word with the asked key: its entity with another attribute, its attribute of an entity
    // with the same noun, then anything else; never the asked key itself.
    std::vector<Fact> facts;
    for (int64_t i = 0; i < kDistractors; ++i) {
        std::string a = adjective, n = noun, at = attribute;
        if (i == 0) {
            while (at == attribute) at = pick(v.attributes, rng);
        } else if (i == 1) {
            while (a == adjective) a = first_word();
        } else {
            while (a == adjective && at == attribute) {
                a = first_word();
                n = pick(v.nouns, rng);
                at = pick(v.attributes, rng);
            }
        }
        facts.push_back(new_fact(a, n, at));
    }
    const std::string question = fill(pick(v.question_frames, rng), asked);
    s.answer = absent ? std::string(kRefusal) : asked.value;
    s.reference = absent ? std::string(kRefusal)
                         : fmt::format("The {} of {} is {}.", asked.attribute, asked.entity, asked.value);
    const auto n_haystack = static_cast<int64_t>(paragraphs_.size());
    s.start_paragraph = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_haystack));
    std::vector<uint64_t> draws;  // the distractors' boundaries, as fractions of the document
    for (int64_t i = 0; i < kDistractors; ++i) draws.push_back(rng());

    std::vector<std::string> inserts;  // the asked fact first (unless absent), then the distractors
    if (!absent) inserts.push_back(asked.sentence);
    for (const Fact& f : facts) inserts.push_back(f.sentence);
    const int64_t budget = max_tokens > 0 ? std::min(length, max_tokens) : length;
    int64_t total = static_cast<int64_t>(tok_.encode(niah::render_prompt(question), false).size());
    for (const std::string& x : inserts) total += static_cast<int64_t>(tok_.encode(x + "\n", false).size());
    MEGACTX_CHECK(total <= budget, "length {}: the question and the facts alone take {} tokens", budget, total);
    const auto part = [&](int64_t i) { return static_cast<size_t>((s.start_paragraph + i) % n_haystack); };
    int64_t n = 0;
    while (total + cost_[part(n)] <= budget) total += cost_[part(n++)];
    for (;;) {
        // Boundary k: before document paragraph k (n: after the last). The asked fact at round(depth · n), the
        // distractors where their draws fall; facts at one boundary keep the order above.
        std::vector<std::vector<std::string>> at(static_cast<size_t>(n) + 1);
        size_t d = 0;
        if (!absent) at[static_cast<size_t>(std::llround(depth * static_cast<double>(n)))].push_back(inserts[d++]);
        for (int64_t i = 0; i < kDistractors; ++i, ++d)
            at[static_cast<size_t>(draws[static_cast<size_t>(i)] % static_cast<uint64_t>(n + 1))].push_back(inserts[d]);
        std::string doc;
        for (int64_t i = 0; i <= n; ++i) {
            for (const std::string& x : at[static_cast<size_t>(i)]) doc += x + "\n";
            if (i < n) doc += paragraphs_[part(i)] + "\n";
        }
        s.n_paragraphs = n;
        s.needle_before = absent ? n : std::llround(depth * static_cast<double>(n));
        s.content = doc + question;
        s.prompt = niah::render_prompt(s.content);
        s.tokens = tok_.encode(s.prompt, false);
        if (static_cast<int64_t>(s.tokens.size()) <= budget || n == 0) break;
        --n;
    }
    MEGACTX_CHECK(static_cast<int64_t>(s.tokens.size()) <= budget,
                  "length {}: the question and the facts alone take {} tokens", budget, s.tokens.size());
    return s;
}

bool is_correct(std::string_view output, const niah::Sample& s) {
    const std::string out = lowered_spaced(output);
    if (s.absent) return out.find("does not say") != std::string::npos;
    return out.find(lowered_spaced(s.answer)) != std::string::npos;
}

niah::Task task(const FactsGenerator& gen) {
    niah::Task t;
    t.name = "facts";
    t.max_new_tokens = kMaxNewTokens;
    t.make = [&gen](int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens, bool absent) {
        return gen.make(length, depth, index, seed, max_tokens, absent);
    };
    t.correct = [](std::string_view output, const niah::Sample& s) { return is_correct(output, s); };
    return t;
}

}  // namespace megactx::facts
